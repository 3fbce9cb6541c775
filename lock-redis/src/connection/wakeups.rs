//! The client's wake-up subscriptions as the backend sees them, over the transport its
//! topology needs: one pub/sub connection per server, shared by every waiter of the
//! client, reconnected with backoff. Queued waiters hear their wake-ups on
//! the client's own channel (a release names the waiter it wakes); without the queue,
//! waiters listen to the channel of the name they wait for.
//!
//! On Redis Cluster the channels are sharded (`SSUBSCRIBE`; the scripts `SPUBLISH`): each
//! lives on the primary serving its hash slot, a queued waiter's on its client's channel
//! for the name (see [`KeyLayout`](crate::KeyLayout)), so a client subscribes on the
//! primaries that serve the names it waits for, one connection each. When a slot moves
//! (the server ends the subscription, or answers `MOVED`) or a primary fails (the
//! connection drops and the reloaded map names another), the channel is subscribed again
//! where the map says, and its waiters re-check.
//!
//! The part both transports share (registry, subscriber task) is in `shared.rs` (the
//! registry's data in `registry.rs`), a waiter's bell in `bells.rs`;
//! the transports in `pubsub.rs` (one server, Sentinel, RedLock) and `sharded.rs` (Redis
//! Cluster).

mod bells;
mod pubsub;
mod registry;
mod sharded;
mod shared;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Shards, Target};
use shared::{Session, Shared};

pub(crate) use bells::Grant;
pub(crate) use shared::Subscription;

/// The wake-up subscriptions of one client. One subscriber task per server listens on one
/// pub/sub connection for all waiters of the client and rings the bell of the waiter (queue)
/// or of the channel (without the queue) a message is for, and every bell after every
/// (re)subscription, as a message may have been missed meanwhile.
pub(crate) struct Wakeups {
    shared: Arc<Shared>,
}

impl fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeups")
            .field("channels", &self.shared.channel_count())
            .finish_non_exhaustive()
    }
}

impl Wakeups {
    /// Wake-ups from `nodes` (on Redis Cluster: from the primaries of `shards`, over
    /// sharded channels); `client_channel` is the client's own channel.
    pub(crate) fn new(
        backend: &'static str,
        nodes: Vec<(String, Target)>,
        shards: Option<Arc<Shards>>,
        request_timeout: Duration,
        client_channel: String,
    ) -> Self {
        let session: Session = if shards.is_some() {
            |task| Box::pin(sharded::session(task))
        } else {
            |task| Box::pin(pubsub::session(task))
        };
        Wakeups {
            shared: Shared::new(
                backend,
                nodes,
                shards,
                request_timeout,
                client_channel,
                session,
            ),
        }
    }

    /// The client channel's subscription count: taken before a queued attempt and handed
    /// to [`Wakeups::enlist`] after it.
    pub(crate) fn epoch(&self) -> u64 {
        self.shared.epoch()
    }

    /// The bell of queued waiter `token`, subscribing the client's channel on server `node`
    /// first if needed. It rings with the messages for `token` that came before it, and
    /// once more when the subscription was (re)made since `epoch` (a message may have been
    /// lost meanwhile) or is not live yet (then when it is). Must be called inside a tokio
    /// runtime (it starts the subscriber task on first use).
    ///
    /// On Redis Cluster `channel` is the client's channel for the name: it is joined (and
    /// subscribed on the name's shard if needed) for as long as the waiter stays, and the
    /// bell rings once it is live.
    pub(crate) fn enlist(
        &self,
        token: &str,
        node: usize,
        epoch: u64,
        channel: Option<&str>,
    ) -> Subscription {
        self.shared.enlist(token, node, epoch, channel)
    }

    /// Joins the channel of a name (without the queue) until the returned subscription is
    /// dropped; it rings once the subscription is live. Must be called inside a tokio
    /// runtime (it starts the subscriber tasks on first use).
    pub(crate) fn join(&self, channel: &str) -> Subscription {
        self.shared.join(channel)
    }

    /// Channels this client listens to right now (for tests and diagnostics): its own
    /// once a waiter queued, and the names' channels that have a waiter without the queue.
    pub(crate) fn active_channels(&self) -> usize {
        self.shared.active_channels()
    }

    /// Queued waiters with a bell right now (for tests and diagnostics).
    pub(crate) fn queued_waiters(&self) -> usize {
        self.shared.queued_waiters()
    }
}
