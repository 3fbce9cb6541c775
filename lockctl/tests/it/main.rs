//! lockctl run as its own process against real servers, in one test binary.

mod common;
mod docs;
mod elect;
mod migration_check;
mod operate;
mod paused_process;
mod primitives;
mod secrets;
mod shutdown;
mod signals;
