//! Where locks live on etcd: the layout of the Go client's `concurrency.Mutex`.
//!
//! A lock `NAME` is the key range `<prefix>/<NAME>/` ([`lock_prefix`]). Each contender
//! puts a key `<prefix>/<NAME>/<lease id in hex>…` attached to its client's lease; the
//! holder is the key with the lowest create revision, the rest queue in create revision
//! order (FIFO), whatever their names. The create revision of the holder's key is its
//! fencing token.
//!
//! The Go client's `concurrency.Election` uses the very same layout, with the
//! candidate's proposal as the value: so does an election's candidate here
//! ([`HoldKind::Candidate`](lock_core::raw::backend::HoldKind)), under the plain
//! `<prefix>/<NAME>/<lease id in hex>`. The leader is the key created first, its term
//! that key's create revision, and a proclaim rewrites the value in place (same key,
//! same create revision, same lease).
//!
//! Concurrent acquisitions of one name in one client each queue on the server at once,
//! under a key of their own: the first under `<lease id in hex>`, the others under
//! `<lease id in hex>_<n>` (n ≥ 1), so a later waiter of another client never
//! overtakes them ([`queue_key`]). The Go client's `Mutex` orders every key under the
//! range by create revision, whatever its name, so the extra keys exclude `etcdctl lock`
//! as well.
//!
//! # Our entries, and proposals
//! Every entry of ours but a candidate's queues under the same keys with `.kind` after
//! them (`<lease id in hex>[_<n>].kind`, one per acquisition under way, so one client may
//! hold several permits or reads of one name at once; [`queue_key`]), and its value
//! says its kind and owner token ([`entry_value`]): the bare owner token for a mutex,
//! `permit/<permits>/<owner token>` (a hold of one permit),
//! `permit/<permits>/<count>/<owner token>` (of `count` permits, at once: one key, one
//! create revision, one fencing token), `read/<owner token>`, `write/<owner token>` or
//! `upgradeable/<owner token>`. The
//! key, which no user chooses, tells our values from proposals ([`Entry::of`]): the value
//! of a key ending in `.kind` is ours (a tag or an owner token; anything else there reads
//! as a mutex's) and no proposal; the value of any other key (a candidate's, ours or the
//! Go client's `Election`'s; the Go client's `Mutex`'s empty value) is a proposal,
//! whatever it says, and its entry a mutex's to the grant rule. So no proposal is ever
//! taken for another kind or for an owner token, and a mutex's holder leads an election
//! with an empty value. An entry is granted when [`HoldKind::granted_behind`] admits it behind
//! the entries created before it; a downgrade rewrites `write/<token>` to
//! `read/<token>` in place (same key, same create revision, same lease), so the entry
//! keeps its place. A reader granted beside an upgradeable reader ahead
//! (`upgradeable/<token>`) is granted by a transaction that rewrites its own key in
//! place on the condition that the upgradeable entry is unchanged
//! ([`passed_upgradeable`]); an upgrade rewrites `upgradeable/<token>` to
//! `write/<token>` in place, so no reader passes it afterwards, and it holds alone once
//! no entry is ahead of it and no reader behind it passed it.
//!
//! Earlier versions put all these values under plain keys. Such an entry reads as a
//! candidate's here (a tag or an owner token shown as its proposal), so a client of this
//! version never holds beside it: a mutex or a candidate queues behind it, a permit, a
//! reader or a writer fails with a conflict until it goes (with its holder's lease at the
//! latest). An earlier client reads this version's entries by their values, which are
//! the same.
//!
//! # Marks of broken holds
//! Breaking a hold (an operator's forced release) deletes the holder's key and, in the
//! same transaction, puts a *mark* `<prefix>/%broken/<escaped name>/<lease hex>[_<n>]`
//! ([`broken_mark`]) whose value is the broken key's create revision, on a lease of its
//! own granted three times the holder's lease TTL, at least `mark_ttl` (60 s), so it
//! outlives the holder's next renewal. The holder's renewal or release, finding its key
//! gone, reads the mark to tell "broken" from "vanished"; the release revokes its lease.
//! The segment `%broken` is no escaped name (the escape writes `%` only before two
//! uppercase hex digits), so no lock range holds a mark and no mark range holds a lock's
//! key; the Go client's `Mutex` only reads its own range, so it never sees one either
//! (unless someone runs `etcdctl lock` on a name starting with `%broken/`, which no name
//! of ours maps to).

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use lock_core::migration::DUAL_TOKEN_PREFIX;
use lock_core::raw::{
    backend::HoldKind,
    names::{escape, unescape},
};
use lock_core::LockName;

