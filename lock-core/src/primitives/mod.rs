//! The primitives built on the lease machinery: each is a kind of hold
//! ([`HoldKind`](crate::raw::HoldKind)) and a typed front end over
//! [`DistributedLock::acquire`](crate::DistributedLock::acquire).

mod election;

pub use election::{Election, Leader, LeaderObserver, Leadership};
