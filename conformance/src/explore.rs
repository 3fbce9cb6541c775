//! The option space the rules run in: every rule runs under option sets drawn from the
//! classes that matter to the protocols, not at one point of it.
//!
//! - **TTL** below, equal to and far above the hand-off lease (the first lease of a hold
//!   a release or a settle hands to a waiter: twice the recheck, a second at least);
//! - **recheck** short and long;
//! - **queue** on and off, where the backend offers the choice ([`Factory::set_queue`]);
//! - **runtime**: tokio's multi-thread and current-thread schedulers.
//!
//! `make test` draws one set per rule from a seed (`LOCK_TEST_SEED`, else one made from
//! the clock), printed with the rule's output so that a failure can be replayed;
//! `make chaos` ([`crate::long_plan`]) runs every class of every dimension.
//! [`Explored`] puts a set on a factory: the options a rule leaves at their defaults take
//! the set's values, and every client is audited by the lease [`crate::oracle`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lock_core::{DistributedLock, LockOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::factory::Factory;
use crate::oracle::Oracle;
use crate::wrap::{FactoryWrap, WrappedFactory};

/// Where the TTL stands against the hand-off lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlClass {
    /// Half the hand-off lease (no shorter than the backend's shortest TTL).
    Below,
    /// The hand-off lease itself.
    Equal,
    /// Four hand-off leases (at least four of the backend's shortest TTL).
    FarAbove,
}

/// How often a waiter re-checks on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecheckClass {
    /// 250 ms: the hand-off lease is at its floor of a second.
    Short,
    /// 1.5 s: the hand-off lease is 3 s.
    Long,
}

/// The tokio scheduler a rule runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeClass {
    /// Two worker threads.
    MultiThread,
    /// One thread: every task of the rule, the client's included, shares it.
    CurrentThread,
}

/// One point of the option space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionSet {
    /// The TTL's class.
    pub ttl: TtlClass,
    /// The recheck's class.
    pub recheck: RecheckClass,
    /// The waiter queue, where the backend offers the choice.
    pub queue: bool,
    /// The runtime.
    pub runtime: RuntimeClass,
}

impl OptionSet {
    /// Today's defaults (the TTL far above the hand-off lease, as the default 30 s is).
    pub const DEFAULT: OptionSet = OptionSet {
        ttl: TtlClass::FarAbove,
        recheck: RecheckClass::Long,
        queue: true,
        runtime: RuntimeClass::MultiThread,
    };

    /// The recheck of this set.
    pub fn recheck(&self) -> Duration {
        match self.recheck {
            RecheckClass::Short => Duration::from_millis(250),
            RecheckClass::Long => Duration::from_millis(1500),
        }
    }

    /// The hand-off lease of this set's recheck: twice it, a second at least.
    pub fn handoff_lease(&self) -> Duration {
        (self.recheck() * 2).max(Duration::from_secs(1))
    }

    /// The TTL of this set on a backend whose shortest usable TTL is `shortest`.
    pub fn ttl(&self, shortest: Duration) -> Duration {
        let handoff = self.handoff_lease();
        match self.ttl {
            TtlClass::Below => (handoff / 2).max(shortest),
            TtlClass::Equal => handoff.max(shortest),
            TtlClass::FarAbove => (handoff * 4).max(shortest * 4),
        }
    }

    /// One set drawn from `seed` for the test `test` (its path): the same seed draws the
    /// same set for the same test.
    pub fn drawn(seed: u64, test: &str) -> OptionSet {
        let mut rng = StdRng::seed_from_u64(seed ^ stable_hash(test));
        OptionSet {
            ttl: [TtlClass::Below, TtlClass::Equal, TtlClass::FarAbove][rng.random_range(0..3)],
            recheck: [RecheckClass::Short, RecheckClass::Long][rng.random_range(0..2)],
            // Off a quarter of the time: the shared kinds need it on Redis.
            queue: rng.random_bool(0.75),
            runtime: [RuntimeClass::MultiThread, RuntimeClass::CurrentThread]
                [rng.random_range(0..2)],
        }
    }

