//! The examples run as their users run them, in one test binary.

mod fenced_write;
mod fleet;
mod metrics;
mod migration;
mod primitives;
mod run;
