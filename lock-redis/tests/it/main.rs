//! lock-redis against real redis-servers, in one test binary: every topology's
//! conformance suite, its fault scenarios, and the protocol's own tests.

mod arbiter;
mod chaos;
mod cluster;
mod cluster_failover;
mod cluster_migration;
mod conformance;
mod election;
mod faults;
mod fence;
mod fencing;
mod interleavings;
mod kinds;
mod migration;
mod operations;
mod primitives;
mod queue;
mod security;
mod sentinel;
mod shared_waiters;
mod single;
