//! The fault scenarios (`lab::chaos_suite!`) on dual deployments
//! (`dual:<old>|<new>`): ZooKeeper -> Redis with the faults on the old side, on the new side
//! and on both, and etcd -> Redis with the faults on either side. Each asserts what
//! `lab::chaos::expectation` promises for the dual topology (with one side
//! healthy, safety even where the faulted backend alone promises only fencing).
//!
//! A binary of its own, not part of `cargo test` (`test = false` in Cargo.toml: the five
//! deployments take minutes even with the short plan); `make chaos` runs it with the long
//! plan.

/// One module of scenarios per dual deployment (a constructor of `testkit::dual`) and
/// faulted side.
macro_rules! dual_chaos {
    ($($(#[$doc:meta])* $module:ident: $deployment:ident, $sides:ident;)*) => {$(
        $(#[$doc])*
        mod $module {
            lab::chaos_suite!(async {
                testkit::dual::$deployment()
                    .await
                    .map(|dual| dual.faults(lab::dual::Sides::$sides))
            });
        }
    )*};
}

dual_chaos! {
    /// ZooKeeper -> Redis, the old side (ZooKeeper) faulted.
    zk_to_redis_old_faulted: zk_redis, Old;
    /// ZooKeeper -> Redis, the new side (Redis) faulted.
    zk_to_redis_new_faulted: zk_redis, New;
    /// ZooKeeper -> Redis, both sides faulted.
    zk_to_redis_both_faulted: zk_redis, Both;
    /// etcd -> Redis, the old side (etcd) faulted.
    etcd_to_redis_old_faulted: etcd_redis, Old;
    /// etcd -> Redis, the new side (Redis) faulted.
    etcd_to_redis_new_faulted: etcd_redis, New;
}
