//! Redis Cluster (`redis+cluster://`): the whole conformance suite on three primaries
//! with a replica each, and what the suite cannot show: holds and waiters across shards,
//! a failover while locks are held and contended, a slot moving while a lock is held and
//! contended, renewal cost per shard, and bad seeds.

mod common;

/// The conformance suite on a cluster of its own per test.
mod suite {
    conformance::conformance_suite!(async { crate::common::ClusterFactory::start().await });
}
