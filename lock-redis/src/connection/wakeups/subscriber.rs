//! The subscriber task: one per server (Redis Cluster: node), running a transport's
//! session over one pub/sub connection and reconnecting with backoff; the commands it
//! follows and what a session works with.

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::time::Duration;

use lock_core::raw::Backoff;
use tokio::sync::mpsc;
use tokio::time::sleep;

use super::shared::Shared;
use crate::connection::reconnect_backoff;

/// How often an idle subscription connection is checked with `PING`.
const SUBSCRIBER_PING: Duration = Duration::from_secs(5);

/// A change to the set of channels a subscriber task listens to.
#[derive(Debug)]
pub(super) enum SubCommand {
    Subscribe(String),
    Unsubscribe(String),
}

/// What a transport's session works with: the registry (weakly: the client may go
/// meanwhile), the index of its server (Redis Cluster: node), the commands for its
/// subscriber task and the reconnection backoff.
pub(super) struct Task<'a>(
    pub(super) &'a Weak<Shared>,
    pub(super) usize,
    pub(super) &'a mut mpsc::UnboundedReceiver<SubCommand>,
    pub(super) &'a mut Backoff,
);

/// One connection's life in a transport: connects, subscribes what the registry lists for
/// the task's server, delivers messages and follows the task's commands until the
/// connection fails or the client is gone.
pub(super) type Session = for<'a> fn(Task<'a>) -> Pin<Box<dyn Future<Output = Broken> + Send + 'a>>;

/// Why a subscriber connection was given up.
pub(super) enum Broken {
    /// The client is gone: stop.
    Stop,
    /// The connection failed: reconnect.
    Reconnect,
}

/// Keeps one pub/sub connection to server `index` subscribed to the registry's channels.
pub(super) async fn run_subscriber(
    shared: Weak<Shared>,
    index: usize,
    mut commands: mpsc::UnboundedReceiver<SubCommand>,
) {
    let mut backoff = reconnect_backoff();
    let Some((session, sharded)) = shared.upgrade().map(|s| (s.session, s.shards.is_some())) else {
        return;
    };
    loop {
        let outcome = session(Task(&shared, index, &mut commands, &mut backoff)).await;
        match shared.upgrade() {
            Some(s) => {
                s.disconnected(index);
                if sharded {
                    s.replace_all(index).await;
                }
            }
            None => return,
        }
        match outcome {
            Broken::Stop => return,
            Broken::Reconnect => {
                let pause = sleep(backoff.next_pause());
                tokio::pin!(pause);
                // Keep draining commands while waiting: the registry is re-read on connect.
                loop {
                    tokio::select! {
                        () = &mut pause => break,
                        command = commands.recv() => if command.is_none() { return },
                    }
                }
            }
        }
    }
}

/// Server `index`'s connection subscribes every channel again: resets the backoff, has
/// every waiter re-check, and returns the keep-alive ticker (`None` when the client is
/// gone).
pub(super) async fn now_live(
    shared: &Weak<Shared>,
    index: usize,
    backoff: &mut Backoff,
) -> Option<tokio::time::Interval> {
    backoff.reset();
    shared.upgrade()?.resubscribed(index);
    let mut ping = tokio::time::interval(SUBSCRIBER_PING);
    ping.tick().await;
    Some(ping)
}
