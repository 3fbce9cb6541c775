//! Where locks live on the server: lock `NAME` is the directory `<prefix>/<escaped NAME>`,
//! each acquisition a node `_c_<token>-lock-<sequence>` in it (Curator's
//! `InterProcessMutex` layout), each election candidate a node
//! `_c_<token>-latch-<sequence>` whose data is its value (Curator's `LeaderLatch`
//! layout; see [`NodeKind`]).
//!
//! # Broken marks
//! Breaking a hold ([`lock_core::DistributedLock::force_release`]) deletes the holder's
//! node and, in the same transaction, sets the data of the persistent node
//! `<prefix>/%broken` ([`broken_node`]; created by the first break under the prefix) to
//! the owner tokens of the last [`BROKEN_KEPT`] holders broken under it, newest last, one
//! per line (UTF-8, `\n`-separated, no trailing newline): a few kilobytes at most. A hold
//! whose node is gone reads it to tell
//! [`LostReason::Broken`](lock_core::LostReason::Broken) from a plain vanishing.
//!
//! A node of its own beside the lock directories, not the lock directory: every create of
//! this crate sets its lock directory's data to none (`Queue::create` counts the
//! directory's children that way), so an acquisition arriving after the break would wipe
//! a mark kept there before the broken holder reads it. Nor the prefix node itself: its
//! data belongs to the application (Curator users share it, and under a chroot it is
//! `/`). No lock name escapes to `%broken` (see [`BROKEN_SEGMENT`]), so listings skip it.
//! Owner tokens are unique per acquisition, so one list serves every name. Being
//! persistent, the node keeps a container prefix from being reaped.

use lock_core::raw::backend::HoldKind;
use lock_core::{Error, LockName, Result};

use crate::error::BACKEND;

/// Curator's protection prefix.
const PROTECTED: &str = "_c_";
/// The digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// The kind of node an acquisition queues, by the word before its sequence.
///
/// Both kinds queue in one order, by sequence (one counter per directory): a mutex and an
/// election on one name exclude each other. Curator sorts by the text after the last
/// `lock-` (`InterProcessMutex`, `LeaderSelector`) or `latch-` (`LeaderLatch`), so its
/// recipes agree with this order on directories of their own kind only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// `_c_<token>-lock-<seq>`, no data: a mutex hold (Curator's `InterProcessMutex`).
    Lock,
    /// `_c_<token>-latch-<seq>`, the candidate's value as data: an election candidate
    /// (Curator's `LeaderLatch`, whose participant id is the UTF-8 data).
    Latch,
    /// `_c_<token>-lease-<seq>` in `<dir>/leases`: a semaphore permit (Curator's
    /// `InterProcessSemaphoreV2`); ours carry [`permit_data`].
    Lease,
    /// `_c_<token>-__READ__<seq>`: a reader (Curator's `InterProcessReadWriteLock`).
    Read,
    /// `_c_<token>-__WRIT__<seq>`: a writer, or with [`DOWNGRADED`] as data a writer
    /// that downgraded to a reader in its place, or with [`UPGRADEABLE`] an upgradeable
    /// reader.
    Write,
}

impl NodeKind {
    /// The kind of node that holds `kind`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a kind of hold this backend does not grant.
    pub(crate) fn of(kind: &HoldKind) -> Result<Self> {
        match kind {
            HoldKind::Mutex => Ok(NodeKind::Lock),
            HoldKind::Candidate { .. } => Ok(NodeKind::Latch),
            HoldKind::Permit { .. } => Ok(NodeKind::Lease),
            HoldKind::Read => Ok(NodeKind::Read),
            HoldKind::Write | HoldKind::Upgradeable => Ok(NodeKind::Write),
            _ => Err(Error::unsupported(BACKEND, "this kind of hold")),
        }
    }

