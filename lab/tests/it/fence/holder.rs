//! The holder in another process and the scenario around it: this test binary started
//! again as a child, told by its environment which lock to take and which store to
//! write through; it reports its fencing token, waits to be told to write (it may be
//! frozen meanwhile), writes blind with that token, and reports what the store said.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use lock_core::fence::{FenceOutcome, FencedStore, FileFence};
use lock_core::{DistributedLockExt, FencingToken, LockOptions};
use lock_etcd::EtcdFence;
use lock_postgres::PostgresFence;
use lock_redis::RedisFence;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{timeout, Instant};

/// The lease of every hold in these tests.
pub(super) const TTL: Duration = Duration::from_secs(2);
/// What the paused holder writes late, and what the holder after it writes.
pub(super) const LATE: &[u8] = b"late write of the paused holder";
pub(super) const FRESH: &[u8] = b"write of the holder that took over";

const ENV_STORE: &str = "FENCE_HOLDER_STORE";
const ENV_URL: &str = "FENCE_HOLDER_LOCK_URL";
const ENV_NAME: &str = "FENCE_HOLDER_NAME";

/// Where a fenced store is, as the holder process is told (one line, tab-separated).
#[derive(Debug, Clone)]
pub(super) enum StoreSpec {
    Redis {
        url: String,
        key: String,
    },
    Etcd {
        url: String,
        key: String,
    },
    Postgres {
        url: String,
        table: String,
        row: String,
    },
    File {
        path: PathBuf,
    },
}

impl StoreSpec {
    fn encode(&self) -> String {
        match self {
            StoreSpec::Redis { url, key } => format!("redis\t{url}\t{key}"),
            StoreSpec::Etcd { url, key } => format!("etcd\t{url}\t{key}"),
            StoreSpec::Postgres { url, table, row } => format!("postgres\t{url}\t{table}\t{row}"),
            StoreSpec::File { path } => format!("file\t{}", path.display()),
        }
    }

    fn decode(text: &str) -> Self {
        let parts: Vec<&str> = text.split('\t').collect();
        let owned = |i: usize| parts[i].to_owned();
        match parts[0] {
            "redis" => StoreSpec::Redis {
                url: owned(1),
                key: owned(2),
            },
            "etcd" => StoreSpec::Etcd {
                url: owned(1),
                key: owned(2),
            },
            "postgres" => StoreSpec::Postgres {
                url: owned(1),
                table: owned(2),
                row: owned(3),
            },
            "file" => StoreSpec::File {
                path: PathBuf::from(parts[1]),
            },
            other => panic!("no store kind {other:?}"),
        }
    }

    /// The store (its table created, on PostgreSQL).
    pub(super) async fn open(&self) -> Arc<dyn FencedStore> {
        match self {
            StoreSpec::Redis { url, key } => {
                Arc::new(RedisFence::connect(url, key).await.expect("redis store"))
            }
            StoreSpec::Etcd { url, key } => {
                Arc::new(EtcdFence::connect(url, key).await.expect("etcd store"))
            }
            StoreSpec::Postgres { url, table, row } => {
                let store = PostgresFence::connect(url, table, row)
                    .await
                    .expect("store");
                store.create_table().await.expect("fenced table");
                Arc::new(store)
            }
            StoreSpec::File { path } => Arc::new(FileFence::new(path).expect("file store")),
        }
    }
}

/// The options of every client here: a short lease, renewed (a frozen process renews
/// nothing).
fn options() -> lock_core::LockOptionsBuilder {
    LockOptions::builder().ttl(TTL)
}

/// In the holder process (this binary started by [`Holder::start`]): holds the lock,
/// writes late, and returns `true`; elsewhere returns `false` at once.
pub(super) async fn act_as_holder_if_asked() -> bool {
    let Ok(spec) = std::env::var(ENV_STORE) else {
        return false;
    };
    let url = std::env::var(ENV_URL).expect("lock URL");
    let name = std::env::var(ENV_NAME).expect("lock name");
    super::register_backends();
    let store = StoreSpec::decode(&spec).open().await;
    let locks = lock_core::connect_with(&url, &options())
        .await
        .expect("client");
    let guard = locks.lock(&name).await.expect("lock");
    let token = guard.fencing_token();
    println!("\nHELD {token}");
    let mut go = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut go)
        .await
        .expect("the go to write");
    // Blind, as a process that does not know it was paused: no look at the guard.
    let said = match store.write(token, LATE).await.expect("late write") {
        FenceOutcome::Written => "written".to_owned(),
        FenceOutcome::Stale { newest } => format!("stale {newest}"),
    };
    println!("\nWROTE {said}");
    drop(guard);
    let _ = timeout(Duration::from_secs(2), locks.close()).await;
    true
}

