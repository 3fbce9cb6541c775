//! The kinds of fleet member: distlock on any URL (its lock, its leader election, the one
//! permit of a semaphore of one, or a read-write lock's write side),
//! Curator on ZooKeeper, plain `SET NX` on Redis.

use std::sync::Arc;
use std::time::Duration;

use distlock::raw::backend::{AcquireKind, HoldKind};
use distlock::raw::url::LockUrl;
use distlock::redis::{KeyLayout, RedisConfig, RedisDeployment};
use distlock::zookeeper::{lock_dir, ZkConfig};
use distlock::{AcquireOptions, DistributedLock, LockGuard, LockName, ReleaseOutcome};
use harness::curator::Curator;
use tokio::time::{sleep, timeout, Instant};

use crate::{BoxError, Cli, Kind};

/// Pause between two `SET NX` attempts on a held key.
const SET_NX_POLL: Duration = Duration::from_millis(2);
/// Bound on a release by Curator, on top of its own.
const CURATOR_RELEASE: Duration = Duration::from_secs(15);

/// A connected member.
pub(crate) enum Member {
    Distlock {
        locks: Arc<dyn DistributedLock>,
        name: LockName,
        /// What each cycle takes: the lock, or leadership.
        kind: HoldKind,
    },
    Curator(Curator),
    SetNx(SetNx),
}

/// One hold of the lock.
pub(crate) enum Hold {
    Guard(LockGuard),
    Curator(u64),
    SetNx {
        owner: String,
        token: u64,
        valid_until: Instant,
    },
}

impl Hold {
    /// Its fencing token.
    pub(crate) fn token(&self) -> u64 {
        match self {
            Hold::Guard(guard) => guard.fencing_token().get(),
            Hold::Curator(czxid) => *czxid,
            Hold::SetNx { token, .. } => *token,
        }
    }

    /// Whether the holder may still write: a guard not lost and before its deadline;
    /// Curator's session-bound hold; a `SET NX` key before its TTL ran out.
    pub(crate) fn vouches(&self) -> bool {
        match self {
            Hold::Guard(guard) => !guard.state().is_lost() && Instant::now() < guard.valid_until(),
            Hold::Curator(_) => true,
            Hold::SetNx { valid_until, .. } => Instant::now() < *valid_until,
        }
    }
}

impl Member {
    pub(crate) async fn connect(cli: &Cli) -> Result<Self, BoxError> {
        let name = LockName::new(cli.name.as_str())?;
        Ok(match cli.kind {
            Kind::Distlock | Kind::Elect | Kind::Permit | Kind::Write => Member::Distlock {
                locks: distlock::connect(&cli.url).await?,
                name,
                kind: match cli.kind {
                    Kind::Elect => HoldKind::Candidate {
                        value: format!("fleet-member-{}", std::process::id()).into_bytes(),
                    },
                    Kind::Permit => HoldKind::permit(1),
                    Kind::Write => HoldKind::Write,
                    _ => HoldKind::Mutex,
                },
            },
            Kind::Curator => {
                let config = ZkConfig::from_url(&LockUrl::parse(&cli.url)?)?;
                if config.chroot.is_some() {
                    return Err("the curator member takes no chroot".into());
                }
                let classpath = cli
                    .classpath
                    .as_deref()
                    .ok_or("the curator member needs --classpath")?;
                let path = lock_dir(&config.prefix, &name);
                Member::Curator(
                    Curator::start(classpath, &config.endpoints.join(","), &path).await?,
                )
            }
            Kind::SetNx => Member::SetNx(SetNx::connect(&cli.url, &name).await?),
        })
    }

    /// Takes the lock, waiting at most `wait`.
    pub(crate) async fn acquire(&mut self, wait: Duration) -> Result<Hold, BoxError> {
        let not_granted = || format!("not granted within {wait:?}");
        match self {
            Member::Distlock { locks, name, kind } => {
                let options = AcquireOptions::timeout(wait).with_kind(kind.clone());
                let guard = locks.acquire(name, &options).await?;
                Ok(Hold::Guard(guard.ok_or_else(not_granted)?))
            }
            Member::Curator(curator) => {
                let czxid = timeout(wait, curator.acquire())
                    .await
                    .map_err(|_| not_granted())??;
                Ok(Hold::Curator(czxid))
            }
            Member::SetNx(set_nx) => set_nx.acquire(wait).await?.ok_or(not_granted().into()),
        }
    }

