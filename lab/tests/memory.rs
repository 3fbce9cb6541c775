//! The interleavings that need only a target, on `memory://`, the reference backend.

lab::interleavings_suite!(async { conformance::memory::MemoryFactory::new() });