    /// The word Curator puts before the sequence.
    const fn word(self) -> &'static str {
        match self {
            NodeKind::Lock => "lock-",
            NodeKind::Latch => "latch-",
            NodeKind::Lease => "lease-",
            NodeKind::Read => "__READ__",
            NodeKind::Write => "__WRIT__",
        }
    }

    /// The kind of hold a node of this kind with data `data` is (`None`: unread, or a
    /// candidate's value that is not needed here): a writer's node marked [`DOWNGRADED`]
    /// reads as a reader, one marked [`UPGRADEABLE`] as an upgradeable reader, a lease node as a permit of the count in its data (a Curator
    /// lease, which carries no count, of `u32::MAX`).
    pub fn hold_kind(self, data: Option<&[u8]>) -> HoldKind {
        match self {
            NodeKind::Lock => HoldKind::Mutex,
            NodeKind::Latch => HoldKind::Candidate {
                value: data.map(<[u8]>::to_vec).unwrap_or_default(),
            },
            NodeKind::Lease => HoldKind::permit(data.and_then(permits_in).unwrap_or(u32::MAX)),
            NodeKind::Read => HoldKind::Read,
            NodeKind::Write if data == Some(DOWNGRADED) => HoldKind::Read,
            NodeKind::Write if data == Some(UPGRADEABLE) => HoldKind::Upgradeable,
            NodeKind::Write => HoldKind::Write,
        }
    }
}

/// The child of a semaphore's directory holding the mutex taken while acquiring a permit
/// (Curator's `InterProcessSemaphoreV2`: an `InterProcessMutex` on `<path>/locks`).
pub const SEMAPHORE_LOCKS: &str = "locks";
/// The child of a semaphore's directory holding the lease nodes, one per permit held.
pub const SEMAPHORE_LEASES: &str = "leases";

/// The data of a writer's node that downgraded to a reader in its place: our readers
/// treat the node as a reader, our writers and every Curator client still as a writer.
pub const DOWNGRADED: &[u8] = b"distlock:downgraded";

/// The data of an upgradeable reader's node (a writer's name): our readers treat it as an
/// upgradeable reader, our writers and every Curator client as a writer (which is safe:
/// they wait for it). Created with it, so it is the node's version 0; an upgrade sets
/// the node's data to none (a plain writer's), version 1.
pub const UPGRADEABLE: &[u8] = b"distlock:upgradeable";

/// The data of our reader's node once granted beside an upgradeable reader: set in one
/// transaction with a check that the upgradeable node is still at version 0, so an
/// upgrade (which changes that version first) sees every reader that passed it.
pub const BESIDE: &[u8] = b"distlock:read-beside";

/// What our lease nodes carry before the number of permits.
const PERMITS_DATA: &str = "distlock:permits=";

/// The data of our lease node in a semaphore of `permits`: `distlock:permits=<n>`.
pub fn permit_data(permits: u32) -> Vec<u8> {
    format!("{PERMITS_DATA}{permits}").into_bytes()
}

/// The number of permits in lease node data `data`, if it is ours (a Curator lease node
/// carries its client's address by default, or what its user chose).
pub fn permits_in(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix(PERMITS_DATA)?
        .parse()
        .ok()
}

/// The `locks` and `leases` directories of the semaphore whose directory is `dir`.
pub fn semaphore_dirs(dir: &str) -> (String, String) {
    (
        format!("{dir}/{SEMAPHORE_LOCKS}"),
        format!("{dir}/{SEMAPHORE_LEASES}"),
    )
}

/// The data a node of an acquisition of `kind` carries: a candidate's value, a permit's
/// [`permit_data`], an upgradeable reader's [`UPGRADEABLE`], else none.
pub(crate) fn node_data(kind: &HoldKind) -> std::borrow::Cow<'_, [u8]> {
    match kind {
        HoldKind::Candidate { value } => value.as_slice().into(),
        HoldKind::Permit { permits, .. } => permit_data(*permits).into(),
        HoldKind::Upgradeable => UPGRADEABLE.into(),
        _ => (&[][..]).into(),
    }
}

/// Escapes a lock name into one ZooKeeper path segment.
///
/// `%`, `/` and the characters ZooKeeper rejects are percent-encoded byte by byte; the
/// segments `.` and `..` become `%2E` and `%2E%2E`. Distinct names give distinct
/// segments, and plain names (e.g. `jobs`) are unchanged, so a Curator
/// InterProcessMutex on `<prefix>/jobs` is the same lock as the name `jobs`.
pub fn escape_segment(name: &str) -> String {
    match name {
        "." => return "%2E".to_owned(),
        ".." => return "%2E%2E".to_owned(),
        _ => {}
    }
    lock_core::raw::names::escape_where(name, |c| c == '/' || forbidden_in_path(c))
}

