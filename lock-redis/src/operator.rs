//! What an operator asks and does: who holds and who waits for a name as the servers
//! show it (`inspect.lua`, one call per server, changing nothing; also the dual lock's
//! advance check), which names are held (`SCAN` over the lock keys), and breaking a hold
//! (`break.lua`, one call per server; on RedLock after an inspection).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, UNIX_EPOCH};

use futures::future::join_all;
use lock_core::raw::backend::{HoldKind, SemaphoreResize};
use lock_core::{FencingToken, LockName, Occupancy, Participant, Result};
use redis::FromRedisValue;

use crate::connection::{Node, Route};
use crate::error;
use crate::hold::acquisition_token;
use crate::layout::{self, BROKEN_STAY};
use crate::scripts::{Call, LeaderView, View};
use crate::topology::{Servers, Topology};

/// Keys a `SCAN` call looks at (and the most lock keys one reply carries).
const SCAN_COUNT: u32 = 1000;

/// Who holds and who waits for `name`; see [`merge`] for how several servers' views
/// combine.
///
/// # Errors
/// When fewer than a majority of servers answered (the one server, on `redis://`).
pub(crate) async fn inspect(servers: &Servers, name: &LockName) -> Result<Occupancy> {
    let key = servers.keys.lock_key(name);
    let call = servers.scripts.inspect(&servers.keys, &key);
    let views = on_a_majority(servers, &key, &call, "the inspection", name).await?;
    let mut seen = merge(&views, servers.topology.arbiter(), servers.quorum());
    seen.holder = seen.holder.map(|holder| shown(servers, holder));
    Ok(seen)
}

/// Runs `call` on every server that lock key `key` goes to, within the request timeout:
/// the answers (`(server index, reply)`) when a majority answered.
///
/// # Errors
/// When fewer than a majority answered (`what` of `name` names the call).
async fn on_a_majority<T: FromRedisValue + Send>(
    servers: &Servers,
    key: &str,
    call: &Call<'_, T>,
    what: &str,
    name: &LockName,
) -> Result<Vec<(usize, T)>> {
    let deadline = servers.request_deadline();
    let routes = servers.routes(key);
    let replies = join_all(routes.into_iter().map(|route| call.on(route, deadline))).await;
    let what = format_args!("{what} of `{name}`");
    error::majority(servers.backend, servers.quorum(), replies, what)
}

/// `holder` as the caller sees it: on RedLock, with the owner token of its acquisition
/// (as its guard shows it), not the round's.
fn shown(servers: &Servers, mut holder: Participant) -> Participant {
    if servers.topology.is_redlock() {
        holder.owner_token = holder
            .owner_token
            .map(|value| acquisition_token(&value).to_owned());
    }
    holder
}

/// The names that start with `prefix` whose lock key holds a value on a majority of
/// the servers (the one server, on `redis://`), sorted. Each server is walked with
/// `SCAN` (string keys matching the escaped prefix, [`SCAN_COUNT`] at a time, each
/// call within `request_timeout`; Redis 6 or later), never `KEYS`; side keys and keys
/// that are no lock key of this prefix are left out.
///
/// # Errors
/// When fewer than a majority of servers answered.
pub(crate) async fn list(servers: &Servers, prefix: &str) -> Result<Vec<LockName>> {
    let pattern = servers.keys.match_pattern(prefix);
    let nodes = match &servers.topology {
        Topology::Cluster(shards) => {
            // Each name lives on one primary: the union of theirs.
            let primaries = shards.primaries(servers.request_deadline()).await?;
            let mut names = Vec::new();
            for listing in join_all(
                primaries
                    .iter()
                    .map(|node| held_on(servers, node, &pattern, prefix)),
            )
            .await
            {
                names.extend(listing?);
            }
            names.sort();
            names.dedup();
            return Ok(names);
        }
        topology => topology.nodes(),
    };
    let replies = join_all(
        nodes
            .iter()
            .map(|node| held_on(servers, node, &pattern, prefix)),
    )
    .await;
    let what = format_args!("the listing of `{prefix}`");
    let quorum = servers.quorum();
    let listings = error::majority(servers.backend, quorum, replies, what)?;
    let mut servers: HashMap<LockName, usize> = HashMap::new();
    for name in listings.into_iter().flat_map(|(_, names)| names) {
        *servers.entry(name).or_default() += 1;
    }
    let mut names: Vec<LockName> = servers
        .into_iter()
        .filter(|(_, on)| *on >= quorum)
        .map(|(name, _)| name)
        .collect();
    names.sort();
    Ok(names)
}

