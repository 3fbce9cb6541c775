//! The raw protocol floors: what a lock costs on each server with no library on top.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use zookeeper_client as zk;

use crate::targets::{BoxError, RawFloor, RawHold};

/// Lease of raw holds: long enough never to expire during a measurement.
const RAW_TTL: Duration = Duration::from_secs(30);

/// Redis: `SET key token NX PX ttl`, then a compare-and-delete script by EVALSHA.
pub(crate) struct RedisFloor {
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
}

impl RedisFloor {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        let client = redis::Client::open(url)?;
        let conn = client.get_multiplexed_async_connection().await?;
        let release = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
        );
        Ok(RedisFloor { conn, release })
    }
}

#[async_trait]
impl RawFloor for RedisFloor {
    fn describe(&self) -> String {
        "SET NX PX + EVALSHA compare-and-delete".into()
    }

    async fn acquire(&self, name: &str) -> Result<RawHold, BoxError> {
        let token = uuid::Uuid::new_v4().to_string();
        let mut conn = self.conn.clone();
        let ttl_ms = u64::try_from(RAW_TTL.as_millis())?;
        let set: Option<String> = redis::cmd("SET")
            .arg(name)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await?;
        set.ok_or("raw SET NX found the key held")?;
        Ok(RawHold {
            name: name.to_owned(),
            token,
        })
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
}

/// ZooKeeper: create an ephemeral sequential node, then delete it.
pub(crate) struct ZkFloor {
    client: zk::Client,
}

impl ZkFloor {
    pub(crate) async fn connect(connect_string: &str) -> Result<Self, BoxError> {
        let client = zk::Client::connector()
            .with_session_timeout(RAW_TTL)
            .connect(connect_string)
            .await?;
        Ok(ZkFloor { client })
    }
}

#[async_trait]
impl RawFloor for ZkFloor {
    fn describe(&self) -> String {
        "create ephemeral sequential + delete".into()
    }

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
        Ok(RawHold {
            name: format!("{prefix}{sequence}"),
            token: String::new(),
        })
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        self.client.delete(&hold.name, None).await?;
        Ok(())
    }
}

/// etcd: a transaction that puts the key with a lease if absent, then a delete.
pub(crate) struct EtcdFloor {
    client: etcd_client::Client,
    lease: i64,
}

impl EtcdFloor {
    pub(crate) async fn connect(endpoints: &[String]) -> Result<Self, BoxError> {
        let mut client = etcd_client::Client::connect(endpoints, None).await?;
        let ttl = i64::try_from(RAW_TTL.as_secs())?;
        let lease = client.lease_grant(ttl, None).await?.id();
        Ok(EtcdFloor { client, lease })
    }
}

#[async_trait]
impl RawFloor for EtcdFloor {
    fn describe(&self) -> String {
        "txn put-if-absent with lease + delete".into()
    }

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
        Ok(RawHold {
            name: key,
            token: String::new(),
        })
    }

    async fn release(&self, hold: RawHold) -> Result<(), BoxError> {
        self.client.kv_client().delete(hold.name, None).await?;
        Ok(())
    }
}