/// The lock name whose directory is the segment `segment` (see [`escape_segment`]), if
/// any: `None` for a segment no name escapes to.
pub(crate) fn unescape_segment(segment: &str) -> Option<LockName> {
    let name = lock_core::raw::names::unescape(segment, escape_segment)?;
    LockName::new(name).ok()
}

/// The directory of lock `name` under `prefix`: `<prefix>/<escaped name>`.
pub fn lock_dir(prefix: &str, name: &LockName) -> String {
    format!("{prefix}/{}", escape_segment(name.as_str()))
}

/// The name start of the nodes of acquisitions with owner token `token` of kind `kind`:
/// `_c_<token>-lock-` or `_c_<token>-latch-`; ZooKeeper appends the sequence.
pub(crate) fn node_marker(token: impl std::fmt::Display, kind: NodeKind) -> String {
    format!("{PROTECTED}{token}-{}", kind.word())
}

/// The owner token in the name of lock node `node`: the text between the protection
/// prefix `_c_` and the `-lock-` or `-latch-` before the sequence (our owner token, or
/// the protection id of a Curator node); `None` for a node without the prefix (e.g. a
/// bare `lock-<sequence>`).
pub(crate) fn owner_token(node: &str) -> Option<&str> {
    let rest = node.strip_prefix(PROTECTED)?;
    let (kind, _) = split_node(rest)?;
    rest[..rest.len() - SEQUENCE_DIGITS - kind.word().len()].strip_suffix('-')
}

/// The kind of lock node `node`: by the word before its sequence.
pub fn node_kind(node: &str) -> Option<NodeKind> {
    split_node(node).map(|(kind, _)| kind)
}

/// The lock nodes among the `children` of a lock directory, in queue order: the names
/// that end in `lock-` or `latch-` and the ten digits ZooKeeper appends to a sequential
/// node (ours and Curator's `_c_<uuid>-lock-<seq>` and `_c_<uuid>-latch-<seq>`), ordered
/// by those digits as Curator orders them. Any other child is no lock node and has no
/// place in the queue, whatever its name sorts like (Curator does not skip it, but can
/// only be blocked by it: it grants the lock or leadership to the first child alone,
/// which is then our first lock node too or none).
pub fn queue_order(children: &[String]) -> Vec<&str> {
    let mut nodes: Vec<(&str, &str)> = children
        .iter()
        .filter_map(|child| Some((sequence(child)?, child.as_str())))
        .collect();
    nodes.sort_unstable();
    nodes.into_iter().map(|(_, child)| child).collect()
}

/// How many broken owner tokens the broken marks keep.
pub(crate) const BROKEN_KEPT: usize = 32;

/// The segment of the node that keeps the broken marks under the prefix. No lock name
/// escapes to it: [`escape_segment`] escapes every `%` of a name, so each `%` it writes
/// starts a `%XX` with two hex digits, and `%b` is none.
pub(crate) const BROKEN_SEGMENT: &str = "%broken";

/// The node keeping the broken marks of the lock directories under `root` (the prefix
/// node, `/` under a chroot without prefix): `<root>/%broken`.
pub fn broken_node(root: &str) -> String {
    format!("{}/{BROKEN_SEGMENT}", root.trim_end_matches('/'))
}

/// The data of the marks node whose data was `data` once the holder with owner token
/// `token` is broken: `token` appended to the broken marks, the oldest dropped beyond
/// [`BROKEN_KEPT`]. Data that is not a list of marks (set by someone else) is replaced.
pub(crate) fn mark_broken(data: &[u8], token: &str) -> Vec<u8> {
    let kept = std::str::from_utf8(data).unwrap_or_default();
    let mut marks: Vec<&str> = kept.lines().filter(|mark| !mark.is_empty()).collect();
    marks.push(token);
    let skip = marks.len().saturating_sub(BROKEN_KEPT);
    marks[skip..].join("\n").into_bytes()
}