/// The names that start with `prefix` held on `node`, found with `SCAN MATCH
/// pattern`. The walk ends when the cursor comes back to 0, as `SCAN` guarantees
/// after a full pass; the caller bounds it in time.
async fn held_on(
    servers: &Servers,
    node: &Node,
    pattern: &str,
    prefix: &str,
) -> Result<HashSet<LockName>> {
    let mut names = HashSet::new();
    // Mutexes and elections hold a string, the shared kinds a sorted set of holders.
    for kind in ["string", "zset"] {
        held_of_type(servers, node, pattern, prefix, kind, &mut names).await?;
    }
    Ok(names)
}

/// Adds to `names` those of the lock keys of type `kind` matching `pattern` on `node`.
async fn held_of_type(
    servers: &Servers,
    node: &Node,
    pattern: &str,
    prefix: &str,
    kind: &str,
    names: &mut HashSet<LockName>,
) -> Result<()> {
    let mut cursor = 0u64;
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .arg("TYPE")
            .arg(kind);
        let (next, keys): (u64, Vec<Vec<u8>>) = Route::Node(node)
            .command("list", servers.request_deadline(), &scan)
            .await?;
        names.extend(
            keys.iter()
                .filter_map(|key| servers.keys.name_of(std::str::from_utf8(key).ok()?))
                .filter(|name| name.as_str().starts_with(prefix)),
        );
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Resizes the semaphore `name` (`resize.lua`): one server decides (shared kinds are not
/// granted on RedLock).
///
/// # Errors
/// [`lock_core::Error::Conflict`] when the name is another kind, a semaphore of another
/// number, or has a hold or waiter of more than the new number; connection errors.
pub(crate) async fn resize(
    servers: &Servers,
    name: &LockName,
    resize: &SemaphoreResize<'_>,
) -> Result<()> {
    let key = servers.keys.lock_key(name);
    let channel = servers.channel_prefix_for(&key);
    let call = servers
        .scripts
        .resize(&servers.keys, &key, resize, &channel);
    let replies = on_a_majority(servers, &key, &call, "the resize", name).await?;
    let Some((_, reply)) = replies.into_iter().next() else {
        return Ok(());
    };
    let ours = HoldKind::permit(resize.to);
    let theirs = match reply.as_slice() {
        [1, ..] => return Ok(()),
        [-1, code] => layout::kind_named(*code),
        [-2, count] => HoldKind::Permit {
            permits: resize.from,
            count: u32::try_from(*count).unwrap_or(u32::MAX),
        },
        _ => {
            return Err(error::protocol(
                servers.backend,
                format!("unexpected reply to a resize: {reply:?}"),
            ))
        }
    };
    Err(lock_core::Error::Conflict {
        name: name.to_string(),
        ours: ours.describe(),
        theirs: theirs.describe(),
    })
}

/// Breaks `name` on every server (`break.lua`): deletes its lock key whoever holds
/// it, adds the owner token removed to the break mark (kept at least [`BROKEN_STAY`]
/// or three TTLs) and wakes the waiters as a release does. Returns the holder removed
/// as [`merge`] shows a holder (RedLock: the value removed from the most servers),
/// `None` when the key was free everywhere.
///
/// On RedLock the servers are read first and the break removes only the value stored
/// on the most of them: the waiters woken by the servers the break reached first may
/// take a server before the break arrives there, and their key stays.
///
/// # Errors
/// When fewer than a majority of servers answered (the hold may be removed from
/// some).
pub(crate) async fn force_release(
    servers: &Servers,
    name: &LockName,
) -> Result<Option<Participant>> {
    let key = servers.keys.lock_key(name);
    let quorum = servers.quorum();
    let only = if servers.topology.is_redlock() {
        let call = servers.scripts.inspect(&servers.keys, &key);
        let views = on_a_majority(servers, &key, &call, "the inspection", name).await?;
        let most = most_stored(views.iter().map(|(_, (value, ..))| value.as_deref()));
        match most {
            Some(value) => Some(value.to_owned()),
            None => return Ok(None),
        }
    } else {
        None
    };
    let stay = BROKEN_STAY.max(servers.config.options.ttl.saturating_mul(3));
    let channel = servers.channel_prefix_for(&key);
    let window = servers.queue_times.window;
    let call =
        servers
            .scripts
            .force_release(&servers.keys, &key, stay, &channel, window, only.as_deref());
    let removed = on_a_majority(servers, &key, &call, "the force release", name).await?;
    // A shared kind's holder (one server decides: shared kinds are not granted on RedLock).
    if let Some((_, (Some(owner), pttl, _, _, Some(entry)))) = removed.first() {
        let shared = vec![owner.clone(), entry.clone(), pttl.to_string()];
        return Ok(shared_holders(&shared).into_iter().next());
    }
    let views: Vec<(usize, View)> = removed
        .into_iter()
        .map(|(i, (holder, pttl, term, value, _))| {
            // The removed hold's entry, where it had one (a candidate's).
            let owner = (term.is_some() || value.is_some())
                .then(|| holder.clone())
                .flatten();
            let entry = (owner, term, value, None, None);
            (
                i,
                (
                    holder,
                    pttl,
                    None,
                    Vec::new(),
                    entry,
                    Vec::new(),
                    Vec::new(),
                ),
            )
        })
        .collect();
    // A value removed from fewer servers than a majority was no hold (an acquire under
    // way or being undone on RedLock): removed, but not reported as a broken holder.
    let holder = merge(&views, servers.topology.arbiter(), quorum)
        .holder
        .filter(|holder| {
            let on = views
                .iter()
                .filter(|(_, (value, ..))| *value == holder.owner_token)
                .count();
            on >= quorum
        });
    Ok(holder.map(|holder| shown(servers, holder)))
}

/// The value stored on the most servers (the first in server order on a tie), `None`
/// when no server stores one.
fn most_stored<'v>(values: impl Iterator<Item = Option<&'v str>> + Clone) -> Option<&'v str> {
    let mut best: Option<(&str, usize)> = None;
    for value in values.clone().flatten() {
        let count = values.clone().filter(|v| *v == Some(value)).count();
        if best.is_none_or(|(_, most)| count > most) {
            best = Some((value, count));
        }
    }
    best.map(|(value, _)| value)
}

