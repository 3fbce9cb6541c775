//! The raw floor of Redis.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::{timeout, Instant};

use super::{no_push, RawFloor, RawHold, PUSH_LIMIT, RAW_TTL, WAIT_LIMIT_MS};
use crate::error::BoxError;

/// Redis: `SET key token NX PX ttl` (then `WAIT replicas`, when set), then a
/// compare-and-delete script by EVALSHA. Its hand-off: the release script also publishes
/// on the key's channel, where the waiter (its own connection) is subscribed.
pub(super) struct RedisFloor {
    client: ::redis::Client,
    conn: ::redis::aio::MultiplexedConnection,
    release: ::redis::Script,
    release_and_publish: ::redis::Script,
    wait: Option<u32>,
}

impl RedisFloor {
    pub(super) async fn connect(url: &str, wait: Option<u32>) -> Result<Self, BoxError> {
        let client = ::redis::Client::open(url)?;
        let conn = client.get_multiplexed_async_connection().await?;
        let release = ::redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
        );
        let release_and_publish = ::redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]) \
             redis.call('publish', ARGV[2], 'released') return 1 else return 0 end",
        );
        Ok(RedisFloor {
            client,
            conn,
            release,
            release_and_publish,
            wait,
        })
    }
}

#[async_trait]
impl RawFloor for RedisFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let token = uuid::Uuid::new_v4().to_string();
        let mut conn = self.conn.clone();
        let ttl_ms = u64::try_from(RAW_TTL.as_millis())?;
        let set: Option<String> = ::redis::cmd("SET")
            .arg(name)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await?;
        set.ok_or("raw SET NX found the key held")?;
        if let Some(replicas) = self.wait {
            let acked: u32 = ::redis::cmd("WAIT")
                .arg(replicas)
                .arg(WAIT_LIMIT_MS)
                .query_async(&mut conn)
                .await?;
            if acked < replicas {
                return Err(
                    format!("raw WAIT: {acked} of {replicas} replicas acknowledged").into(),
                );
            }
        }
        Ok(RawHold::new(name.to_owned(), token))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        let mut conn = self.conn.clone();
        let deleted: i64 = self
            .release
            .key(&hold.name)
            .arg(&hold.token)
            .invoke_async(&mut conn)
            .await?;
        if deleted != 1 {
            return Err("raw release found the key gone".into());
        }
        Ok(())
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let channel = format!("{name}/released");
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        let mut messages = pubsub.into_on_message();
        let mut waiter = self.client.get_multiplexed_async_connection().await?;
        let hold = self.acquire(name).await?;
        let token = uuid::Uuid::new_v4().to_string();
        let set_nx = |conn: &mut ::redis::aio::MultiplexedConnection| {
            let mut conn = conn.clone();
            let (name, token) = (name.to_owned(), token.clone());
            async move {
                ::redis::cmd("SET")
                    .arg(name)
                    .arg(token)
                    .arg("NX")
                    .arg("PX")
                    .arg(u64::try_from(RAW_TTL.as_millis()).unwrap_or(u64::MAX))
                    .query_async::<Option<String>>(&mut conn)
                    .await
            }
        };
        if set_nx(&mut waiter).await?.is_some() {
            return Err("raw waiter took a held key".into());
        }
        let started = Instant::now();
        let mut conn = self.conn.clone();
        let _: i64 = self
            .release_and_publish
            .key(name)
            .arg(&hold.token)
            .arg(&channel)
            .invoke_async(&mut conn)
            .await?;
        loop {
            timeout(PUSH_LIMIT, messages.next())
                .await
                .map_err(|_| no_push("release message"))?
                .ok_or_else(|| no_push("release message"))?;
            if set_nx(&mut waiter).await?.is_some() {
                break;
            }
        }
        let took = started.elapsed();
        self.release(RawHold::new(name.to_owned(), token)).await?;
        Ok(Some(took))
    }
}