/// Whether marks node data `data` marks owner token `token` as broken.
pub(crate) fn is_marked_broken(data: &[u8], token: &str) -> bool {
    std::str::from_utf8(data).is_ok_and(|marks| marks.lines().any(|mark| mark == token))
}

/// The namespace root of the lock directory of the node at `path` (where its broken marks
/// are): two levels up, three for a lease node (in `<dir>/leases`).
pub(crate) fn root_of_node(path: &str) -> &str {
    let dir = parent(path);
    let is_lease = path
        .rsplit('/')
        .next()
        .and_then(node_kind)
        .is_some_and(|kind| kind == NodeKind::Lease);
    parent(if is_lease { parent(dir) } else { dir })
}

/// The owner token of the node at `path` (a lock directory's child), if it has one.
pub(crate) fn owner_token_of_path(path: &str) -> Option<&str> {
    owner_token(path.rsplit('/').next()?)
}

/// The parent of the node at `path`: a lock node's directory, a directory's namespace root.
pub(crate) fn parent(path: &str) -> &str {
    path.rfind('/').map_or(path, |cut| &path[..cut.max(1)])
}

/// The sequence of a lock node: the ten digits after its last `lock-` or `latch-`.
fn sequence(child: &str) -> Option<&str> {
    split_node(child).map(|(_, digits)| digits)
}

/// The kind and sequence of a lock node: a name ending in `lock-` or `latch-` and ten
/// digits.
fn split_node(child: &str) -> Option<(NodeKind, &str)> {
    let cut = child.len().checked_sub(SEQUENCE_DIGITS)?;
    let digits = child.get(cut..)?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let head = &child[..cut];
    [
        NodeKind::Lock,
        NodeKind::Latch,
        NodeKind::Lease,
        NodeKind::Read,
        NodeKind::Write,
    ]
    .into_iter()
    .find(|kind| head.ends_with(kind.word()))
    .map(|kind| (kind, digits))
}

