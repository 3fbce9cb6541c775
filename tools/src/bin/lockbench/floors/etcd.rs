//! The raw floor of etcd.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
};
use tokio::time::{timeout, Instant};

use super::{no_push, RawFloor, RawHold, PUSH_LIMIT, RAW_TTL};
use crate::error::BoxError;

/// etcd: a transaction that puts the key with a lease if absent, then a delete.
pub(super) struct EtcdFloor {
    client: etcd_client::Client,
    lease: i64,
}

impl EtcdFloor {
    pub(super) async fn connect(endpoints: &[String]) -> Result<Self, BoxError> {
        let mut client = etcd_client::Client::connect(endpoints, None).await?;
        let ttl = i64::try_from(RAW_TTL.as_secs())?;
        let lease = client.lease_grant(ttl, None).await?.id();
        Ok(EtcdFloor { client, lease })
    }
}

#[async_trait]
impl RawFloor for EtcdFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let key = format!("lockbench-floor/{name}/{:x}", self.lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(self.lease)),
            )]);
        let response = self.client.kv_client().txn(txn).await?;
        if !response.succeeded() {
            return Err("raw txn found the key present".into());
        }
        Ok(RawHold::new(key, String::new()))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        self.client.kv_client().delete(hold.name, None).await?;
        Ok(())
    }

    /// The waiter watches the holder's key for its delete, then takes the name.
    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let hold = self.acquire(name).await?;
        let deletes = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut watch = self
            .client
            .watch_client()
            .watch(hold.name.as_str(), Some(deletes))
            .await?;
        let started = Instant::now();
        self.client
            .kv_client()
            .delete(hold.name.as_str(), None)
            .await?;
        loop {
            let answer = timeout(PUSH_LIMIT, watch.message())
                .await
                .map_err(|_| no_push("watch event"))??
                .ok_or_else(|| no_push("watch event"))?;
            let events = answer.events();
            if events.iter().any(|e| e.event_type() == EventType::Delete) {
                break;
            }
        }
        let next = self.acquire(name).await?;
        let took = started.elapsed();
        self.release(next).await?;
        Ok(Some(took))
    }
}