/// The characters a name's segment escapes, besides `%`.
const RESERVED: &[char] = &['/'];

/// The segment under the prefix that holds the marks of broken holds.
const BROKEN: &str = "%broken";

/// What every key of a client starts with: `<prefix>/`, or nothing with an empty prefix.
fn root(prefix: &str) -> String {
    if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    }
}

/// The key range of lock `name` under `prefix`: `<prefix>/<escaped name>/` (or
/// `<escaped name>/` with an empty prefix). Every key of the lock's queue starts with it.
///
/// `%` and `/` in a name are percent-encoded, so `jobs` and `jobs/daily` never share a
/// range; a name without them is used as is.
pub(crate) fn lock_prefix(prefix: &str, name: &LockName) -> String {
    format!("{}{}/", root(prefix), escape(name.as_str(), RESERVED))
}

/// What the key of every lock whose name starts with `name_prefix` starts with. The
/// escape maps each character on its own to a code that no other code starts, so a
/// name starts with `name_prefix` exactly when its escape starts with `name_prefix`'s.
pub(crate) fn names_under(prefix: &str, name_prefix: &str) -> String {
    format!("{}{}", root(prefix), escape(name_prefix, RESERVED))
}

/// The lock whose queue key `key` is (on lease `lease`): `<prefix>/<escaped name>/`
/// then the lease in hex, optionally `_<n>`, optionally `.kind` ([`queue_key`]). `None`
/// for any other key: a mark, a key of another layout, a key whose name is not its
/// lease's.
pub(crate) fn lock_of_key(prefix: &str, key: &[u8], lease: i64) -> Option<LockName> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(&root(prefix))?;
    let (segment, leaf) = rest.split_once('/')?;
    let leaf = leaf.strip_suffix(TAGGED).unwrap_or(leaf);
    let slot = match leaf.split_once('_') {
        None => 0,
        Some((_, n)) => n.parse().ok().filter(|&n| n > 0)?,
    };
    if lease <= 0 || leaf != plain_key("", lease, slot) {
        return None;
    }
    LockName::new(unescape(segment, |name| escape(name, RESERVED))?).ok()
}

/// The mark left when the hold of `key` (a queue key under `prefix`) is broken:
/// `<prefix>/%broken/` then `key` without `<prefix>/`.
pub(crate) fn broken_mark(prefix: &str, key: &str) -> String {
    let root = root(prefix);
    format!("{root}{BROKEN}/{}", key.strip_prefix(&root).unwrap_or(key))
}