/// Characters ZooKeeper rejects in a path (besides `/` as a separator).
pub(crate) fn forbidden_in_path(c: char) -> bool {
    c.is_control()
        || ('\u{E000}'..='\u{F8FF}').contains(&c)
        || ('\u{FFF0}'..='\u{FFFF}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_one_distinct_segment_each() {
        let names = [
            "jobs",
            "jobs/daily",
            "jobs/",
            "jobs//daily",
            "jobs%2Fdaily",
            "jobs%252Fdaily",
            ".",
            "..",
            "%2E",
            "...",
            "a\u{E000}b",
            "a\u{FFF5}b",
            "zookeeper",
            "jöbs",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let segment = escape_segment(name);
            assert!(!segment.contains('/'), "{name} -> {segment}");
            assert!(segment != "." && segment != "..", "{name} -> {segment}");
            assert!(
                !segment.chars().any(forbidden_in_path),
                "{name} -> {segment}"
            );
            assert!(seen.insert(segment.clone()), "{name} collides: {segment}");
        }
        assert_eq!(escape_segment("jobs"), "jobs");
        assert_eq!(escape_segment("jobs/daily"), "jobs%2Fdaily");
        assert_eq!(escape_segment("..."), "...");
        let name = LockName::new("a/b").unwrap();
        assert_eq!(lock_dir("/locks", &name), "/locks/a%2Fb");
    }

    #[test]
    fn segments_unescape_to_their_names_only() {
        for name in [
            "jobs",
            "jobs/daily",
            "a%b",
            ".",
            "..",
            "...",
            "%2E",
            "a\u{E000}b",
            "jöbs",
        ] {
            let segment = escape_segment(name);
            assert_eq!(
                unescape_segment(&segment).as_ref().map(LockName::as_str),
                Some(name),
                "{segment}"
            );
        }
        for segment in ["%41", "a%2fb", "%", "%2E%2E%2E", "a.%2E", "%0A"] {
            assert_eq!(unescape_segment(segment), None, "{segment}");
        }
    }

    #[test]
    fn broken_marks_keep_the_last_few_tokens() {
        let mut data = Vec::new();
        for i in 0..BROKEN_KEPT + 2 {
            data = mark_broken(&data, &format!("t{i}"));
        }
        assert!(!is_marked_broken(&data, "t0") && !is_marked_broken(&data, "t1"));
        assert!((2..BROKEN_KEPT + 2).all(|i| is_marked_broken(&data, &format!("t{i}"))));
        assert!(!is_marked_broken(&data, "t"), "whole lines only");
        assert_eq!(mark_broken(b"", "a"), b"a");
        assert_eq!(mark_broken(b"a", "b"), b"a\nb");
        assert_eq!(
            mark_broken(&[0xff, 0xfe], "a"),
            b"a",
            "foreign data is replaced"
        );
        assert!(!is_marked_broken(b"", ""));
    }

    #[test]
    fn no_name_escapes_to_the_marks_node() {
        // Decoding inverts escaping, so if any text escaped to the segment, decoding the
        // segment would give it back: `None` proves no name does.
        assert_eq!(
            lock_core::raw::names::unescape(BROKEN_SEGMENT, escape_segment),
            None
        );
        assert_eq!(unescape_segment(BROKEN_SEGMENT), None, "listings skip it");
        for name in [
            BROKEN_SEGMENT,
            "broken",
            "%25broken",
            "%b",
            "%%broken",
            "%BROKEN",
        ] {
            let segment = escape_segment(name);
            assert_ne!(segment, BROKEN_SEGMENT, "{name}");
            // Every `%` an escape writes starts two hex digits: never `%b` followed by `r`.
            for (i, _) in segment.match_indices('%') {
                let digits = segment.get(i + 1..i + 3).unwrap_or_default();
                assert!(
                    digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{name} -> {segment}"
                );
            }
        }
        assert_eq!(broken_node("/locks"), "/locks/%broken");
        assert_eq!(broken_node("/"), "/%broken");
        assert_eq!(broken_node("/a/b"), "/a/b/%broken");
    }

    #[test]
    fn parents_of_nodes_and_directories() {
        let node = "/a/locks/x%2Fy/_c_t-lock-0000000001";
        assert_eq!(parent(node), "/a/locks/x%2Fy");
        assert_eq!(parent(parent(node)), "/a/locks");
        assert_eq!(owner_token_of_path(node), Some("t"));
        assert_eq!(parent("/locks"), "/");
    }

    #[test]
    fn nodes_queue_by_sequence_like_curator_and_other_children_not_at_all() {
        let children = [
            "_c_9e1-lock-0000000003",
            "foo",
            "lock-",
            "lock-abc",
            "x-lock-0",
            "0000000000",
            "_c_a22-lock-0000000001",
            "lock-0000000000",
            "_c_0b7-lock-0000000002",
            "_c_0b7-lock-00000000021",
        ]
        .map(String::from);
        assert_eq!(
            queue_order(&children),
            [
                "lock-0000000000",
                "_c_a22-lock-0000000001",
                "_c_0b7-lock-0000000002",
                "_c_9e1-lock-0000000003",
            ]
        );
        assert!(queue_order(&[]).is_empty());
    }

    #[test]
    fn latch_and_lock_nodes_queue_together_by_sequence() {
        let children = [
            "_c_b-latch-0000000004",
            "_c_a-lock-0000000002",
            "latch-0000000003",
            "_c_c-latch-000000001",
            "_c_d-latch-0000000001x",
            "_c_e-clutch-0000000000",
        ]
        .map(String::from);
        assert_eq!(
            queue_order(&children),
            [
                "_c_a-lock-0000000002",
                "latch-0000000003",
                "_c_b-latch-0000000004"
            ]
        );
        assert_eq!(node_kind("_c_a-lock-0000000002"), Some(NodeKind::Lock));
        assert_eq!(node_kind("latch-0000000003"), Some(NodeKind::Latch));
        assert_eq!(node_kind("_c_e-clutch-0000000000"), None);
        assert_eq!(node_kind("é0000000000"), None);
    }

    #[test]
    fn owner_tokens_are_read_between_the_protection_prefix_and_lock() {
        let ours = format!(
            "{}0000000007",
            node_marker("dual-9e1b-lock-x", NodeKind::Lock)
        );
        assert_eq!(owner_token(&ours), Some("dual-9e1b-lock-x"));
        let ours = format!(
            "{}0000000007",
            node_marker("dual-9e1b-latch-x", NodeKind::Latch)
        );
        assert_eq!(owner_token(&ours), Some("dual-9e1b-latch-x"));
        assert_eq!(node_kind(&ours), Some(NodeKind::Latch));
        assert_eq!(
            owner_token("_c_53345f98-9423-4e0c-a7b5-9f819e3ec2e1-latch-0000000003"),
            Some("53345f98-9423-4e0c-a7b5-9f819e3ec2e1")
        );
        assert_eq!(owner_token("latch-0000000000"), None);
        assert_eq!(
            owner_token("_c_c2a0e1f4-5b6d-4c3e-8f9a-0b1c2d3e4f50-lock-0000000001"),
            Some("c2a0e1f4-5b6d-4c3e-8f9a-0b1c2d3e4f50")
        );
        assert_eq!(owner_token("lock-0000000000"), None);
        assert_eq!(owner_token("x-lock-0000000000"), None);
        assert_eq!(owner_token("_c_lock-0000000000"), None);
    }

    #[test]
    fn semaphore_and_read_write_nodes_are_curators() {
        let read = "_c_5b1e-__READ__0000000001";
        let write = "_c_77aa-__WRIT__0000000002";
        let lease = "_c_9c3d-lease-0000000000";
        assert_eq!(node_kind(read), Some(NodeKind::Read));
        assert_eq!(node_kind(write), Some(NodeKind::Write));
        assert_eq!(node_kind(lease), Some(NodeKind::Lease));
        assert_eq!(owner_token(read), Some("5b1e"));
        assert_eq!(owner_token(write), Some("77aa"));
        assert_eq!(owner_token(lease), Some("9c3d"));
        let children = [write, read, "__READ__", "_c_x-__READ__1"].map(String::from);
        assert_eq!(queue_order(&children), [read, write]);
        assert_eq!(
            node_marker("t", NodeKind::of(&HoldKind::Read).unwrap()),
            "_c_t-__READ__"
        );
        assert_eq!(
            node_marker("t", NodeKind::of(&HoldKind::Write).unwrap()),
            "_c_t-__WRIT__"
        );
        let permit = HoldKind::permit(3);
        assert_eq!(
            node_marker("t", NodeKind::of(&permit).unwrap()),
            "_c_t-lease-"
        );
        assert_eq!(
            NodeKind::Write.hold_kind(Some(DOWNGRADED)),
            HoldKind::Read,
            "a downgraded writer reads as a reader"
        );
        assert_eq!(NodeKind::Write.hold_kind(None), HoldKind::Write);
        // An upgradeable reader queues a writer's node (Curator waits for it).
        assert_eq!(
            NodeKind::of(&HoldKind::Upgradeable).unwrap(),
            NodeKind::Write
        );
        assert_eq!(
            NodeKind::Write.hold_kind(Some(&node_data(&HoldKind::Upgradeable))),
            HoldKind::Upgradeable
        );
        assert_eq!(NodeKind::Write.hold_kind(Some(&[])), HoldKind::Write);
        assert_eq!(
            semaphore_dirs("/locks/s"),
            ("/locks/s/locks".to_owned(), "/locks/s/leases".to_owned())
        );
    }

    #[test]
    fn lease_data_carries_the_permits() {
        assert_eq!(permits_in(&permit_data(4)), Some(4));
        assert_eq!(permits_in(b"10.0.0.1"), None, "Curator's default data");
        assert_eq!(permits_in(b"distlock:permits=x"), None);
        assert_eq!(permits_in(&[0xff]), None);
        assert_eq!(
            NodeKind::Lease.hold_kind(Some(b"10.0.0.1")),
            HoldKind::permit(u32::MAX)
        );
    }

    #[test]
    fn broken_marks_of_lease_nodes_are_under_the_prefix() {
        assert_eq!(root_of_node("/p/name/leases/_c_t-lease-0000000001"), "/p");
        assert_eq!(root_of_node("/p/name/_c_t-__WRIT__0000000001"), "/p");
        assert_eq!(root_of_node("/p/leases/_c_t-lock-0000000001"), "/p");
    }
}
