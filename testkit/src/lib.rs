//! distlock's test deployments: for every backend and topology, a conformance
//! [`Factory`](conformance::Factory) over real servers from the `harness` crate (also a
//! chaos target of the `lab` crate), the raw server access a test needs to reach behind
//! the library, and the dual deployments built from two of them.
//!
//! - [`redis`]: one redis-server, RedLock's N, Sentinel and Redis Cluster deployments.
//! - [`zookeeper`]: a standalone server or a 3-member ensemble, plain or TLS, and Curator.
//! - [`etcd`]: one member or a 3-member cluster.
//! - [`postgres`]: one PostgreSQL server, each factory in a schema of its own.
//! - [`file`](mod@file): a temporary lock directory of this machine.
//! - [`dual`]: `dual:<old>|<new>` deployments whose sides are the factories above.
//!
//! Every backend crate's integration tests and the dual tests use this kit; nothing
//! includes another crate's test files.

pub mod dual;
pub mod etcd;
pub mod file;
pub mod postgres;
pub mod redis;
pub mod zookeeper;
