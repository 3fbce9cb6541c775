//! The `metrics` example as a process against each backend (memory, Redis, ZooKeeper,
//! etcd; servers from the conformance harness), its Prometheus endpoint scraped over plain
//! TCP during a lock's life: attempts and grants go up, the held gauge is 1 while held and 0
//! after, renewals and renewal latency keep counting while held, a try from another client
//! is not acquired, an invalid TTL is an error by kind, a waiting acquire counts as a
//! waiter while it waits and then times out (or is granted, its wait timed), a hold removed
//! behind the process's back with a raw client is one loss `vanished` (not on memory, whose
//! space lives in the example's process), and a hold broken through the library's
//! `force_release` one loss `broken`; after each nothing is held.
//!
//! Without a server binary the test prints a loud notice and passes, unless
//! `LOCK_TEST_STRICT=1`, where it fails.

use std::future::Future;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use distlock::LockName;
use harness::{or_skip, EtcdServer, RedisServer, ZkServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

/// Bound on every wait of the test: a line from the example, a scrape, a metric's move.
const WAIT: Duration = Duration::from_secs(20);
/// The lock's TTL: renewals every 2/3 s, and within the minimum of every backend.
const QUERY: &str = "ttl=2s";
/// The lock name.
const NAME: &str = "reports/nightly";

/// One sample of the exposition: a metric name, its labels, its value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// One scrape of the endpoint.
#[derive(Debug)]
struct Scrape(Vec<Sample>);

impl Scrape {
    /// Parses the Prometheus text format (comments and blank lines skipped).
    fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let value: f64 = value.parse().ok()?;
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, rest.strip_suffix('}')?),
                    None => (series, ""),
                };
                let labels = labels
                    .split(',')
                    .filter(|pair| !pair.is_empty())
                    .filter_map(|pair| {
                        let (key, value) = pair.split_once('=')?;
                        Some((key.to_owned(), value.trim_matches('"').to_owned()))
                    })
                    .collect();
                Some(Sample {
                    name: name.to_owned(),
                    labels,
                    value,
                })
            })
            .collect();
        Scrape(samples)
    }

    fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| s.name == name)
    }

    /// The sum of `name` over the series whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
            })
            .map(|s| s.value)
            .sum()
    }
}

/// The example process, its output lines and its metrics endpoint.
struct Example {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
    endpoint: SocketAddr,
    backend: &'static str,
}

