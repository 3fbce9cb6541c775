//! The raw floor of ZooKeeper.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OnceCell;
use tokio::time::{timeout, Instant};
use zookeeper_client as zk;

use super::{no_push, RawFloor, RawHold, PUSH_LIMIT, RAW_TTL};
use crate::error::BoxError;

/// ZooKeeper: create an ephemeral sequential node, then delete it. Its hand-off: a waiter
/// (a session of its own, opened at the first hand-off) queues its node behind the
/// holder's and watches it; once it fires, the waiter's listing shows its node first.
pub(super) struct ZkFloor {
    client: zk::Client,
    connect_string: String,
    ca_file: Option<PathBuf>,
    waiter: OnceCell<zk::Client>,
}

impl ZkFloor {
    pub(super) async fn connect(
        connect_string: &str,
        ca_file: Option<PathBuf>,
    ) -> Result<Self, BoxError> {
        Ok(ZkFloor {
            client: Self::session(connect_string, ca_file.as_deref()).await?,
            connect_string: connect_string.to_owned(),
            ca_file,
            waiter: OnceCell::new(),
        })
    }

    /// Over TLS when `ca_file` is given (the server asks for no client certificate).
    async fn session(connect_string: &str, ca_file: Option<&Path>) -> Result<zk::Client, BoxError> {
        let connector = zk::Client::connector().with_session_timeout(RAW_TTL);
        Ok(match ca_file {
            Some(ca_file) => {
                let ca = tokio::fs::read_to_string(ca_file).await?;
                connector
                    .with_tls(zk::TlsOptions::new().with_pem_ca(&ca)?)
                    .secure_connect(connect_string)
                    .await?
            }
            None => connector.connect(connect_string).await?,
        })
    }
}

#[async_trait]
impl RawFloor for ZkFloor {
    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let dir = format!("/lockbench-floor/{}", name.replace('/', "_"));
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let prefix = format!("{dir}/lock-");
        let created = match self.client.create(&prefix, &[], &options).await {
            Err(zk::Error::NoNode) => {
                let parents = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                for path in ["/lockbench-floor", dir.as_str()] {
                    match self.client.create(path, &[], &parents).await {
                        Ok(_) | Err(zk::Error::NodeExists) => {}
                        Err(err) => return Err(err.into()),
                    }
                }
                self.client.create(&prefix, &[], &options).await?
            }
            other => other?,
        };
        let (_stat, sequence) = created;
        Ok(RawHold::new(format!("{prefix}{sequence}"), String::new()))
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        self.client.delete(&hold.name, None).await?;
        Ok(())
    }

    async fn handoff(&self, name: &str) -> Result<Option<Duration>, BoxError> {
        let waiter = self
            .waiter
            .get_or_try_init(|| Self::session(&self.connect_string, self.ca_file.as_deref()))
            .await?;
        let hold = self.acquire(name).await?;
        let (dir, _) = hold
            .name
            .rsplit_once('/')
            .ok_or("a raw node without its dir")?;
        let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (_, sequence) = waiter
            .create(&format!("{dir}/lock-"), &[], &options)
            .await?;
        let queued = format!("lock-{sequence}");
        let (_, _, watch) = waiter.get_and_watch_data(&hold.name).await?;
        let started = Instant::now();
        self.client.delete(&hold.name, None).await?;
        timeout(PUSH_LIMIT, watch.changed())
            .await
            .map_err(|_| no_push("watch event"))?;
        let children = waiter.list_children(dir).await?;
        let took = started.elapsed();
        if children.iter().min() != Some(&queued) {
            return Err(format!("raw waiter is not first in {dir}: {children:?}").into());
        }
        waiter.delete(&format!("{dir}/{queued}"), None).await?;
        Ok(Some(took))
    }
}
