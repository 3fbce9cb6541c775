//! The fault scenarios that apply to `memory://` (no servers, no network), on the lock and
//! on the primitives (every client campaigning, taking a semaphore's one permit, or a
//! read-write lock's write side).

lab::chaos_suite!(async { conformance::memory::MemoryFactory::new() });

/// The same scenarios with every client campaigning for leadership.
mod election {
    lab::chaos_suite!(
        kinded: Election on "memory",
        async { conformance::memory::MemoryFactory::new() }
    );
}

/// The same scenarios with every client taking the one permit of a semaphore of one.
mod semaphore {
    lab::chaos_suite!(
        kinded: Semaphore on "memory",
        async { conformance::memory::MemoryFactory::new() }
    );
}

/// The same scenarios with every client taking a read-write lock's write side.
mod writer {
    lab::chaos_suite!(
        kinded: Writer on "memory",
        async { conformance::memory::MemoryFactory::new() }
    );
}
