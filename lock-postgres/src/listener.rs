//! Push wake-ups: one connection per process that `LISTEN`s on a schema's channel (a
//! [`Hub`], shared by the clients of the same server, credentials, TLS, schema and
//! runtime, so that a notification wakes one server process per client process, not one
//! per client) and wakes the subscribers of each client ([`Listener`]).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use lock_core::raw::plumbing::Backoff;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use crate::config::PostgresConfig;
use crate::connection::pg_config;
use crate::layout::quote_ident;
use crate::tls::Connector;

/// A client's subscriptions to the changes of names, woken by its hub's connection,
/// which listens on the schema's channel (reconnecting with backoff). A notification's
/// payload is `-<seq>:<name>` when entry `seq` of `name` left the queue or changed its
/// kind (`0`: any entry), `*<seq>.<fence>:<name>` when a release granted entry `seq`
/// with token `fence` ([`crate::handover`]), `+:<name>` for any other change (a grant,
/// a proclaim). Observers of a name are woken by every change;
/// a waiter only when an entry it waits for ([`Waiter::watch`]) left or changed, or its
/// own was granted, so that a release wakes the waiter it may grant, not every waiter of
/// the name. After a reconnect (which may have missed notifications) everyone is woken.
#[derive(Debug)]
pub(crate) struct Listener {
    subscribers: Arc<Mutex<Subscribers>>,
    /// The shared connection, until [`Listener::stop`].
    hub: Mutex<Option<Arc<Hub>>>,
}

/// The clients' subscribers a hub wakes.
type Clients = Arc<Mutex<Vec<Weak<Mutex<Subscribers>>>>>;

/// One listening connection and the clients it wakes; its task ends with the last client.
#[derive(Debug)]
struct Hub {
    clients: Clients,
    task: JoinHandle<()>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
        lock(&HUBS).retain(|_, hub| hub.strong_count() > 0);
    }
}

/// The live hubs, by [`hub_key`].
static HUBS: LazyLock<Mutex<HashMap<String, Weak<Hub>>>> = LazyLock::new(Mutex::default);

/// What a client's listening connection depends on: its server, credentials, TLS and
/// bounds, the schema, and the runtime its task runs on.
fn hub_key(config: &PostgresConfig) -> String {
    format!(
        "{:?}",
        (
            tokio::runtime::Handle::current().id(),
            &config.hosts,
            &config.dbname,
            &config.username,
            &config.password,
            &config.sslmode,
            (&config.ca_file, &config.cert_file, &config.key_file),
            &config.application_name,
            (config.connect_timeout, config.options.request_timeout),
            config.read_write,
            &config.schema,
        )
    )
}

impl Listener {
    /// Starts listening for `config`, over `tls`, on the hub of a client of the same
    /// server and schema in this process if there is one.
    pub(crate) fn start(config: &PostgresConfig, tls: Connector) -> Listener {
        let subscribers: Arc<Mutex<Subscribers>> = Arc::default();
        let key = hub_key(config);
        let mut hubs = lock(&HUBS);
        let hub = match hubs.get(&key).and_then(Weak::upgrade) {
            Some(hub) => hub,
            None => {
                let clients = Clients::default();
                let task = tokio::spawn(listen(
                    pg_config(config),
                    tls,
                    config.schema.clone(),
                    Arc::clone(&clients),
                ));
                let hub = Arc::new(Hub { clients, task });
                hubs.insert(key, Arc::downgrade(&hub));
                hub
            }
        };
        drop(hubs);
        let mut clients = lock(&hub.clients);
        clients.retain(|client| client.strong_count() > 0);
        clients.push(Arc::downgrade(&subscribers));
        drop(clients);
        Listener {
            subscribers,
            hub: Mutex::new(Some(hub)),
        }
    }

    /// Stops listening, waking everyone (nothing will wake them any more).
    pub(crate) fn stop(&self) {
        if let Some(hub) = lock(&self.hub).take() {
            let own = Arc::downgrade(&self.subscribers);
            lock(&hub.clients).retain(|client| !client.ptr_eq(&own));
        }
        wake(&self.subscribers, None, true);
    }

