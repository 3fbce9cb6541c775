//! The whole conformance suite on `memory://`, the reference backend.

conformance::conformance_suite!(async { conformance::memory::MemoryFactory::new() });

/// `extend_for` a shorter lease on an auto-renewed hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_for_keeps_an_auto_renewed_hold() {
    let factory = conformance::memory::MemoryFactory::new();
    conformance::interleavings::extend_for_keeps_an_auto_renewed_hold(&factory).await;
}

/// The release of an ended hold lost while the client was cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_hold_released_despite_a_broken_link() {
    let factory = conformance::memory::MemoryFactory::new();
    conformance::interleavings::ended_hold_released_despite_a_broken_link(&factory).await;
}

/// A waiter cut off beyond the TTL waits on and gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_outlives_its_session() {
    let factory = conformance::memory::MemoryFactory::new();
    conformance::interleavings::waiter_outlives_its_session(&factory).await;
}