impl Example {
    /// Starts the example on `url` and waits for its endpoint.
    async fn start(url: &str, backend: &'static str) -> Example {
        let mut child = Command::new(env!("CARGO_BIN_EXE_metrics"))
            .args(["--port", "0", "--name", NAME, "--commands"])
            .env("LOCK_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the example starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tell, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut stdout = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = stdout.next_line().await {
                eprintln!("example: {line}");
                if tell.send(line).is_err() {
                    return;
                }
            }
        });
        let mut example = Example {
            child,
            stdin,
            lines,
            endpoint: SocketAddr::from(([127, 0, 0, 1], 0)),
            backend,
        };
        let announced = example.expect("metrics at http://").await;
        let addr = announced
            .trim_start_matches("metrics at http://")
            .trim_end_matches("/metrics");
        example.endpoint = addr.parse().expect("endpoint address");
        example
    }

    /// Sends one command.
    async fn send(&mut self, command: &str) {
        let line = format!("{command}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("the example reads commands");
    }

    /// Sends `command` and waits for its answer, the next line that starts with `answer`.
    async fn run(&mut self, command: &str, answer: &str) -> String {
        self.send(command).await;
        self.expect(answer).await
    }

    /// The next line that starts with `start` (as [`Example::expect_each`]).
    async fn expect(&mut self, start: &str) -> String {
        let mut lines = self.expect_each(&[start]).await;
        lines.pop().expect("one line")
    }

    /// The next lines that start with each of `starts`, in any order; fails on an error
    /// line, the end of the output, or after [`WAIT`].
    async fn expect_each(&mut self, starts: &[&str]) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let mut missing = starts.to_vec();
        let mut found = Vec::new();
        while !missing.is_empty() {
            let line = timeout(deadline - Instant::now(), self.lines.recv()).await;
            match line {
                Ok(Some(line)) if line.starts_with("error") => panic!("{line}"),
                Ok(Some(line)) => {
                    if let Some(at) = missing.iter().position(|start| line.starts_with(start)) {
                        missing.remove(at);
                        found.push(line);
                    }
                }
                Ok(None) => panic!("the example ended before printing {missing:?}"),
                Err(_) => panic!("no line {missing:?} within {WAIT:?}"),
            }
        }
        found
    }

    /// One scrape over plain TCP (HTTP/1.0, so the body comes whole, then the close).
    async fn scrape(&self) -> Scrape {
        let text = within("scrape", async {
            let mut stream = TcpStream::connect(self.endpoint).await?;
            stream
                .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut response = String::new();
            stream.read_to_string(&mut response).await?;
            Ok::<_, std::io::Error>(response)
        })
        .await;
        let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1."), "{head}");
        assert!(head.contains(" 200 "), "{head}");
        Scrape::parse(body)
    }

    /// Scrapes until `done` holds for the scrape (every 100 ms, at most [`WAIT`]).
    async fn until(&self, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
        let deadline = Instant::now() + WAIT;
        loop {
            let scrape = self.scrape().await;
            if done(&scrape) {
                return scrape;
            }
            assert!(
                Instant::now() < deadline,
                "{what} not seen within {WAIT:?}: {scrape:?}"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of `name` for this backend (summed over its other labels).
    fn of(&self, scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut labels = labels.to_vec();
        labels.push(("backend", self.backend));
        scrape.sum(name, &labels)
    }

    /// How many observations histogram `name` has for this backend.
    fn observed(&self, scrape: &Scrape, name: &str) -> f64 {
        self.of(scrape, &format!("{name}_count"), &[])
    }

    /// Waits for the loss of the held lock, which must be for `reason`, the `losses`-th
    /// loss and the end of the `holds`-th hold; then releases the lost guard.
    async fn lose(&mut self, reason: &str, losses: f64, holds: f64) {
        use distlock::metrics::{HELD, HOLD_DURATION, LOSSES};
        let line = self.expect("lost").await;
        let seen = line
            .split(": ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next());
        assert_eq!(seen, Some(reason), "{line}");
        let lost = self
            .until("the loss", |s| self.of(s, LOSSES, &[]) >= losses)
            .await;
        assert_eq!(self.of(&lost, LOSSES, &[]), losses, "{lost:?}");
        assert_eq!(self.of(&lost, LOSSES, &[("reason", reason)]), 1.0);
        assert_eq!(self.of(&lost, HELD, &[]), 0.0);
        assert_eq!(self.observed(&lost, HOLD_DURATION), holds);
        self.run("release", "released").await;
    }

    /// Asks the example to quit and waits for its exit.
    async fn quit(mut self) {
        self.send("quit").await;
        let status = within("the example quits", self.child.wait()).await;
        assert!(status.success(), "{status}");
    }
}

/// The life of one lock in the example, on `url`, with `steal` removing the hold behind
/// the example's back through a raw client of the server (`None` on memory).
async fn lock_life<F>(url: String, backend: &'static str, steal: Option<F>)
where
    F: Future<Output = ()>,
{
    use distlock::metrics::{
        ACQUIRE_ATTEMPTS, ACQUIRE_ERRORS, ACQUIRE_GRANTS, ACQUIRE_NOT_ACQUIRED, ACQUIRE_TIMEOUTS,
        ACQUIRE_WAIT, HELD, HOLD_DURATION, LOSSES, RENEWALS, RENEWAL_LAG, RENEWAL_LATENCY, WAITERS,
    };
    let mut example = Example::start(&url, backend).await;
    let before = example.scrape().await;
    assert_eq!(example.of(&before, HELD, &[]), 0.0, "{before:?}");
    assert_eq!(example.of(&before, ACQUIRE_GRANTS, &[]), 0.0);

    example.run("lock", "acquired").await;
    let held = example.scrape().await;
    assert_eq!(example.of(&held, ACQUIRE_ATTEMPTS, &[]), 1.0, "{held:?}");
    assert_eq!(example.of(&held, ACQUIRE_GRANTS, &[]), 1.0);
    assert_eq!(example.of(&held, HELD, &[]), 1.0);
    assert_eq!(example.of(&held, WAITERS, &[]), 0.0);
    example.run("try", "not acquired").await;

    // Renewed on plan while held: two more renewals of this hold, each timed.
    let renewed = [("outcome", "renewed")];
    let renewals = example.of(&held, RENEWALS, &renewed);
    let calls = example.observed(&held, RENEWAL_LATENCY);
    let renewing = example
        .until("two renewals", |s| {
            example.of(s, RENEWALS, &renewed) >= renewals + 2.0
                && example.observed(s, RENEWAL_LATENCY) >= calls + 2.0
        })
        .await;
    assert_eq!(example.of(&renewing, HELD, &[]), 1.0);
    assert!(example.of(&renewing, ACQUIRE_NOT_ACQUIRED, &[]) >= 1.0);
    assert!(example.observed(&renewing, RENEWAL_LAG) >= 2.0);
    assert_eq!(example.of(&renewing, LOSSES, &[]), 0.0);

    // An invalid TTL is an acquire error of its kind, and nothing else.
    let invalid = [("kind", "invalid_config")];
    example.run("try 0s", "refused (invalid_config)").await;
    let refused = example.scrape().await;
    assert_eq!(example.of(&refused, ACQUIRE_ERRORS, &invalid), 1.0);
    assert_eq!(
        example.of(&refused, ACQUIRE_ERRORS, &[]),
        1.0,
        "{refused:?}"
    );

    // A wait on the held lock: a waiter while it waits, then a timeout, and no waiter.
    example.run("wait 3s", "waiting").await;
    example
        .until("the waiter", |s| example.of(s, WAITERS, &[]) == 1.0)
        .await;
    example.expect("timed out").await;
    let timed_out = example
        .until("the timeout", |s| {
            example.of(s, ACQUIRE_TIMEOUTS, &[]) == 1.0
        })
        .await;
    assert_eq!(example.of(&timed_out, WAITERS, &[]), 0.0, "{timed_out:?}");
    assert_eq!(example.of(&timed_out, HELD, &[]), 1.0);
    let waits = example.observed(&timed_out, ACQUIRE_WAIT);
    assert_eq!(waits, 1.0, "only the grant's wait");

    // A wait granted by the release: its wait is timed, and the waiter is gone.
    example.run("wait 20s", "waiting").await;
    example
        .until("the waiter", |s| example.of(s, WAITERS, &[]) == 1.0)
        .await;
    example.send("release").await;
    example.expect_each(&["released", "granted"]).await;
    let granted = example
        .until("the granted wait", |s| {
            example.observed(s, ACQUIRE_WAIT) == waits + 1.0
                && example.observed(s, HOLD_DURATION) == 2.0
        })
        .await;
    assert_eq!(example.of(&granted, WAITERS, &[]), 0.0, "{granted:?}");
    assert_eq!(example.of(&granted, HELD, &[]), 0.0);
    assert_eq!(example.of(&granted, ACQUIRE_GRANTS, &[]), 2.0);
    assert_eq!(example.of(&granted, ACQUIRE_TIMEOUTS, &[]), 1.0);
    let mut holds = 2.0;

    // Lost behind its back: removed with a raw client, then broken by an operator.
    let mut losses = 0.0;
    if let Some(steal) = steal {
        example.run("lock", "acquired").await;
        steal.await;
        losses += 1.0;
        holds += 1.0;
        example.lose("vanished", losses, holds).await;
    }
    example.run("lock", "acquired").await;
    example.run("break", "broke").await;
    losses += 1.0;
    holds += 1.0;
    example.lose("broken", losses, holds).await;

    // Taken again and released: held while held, then nothing; the release is no loss.
    example.run("lock", "acquired").await;
    assert_eq!(example.of(&example.scrape().await, HELD, &[]), 1.0);
    example.run("release", "released").await;
    holds += 1.0;
    let after = example.scrape().await;
    assert_eq!(example.of(&after, HELD, &[]), 0.0, "{after:?}");
    assert_eq!(example.of(&after, WAITERS, &[]), 0.0);
    assert_eq!(example.of(&after, LOSSES, &[]), losses);
    assert_eq!(example.observed(&after, HOLD_DURATION), holds);
    example.quit().await;
}

/// What `call` returns within [`WAIT`]; panics naming `what` otherwise.
async fn within<T, E: std::fmt::Debug>(what: &str, call: impl Future<Output = Result<T, E>>) -> T {
    match timeout(WAIT, call).await {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => panic!("{what}: {err:?}"),
        Err(_) => panic!("{what}: no answer within {WAIT:?}"),
    }
}

fn name() -> LockName {
    LockName::new(NAME).expect("valid name")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    let url = format!("memory://metrics?{QUERY}");
    lock_life(url, "memory", None::<std::future::Ready<()>>).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis() {
    let Some(server) = or_skip(RedisServer::start().await) else {
        return;
    };
    let steal = async {
        let client = redis::Client::open(server.url()).expect("redis URL");
        let mut conn = within("connects", client.get_multiplexed_async_connection()).await;
        let key =
            distlock::redis::KeyLayout::new(distlock::redis::DEFAULT_PREFIX).lock_key(&name());
        let removed: i64 = within("DEL", redis::cmd("DEL").arg(&key).query_async(&mut conn)).await;
        assert_eq!(removed, 1, "{key}");
    };
    lock_life(format!("{}?{QUERY}", server.url()), "redis", Some(steal)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper() {
    let Some(server) = or_skip(ZkServer::start().await) else {
        return;
    };
    let steal = async {
        let hosts = server.addr().to_string();
        let client = within(
            "connects",
            zookeeper_client::Client::connector().connect(&hosts),
        )
        .await;
        let dir = distlock::zookeeper::lock_dir("/metrics", &name());
        let nodes = within("lists", client.list_children(&dir)).await;
        assert_eq!(nodes.len(), 1, "{nodes:?}");
        for node in nodes {
            within("deletes", client.delete(&format!("{dir}/{node}"), None)).await;
        }
    };
    let url = format!("zk://{}/metrics?{QUERY}", server.addr());
    lock_life(url, "zookeeper", Some(steal)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    let Some(server) = or_skip(EtcdServer::start().await) else {
        return;
    };
    let steal = async {
        let endpoint = format!("http://{}", server.addr());
        let mut client = within("connects", etcd_client::Client::connect([endpoint], None)).await;
        let range = distlock::etcd::EtcdConfig::default()
            .with_prefix("metrics")
            .lock_prefix(&name());
        let options = etcd_client::DeleteOptions::new().with_prefix();
        let deleted = within("deletes", client.delete(range.as_str(), Some(options))).await;
        assert_eq!(deleted.deleted(), 1, "{range}");
    };
    let url = format!("etcd://{}/metrics?{QUERY}", server.addr());
    lock_life(url, "etcd", Some(steal)).await;
}
