//! The wake-up transport of Redis Cluster: sharded channels (`SSUBSCRIBE`; the scripts
//! `SPUBLISH`) on a RESP3 connection per node, each channel on the primary serving its
//! hash slot and placed again when the slot moves.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

use super::registry::SubCommand;
use super::shared::{now_live, Broken, Shared, Task};
use crate::connection::cluster::{redirect, slot_of};
use crate::connection::Shards;

/// Keeps one RESP3 connection to cluster node `index` subscribed (`SSUBSCRIBE`) to the
/// channels placed on it; a channel the node no longer serves (`MOVED`, or the server
/// ends its subscription when its slot moves) is placed again where the map says.
pub(super) async fn session(Task(shared, index, commands, backoff): Task<'_>) -> Broken {
    let Some(s) = shared.upgrade() else {
        return Broken::Stop;
    };
    let (backend, limit) = (s.backend, s.request_timeout);
    let Some(shards) = s.shards.clone() else {
        return Broken::Stop;
    };
    drop(s);
    // A node with no channel placed on it (any more: its slots moved, it failed over) is
    // not connected to until one is. (The client is not kept alive meanwhile.)
    loop {
        match shared.upgrade() {
            None => return Broken::Stop,
            Some(s) if !s.channel_names(index).is_empty() => break,
            Some(_) => {}
        }
        if commands.recv().await.is_none() {
            return Broken::Stop;
        }
    }
    let (label, client) = match shards.pubsub_client(index) {
        Ok(found) => found,
        Err(err) => {
            tracing::debug!(backend, error = %err, "wake-up subscription: no client");
            return Broken::Reconnect;
        }
    };
    let (pushes, mut received) = mpsc::unbounded_channel::<PushInfo>();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_push_sender(pushes);
    let mut conn = match timeout(
        limit,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(err)) => {
            tracing::debug!(backend, node = %label, error = %err,
                "wake-up subscription: connect failed");
            return Broken::Reconnect;
        }
        Err(_) => return Broken::Reconnect,
    };
    let channels = match shared.upgrade() {
        Some(s) => s.channel_names(index),
        None => return Broken::Stop,
    };
    for channel in &channels {
        if !ssubscribe(shared, &shards, index, limit, &mut conn, channel).await {
            return Broken::Reconnect;
        }
    }
    let Some(mut ping) = now_live(shared, index, backoff).await else {
        return Broken::Stop;
    };
    // Channels this client asked to leave: their `sunsubscribe` is no displacement.
    let mut leaving: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return Broken::Stop,
                Some(SubCommand::Subscribe(channel)) => {
                    if !ssubscribe(shared, &shards, index, limit, &mut conn, &channel).await {
                        return Broken::Reconnect;
                    }
                }
                Some(SubCommand::Unsubscribe(channel)) => {
                    let mut cmd = redis::cmd("SUNSUBSCRIBE");
                    cmd.arg(&channel);
                    leaving.push(channel);
                    if !matches!(timeout(limit, cmd.query_async::<Value>(&mut conn)).await, Ok(Ok(_))) {
                        return Broken::Reconnect;
                    }
                }
            },
            push = received.recv() => {
                let Some(push) = push else {
                    return Broken::Reconnect;
                };
                let Some(s) = shared.upgrade() else {
                    return Broken::Stop;
                };
                let text = |i: usize| match push.data.get(i) {
                    Some(Value::BulkString(bytes)) => Some(bytes.clone()),
                    Some(Value::SimpleString(text)) => Some(text.clone().into_bytes()),
                    _ => None,
                };
                match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        if let (Some(channel), Some(payload)) = (text(0), text(1)) {
                            s.deliver(&String::from_utf8_lossy(&channel), &payload);
                        }
                    }
                    PushKind::SUnsubscribe => {
                        let Some(channel) = text(0) else { continue };
                        let channel = String::from_utf8_lossy(&channel).into_owned();
                        if let Some(i) = leaving.iter().position(|c| *c == channel) {
                            leaving.swap_remove(i);
                            continue;
                        }
                        // The server ended it: the slot moved. Reload and go where it is,
                        // aside, so that the other channels' messages keep coming.
                        let shards = Arc::clone(&shards);
                        tokio::spawn(async move {
                            let deadline = Instant::now() + limit;
                            let _ = shards.reload(shards.version(), deadline).await;
                            s.replace(index, &channel);
                        });
                    }
                    PushKind::Disconnection => return Broken::Reconnect,
                    _ => {}
                }
            }
            _ = ping.tick() => {
                let pong = timeout(limit, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return Broken::Reconnect;
                }
            }
        }
    }
}

/// `SSUBSCRIBE channel` on node `index`'s connection: `false` when the connection failed.
/// A `MOVED` reply updates the map and places the channel where it now says; once
/// subscribed, its waiters re-check; any other refusal is tried again after a pause
/// ([`Shared::refused`]).
async fn ssubscribe(
    shared: &Weak<Shared>,
    shards: &Shards,
    index: usize,
    limit: Duration,
    conn: &mut MultiplexedConnection,
    channel: &str,
) -> bool {
    let mut cmd = redis::cmd("SSUBSCRIBE");
    cmd.arg(channel);
    let reply = timeout(limit, cmd.query_async::<Value>(conn)).await;
    let Some(s) = shared.upgrade() else {
        return true;
    };
    match reply {
        Ok(Ok(_)) => {
            s.subscribed(index, channel);
            true
        }
        Ok(Err(err))
            if redirect(&err)
                .is_some_and(|addr| shards.moved(slot_of(channel.as_bytes()), &addr).is_ok()) =>
        {
            s.replace(index, channel);
            true
        }
        Ok(Err(err)) => {
            tracing::debug!(backend = s.backend, error = %err, channel,
                "wake-up subscription refused; tried again after a pause");
            s.refused(index, channel);
            !err.is_io_error() && !err.is_connection_dropped()
        }
        Err(_) => false,
    }
}