/// The holders of a shared kind in `flat` (owner token, `<kind>:<fencing token>`, ms
/// left, repeated; see `inspect.lua`), each with its kind and fencing token.
fn shared_holders(flat: &[String]) -> Vec<Participant> {
    flat.chunks_exact(3)
        .map(|holder| {
            let (kind, fence) = holder[1].split_once(':').unwrap_or(("", ""));
            let left = holder[2].parse::<u64>().ok().map(Duration::from_millis);
            Participant::new(Some(holder[0].clone()))
                .kind(layout::read_kind(kind))
                .fencing_token(fence.parse().ok().map(FencingToken))
                .lease_left(left)
        })
        .collect()
}

/// The occupancy shown by the servers that answered (`(server index, view)`, in server
/// order):
/// - holder: the value stored on the most of them (the first in server order on a tie;
///   on RedLock a holder has it on a majority, a value on fewer is an acquire under way
///   or being undone, still a participant). Its `lease_left` is how long it stays on as
///   many servers as a majority needs (the `quorum`-th longest PTTL, or the shortest
///   where fewer hold it), `None` for a key without expiry. A mutex's holder shows the
///   token floor as its `fencing_token`: the last token granted, which is its own (every
///   grant takes the next token, RedLock's writes it through a majority), so that an
///   election's readers see a mutex on its name as its leader, as on every backend; a
///   plain `SET NX` holder outside distlock has none and shows its predecessor's.
///   A candidate's holder (an election's leader) shows the term and value of its leader
///   entry instead, from the servers that show its owner token in both the lock key and
///   the entry: the term found there (written by the grant; on RedLock by its fencing
///   write, which a grant needs on a majority, so any majority of answers meets it), the
///   value of the highest version (each proclaim raises it, on a majority). A candidate
///   without a term anywhere is still in RedLock's first round: nobody leads yet, and no
///   holder is shown. One seen during its second round may still fail and be undone; its
///   term is above every earlier leader's all the same.
/// - waiters: the live queue entries of the server that orders the waiters (`arbiter`),
///   then those only other servers list, each in ticket order and once; the owner token
///   is the part of the waiter id `<client id>/<owner token>` after the first `/`.
/// - token floor: the highest fencing counter (every later grant is above it).
fn merge(views: &[(usize, View)], arbiter: usize, quorum: usize) -> Occupancy {
    let floor = views
        .iter()
        .filter_map(|(_, (_, _, counter, ..))| *counter)
        .max()
        .map(FencingToken);
    let holder = most_stored(views.iter().map(|(_, (value, ..))| value.as_deref()))
        .map(|value| {
            // A key without expiry (-1) stays for ever.
            let mut left: Vec<u64> = views
                .iter()
                .filter(|(_, (v, ..))| v.as_deref() == Some(value))
                .map(|&(_, (_, p, ..))| {
                    u64::try_from(p).unwrap_or(if p == -1 { u64::MAX } else { 0 })
                })
                .collect();
            left.sort_unstable_by(|a, b| b.cmp(a));
            let kept = left[quorum.min(left.len()) - 1];
            let holder = Participant::new(Some(value.to_owned()))
                .lease_left((kept != u64::MAX).then(|| Duration::from_millis(kept)));
            (value, holder)
        })
        .and_then(|(value, holder)| leader(views, value, holder.fencing_token(floor)));
    let mut seen = HashSet::new();
    let arbiter_first = views
        .iter()
        .filter(|(i, _)| *i == arbiter)
        .chain(views.iter().filter(|(i, _)| *i != arbiter));
    let waiters: Vec<Participant> = arbiter_first
        .flat_map(|(_, (_, _, _, ids, ..))| ids)
        .filter(|id| seen.insert(id.as_str()))
        .map(|id| match id.split_once('/') {
            Some((client, token)) => {
                Participant::new(Some(token.to_owned())).session(Some(client.to_owned()))
            }
            None => Participant::new(None),
        })
        .collect();
    // A shared kind's holders (one server decides: shared kinds are not granted on
    // RedLock), with the kinds of the waiters.
    if let Some((_, (.., shared, kinds))) = views.iter().find(|(_, v)| !v.5.is_empty()) {
        let waiters = waiters
            .into_iter()
            .zip(
                kinds
                    .iter()
                    .map(String::as_str)
                    .chain(std::iter::repeat("")),
            )
            .map(|(waiter, kind)| waiter.kind(layout::read_kind(kind)))
            .collect();
        return Occupancy::shared(shared_holders(shared), waiters).token_floor(floor);
    }
    Occupancy::new(holder, waiters).token_floor(floor)
}

