//! A waiter's subscription: what it listens to and its bell, leaving the registry when
//! dropped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::bells::Bell;
use super::shared::Shared;

/// What a subscription listens to.
#[derive(Debug)]
pub(super) enum Membership {
    /// The channel of a name.
    Channel(String),
    /// The client's channel, for the queued waiter with this owner token (on Redis
    /// Cluster its channel for the name, joined as long as the waiter stays).
    Inbox(String, Option<String>),
}

/// A waiter's bell; leaving happens on drop.
pub(crate) struct Subscription {
    pub(super) shared: Arc<Shared>,
    pub(super) membership: Membership,
    pub(super) bell: Bell,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Forgets the rings so far: the next wait is for a later one.
    pub(crate) fn mark(&mut self) {
        self.bell.mark();
    }

    /// See [`Bell::wait`].
    pub(crate) async fn wait(&mut self, nap: Duration, window: Duration) {
        self.bell.wait(nap, window).await;
    }

    /// Waits for the next ring: a message on the channel, its subscription made live
    /// (first, or again after a reconnect: a message may have been missed meanwhile).
    pub(crate) async fn rung(&mut self) {
        self.bell.rung().await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.leave(&self.membership);
    }
}