    /// Sets that together cover every class of every dimension: each TTL class, the far
    /// TTL under both rechecks (the hand-off lease differs) and with the queue (the
    /// shared kinds need it on Redis), the other dimensions turning with them.
    pub fn covering() -> [OptionSet; 4] {
        let set = |ttl, recheck, queue, runtime| OptionSet {
            ttl,
            recheck,
            queue,
            runtime,
        };
        [
            set(
                TtlClass::Below,
                RecheckClass::Long,
                true,
                RuntimeClass::CurrentThread,
            ),
            set(
                TtlClass::Equal,
                RecheckClass::Short,
                false,
                RuntimeClass::MultiThread,
            ),
            set(
                TtlClass::FarAbove,
                RecheckClass::Short,
                true,
                RuntimeClass::MultiThread,
            ),
            set(
                TtlClass::FarAbove,
                RecheckClass::Long,
                true,
                RuntimeClass::CurrentThread,
            ),
        ]
    }

    /// A runtime of this set's class.
    ///
    /// # Panics
    /// If the runtime cannot be built.
    pub fn runtime(&self) -> tokio::runtime::Runtime {
        let mut builder = match self.runtime {
            RuntimeClass::MultiThread => {
                let mut builder = tokio::runtime::Builder::new_multi_thread();
                builder.worker_threads(2);
                builder
            }
            RuntimeClass::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        };
        builder.enable_all().build().expect("a tokio runtime")
    }
}

impl fmt::Display for OptionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ttl {:?} (hand-off lease {:?}), recheck {:?} ({:?}), queue {}, runtime {:?}",
            self.ttl,
            self.handoff_lease(),
            self.recheck,
            self.recheck(),
            if self.queue { "on" } else { "off" },
            self.runtime
        )
    }
}

/// FNV-1a: a hash of a test's path that is the same in every build and process.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The seed of this run: `LOCK_TEST_SEED` when set (to replay a run), else one made from
/// the clock, so that successive runs cover the space.
///
/// # Panics
/// If `LOCK_TEST_SEED` is set but not a number.
pub fn seed() -> u64 {
    match std::env::var("LOCK_TEST_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("LOCK_TEST_SEED must be a number, got {text:?}")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs() / 60),
    }
}

/// The rules that run on the multi-thread runtime whatever the draw: they end a client's
/// runtime as a process exit would, in a thread of its own, while the rule's runtime must
/// keep serving the connections the factory made on it.
pub const MULTI_THREAD_RULES: &[&str] = &["close_frees_everything"];

/// The sets `test` runs under now: every class in the long plan (only the n-th, 1-based,
/// with `LOCK_TEST_SET=n`, to replay one), else one drawn set.
///
/// # Panics
/// If `LOCK_TEST_SET` is set but not the number of a covering set.
pub fn sets_for(test: &str) -> Vec<(u64, OptionSet)> {
    let seed = seed();
    let mut sets = if crate::long_plan() {
        let covering = OptionSet::covering();
        match std::env::var("LOCK_TEST_SET") {
            Ok(text) => {
                let chosen = text
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .and_then(|index| covering.get(index))
                    .unwrap_or_else(|| {
                        panic!(
                            "LOCK_TEST_SET must be 1 to {}, got {text:?}",
                            covering.len()
                        )
                    });
                vec![(seed, *chosen)]
            }
            Err(_) => covering.map(|set| (seed, set)).to_vec(),
        }
    } else {
        vec![(seed, OptionSet::drawn(seed, test))]
    };
    let rule = test.rsplit("::").next().unwrap_or(test);
    if MULTI_THREAD_RULES.contains(&rule) {
        for (_, set) in &mut sets {
            set.runtime = RuntimeClass::MultiThread;
        }
    }
    sets
}

/// Runs `body` under each set [`sets_for`] gives `test`, each on a runtime of its class,
/// saying which set runs; a failure names the seed that replays it.
pub fn run_explored<Fut>(test: &str, body: impl Fn(OptionSet) -> Fut)
where
    Fut: Future<Output = ()>,
{
    let long = crate::long_plan();
    for (seed, set) in sets_for(test) {
        let alone = OptionSet::covering()
            .iter()
            .position(|covering| long && *covering == set)
            .map(|index| format!(", LOCK_TEST_SET={} runs it alone", index + 1))
            .unwrap_or_default();
        println!("[conformance] {test}: {set} (LOCK_TEST_SEED={seed} replays it{alone})");
        let replay = Replay { test, seed, set };
        set.runtime().block_on(body(set));
        std::mem::forget(replay);
    }
}