/// `holder`, whose owner token is `value` in the lock key, as [`merge`] shows it: a
/// mutex's holder as it is; a candidate's with its term and value, or `None` while no
/// server stores its term.
fn leader(views: &[(usize, View)], value: &str, holder: Participant) -> Option<Participant> {
    let entries: Vec<&LeaderView> = views
        .iter()
        .filter(|(_, (key, _, _, _, entry, ..))| {
            key.as_deref() == Some(value) && entry.0.as_deref() == Some(value)
        })
        .map(|(_, (_, _, _, _, entry, ..))| entry)
        .collect();
    if entries.is_empty() {
        return Some(holder);
    }
    // One owner token has one term: every fencing write of its round carries the same.
    let term = entries.iter().filter_map(|(_, term, ..)| *term).max()?;
    let (shown, version) = entries
        .iter()
        .filter(|(_, _, value, ..)| value.is_some())
        .max_by_key(|(_, _, _, version, _)| version.unwrap_or(0))
        .map_or((None, None), |(_, _, value, version, _)| {
            (value.clone(), Some(version.unwrap_or(0)))
        });
    // Each server records its own clock at the grant: the earliest.
    let since = entries
        .iter()
        .filter_map(|(.., since)| *since)
        .min()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    Some(
        holder
            .fencing_token(Some(FencingToken(term)))
            .value(Some(shown.unwrap_or_default()))
            .value_version(version)
            .since(since),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::raw::backend::HoldKind;

    fn view(holder: Option<&str>, pttl: i64, counter: Option<u64>, ids: &[&str]) -> View {
        let ids = ids.iter().map(|id| (*id).to_owned()).collect();
        let entry = (None, None, None, None, None);
        let holder = holder.map(str::to_owned);
        (holder, pttl, counter, ids, entry, Vec::new(), Vec::new())
    }

    #[test]
    fn shared_holders_show_kind_token_and_lease() {
        let flat: Vec<String> = ["a", "P3:17", "900", "b", "W:18", "50", "c", "junk", "x"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let holders = shared_holders(&flat);
        assert_eq!(holders.len(), 3);
        assert_eq!(holders[0].kind, Some(HoldKind::permit(3)));
        assert_eq!(holders[0].fencing_token, Some(FencingToken(17)));
        assert_eq!(holders[0].lease_left, Some(Duration::from_millis(900)));
        assert_eq!(holders[1].kind, Some(HoldKind::Write));
        assert_eq!(
            (holders[2].kind.clone(), holders[2].fencing_token),
            (None, None)
        );
    }

    #[test]
    fn servers_views_merge_into_one_occupancy() {
        let views = [
            (0, view(Some("a"), 900, Some(7), &["c/x"])),
            (1, view(Some("b"), 500, Some(9), &["c/y", "odd"])),
            (2, view(Some("b"), 300, None, &["c/y"])),
        ];
        let seen = merge(&views, 1, 2);
        let holder = seen.holder.expect("b is on two servers");
        assert_eq!(holder.owner_token.as_deref(), Some("b"));
        assert_eq!(holder.lease_left, Some(Duration::from_millis(300)));
        let waiters: Vec<_> = seen.waiters.iter().map(|w| w.owner_token.clone()).collect();
        assert_eq!(waiters, [Some("y".into()), None, Some("x".into())]);
        assert_eq!(seen.token_floor, Some(FencingToken(9)));
        let free = merge(&[(0, view(None, -2, None, &[]))], 0, 1);
        assert_eq!(free, Occupancy::default());
        let forever = merge(&[(0, view(Some("p"), -1, None, &[]))], 0, 1);
        assert_eq!(forever.holder.expect("held").lease_left, None);
    }

    #[test]
    fn a_leader_shows_its_term_and_newest_value() {
        let entry = |owner: &str, term: Option<u64>, value: &str, version: u64| {
            let owner = Some(owner.to_owned());
            let value = Some(value.as_bytes().to_vec());
            (owner, term, value, Some(version), Some(1_000))
        };
        let with = |mut view: View, leader: LeaderView| {
            view.4 = leader;
            view
        };
        // RedLock: the term on two of three servers, a proclaim (version 1) on two.
        let views = [
            (
                0,
                with(
                    view(Some("c"), 900, Some(7), &[]),
                    entry("c", Some(7), "v1", 1),
                ),
            ),
            (
                1,
                with(
                    view(Some("c"), 900, Some(7), &[]),
                    entry("c", None, "v1", 1),
                ),
            ),
            (
                2,
                with(
                    view(Some("c"), 900, Some(7), &[]),
                    entry("c", Some(7), "v0", 0),
                ),
            ),
        ];
        let holder = merge(&views, 0, 2).holder.expect("c leads");
        assert_eq!(holder.fencing_token, Some(FencingToken(7)));
        assert_eq!(holder.value.as_deref(), Some(&b"v1"[..]));
        assert_eq!(holder.since, Some(UNIX_EPOCH + Duration::from_secs(1)));
        // No term anywhere yet: RedLock's first round, nobody leads.
        let under_way = [
            (
                0,
                with(view(Some("d"), 900, Some(7), &[]), entry("d", None, "x", 0)),
            ),
            (
                1,
                with(view(Some("d"), 900, Some(7), &[]), entry("d", None, "x", 0)),
            ),
        ];
        assert_eq!(merge(&under_way, 0, 2).holder, None);
        // A stale entry of another owner is not the holder's: shown as a mutex's holder,
        // with the token floor.
        let stale = [(
            0,
            with(
                view(Some("e"), 900, Some(8), &[]),
                entry("c", Some(7), "old", 0),
            ),
        )];
        let holder = merge(&stale, 0, 1).holder.expect("e holds");
        assert_eq!(
            (holder.fencing_token, holder.value),
            (Some(FencingToken(8)), None)
        );
    }
}
