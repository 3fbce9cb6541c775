//! What the server shows about one lock name: its holder, its waiters, and the bound that
//! every later fencing token of the name exceeds.

use std::time::{Duration, SystemTime};

use crate::kind::HoldKind;
use crate::token::FencingToken;

/// Who holds and who waits for one lock name, as the server showed it at one moment.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// The current holder, if any: the oldest, where a kind grants several at a time.
    pub holder: Option<Participant>,
    /// The other holders, where a kind grants several at a time (a semaphore's permits, a
    /// read-write lock's readers), oldest first.
    pub co_holders: Vec<Participant>,
    /// The waiters the server knows of: in queue order where the backend queues, in no
    /// particular order otherwise. Backends whose waiters leave no trace on the server
    /// (Redis with `queue=off`) list none.
    pub waiters: Vec<Participant>,
    /// Every hold of this name granted after the inspection has a fencing token greater
    /// than this one, where the backend can say.
    pub token_floor: Option<FencingToken>,
}

impl Occupancy {
    /// An occupancy with `holder` and `waiters` and no token floor.
    pub fn new(holder: Option<Participant>, waiters: Vec<Participant>) -> Self {
        Occupancy {
            holder,
            waiters,
            co_holders: Vec::new(),
            token_floor: None,
        }
    }

    /// An occupancy with several `holders` (oldest first) and `waiters`.
    pub fn shared(holders: Vec<Participant>, waiters: Vec<Participant>) -> Self {
        let mut holders = holders.into_iter();
        Occupancy {
            holder: holders.next(),
            co_holders: holders.collect(),
            ..Occupancy::new(None, waiters)
        }
    }

    /// Every holder, oldest first.
    pub fn holders(&self) -> impl Iterator<Item = &Participant> {
        self.holder.iter().chain(&self.co_holders)
    }

    /// Sets [`Occupancy::token_floor`].
    pub fn token_floor(mut self, floor: Option<FencingToken>) -> Self {
        self.token_floor = floor;
        self
    }

    /// The holders, then the waiters.
    pub fn participants(&self) -> impl Iterator<Item = &Participant> {
        self.holders().chain(&self.waiters)
    }
}

/// One holder or waiter of a lock name.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// The owner token it stored on the server, where the layout keeps one: ours, a
    /// Curator node's protection id, the value a plain `SET NX` client wrote.
    pub owner_token: Option<String>,
    /// Its fencing token, where the server keeps it per participant.
    pub fencing_token: Option<FencingToken>,
    /// How long its lease has left, where leases are per lock.
    pub lease_left: Option<Duration>,
    /// The client session it belongs to, where the server knows it (a ZooKeeper session
    /// id, an etcd lease id, the client id of a queued Redis waiter): the acquisitions of
    /// one process share it.
    pub session: Option<String>,
    /// Since when it holds or waits, on the server's wall clock, where the server records
    /// it (a ZooKeeper node's creation time).
    pub since: Option<SystemTime>,
    /// The value it stored, where it is an election's candidate (the leader's value, for
    /// the holder): a distlock candidate's value, a Curator `LeaderLatch` participant's
    /// id, an etcd `Election` proposal.
    pub value: Option<Vec<u8>>,
    /// How many times that value was proclaimed since the grant, where the server counts
    /// it (a data version): of two reads of one leader, the higher version is the newer
    /// value.
    pub value_version: Option<u64>,
    /// What it holds or waits for, where the layout tells kinds apart (a permit, a
    /// reader, a writer); `None` for a mutex or a candidate.
    pub kind: Option<HoldKind>,
}

impl Participant {
    /// A participant that stored `owner_token`.
    pub fn new(owner_token: Option<String>) -> Self {
        Participant {
            owner_token,
            fencing_token: None,
            lease_left: None,
            session: None,
            since: None,
            value: None,
            value_version: None,
            kind: None,
        }
    }

    /// Sets [`Participant::kind`].
    pub fn kind(mut self, kind: Option<HoldKind>) -> Self {
        self.kind = kind;
        self
    }

    /// Sets [`Participant::fencing_token`].
    pub fn fencing_token(mut self, token: Option<FencingToken>) -> Self {
        self.fencing_token = token;
        self
    }

    /// Sets [`Participant::session`].
    pub fn session(mut self, session: Option<String>) -> Self {
        self.session = session;
        self
    }

    /// Sets [`Participant::since`].
    pub fn since(mut self, since: Option<SystemTime>) -> Self {
        self.since = since;
        self
    }

    /// Sets [`Participant::value`].
    pub fn value(mut self, value: Option<Vec<u8>>) -> Self {
        self.value = value;
        self
    }

    /// Sets [`Participant::value_version`].
    pub fn value_version(mut self, version: Option<u64>) -> Self {
        self.value_version = version;
        self
    }

    /// Sets [`Participant::lease_left`].
    pub fn lease_left(mut self, left: Option<Duration>) -> Self {
        self.lease_left = left;
        self
    }
}
