//! The examples run as their users run them, in one test binary.

mod fleet;
mod metrics;
mod migration;