/// Says, if the rule panics, which seed and set replay it.
struct Replay<'a> {
    test: &'a str,
    seed: u64,
    set: OptionSet,
}

impl Drop for Replay<'_> {
    fn drop(&mut self) {
        eprintln!(
            "[conformance] {} failed under {}; replay it with LOCK_TEST_SEED={}",
            self.test, self.set, self.seed
        );
    }
}

/// A factory whose clients run under an option set and are audited by the lease oracle:
/// options a rule leaves at their defaults (TTL, recheck) take the set's, its shortest
/// TTL is the set's TTL, and the queue follows the set where the backend offers it.
pub type Explored<F> = WrappedFactory<F, Exploring>;

/// What an [`Explored`] factory changes: the option set, and the oracle's audit.
#[derive(Debug)]
pub struct Exploring {
    set: OptionSet,
    oracle: Arc<Oracle>,
}

impl<F: Factory + 'static> WrappedFactory<F, Exploring> {
    /// `factory` under `set`.
    pub fn under(factory: F, mut set: OptionSet) -> Self {
        if !factory.set_queue(set.queue) && !set.queue {
            // The set line said "queue off": say what runs instead.
            println!("[conformance] queue off is not offered here: the queue stays on");
            set.queue = true;
        }
        let inner = Arc::new(factory);
        let oracle = Oracle::new(Arc::clone(&inner) as Arc<dyn Factory>);
        WrappedFactory::new(inner, Exploring { set, oracle })
    }

    /// Ends the audit of this rule's holds.
    ///
    /// # Panics
    /// If any guard promised more than its server kept.
    pub async fn finish(&self) {
        self.wrapper().oracle.finish().await;
    }
}

impl FactoryWrap for Exploring {
    fn short_ttl(&self, inner: Duration) -> Duration {
        self.set.ttl(inner)
    }

    fn options(&self, mut options: LockOptions, short_ttl: Duration) -> LockOptions {
        let defaults = LockOptions::default();
        if options.ttl == defaults.ttl {
            options.ttl = short_ttl;
        }
        if options.recheck == defaults.recheck {
            options.recheck = self.set.recheck();
        }
        options
    }

    fn client(&self, client: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
        self.oracle.audit(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_stand_where_they_say() {
        for set in OptionSet::covering() {
            let shortest = Duration::from_millis(600);
            let (ttl, handoff) = (set.ttl(shortest), set.handoff_lease());
            match set.ttl {
                TtlClass::Below => assert!(ttl < handoff, "{set}"),
                TtlClass::Equal => assert_eq!(ttl, handoff, "{set}"),
                TtlClass::FarAbove => assert!(ttl >= handoff * 4, "{set}"),
            }
        }
    }

    #[test]
    fn a_seed_replays_its_draw_and_seeds_cover_the_space() {
        let test = "backend::single::mutual_exclusion";
        assert_eq!(OptionSet::drawn(7, test), OptionSet::drawn(7, test));
        let drawn: Vec<OptionSet> = (0..200).map(|seed| OptionSet::drawn(seed, test)).collect();
        for class in [TtlClass::Below, TtlClass::Equal, TtlClass::FarAbove] {
            assert!(drawn.iter().any(|s| s.ttl == class), "{class:?}");
        }
        assert!(drawn.iter().any(|s| !s.queue) && drawn.iter().any(|s| s.queue));
        for class in [RuntimeClass::MultiThread, RuntimeClass::CurrentThread] {
            assert!(drawn.iter().any(|s| s.runtime == class), "{class:?}");
        }
    }

    #[test]
    fn covering_sets_cover_every_class() {
        let sets = OptionSet::covering();
        for class in [TtlClass::Below, TtlClass::Equal, TtlClass::FarAbove] {
            assert!(sets.iter().any(|s| s.ttl == class));
        }
        for class in [RecheckClass::Short, RecheckClass::Long] {
            assert!(sets.iter().any(|s| s.recheck == class));
        }
        for class in [RuntimeClass::MultiThread, RuntimeClass::CurrentThread] {
            assert!(sets.iter().any(|s| s.runtime == class));
        }
        assert!(sets.iter().any(|s| s.queue) && sets.iter().any(|s| !s.queue));
    }
}
