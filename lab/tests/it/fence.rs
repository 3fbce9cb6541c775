//! Fencing checked by the resource itself (`lock_core::fence`), on every ready store:
//! Redis, etcd, PostgreSQL and a local file.
//!
//! A holder in another process (this test binary, started again as a child: `holder`)
//! takes the lock and is frozen with SIGSTOP past its lease; a second holder takes the
//! lock and writes through the store; the first is thawed and writes with its old token,
//! blind, as a paused process would. The store must refuse it: the test reads what the
//! store holds afterwards, not only what the late writer was told. `paused` runs this with
//! one backend per store, `dual` with the holders of a migration (`dual:`): an old-only
//! holder paused, a dual holder taking over, then a new-only holder.

mod dual;
mod holder;
mod paused;

use std::sync::Arc;

use harness::shared::Shared;
use harness::{or_skip, EtcdServer, PostgresServer, RedisServer};
use lock_core::raw::driver::register;

/// The servers the tests of this module share (no test here damages a server: only the
/// holder process is paused).
static REDIS: Shared<RedisServer> = Shared::new();
static ETCD: Shared<EtcdServer> = Shared::new();
static POSTGRES: Shared<PostgresServer> = Shared::new();

async fn redis() -> Option<Arc<RedisServer>> {
    REDIS
        .get_or_start(|| async { or_skip(RedisServer::start().await) })
        .await
}

async fn etcd() -> Option<Arc<EtcdServer>> {
    ETCD.get_or_start(|| async { or_skip(EtcdServer::start().await) })
        .await
}

async fn postgres() -> Option<Arc<PostgresServer>> {
    POSTGRES
        .get_or_start(|| async { or_skip(PostgresServer::start().await) })
        .await
}

/// Makes `lock_core::connect` serve the backends these tests use.
fn register_backends() {
    register::<lock_redis::RedisBackend>();
    register::<lock_etcd::EtcdBackend>();
    register::<lock_postgres::PostgresBackend>();
}
