//! The spans of the lease machinery, recorded by a test layer on the memory backend: each
//! carries the backend, the lock name and, once granted, the fencing token.
//!
//! The layer is the process's global subscriber, so every thread's spans reach it (a
//! subscriber scoped to the test's thread missed spans whose callsites other tests of the
//! binary had registered first); the test keeps those of its own lock names.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lock_core::memory::{MemoryBackend, MemorySpace};
use lock_core::{DistributedLockExt, LockOptions};
use tokio::time::sleep;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span seen: its name and every field it was given, at creation or later.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.fields
            .insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .insert(field.name().to_owned(), value.to_owned());
    }
}

/// Records every span's name and fields, in creation order.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(Id, Seen)>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name(),
            ..Seen::default()
        };
        attrs.record(&mut seen);
        self.0.lock().expect("spans").push((id.clone(), seen));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().expect("spans");
        if let Some((_, seen)) = spans.iter_mut().rev().find(|(seen, _)| seen == id) {
            values.record(seen);
        }
    }
}

impl Spans {
    /// The layer, installed as the global subscriber on first use.
    fn global() -> &'static Spans {
        static SPANS: OnceLock<Spans> = OnceLock::new();
        SPANS.get_or_init(|| {
            let spans = Spans::default();
            tracing::subscriber::set_global_default(
                tracing_subscriber::registry().with(spans.clone()),
            )
            .expect("the only global subscriber of this binary");
            spans
        })
    }

    /// The fields of the spans called `name` on one of the `locks`, in creation order.
    fn named(&self, name: &str, locks: &[&str]) -> Vec<BTreeMap<String, String>> {
        let spans = self.0.lock().expect("spans");
        spans
            .iter()
            .filter(|(_, seen)| seen.name == name)
            .filter(|(_, seen)| {
                seen.fields
                    .get("lock")
                    .is_some_and(|lock| locks.contains(&lock.as_str()))
            })
            .map(|(_, seen)| seen.fields.clone())
            .collect()
    }
}

/// Acquire (fencing token recorded at the grant), the watchdog's renewal of one hold, an
/// explicit release and the background release of a dropped guard each have their span,
/// with the backend, the lock name and the fencing token.
#[tokio::test]
async fn acquire_renew_and_release_are_spans_with_lock_and_token() {
    let spans = Spans::global();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (held, dropped_name) = (
        format!("jobs/spans-{unique}"),
        format!("jobs/dropped-{unique}"),
    );
    let ours = [held.as_str(), dropped_name.as_str()];
    let space = MemorySpace::named(&format!("spans-{}", uuid::Uuid::new_v4().simple()));
    let mut options = LockOptions::default();
    options.ttl = Duration::from_millis(300);
    let client = MemoryBackend::client(space, options).expect("valid options");

    let guard = client.lock(held.as_str()).await.expect("lock");
    let token = guard.fencing_token().0.to_string();
    sleep(Duration::from_millis(250)).await;
    guard.release().await.expect("release");
    let dropped = client.lock(dropped_name.as_str()).await.expect("lock");
    let dropped_token = dropped.fencing_token().0.to_string();
    drop(dropped);
    sleep(Duration::from_millis(50)).await;

    let field = |span: &BTreeMap<String, String>, key: &str| span.get(key).cloned();
    let acquires = spans.named("distlock.acquire", &ours);
    assert_eq!(acquires.len(), 2, "{acquires:?}");
    assert_eq!(field(&acquires[0], "backend").as_deref(), Some("memory"));
    assert_eq!(field(&acquires[0], "lock").as_deref(), Some(held.as_str()));
    assert_eq!(field(&acquires[0], "fencing_token"), Some(token.clone()));
    let renewals = spans.named("distlock.renew", &ours);
    assert!(!renewals.is_empty(), "renewed while held");
    assert_eq!(field(&renewals[0], "holds").as_deref(), Some("1"));
    assert_eq!(field(&renewals[0], "lock").as_deref(), Some(held.as_str()));
    assert_eq!(field(&renewals[0], "fencing_token"), Some(token.clone()));
    let releases = spans.named("distlock.release", &ours);
    assert_eq!(releases.len(), 2, "{releases:?}");
    assert_eq!(field(&releases[0], "fencing_token"), Some(token));
    assert_eq!(field(&releases[0], "background").as_deref(), Some("false"));
    assert_eq!(
        field(&releases[1], "lock").as_deref(),
        Some(dropped_name.as_str())
    );
    assert_eq!(field(&releases[1], "fencing_token"), Some(dropped_token));
    assert_eq!(field(&releases[1], "background").as_deref(), Some("true"));
}