/// The holder process, seen from the test.
pub(super) struct Holder {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// The fencing token of its hold.
    pub(super) token: FencingToken,
}

impl Holder {
    /// Starts this binary's test `test` (its path without the crate) as a holder of
    /// `name` on `url`, writing to `store`; returns once it holds the lock.
    pub(super) async fn start(test: &str, url: &str, name: &str, store: &StoreSpec) -> Holder {
        let exe = std::env::current_exe().expect("this test binary");
        let mut child = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV_STORE, store.encode())
            .env(ENV_URL, url)
            .env(ENV_NAME, name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the holder process starts");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let held = said(&mut lines, "HELD ").await;
        Holder {
            child,
            stdin,
            lines,
            token: FencingToken(held.parse().expect("a token")),
        }
    }

    fn signal(&self, signal: Signal) {
        let pid = self.child.id().expect("the holder runs");
        kill(Pid::from_raw(i32::try_from(pid).expect("pid")), signal).expect("signal");
    }

    /// SIGSTOP: the process stops, its lease runs out.
    pub(super) fn freeze(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// SIGCONT, then the go to write: what the store told the late writer.
    pub(super) async fn thaw_and_write(mut self) -> FenceOutcome {
        self.signal(Signal::SIGCONT);
        self.stdin.write_all(b"write\n").await.expect("the go");
        let wrote = said(&mut self.lines, "WROTE ").await;
        let status = timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the holder ends")
            .expect("its status");
        assert!(status.success(), "the holder process failed: {status}");
        match wrote.split_once(' ') {
            Some(("stale", newest)) => FenceOutcome::Stale {
                newest: FencingToken(newest.parse().expect("a token")),
            },
            _ if wrote == "written" => FenceOutcome::Written,
            _ => panic!("the holder said {wrote:?}"),
        }
    }
}

/// What follows `marker` on the holder's next line that has it.
async fn said(lines: &mut Lines<BufReader<ChildStdout>>, marker: &str) -> String {
    let found = timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("holder output") {
            if let Some((_, rest)) = line.split_once(marker) {
                return rest.trim().to_owned();
            }
        }
        panic!("the holder ended without saying {marker:?}")
    });
    found.await.expect("the holder answers")
}

/// What [`paused_holder_is_refused`] saw.
pub(super) struct Refused {
    /// The store, holding the second holder's write.
    pub(super) store: Arc<dyn FencedStore>,
    /// The second holder's token.
    pub(super) newest: FencingToken,
    /// The lock's name.
    pub(super) name: String,
}

/// A holder process on `holder_url` is frozen past its lease; a client on `taker_url`
/// takes the lock and writes through `store`; the holder is thawed and writes with its
/// old token: the store refuses it, and holds the second write alone.
pub(super) async fn paused_holder_is_refused(
    test: &str,
    holder_url: &str,
    taker_url: &str,
    store: StoreSpec,
) -> Refused {
    super::register_backends();
    let name = format!("fenced/{}", uuid::Uuid::new_v4().simple());
    let fenced = store.open().await;
    let holder = Holder::start(test, holder_url, &name, &store).await;
    holder.freeze();
    let frozen_at = Instant::now();

    let taker = lock_core::connect_with(taker_url, &options())
        .await
        .expect("client");
    let guard = taker
        .lock_timeout(&name, TTL * 4 + Duration::from_secs(5))
        .await
        .expect("another client takes over from the frozen holder");
    let takeover = frozen_at.elapsed();
    let newest = guard.fencing_token();
    assert!(newest > holder.token, "{newest} after {}", holder.token);
    assert!(
        takeover >= TTL / 2,
        "taken over while the lease ran: {takeover:?}"
    );
    let written = fenced.write(newest, FRESH).await.expect("write");
    assert_eq!(written, FenceOutcome::Written);
    guard.release().await.expect("release");
    taker.close().await.expect("close");

    let old = holder.token;
    let late = holder.thaw_and_write().await;
    assert_eq!(
        late,
        FenceOutcome::Stale { newest },
        "the store refuses token {old}"
    );
    let stored = fenced.read().await.expect("read").expect("a write");
    assert_eq!(
        (stored.token, stored.value.as_slice()),
        (newest, FRESH),
        "the store's content"
    );
    eprintln!("{test}: token {old} frozen, token {newest} took over after {takeover:?}; late write refused by the store");
    Refused {
        store: fenced,
        newest,
        name,
    }
}

/// The libtest name of test `function` in `module` (a `module_path!()`).
pub(super) fn test_name(module: &str, function: &str) -> String {
    let path = module.split_once("::").map_or("", |(_, rest)| rest);
    format!("{path}::{function}")
}
