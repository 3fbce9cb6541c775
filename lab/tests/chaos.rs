//! The fault scenarios that apply to `memory://` (no servers, no network), on the lock and
//! on leader elections (every client campaigning).

lab::chaos_suite!(async { conformance::memory::MemoryFactory::new() });

/// The same scenarios with every client campaigning for leadership.
mod election {
    lab::chaos_suite!(async { lab::chaos::Elected::of(conformance::memory::MemoryFactory::new()) });
}
