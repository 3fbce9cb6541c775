//! The key slots that let several acquisitions of one name in one client queue at once,
//! each under a key of its own (see [`crate::layout`]).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lock_core::raw::{backend::HoldKind, plumbing::lock_unpoisoned};
use lock_core::LockName;

use crate::layout::queue_key;

/// The keys of one name that this client's acquisitions use. Each acquisition under way
/// takes the lowest free slot: slot 0 is the Go client's plain `<lease hex>` key, slot n
/// `<lease hex>_<n>`, each then `.kind` for any kind but a candidate. A slot is freed once
/// its hold ended or its cancelled attempt's key was cleaned up: two live acquisitions never
/// share one, and a key found on the server for a free slot (in either form) is our leftover.
#[derive(Default)]
pub(crate) struct Slots {
    names: Mutex<HashMap<LockName, BTreeSet<u32>>>,
}

impl Slots {
    fn names(&self) -> MutexGuard<'_, HashMap<LockName, BTreeSet<u32>>> {
        lock_unpoisoned(&self.names)
    }

    /// Takes the lowest free slot of `name`.
    pub(crate) fn take(self: &Arc<Self>, name: &LockName) -> Slot {
        let mut names = self.names();
        let used = names.entry(name.clone()).or_default();
        let mut n = 0;
        while used.contains(&n) {
            n += 1;
        }
        used.insert(n);
        Slot {
            slots: Arc::downgrade(self),
            name: name.clone(),
            n,
        }
    }
}

/// One acquisition's key slot on one name; freed on drop.
pub(crate) struct Slot {
    slots: Weak<Slots>,
    name: LockName,
    n: u32,
}

impl Slot {
    /// The slot's key for an acquisition of `kind` in the range `prefix` under `lease`.
    pub(crate) fn key(&self, prefix: &str, lease: i64, kind: &HoldKind) -> String {
        queue_key(prefix, lease, self.n, kind)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(slots) = self.slots.upgrade() else {
            return;
        };
        let mut names = slots.names();
        if let Some(used) = names.get_mut(&self.name) {
            used.remove(&self.n);
            if used.is_empty() {
                names.remove(&self.name);
            }
        }
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("name", &self.name)
            .field("n", &self.n)
            .finish()
    }
}
