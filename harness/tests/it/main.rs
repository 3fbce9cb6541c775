//! The harness's servers and fault proxy, in one test binary.

mod harness;
mod postgres;
mod proxy;
