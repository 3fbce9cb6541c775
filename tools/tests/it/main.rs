//! The tools run as their users run them, in one test binary.

mod lockbench;
