//! The wake-up transport of one server, Sentinel and RedLock: a RESP2 pub/sub connection
//! per server (`SUBSCRIBE`; the scripts `PUBLISH`).

use std::time::Duration;

use futures::StreamExt;
use redis::aio::PubSubSink;
use tokio::time::{timeout, Instant};

use super::registry::SubCommand;
use super::shared::{now_live, Broken, Task};

/// Keeps one pub/sub connection to server `index` subscribed to the registry's channels.
pub(super) async fn session(Task(shared, index, commands, backoff): Task<'_>) -> Broken {
    let (backend, label, target, limit) = match shared.upgrade() {
        Some(s) => (
            s.backend,
            s.nodes[index].0.clone(),
            s.nodes[index].1.clone(),
            s.request_timeout,
        ),
        None => return Broken::Stop,
    };
    // Behind Sentinels, each (re)connection goes to the primary they name then.
    let connect = async {
        let client = target.client(Instant::now() + limit).await.ok()?;
        Some(client.get_async_pubsub().await)
    };
    let pubsub = match timeout(limit, connect).await {
        Ok(Some(Ok(pubsub))) => pubsub,
        Ok(None) => return Broken::Reconnect,
        Ok(Some(Err(err))) => {
            tracing::debug!(backend, node = %label, error = %err, "wake-up subscription: connect failed");
            return Broken::Reconnect;
        }
        Err(_) => return Broken::Reconnect,
    };
    let (mut sink, mut stream) = pubsub.split();
    let channels = match shared.upgrade() {
        Some(s) => s.channel_names(index),
        None => return Broken::Stop,
    };
    if !channels.is_empty() && !call(limit, sink.subscribe(&channels)).await {
        return Broken::Reconnect;
    }
    let Some(mut ping) = now_live(shared, index, backoff).await else {
        return Broken::Stop;
    };
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None => return Broken::Stop,
                Some(SubCommand::Subscribe(channel)) => {
                    if !call(limit, sink.subscribe(&channel)).await {
                        return Broken::Reconnect;
                    }
                    match shared.upgrade() {
                        Some(s) => s.subscribed(index, &channel),
                        None => return Broken::Stop,
                    }
                }
                Some(SubCommand::Unsubscribe(channel)) => {
                    if !call(limit, sink.unsubscribe(&channel)).await {
                        return Broken::Reconnect;
                    }
                }
            },
            message = stream.next() => match (message, shared.upgrade()) {
                (Some(message), Some(s)) => {
                    s.deliver(message.get_channel_name(), message.get_payload_bytes());
                }
                (None, _) => return Broken::Reconnect,
                (_, None) => return Broken::Stop,
            },
            _ = ping.tick() => {
                if !ping_ok(limit, &mut sink).await {
                    return Broken::Reconnect;
                }
            }
        }
    }
}

async fn call(
    limit: Duration,
    request: impl std::future::Future<Output = redis::RedisResult<()>>,
) -> bool {
    matches!(timeout(limit, request).await, Ok(Ok(())))
}

async fn ping_ok(limit: Duration, sink: &mut PubSubSink) -> bool {
    matches!(timeout(limit, sink.ping::<String>()).await, Ok(Ok(_)))
}
