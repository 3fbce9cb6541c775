//! lock-postgres against real PostgreSQL servers, in one test binary: the conformance
//! suite and the protocol's own tests.

mod chaos;
mod conformance;
mod faults;
mod fence;
mod interop;
mod security;
