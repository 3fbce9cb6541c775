//! lock-zookeeper against real ZooKeeper servers, in one test binary: the conformance
//! suites, the fault scenarios, Curator interop and the protocol's own tests.

mod chaos;
mod conformance;
mod election;
mod election_interop;
mod faults;
mod fencing;
mod foreign_children;
mod inspect;
mod interleavings;
mod interop;
mod lagging_server;
mod operations;
mod primitives;
mod primitives_interop;
mod security;