/// The end of the range of every key that starts with `start` (etcd's rule: the last
/// byte below 0xFF raised by one; `\0`, meaning "no end", when there is none).
pub(crate) fn range_end(start: &[u8]) -> Vec<u8> {
    match start.iter().rposition(|&byte| byte < 0xFF) {
        Some(i) => {
            let mut end = start[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

/// The queue key of this client's acquisition number `n` (see the module docs), of
/// `kind`, in the range `prefix` under lease `lease`: [`plain_key`] for a candidate,
/// then `.kind` for any other kind.
pub(crate) fn queue_key(prefix: &str, lease: i64, n: u32, kind: &HoldKind) -> String {
    let plain = plain_key(prefix, lease, n);
    match kind {
        HoldKind::Candidate { .. } => plain,
        _ => plain + TAGGED,
    }
}

/// `<prefix><lease hex>`, or `<prefix><lease hex>_<n>` for n ≥ 1: the key of a
/// candidate (see [`queue_key`]).
fn plain_key(prefix: &str, lease: i64, n: u32) -> String {
    match n {
        0 => format!("{prefix}{lease:x}"),
        n => format!("{prefix}{lease:x}_{n}"),
    }
}

/// The key of the same acquisition number and lease as queue key `key`, in the other
/// form (with `.kind` or without). Never a live acquisition's: only a leftover of this
/// client's earlier acquisition of another kind under that number.
pub(crate) fn twin_key(key: &str) -> String {
    match key.strip_suffix(TAGGED) {
        Some(plain) => plain.to_owned(),
        None => format!("{key}{TAGGED}"),
    }
}

/// What the key of an acquisition of `kind` with owner token `token` stores (see the
/// module docs): a candidate's proposal, a mutex's owner token, or the kind then the
/// owner token for a permit, a reader or a writer.
pub(crate) fn entry_value(kind: &HoldKind, token: &str) -> Option<Vec<u8>> {
    let value = match kind {
        HoldKind::Mutex => token.to_owned(),
        HoldKind::Candidate { value } => return Some(value.clone()),
        HoldKind::Permit { permits, count: 1 } => format!("{PERMIT}{permits}/{token}"),
        HoldKind::Permit { permits, count } => format!("{PERMIT}{permits}/{count}/{token}"),
        HoldKind::Read => format!("{READ}{token}"),
        HoldKind::Write => format!("{WRITE}{token}"),
        HoldKind::Upgradeable => format!("{UPGRADEABLE}{token}"),
        _ => return None,
    };
    Some(value.into_bytes())
}

/// What ends the key of an entry whose value is ours, not a proposal (see the module
/// docs).
const TAGGED: &str = ".kind";
/// The value tag of a permit's entry (then the permits, `/` and the owner token).
const PERMIT: &str = "permit/";
/// The value tag of a reader's entry (then the owner token).
const READ: &str = "read/";
/// The value tag of a writer's entry (then the owner token).
const WRITE: &str = "write/";
/// The value tag of an upgradeable reader's entry (then the owner token).
const UPGRADEABLE: &str = "upgradeable/";

/// Whether `kv` is a reader's entry granted beside an upgradeable reader ahead of it: the
/// grant rewrote it in place (same value and lease), on the condition that the
/// upgradeable entry was unchanged, so its mod revision is above its create revision.
/// (A writer's entry that downgraded is one too, but none can be behind an upgradeable
/// reader that holds: it would have waited for it.)
pub(crate) fn passed_upgradeable(kv: &KeyValue) -> bool {
    kv.mod_revision() > kv.create_revision()
        && Entry::of(kv.key(), kv.value()).kind == HoldKind::Read
}
/// What one queue key says of itself, read from its name and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The kind of hold it asks for: [`HoldKind::Mutex`] for any entry that is not a
    /// permit's, a reader's or a writer's (a mutex's, a candidate's, the Go client's).
    pub(crate) kind: HoldKind,
    /// Its owner token, where the value of a `.kind` key holds one of ours.
    pub(crate) owner: Option<String>,
    /// The value of a plain key, unless empty: a candidate's proposal, whatever it says.
    pub(crate) proposal: Option<Vec<u8>>,
}

impl Entry {
    /// The entry whose key `key` stores `value` ([`queue_key`] and [`entry_value`]'s
    /// inverse). Only the value of a key ending in `.kind` is ours: a tag followed by
    /// anything but an owner token (and, for a permit, a number written plainly) is no
    /// tag, and such an entry reads as a mutex's, never as a shared kind. The value of
    /// any other key is a proposal.
    pub(crate) fn of(key: &[u8], value: &[u8]) -> Entry {
        if !key.ends_with(TAGGED.as_bytes()) {
            return Entry {
                kind: HoldKind::Mutex,
                owner: None,
                proposal: (!value.is_empty()).then(|| value.to_vec()),
            };
        }
        let text = std::str::from_utf8(value).unwrap_or("");
        let token = |rest: &str| reads_as_owner_token(rest).then(|| rest.to_owned());
        let tagged = if let Some(rest) = text.strip_prefix(PERMIT) {
            number_then(rest).and_then(|(permits, rest)| {
                let (count, rest) = match token(rest) {
                    Some(_) => (1, rest),
                    None => number_then(rest).filter(|(count, _)| *count <= permits)?,
                };
                token(rest).map(|owner| (HoldKind::Permit { permits, count }, owner))
            })
        } else if let Some(rest) = text.strip_prefix(READ) {
            token(rest).map(|owner| (HoldKind::Read, owner))
        } else if let Some(rest) = text.strip_prefix(WRITE) {
            token(rest).map(|owner| (HoldKind::Write, owner))
        } else if let Some(rest) = text.strip_prefix(UPGRADEABLE) {
            token(rest).map(|owner| (HoldKind::Upgradeable, owner))
        } else {
            None
        };
        let (kind, owner) = match tagged {
            Some((kind, owner)) => (kind, Some(owner)),
            None => (HoldKind::Mutex, token(text)),
        };
        Entry {
            kind,
            owner,
            proposal: None,
        }
    }
}

/// A number above 0 written plainly at the start of `text`, then `/`: the number and the
/// rest.
fn number_then(text: &str) -> Option<(u32, &str)> {
    let (number, rest) = text.split_once('/')?;
    let n: u32 = number.parse().ok()?;
    (n.to_string() == number && n > 0).then_some((n, rest))
}

/// Whether `text` has the form of the owner tokens distlock stores: a lowercase hyphenated
/// UUID, optionally after [`DUAL_TOKEN_PREFIX`] (a dual hold's).
pub(crate) fn reads_as_owner_token(text: &str) -> bool {
    let uuid = text.strip_prefix(DUAL_TOKEN_PREFIX).unwrap_or(text);
    uuid.len() == 36
        && uuid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// Range options for the head of a queue that an entry of `kind` reads beside its put
/// (in create order, up to and including its own key): enough to tell whether it is
/// granted at once. An exclusive kind reads the first key (the owner: granted when it is
/// ours), a permit of `n` the first n + 1 (granted when ours is among them), a reader or
/// an upgradeable reader all of them (granted when no writer is before ours).
pub(crate) fn queue_head(kind: &HoldKind) -> GetOptions {
    let limit = match kind {
        // Every entry ahead takes a permit at least.
        HoldKind::Permit { permits, .. } => i64::from(*permits) + 1,
        HoldKind::Read | HoldKind::Upgradeable => 0,
        _ => 1,
    };
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(limit)
}

/// How many of the entries just ahead of its own an exclusive waiter reads: its
/// predecessor, which it waits for, and the one before, whose delete tells it to re-check
/// before the predecessor goes (see [`crate::queue`]).
pub(crate) const NEAREST: usize = 2;

/// Range options for the entries ahead of ours (created at `revision`) that a waiter of
/// `kind` re-checks: the [`NEAREST`] just before it for an exclusive kind (the mutex's
/// predecessor and the one before), all of them otherwise ([`reads_all_ahead`]).
pub(crate) fn entries_ahead(kind: &HoldKind, revision: i64) -> GetOptions {
    let ahead = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(revision - 1);
    if reads_all_ahead(kind) {
        ahead.with_sort(SortTarget::Create, SortOrder::Ascend)
    } else {
        ahead
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(NEAREST as i64)
    }
}

/// Whether a waiter of `kind` reads every entry ahead of its own (a permit, a reader, an
/// upgradeable reader), not only the nearest (an exclusive kind).
pub(crate) fn reads_all_ahead(kind: &HoldKind) -> bool {
    kind.is_shared() || *kind == HoldKind::Upgradeable
}

/// Range options for the last keys of a queue by create revision: the key just put (the
/// newest) and the [`NEAREST`] entries before it, newest first.
pub(crate) fn queue_tail() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(NEAREST as i64 + 1)
}

/// Range options for "the key created first under the prefix" (the owner).
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

#[cfg(test)]
mod tests;
