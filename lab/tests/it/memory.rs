//! The interleavings that need only a target, on `memory://`, the reference backend.

lab::interleavings_suite!(async { conformance::memory::MemoryFactory::new() });

/// A mutex on an election's name leads it (see [`lab::kinds`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_on_an_elections_name_leads() {
    let factory = conformance::memory::MemoryFactory::new();
    let client = conformance::Factory::client(&factory, lock_core::LockOptions::default()).await;
    let name = lock_core::LockName::new("lab/mutex_leads").expect("name");
    lab::kinds::a_mutex_on_an_elections_name_leads(client, &name).await;
}