    /// Wakes the waiter of entry `seq` of `name` in the clients of this process that
    /// share the hub, which a release of this client granted with `fence` and committed
    /// (the grant's notification, which tells the other processes, comes later and finds
    /// it woken). Observers hear of the grant from that notification.
    pub(crate) fn granted_here(&self, name: &str, seq: i64, fence: i64) {
        if let Some(hub) = lock(&self.hub).as_ref() {
            wake_clients(&hub.clients, Some(&format!("*{seq}.{fence}:{name}")), false);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wakes whom a notification with `payload` concerns in every client (`None`: everyone);
/// its observers too if `observers` (a change the server told).
fn wake_clients(clients: &Clients, payload: Option<&str>, observers: bool) {
    let clients: Vec<_> = lock(clients).iter().filter_map(Weak::upgrade).collect();
    for subscribers in clients {
        wake(&subscribers, payload, observers);
    }
}

#[derive(Debug, Default)]
struct Subscribers {
    observers: HashMap<String, watch::Sender<u64>>,
    waiters: HashMap<String, Vec<Weak<Waiting>>>,
}

/// What one waiter waits for, and how it is woken.
#[derive(Debug, Default)]
struct Waiting {
    watched: Mutex<Watched>,
    woken: Notify,
}

/// The entries a waiter watches, and those that left or were granted since it last
/// chose them (so that one leaving, or its own entry granted, between its read of the
/// queue and its choice still wakes it).
#[derive(Debug, Default)]
struct Watched {
    seqs: Vec<i64>,
    left_since: Vec<i64>,
    /// Grants on release since the last choice: entry and token.
    granted_since: Vec<(i64, i64)>,
    /// The waiter's own entry, and the token a release granted it, once seen.
    own: Option<i64>,
    grant: Option<i64>,
    /// More left than are kept: the next choice wakes the waiter at once.
    overflow: bool,
}

/// How many left entries a waiter keeps between two choices.
const LEFT_KEPT: usize = 256;

/// One waiter's subscription to the changes of a name (see [`Listener`]).
#[derive(Debug)]
pub(crate) struct Waiter {
    waiting: Arc<Waiting>,
}

impl Waiter {
    /// Wakes this waiter, whose entry is `own`, when one of `seqs` leaves or changes, or
    /// a release grants `own` (from now on).
    pub(crate) fn watch(&self, own: i64, seqs: impl IntoIterator<Item = i64>) {
        let mut watched = lock(&self.waiting.watched);
        watched.seqs.clear();
        watched.seqs.extend(seqs);
        if watched.own != Some(own) {
            watched.own = Some(own);
            watched.grant = None;
        }
        if let Some(&(_, fence)) = watched.granted_since.iter().find(|(seq, _)| *seq == own) {
            watched.grant = Some(fence);
        }
        let missed = watched.overflow
            || watched.grant.is_some()
            || watched
                .left_since
                .iter()
                .any(|seq| watched.seqs.contains(seq));
        watched.left_since.clear();
        watched.granted_since.clear();
        watched.overflow = false;
        if missed {
            self.waiting.woken.notify_one();
        }
    }

    /// The token of the grant on release seen for the waiter's own entry, if any.
    pub(crate) fn grant(&self) -> Option<i64> {
        lock(&self.waiting.watched).grant
    }

    /// Resolves at the next wake-up (at once if one came since the last).
    pub(crate) async fn woken(&self) {
        self.waiting.woken.notified().await;
    }
}

impl Listener {
    /// A counter bumped at each change of `name` from now on.
    pub(crate) fn observe(&self, name: &str) -> watch::Receiver<u64> {
        let mut subscribers = lock(&self.subscribers);
        let observers = &mut subscribers.observers;
        observers.retain(|_, sender| sender.receiver_count() > 0);
        match observers.get(name) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                observers.insert(name.to_owned(), sender);
                receiver
            }
        }
    }

    /// A waiter on `name`, watching nothing yet.
    pub(crate) fn wait_on(&self, name: &str) -> Waiter {
        let waiting = Arc::new(Waiting::default());
        let mut subscribers = lock(&self.subscribers);
        let waiters = subscribers.waiters.entry(name.to_owned()).or_default();
        waiters.retain(|w| w.strong_count() > 0);
        waiters.push(Arc::downgrade(&waiting));
        subscribers.waiters.retain(|_, w| !w.is_empty());
        Waiter { waiting }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wakes whom a notification with `payload` concerns (`None`: everyone), its observers
/// only if `observers`.
fn wake(subscribers: &Mutex<Subscribers>, payload: Option<&str>, observers: bool) {
    let subscribers = lock(subscribers);
    let bump = |sender: &watch::Sender<u64>| sender.send_modify(|n| *n = n.wrapping_add(1));
    let wake_waiter = |waiting: &Weak<Waiting>, change: Option<Change>| {
        if let Some(waiting) = waiting.upgrade() {
            let concerned = match change {
                None | Some(Change::Left(0)) => true,
                Some(Change::Left(seq)) => {
                    let mut watched = lock(&waiting.watched);
                    if watched.left_since.len() < LEFT_KEPT {
                        watched.left_since.push(seq);
                    } else {
                        watched.overflow = true;
                    }
                    watched.seqs.contains(&seq)
                }
                Some(Change::Granted(seq, fence)) => {
                    let mut watched = lock(&waiting.watched);
                    if watched.granted_since.len() < LEFT_KEPT {
                        watched.granted_since.push((seq, fence));
                    } else {
                        watched.overflow = true;
                    }
                    let own = watched.own == Some(seq);
                    if own {
                        watched.grant = Some(fence);
                    }
                    own
                }
            };
            if concerned {
                waiting.woken.notify_one();
            }
        }
    };
    let Some(payload) = payload else {
        subscribers.observers.values().for_each(bump);
        for waiting in subscribers.waiters.values().flatten() {
            wake_waiter(waiting, None);
        }
        return;
    };
    let Some((head, name)) = payload.split_once(':') else {
        return;
    };
    if observers {
        subscribers.observers.get(name).into_iter().for_each(bump);
    }
    if let Some(change) = Change::parse(head) {
        for waiting in subscribers.waiters.get(name).into_iter().flatten() {
            wake_waiter(waiting, Some(change));
        }
    }
}

/// What a notification tells waiters (see [`Listener`]).
#[derive(Debug, Clone, Copy)]
enum Change {
    /// `-<seq>`: the entry left or changed its kind.
    Left(i64),
    /// `*<seq>.<fence>`: a release granted the entry this token.
    Granted(i64, i64),
}

impl Change {
    fn parse(head: &str) -> Option<Change> {
        if let Some(seq) = head.strip_prefix('-') {
            return seq.parse().ok().map(Change::Left);
        }
        let (seq, fence) = head.strip_prefix('*')?.split_once('.')?;
        Some(Change::Granted(seq.parse().ok()?, fence.parse().ok()?))
    }
}

/// The listening loop: connect, `LISTEN`, wake everyone (changes may have been missed
/// while not listening), forward notifications until the connection ends; again after a
/// pause. Ends when the task is aborted (the client dropped).
async fn listen(config: tokio_postgres::Config, tls: Connector, channel: String, clients: Clients) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        match config.connect(tls.make()).await {
            Ok((client, mut connection)) => {
                let mut messages =
                    futures::stream::poll_fn(move |cx| connection.poll_message(cx)).fuse();
                let statement = format!("LISTEN {}", quote_ident(&channel));
                let listening = {
                    let listen = client.batch_execute(&statement);
                    let mut listen = std::pin::pin!(listen);
                    loop {
                        tokio::select! {
                            done = &mut listen => break done.is_ok(),
                            message = messages.next() => match message {
                                Some(Ok(_)) => {}
                                Some(Err(_)) | None => break false,
                            },
                        }
                    }
                };
                if listening {
                    backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
                    wake_clients(&clients, None, true);
                    while let Some(Ok(message)) = messages.next().await {
                        if let AsyncMessage::Notification(n) = message {
                            if n.channel() == channel {
                                wake_clients(&clients, Some(n.payload()), true);
                            }
                        }
                    }
                    tracing::debug!(channel, "the listening connection ended; reconnecting");
                }
                drop(client);
            }
            Err(err) => tracing::debug!(channel, error = %err, "listening connection failed"),
        }
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    /// A grant that a release in this process tells wakes the grantee waiting in another
    /// client of the process, with its token, with no notification from the server (there
    /// is none: nothing listens at the address); a grant of another entry does not.
    #[tokio::test]
    async fn a_grant_told_here_wakes_the_grantee_of_another_client() {
        let config = PostgresConfig::new(["127.0.0.1:1"]);
        let tls = crate::tls::connector(&config)
            .await
            .expect("a plain connector");
        let releasing = Listener::start(&config, tls.clone());
        let waiting = Listener::start(&config, tls);
        let waiter = waiting.wait_on("job");
        waiter.watch(7, [6]);
        releasing.granted_here("job", 8, 41);
        assert_eq!(waiter.grant(), None);
        assert!(waiter.woken().now_or_never().is_none());
        releasing.granted_here("job", 7, 42);
        assert_eq!(waiter.grant(), Some(42));
        assert!(waiter.woken().now_or_never().is_some());
    }
}
