//! lock-etcd against real etcd servers, in one test binary: the conformance suites,
//! the fault scenarios and the protocol's own tests.

mod cancellation;
mod chaos;
mod conformance;
mod election;
mod faults;
mod fence;
mod inspect;
mod interleavings;
mod interop;
mod operations;
mod primitives;
mod security;
mod session;
