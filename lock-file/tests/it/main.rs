//! lock-file on temporary directories, in one test binary: the conformance suite, and
//! holders in processes of their own (killed, or `flock(1)`).

mod conformance;
mod fencing;
mod processes;
mod records;
