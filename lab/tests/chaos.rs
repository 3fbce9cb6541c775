//! The fault scenarios that apply to `memory://` (no servers, no network), on the lock and
//! on the primitives (every client campaigning, taking a semaphore's one permit, or a
//! read-write lock's write side).

lab::chaos_suite!(async { conformance::memory::MemoryFactory::new() });

/// The same scenarios with every client campaigning for leadership.
mod election {
    lab::chaos_suite!(async {
        lab::chaos::Kinded::of(
            lab::chaos::Primitive::Election,
            conformance::memory::MemoryFactory::new(),
        )
    });
}

/// The same scenarios with every client taking the one permit of a semaphore of one.
mod semaphore {
    lab::chaos_suite!(async {
        lab::chaos::Kinded::of(
            lab::chaos::Primitive::Semaphore,
            conformance::memory::MemoryFactory::new(),
        )
    });
}

/// The same scenarios with every client taking a read-write lock's write side.
mod writer {
    lab::chaos_suite!(async {
        lab::chaos::Kinded::of(
            lab::chaos::Primitive::Writer,
            conformance::memory::MemoryFactory::new(),
        )
    });
}
