//! The registry of the client's wake-ups: the channels with their waiters' bells, the
//! client's own channel with its queued waiters' bells, and the command queues of the
//! subscriber tasks; and how a message rings the bells it is for.

use std::collections::{HashMap, VecDeque};

use tokio::sync::{mpsc, watch};

use super::bells::{ring, Ring, Rings};

/// A change to the set of channels a subscriber task listens to.
#[derive(Debug)]
pub(super) enum SubCommand {
    Subscribe(String),
    Unsubscribe(String),
}

pub(super) struct Channel {
    pub(super) waiters: usize,
    pub(super) bell: watch::Sender<Rings>,
    /// A client's channel for a name (Redis Cluster, queue): its messages name the waiter.
    pub(super) inbox: bool,
    /// Since when a client's channel for a name has had no waiter (it stays subscribed for
    /// [`super::shared::LINGER`]).
    pub(super) idle_since: Option<tokio::time::Instant>,
}

/// The client's own channel and the bells of its queued waiters.
pub(super) struct Inbox {
    pub(super) channel: String,
    /// The server on which its subscription was asked for (it then stays for the client's
    /// life): the one whose queue orders the waiters.
    pub(super) requested: Option<usize>,
    /// Per server: the subscription is confirmed on the current connection.
    pub(super) live: Vec<bool>,
    /// Bells by owner token.
    pub(super) bells: HashMap<String, watch::Sender<Rings>>,
    /// The latest messages for waiters without a bell yet (a release can wake a waiter
    /// between its queued attempt and its bell), at most [`UNCLAIMED`].
    pub(super) unclaimed: VecDeque<(String, Ring)>,
}

/// How many messages for waiters without a bell are kept.
pub(super) const UNCLAIMED: usize = 256;

pub(super) struct Registry {
    pub(super) channels: HashMap<String, Channel>,
    pub(super) inbox: Inbox,
    /// The command queue of each server's subscriber task, started on first use (Redis
    /// Cluster: of each node seen, as [`Shards`](crate::connection::Shards) numbers them).
    pub(super) tasks: Vec<Option<mpsc::UnboundedSender<SubCommand>>>,
    /// Redis Cluster: the node each channel is subscribed on.
    pub(super) placed: HashMap<String, usize>,
    /// Redis Cluster: the channels whose subscription was refused, by refusals in a row.
    pub(super) refusals: HashMap<String, u32>,
}

impl Registry {
    /// Sends `command` to every started subscriber task.
    pub(super) fn send(&self, command: impl Fn() -> SubCommand) {
        for sender in self.tasks.iter().flatten() {
            // Fails only when the task ended, i.e. the client is going away.
            let _ = sender.send(command());
        }
    }
}

/// Rings `bell` with the messages kept for `token` before it had a bell.
pub(super) fn claim(inbox: &mut Inbox, token: &str, bell: &watch::Sender<Rings>) {
    inbox.unclaimed.retain(|(for_token, what)| {
        let mine = for_token == token;
        if mine {
            ring(bell, *what);
        }
        !mine
    });
}

/// Rings the bell of `channel`, and for a client's channel for a name every bell of the
/// client's queued waiters (which of them it serves is not known here: all look).
pub(super) fn ring_channel(registry: &Registry, channel: &str) {
    if let Some(entry) = registry.channels.get(channel) {
        ring(&entry.bell, Ring::Wake);
        if entry.inbox {
            for bell in registry.inbox.bells.values() {
                ring(bell, Ring::Wake);
            }
        }
    }
}
