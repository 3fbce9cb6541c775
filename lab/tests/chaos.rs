//! The fault scenarios that apply to `memory://` (no servers, no network).

lab::chaos_suite!(async { conformance::memory::MemoryFactory::new() });
