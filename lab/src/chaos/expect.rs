//! What each topology promises in each scenario: one function per scenario, named
//! after it, that [`expectation`](super::expectation) dispatches to through [`promise`],
//! which also derives a dual deployment's promise from its sides'.

use super::Sides;

use super::Topology::{self, Dual, InProcess, Independent, Quorum, Replicated, Single};

/// What a topology promises in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No overlapping accepted sections, no lost update, bounded takeover.
    Safe,
    /// Mutual exclusion may be lost for the documented reason; the fence must still
    /// turn the stale writer away, so the resource stays consistent.
    FencedOnly(&'static str),
    /// The scenario needs something this topology does not have.
    NotApplicable(&'static str),
}

/// What `topology` promises in a scenario whose promise for a single deployment is
/// `scenario` (one of the functions below); a dual deployment's comes from its sides'.
pub(super) fn promise(topology: &Topology, scenario: fn(&Topology) -> Expect) -> Expect {
    match topology {
        Dual { old, new, faults } => dual(old, new, *faults, scenario),
        single => scenario(single),
    }
}

/// A dual deployment's promise, from its sides'.
///
/// A dual client enters only once it holds both sides, and its guard vouches only while
/// both holds do (Lost if either side is, valid until the earlier deadline). Two dual
/// guards can vouch at once only if each side let both clients in at once, so the dual
/// excludes whenever either side does:
///
/// - Faults on one side: the scenario applies as it does to that side alone (the links,
///   servers and keys it breaks are that side's). The other side sees no fault: a
///   contender gets it only once the victim's hold there has expired (after the victim's
///   validity deadline) or been released, which the dual lock does only once the victim's
///   guard has stopped vouching (a hold lost on one side is lost; `tests/dual/faults.rs`
///   checks that order). So the dual promises safety even where the faulted side alone
///   promises only fencing (a key removed early, a Redis restarted empty). Faults on the
///   whole client (a crash, a pause) hit both sides; every deployment promises safety for
///   those.
/// - Faults on both sides: the scenario must apply to each side (it breaks both sides'
///   servers and links), and the dual promises the stronger of the two sides' promises
///   (safety if either side keeps it under that fault, else fencing).
///
/// `lab/tests/dual_chaos.rs` (`make chaos`) checks these promises like any other.
fn dual(
    old: &Topology,
    new: &Topology,
    faults: Sides,
    scenario: fn(&Topology) -> Expect,
) -> Expect {
    let (old, new) = (promise(old, scenario), promise(new, scenario));
    match (faults, old, new) {
        (Sides::Old, Expect::NotApplicable(why), _)
        | (Sides::New, _, Expect::NotApplicable(why)) => Expect::NotApplicable(why),
        (Sides::Old | Sides::New, _, _) => Expect::Safe,
        (Sides::Both, Expect::NotApplicable(why), _)
        | (Sides::Both, _, Expect::NotApplicable(why)) => Expect::NotApplicable(why),
        (Sides::Both, Expect::Safe, _) | (Sides::Both, _, Expect::Safe) => Expect::Safe,
        (Sides::Both, fenced @ Expect::FencedOnly(_), Expect::FencedOnly(_)) => fenced,
    }
}

const NO_SERVER: Expect = Expect::NotApplicable("no server process");
const NO_NETWORK: Expect = Expect::NotApplicable("no network");
const REDLOCK_ONLY: Expect = Expect::NotApplicable("RedLock only");
const NEEDS_REPLICAS: Expect =
    Expect::NotApplicable("needs primaries with replicas that watchers promote");
/// Redis forgets everything on a restart without persistence, the replicated deployments
/// too: their replicas restart empty and resynchronise from an empty primary.
const FORGETS_ON_RESTART: &str =
    "every Redis server (primary and replicas, without persistence) restarts at once and \
     forgets its locks and fencing counters";

/// `Safe`, except where there is no network to fault.
fn needs_network(topology: &Topology) -> Expect {
    match topology {
        InProcess => NO_NETWORK,
        _ => Expect::Safe,
    }
}

/// `Safe` on several servers, else not applicable.
fn needs_members(topology: &Topology) -> Expect {
    match topology {
        Quorum { .. } | Independent { .. } => Expect::Safe,
        Replicated { .. } => Expect::NotApplicable(
            "members of a replicated deployment are not peers: see the primary's scenarios",
        ),
        _ => Expect::NotApplicable("needs several servers"),
    }
}

pub(super) fn holder_partitioned(_: &Topology) -> Expect {
    Expect::Safe
}

pub(super) fn follower_partition(topology: &Topology) -> Expect {
    match topology {
        Quorum {
            reported_activity: true,
            ..
        } => Expect::FencedOnly(
            "the leader counts a session's activity at a follower only when the follower \
             reports it (every half tick): cut off right after a renewal it had not reported, \
             the session ends up to that much before the holder's lease",
        ),
        Quorum { .. } => Expect::Safe,
        _ => Expect::NotApplicable("needs a consensus cluster"),
    }
}

pub(super) fn holder_paused_beyond_ttl(_: &Topology) -> Expect {
    Expect::Safe
}

pub(super) fn long_network_delay(topology: &Topology) -> Expect {
    needs_network(topology)
}

pub(super) fn stuck_server(topology: &Topology) -> Expect {
    match topology {
        InProcess => NO_SERVER,
        Replicated { .. } => Expect::FencedOnly(
            "stopped past the watchers' down-after, the primary may be failed over just as it \
             resumes: it serves the clients still connected to it until the watchers demote \
             it (seconds later), while the promoted replica serves the others",
        ),
        _ => Expect::Safe,
    }
}

pub(super) fn server_crash_restart(topology: &Topology) -> Expect {
    match topology {
        InProcess => NO_SERVER,
        Single { durable: false } => Expect::FencedOnly(
            "single Redis without persistence forgets its locks (and fencing counters) on restart",
        ),
        Replicated { .. } => Expect::FencedOnly(FORGETS_ON_RESTART),
        Independent { .. } => Expect::FencedOnly(
            "every RedLock node (without persistence) restarts at once, within the TTL: outside \
             RedLock's assumptions, a majority forgets the holder",
        ),
        _ => Expect::Safe,
    }
}

pub(super) fn server_restart_without_data(topology: &Topology) -> Expect {
    match topology {
        InProcess => NO_SERVER,
        Single { durable: false } => Expect::FencedOnly(
            "a server that restarts with its data wiped forgets every lock it held",
        ),
        Replicated { .. } => Expect::FencedOnly(FORGETS_ON_RESTART),
        Independent { .. } => {
            Expect::FencedOnly("every RedLock node restarted empty at once forgets the holder")
        }
        _ => Expect::NotApplicable("losing the data of a durable store is outside its guarantees"),
    }
}

pub(super) fn early_key_expiry(_: &Topology) -> Expect {
    Expect::FencedOnly(
        "a key removed early (operator, clock jump on the server) frees the lock before its \
         holder can know",
    )
}

/// A wall-clock step ahead on Redis (one server without persistence, RedLock, replicated:
/// the deployments of Redis); ZooKeeper times sessions on the monotonic clock
/// (`System.nanoTime`), which a wall-clock step leaves alone (etcd's clock cannot be
/// moved: see `target_expectation`).
pub(super) fn server_clock_jump_forward(topology: &Topology) -> Expect {
    match topology {
        InProcess => NO_SERVER,
        Single { durable: false } | Independent { .. } | Replicated { .. } => Expect::FencedOnly(
            "Redis expires keys by its wall clock: a step ahead past the TTL ends the hold on \
             the server at once, while the holder's guard, timed on the client's monotonic \
             clock, vouches for it until its next renewal finds the key gone",
        ),
        _ => Expect::Safe,
    }
}

pub(super) fn server_clock_jump_back(topology: &Topology) -> Expect {
    match topology {
        InProcess => NO_SERVER,
        _ => Expect::Safe,
    }
}

pub(super) fn acquire_reply_delayed(topology: &Topology) -> Expect {
    needs_network(topology)
}

pub(super) fn release_reply_lost(topology: &Topology) -> Expect {
    needs_network(topology)
}

pub(super) fn waiter_connection_reset(topology: &Topology) -> Expect {
    needs_network(topology)
}

pub(super) fn waiter_long_connection_reset(topology: &Topology) -> Expect {
    needs_network(topology)
}

pub(super) fn crashed_head_waiter(_: &Topology) -> Expect {
    Expect::Safe
}

pub(super) fn cancellation_under_faults(_: &Topology) -> Expect {
    Expect::Safe
}

pub(super) fn member_crash(topology: &Topology) -> Expect {
    needs_members(topology)
}

pub(super) fn majority_loss(topology: &Topology) -> Expect {
    needs_members(topology)
}

pub(super) fn redlock_restart_immediate(topology: &Topology) -> Expect {
    match topology {
        Independent { .. } => Expect::FencedOnly(
            "RedLock assumes a crashed node restarts only after the TTL or with persistence; \
             restarted at once and empty, a majority can forget the holder",
        ),
        _ => REDLOCK_ONLY,
    }
}

pub(super) fn redlock_restart_delayed(topology: &Topology) -> Expect {
    match topology {
        Independent { .. } => Expect::Safe,
        _ => REDLOCK_ONLY,
    }
}

pub(super) fn stale_counter_restore(topology: &Topology) -> Expect {
    match topology {
        Single { durable: false } | Independent { .. } | Replicated { .. } => Expect::FencedOnly(
            "restored from an older snapshot, the servers forget the holder; the fencing \
             token, never below the server clock, still rises past the holder's",
        ),
        _ => Expect::NotApplicable(
            "run on Redis only: memory:// keeps nothing on disk, and ZooKeeper and etcd \
             promise nothing once their data goes back",
        ),
    }
}

pub(super) fn nemesis(topology: &Topology) -> Expect {
    match topology {
        Replicated { .. } => Expect::FencedOnly(
            "the fault mix restarts the servers (Redis without persistence forgets its locks) \
             and stops them past the watchers' down-after (a failover while the old primary \
             still serves its clients)",
        ),
        Single { durable: false } => Expect::FencedOnly(
            "the fault mix restarts the server, and Redis without persistence forgets its locks",
        ),
        Independent { .. } => Expect::FencedOnly(
            "the fault mix restarts nodes at once without data, outside RedLock's assumptions",
        ),
        _ => Expect::Safe,
    }
}

pub(super) fn primary_killed_while_holding(topology: &Topology) -> Expect {
    match topology {
        Replicated { acked: 0, .. } => Expect::FencedOnly(
            "replication is asynchronous: a grant or renewal the promoted replica had not \
             received is lost, and another client can be granted the name while the old \
             guard still vouches, until its next renewal finds the key gone",
        ),
        Replicated { .. } => Expect::FencedOnly(
            "a grant waits for a replica's acknowledgement, its renewals do not: a renewal \
             the promoted replica had not received lets the key expire there earlier than the \
             guard says; and the watchers may promote a replica that had not acknowledged",
        ),
        _ => NEEDS_REPLICAS,
    }
}

pub(super) fn primary_partitioned_from_replicas(topology: &Topology) -> Expect {
    match topology {
        Replicated { acked: 0, .. } => Expect::FencedOnly(
            "a grant made while the replicas are cut off lives on the primary alone: the \
             replica promoted when the primary dies grants the name again while the first \
             guard still vouches",
        ),
        Replicated { .. } => Expect::Safe,
        _ => NEEDS_REPLICAS,
    }
}

pub(super) fn sentinel_split_brain(topology: &Topology) -> Expect {
    match topology {
        Replicated { .. } => Expect::FencedOnly(
            "the old primary, cut off from the watchers and its replicas but not from its \
             holder, goes on renewing the hold (renewals are never waited for) while the \
             promoted replica grants the name to others; the holder learns only when the \
             watchers demote the old primary after the partition heals",
        ),
        _ => NEEDS_REPLICAS,
    }
}

pub(super) fn slot_migration_while_held(topology: &Topology) -> Expect {
    match topology {
        Replicated { shards: 2.., .. } => Expect::Safe,
        Replicated { .. } => Expect::NotApplicable("one shard: no slot to move"),
        _ => Expect::NotApplicable("needs a sharded cluster"),
    }
}

pub(super) fn leader_service_partitioned(topology: &Topology) -> Expect {
    holder_partitioned(topology)
}

pub(super) fn leader_service_paused(topology: &Topology) -> Expect {
    holder_paused_beyond_ttl(topology)
}

pub(super) fn leader_service_server_restart(topology: &Topology) -> Expect {
    server_crash_restart(topology)
}
