//! The whole conformance suite on `memory://`, the reference backend.

conformance::conformance_suite!(async { conformance::memory::MemoryFactory::new() });
