//! Where locks live on etcd: the layout of the Go client's `concurrency.Mutex`.
//!
//! A lock `NAME` is the key range `<prefix>/<NAME>/` ([`lock_prefix`]). Each contender
//! puts `<prefix>/<NAME>/<lease id in hex>` attached to its client's lease; the holder is
//! the key with the lowest create revision, the rest queue in create revision order
//! (FIFO). The create revision of the holder's key is its fencing token. The value of
//! our keys is the acquisition's owner token (the Go client puts an empty value and
//! never reads it), so that an inspection can tell who queues.
//!
//! Concurrent acquisitions of one name in one client each queue on the server at once,
//! under a key of their own: the first under the plain `<lease id in hex>`, the others
//! under `<lease id in hex>_<n>` (n ≥ 1), so a later waiter of another client never
//! overtakes them ([`queue_key`]). The Go client's `Mutex` orders every key under the
//! range by create revision, whatever its name, so the extra keys exclude `etcdctl lock`
//! as well.

use etcd_client::{GetOptions, SortOrder, SortTarget};
use lock_core::LockName;

/// The key range of lock `name` under `prefix`: `<prefix>/<escaped name>/` (or
/// `<escaped name>/` with an empty prefix). Every key of the lock's queue starts with it.
///
/// `%` and `/` in a name are percent-encoded, so `jobs` and `jobs/daily` never share a
/// range; a name without them is used as is.
pub(crate) fn lock_prefix(prefix: &str, name: &LockName) -> String {
    let escaped = lock_core::raw::escape(name.as_str(), &['/']);
    if prefix.is_empty() {
        format!("{escaped}/")
    } else {
        format!("{prefix}/{escaped}/")
    }
}

/// The queue key of this client's acquisition number `n` (see the module docs) in the
/// range `prefix` under lease `lease`: `<prefix><lease hex>`, or `<prefix><lease hex>_<n>`
/// for n ≥ 1.
pub(crate) fn queue_key(prefix: &str, lease: i64, n: u32) -> String {
    match n {
        0 => format!("{prefix}{lease:x}"),
        n => format!("{prefix}{lease:x}_{n}"),
    }
}

/// Range options for "the key created first under the prefix" (the owner).
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_disjoint_ranges() {
        let name = |n: &str| LockName::new(n).expect("valid");
        assert_eq!(lock_prefix("", &name("jobs")), "jobs/");
        assert_eq!(lock_prefix("", &name("jobs/daily")), "jobs%2Fdaily/");
        assert_eq!(lock_prefix("locks", &name("jobs")), "locks/jobs/");
        assert_eq!(lock_prefix("locks", &name("a%2Fb")), "locks/a%252Fb/");
        // No range is a prefix of another's keys: escaped names hold no `/`.
        let a = lock_prefix("p", &name("jobs"));
        let b = lock_prefix("p", &name("jobs/daily"));
        assert!(!b.starts_with(&a) && !a.starts_with(&b));
    }

    #[test]
    fn queue_keys_are_the_lease_in_hex_then_the_slot() {
        assert_eq!(queue_key("locks/jobs/", 0x1f, 0), "locks/jobs/1f");
        assert_eq!(queue_key("locks/jobs/", 0x1f, 2), "locks/jobs/1f_2");
    }
}
