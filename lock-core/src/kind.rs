//! The kinds of hold a lock service grants: the mutex, and the primitives built on it.

/// The kind of hold an acquisition asks for. A backend grants the kinds its
/// [`Capabilities`](crate::Capabilities) name; the lease client refuses the others before they reach it.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum HoldKind {
    /// Exclusive: one holder at a time. The default.
    #[default]
    Mutex,
    /// A candidate of a leader election: exclusive like the mutex (the holder leads), and
    /// the candidate's `value` (its identity or address) is stored with its entry, where
    /// [`Backend::inspect`](crate::raw::Backend::inspect) shows it and [`Backend::proclaim`](crate::raw::Backend::proclaim) changes it.
    Candidate {
        /// What the candidate proclaims; readers see it as the leader's value.
        value: Vec<u8>,
    },
}