    /// Gives the lock back; an error unless it was still held.
    pub(crate) async fn release(&mut self, hold: Hold) -> Result<(), BoxError> {
        match (self, hold) {
            (Member::Distlock { .. }, Hold::Guard(guard)) => match guard.release().await? {
                ReleaseOutcome::Released => Ok(()),
                other => Err(format!("release: {other:?}").into()),
            },
            (Member::Curator(curator), Hold::Curator(_)) => {
                timeout(CURATOR_RELEASE, curator.release())
                    .await
                    .map_err(|_| "curator release timed out")??;
                Ok(())
            }
            (Member::SetNx(set_nx), Hold::SetNx { owner, .. }) => set_nx.release(&owner).await,
            _ => Err("a hold of another member".into()),
        }
    }

    /// Ends the member's sessions.
    pub(crate) async fn close(self) {
        if let Member::Curator(curator) = self {
            curator.exit().await;
        }
    }
}

/// A plain Redis lock: `SET key token NX PX ttl` polled until granted, then `INCR` of the
/// distlock backend's fencing counter as the token; released by compare-and-delete.
pub(crate) struct SetNx {
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
    lock_key: String,
    fence_key: String,
    ttl: Duration,
    request_timeout: Duration,
}

impl SetNx {
    async fn connect(url: &str, name: &LockName) -> Result<Self, BoxError> {
        let config = RedisConfig::from_url(&LockUrl::parse(url)?)?;
        let RedisDeployment::Single { node, db } = &config.deployment else {
            return Err("the set-nx member takes one redis:// server".into());
        };
        let request_timeout = config.options.request_timeout;
        let client = redis::Client::open(format!("redis://{}:{}/{db}", node.host, node.port))?;
        let conn = timeout(request_timeout, client.get_multiplexed_async_connection())
            .await
            .map_err(|_| "redis connect timed out")??;
        let keys = KeyLayout::new(config.prefix.as_str());
        Ok(SetNx {
            conn,
            release: redis::Script::new(
                "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
            ),
            lock_key: keys.lock_key(name),
            fence_key: keys.fence_key(name),
            ttl: config.options.ttl,
            request_timeout,
        })
    }

    async fn acquire(&mut self, wait: Duration) -> Result<Option<Hold>, BoxError> {
        let owner = uuid::Uuid::new_v4().to_string();
        let ttl_ms = u64::try_from(self.ttl.as_millis())?;
        let deadline = Instant::now() + wait;
        loop {
            let asked = Instant::now();
            let set: Option<String> = self
                .query(
                    redis::cmd("SET")
                        .arg(&self.lock_key)
                        .arg(&owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms),
                )
                .await?;
            if set.is_some() {
                let token: u64 = self.query(redis::cmd("INCR").arg(&self.fence_key)).await?;
                return Ok(Some(Hold::SetNx {
                    owner,
                    token,
                    valid_until: asked + self.ttl,
                }));
            }
            if Instant::now() + SET_NX_POLL >= deadline {
                return Ok(None);
            }
            sleep(SET_NX_POLL).await;
        }
    }

    async fn release(&mut self, owner: &str) -> Result<(), BoxError> {
        let mut conn = self.conn.clone();
        let deleted: i64 = timeout(
            self.request_timeout,
            self.release
                .key(&self.lock_key)
                .arg(owner)
                .invoke_async(&mut conn),
        )
        .await
        .map_err(|_| "redis release timed out")??;
        if deleted == 1 {
            Ok(())
        } else {
            Err("release found the key gone".into())
        }
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, BoxError> {
        let mut conn = self.conn.clone();
        Ok(timeout(self.request_timeout, cmd.query_async(&mut conn))
            .await
            .map_err(|_| "redis command timed out")??)
    }
}
