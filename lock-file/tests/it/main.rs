//! lock-file on temporary directories, in one test binary: the conformance suite, and
//! holders in processes of their own (killed, or `flock(1)`), and many waiters of one
//! name.

mod conformance;
mod fencing;
mod herd;
mod processes;
mod records;
