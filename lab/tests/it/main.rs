//! The lab against real servers and the in-process backend, in one test binary: the fault
//! scenarios on memory, the dual lock on real servers (its conformance suites, faults on
//! either side, attempts that end before a grant), and fencing checked by the stores
//! themselves against holder processes paused past their lease.

mod chaos;
mod chaos_power;
mod dual;
mod fence;
mod memory;
