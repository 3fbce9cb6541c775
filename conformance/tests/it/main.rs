//! The conformance suite on the in-process backend, and its documented claims; one test
//! binary.

mod documented;
mod fence;
mod memory;
