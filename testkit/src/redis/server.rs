//! What the servers keep, read behind the library: a hold's lease (for the lease oracle,
//! [`conformance::Factory::server_lease`]) and what is left of a name
//! ([`conformance::Factory::leftovers`]).

use std::time::Duration;

use lock_core::LockName;
use lock_redis::KeyLayout;
use redis::aio::MultiplexedConnection;

/// What the servers of `conns` keep of the hold of `owner` on the lock `key` (holders'
/// table `table` for the shared kinds): the key's PTTL where it is the owner's string
/// (or one of its RedLock attempts);
/// for a shared kind the least of the owner's entry, the key's and the table's expiry.
/// Over RedLock's nodes, what a majority keeps.
pub async fn lease_on(
    conns: Vec<MultiplexedConnection>,
    key: &str,
    table: &str,
    owner: &str,
) -> conformance::ServerLease {
    const LEFT: &str = r"
        local kind = redis.call('TYPE', KEYS[1])['ok']
        local left = -2
        if kind == 'string' then
          -- RedLock writes each attempt as '<owner token>~<attempt>'.
          local value = redis.call('GET', KEYS[1])
          if value ~= ARGV[1] and string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '~' then
            return -2
          end
          left = redis.call('PTTL', KEYS[1])
        elseif kind == 'zset' then
          local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
          if not score or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return -2 end
          local now = redis.call('TIME')
          left = tonumber(score) - (tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
          for _, k in ipairs(KEYS) do
            local pttl = redis.call('PTTL', k)
            if pttl >= 0 and pttl < left then left = pttl end
          end
        end
        return left";
    let quorum = conns.len() / 2 + 1;
    let mut kept = Vec::new();
    for mut conn in conns {
        let left: i64 = redis::Script::new(LEFT)
            .key(key)
            .key(table)
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .expect("reading a hold's lease");
        match left {
            -2 => {}
            // No expiry at all.
            -1 => kept.push(Duration::MAX),
            ms => kept.push(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        }
    }
    kept.sort_unstable_by(|a, b| b.cmp(a));
    match kept.get(quorum - 1) {
        Some(&left) => conformance::ServerLease::Left(left),
        None => conformance::ServerLease::Absent,
    }
}

/// Anything left for `names` under key `prefix` on the servers behind `conns` (see
/// [`conformance::Factory::leftovers`]).
pub async fn leftovers_on(
    conns: Vec<MultiplexedConnection>,
    prefix: &str,
    names: &[LockName],
) -> Vec<String> {
    let keys = KeyLayout::new(prefix);
    let mut left = Vec::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        for name in names {
            let key = keys.lock_key(name);
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            if exists > 0 {
                left.push(format!("server {i}: lock key {key:?} exists"));
            }
            let queue = [
                ("waiter queue", keys.queue_key(name)),
                ("waiter liveness", keys.queue_live_key(name)),
            ];
            for (what, key) in queue {
                let entries: i64 = redis::cmd("ZCARD")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("ZCARD");
                if entries > 0 {
                    left.push(format!(
                        "server {i}: {what} {key:?} holds {entries} entries"
                    ));
                }
            }
            let leader = keys.leader_key(name);
            let exists: i64 = redis::cmd("EXISTS")
                .arg(&leader)
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            if exists > 0 {
                left.push(format!("server {i}: leader entry {leader:?} exists"));
            }
            for channel in [keys.wakeup_channel(name), keys.changes_channel(name)] {
                let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(&mut conn)
                    .await
                    .expect("PUBSUB NUMSUB");
                if subscribers > 0 {
                    left.push(format!(
                        "server {i}: {subscribers} subscribers on {channel:?}"
                    ));
                }
            }
        }
    }
    left
}
