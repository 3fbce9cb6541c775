//! Unit tests of the key layout.

use super::*;

fn candidate() -> HoldKind {
    HoldKind::Candidate { value: Vec::new() }
}

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

/// Marks live apart from every lock range: no range holds a mark, no mark range holds
/// a queue key, and no mark reads as a lock's key; whatever the name, `%` and `/`
/// included, with and without a prefix.
#[test]
fn marks_never_share_a_lock_range() {
    let names = [
        "jobs",
        "%broken",
        "%broken/jobs",
        "%25broken",
        "%",
        "/",
        "a/%broken",
        "%2F",
        "broken",
        "%BROKEN",
        "日本",
    ];
    for prefix in ["", "locks", "a/b"] {
        let marks = broken_mark(prefix, &format!("{}x/1f", root(prefix)));
        let marks = marks.trim_end_matches("x/1f");
        assert!(marks.ends_with("%broken/"), "{marks}");
        for (name, kind) in names
            .iter()
            .flat_map(|n| [(n, candidate()), (n, HoldKind::Read)])
        {
            let name = LockName::new(*name).expect("valid");
            let range = lock_prefix(prefix, &name);
            let key = queue_key(&range, 0x1f, 0, &kind);
            let mark = broken_mark(prefix, &key);
            assert!(!mark.starts_with(&range), "{mark} in {range}");
            assert!(!key.starts_with(marks), "{key} among the marks {marks}");
            assert!(!range.starts_with(marks) && !marks.starts_with(&range));
            assert_eq!(lock_of_key(prefix, key.as_bytes(), 0x1f), Some(name));
            assert_eq!(lock_of_key(prefix, mark.as_bytes(), 0x1f), None, "{mark}");
        }
    }
    // The reason: every `%` the escape writes opens `%XX` (two uppercase hex
    // digits), whatever the characters around it, so no escaped name is `%broken`.
    let chars = (' '..='~').chain(['é', '日', '\u{10FFFF}']);
    for c in chars {
        let range = lock_prefix("", &LockName::new(format!("{c}%{c}/b{c}")).expect("valid"));
        let segment = range.strip_suffix('/').expect("a range ends with /");
        assert!(!segment.contains('/'), "{segment}");
        for (i, _) in segment.match_indices('%') {
            let code = segment.get(i + 1..i + 3).expect("two digits after %");
            assert!(
                code.chars()
                    .all(|d| d.is_ascii_digit() || ('A'..='F').contains(&d)),
                "{segment}"
            );
        }
    }
    assert_eq!(
        broken_mark("locks", "locks/a%2Fb/1f_2"),
        "locks/%broken/a%2Fb/1f_2"
    );
    assert_eq!(broken_mark("", "jobs/1f"), "%broken/jobs/1f");
}

#[test]
fn only_queue_keys_name_a_lock() {
    let name = |n: &str| Some(LockName::new(n).expect("valid"));
    let of = |key: &str, lease| lock_of_key("p", key.as_bytes(), lease);
    assert_eq!(of("p/jobs/1f", 0x1f), name("jobs"));
    assert_eq!(of("p/jobs/1f_3", 0x1f), name("jobs"));
    assert_eq!(of("p/jobs/1f.kind", 0x1f), name("jobs"));
    assert_eq!(of("p/jobs/1f_3.kind", 0x1f), name("jobs"));
    assert_eq!(of("p/a%2Fb%25/1f", 0x1f), name("a/b%"));
    for (key, lease) in [
        ("p/jobs/1f", 0x2f),
        ("p/jobs/1f", 0),
        ("p/jobs/1f_0", 0x1f),
        ("p/jobs/1f_03", 0x1f),
        ("p/jobs/1f.kind_3", 0x1f),
        ("p/jobs/1f.kind.kind", 0x1f),
        ("p/jobs/1f.KIND", 0x1f),
        ("p/jobs/.kind", 0x1f),
        ("p/jobs/1f_", 0x1f),
        ("p/jobs/1F", 0x1f),
        ("p/jobs/x/1f", 0x1f),
        ("p/a/b/1f", 0x1f),
        ("p/a%41/1f", 0x1f),
        ("p/a%2f/1f", 0x1f),
        ("p/%broken/jobs/1f", 0x1f),
        ("q/jobs/1f", 0x1f),
        ("p/jobs", 0x1f),
        ("p//1f", 0x1f),
    ] {
        assert_eq!(of(key, lease), None, "{key} on lease {lease:x}");
    }
}

#[test]
fn names_under_a_prefix_share_its_escape() {
    let texts = [
        "",
        "jobs",
        "jobs/",
        "jobs/daily",
        "jobs-x",
        "a%",
        "a%b",
        "a%2",
        "a/",
        "%",
    ];
    for under in texts {
        let start = names_under("p", under);
        for name in texts.iter().filter(|n| !n.is_empty()) {
            let range = lock_prefix("p", &LockName::new(*name).expect("valid"));
            assert_eq!(
                range.starts_with(&start),
                name.starts_with(under),
                "{name} under {under:?}"
            );
        }
    }
    assert_eq!(names_under("", ""), "");
    assert_eq!(range_end(b"p/a"), b"p/b");
    assert_eq!(range_end(b"a\xff"), b"b");
    assert_eq!(range_end(b""), b"\0");
}

#[test]
fn only_token_shaped_values_read_as_owner_tokens() {
    for token in [
        "67e55044-10b1-426f-9247-bb680e5fe0c8",
        "dual-67e55044-10b1-426f-9247-bb680e5fe0c8",
    ] {
        assert!(reads_as_owner_token(token), "{token}");
    }
    for value in [
        "",
        "10.0.0.1:8080",
        "67E55044-10B1-426F-9247-BB680E5FE0C8",
        "67e55044-10b1-426f-9247-bb680e5fe0c",
        "67e55044x10b1-426f-9247-bb680e5fe0c8",
        "dual-",
        "x-67e55044-10b1-426f-9247-bb680e5fe0c8",
    ] {
        assert!(!reads_as_owner_token(value), "{value}");
    }
}

#[test]
fn entries_say_their_kind_and_owner() {
    let token = "67e55044-10b1-426f-9247-bb680e5fe0c8";
    let dual = format!("dual-{token}");
    for kind in [
        HoldKind::Mutex,
        HoldKind::permit(4),
        HoldKind::Permit {
            permits: 4,
            count: 3,
        },
        HoldKind::Read,
        HoldKind::Write,
        HoldKind::Upgradeable,
    ] {
        let key = queue_key("p/jobs/", 0x1f, 1, &kind);
        for owner in [token, dual.as_str()] {
            let value = entry_value(&kind, owner).expect("a value");
            let entry = Entry::of(key.as_bytes(), &value);
            assert_eq!(entry.kind, kind, "{}", String::from_utf8_lossy(&value));
            assert_eq!(entry.owner.as_deref(), Some(owner));
        }
    }
    assert_eq!(
        entry_value(&HoldKind::permit(4), token).expect("a value"),
        format!("permit/4/{token}").into_bytes()
    );
    let three = HoldKind::Permit {
        permits: 4,
        count: 3,
    };
    assert_eq!(
        entry_value(&three, token).expect("a value"),
        format!("permit/4/3/{token}").into_bytes()
    );
    // A count above the permits, or 0, is no tag: the entry reads as a mutex's.
    let tagged = queue_key("p/jobs/", 0x1f, 1, &three);
    for bad in [format!("permit/4/5/{token}"), format!("permit/4/0/{token}")] {
        let entry = Entry::of(tagged.as_bytes(), bad.as_bytes());
        assert_eq!(entry.kind, HoldKind::Mutex, "{bad}");
    }
    assert_eq!(
        entry_value(&HoldKind::Write, token).expect("a value"),
        format!("write/{token}").into_bytes()
    );
    // Our entries are no proposals.
    let mutex = queue_key("p/jobs/", 0x1f, 0, &HoldKind::Mutex);
    assert_eq!(Entry::of(mutex.as_bytes(), token.as_bytes()).proposal, None);
    // A candidate's proposal is stored as is, under a plain key, and reads as a
    // mutex's entry with that proposal, whatever it says: a proposal shaped like a
    // tag or an owner token is neither.
    let proposal = HoldKind::Candidate {
        value: b"10.0.0.1:80".to_vec(),
    };
    let plain = queue_key("p/jobs/", 0x1f, 0, &proposal);
    assert_eq!(plain, "p/jobs/1f");
    assert_eq!(
        entry_value(&proposal, token).expect("a value"),
        b"10.0.0.1:80"
    );
    let kinds = [
        HoldKind::Mutex,
        HoldKind::permit(4),
        HoldKind::Permit {
            permits: 4,
            count: 3,
        },
        HoldKind::Read,
        HoldKind::Write,
        HoldKind::Upgradeable,
    ];
    for kind in kinds {
        let value = entry_value(&kind, token).expect("a value");
        for key in [plain.as_str(), "p/jobs/1f_2"] {
            let entry = Entry::of(key.as_bytes(), &value);
            let shown = String::from_utf8_lossy(&value);
            assert_eq!(entry.kind, HoldKind::Mutex, "{shown}");
            assert_eq!(entry.owner, None, "{shown}");
            assert_eq!(entry.proposal.as_ref(), Some(&value), "{shown}");
        }
    }
    assert_eq!(Entry::of(plain.as_bytes(), b"").proposal, None);
    // Near misses are no tags: they read as a mutex's entry, never as a shared kind.
    let tagged = queue_key("p/jobs/", 0x1f, 0, &HoldKind::Read);
    for value in [
        String::new(),
        "read/".into(),
        "read/x".into(),
        format!("permit/04/{token}"),
        format!("permit/-1/{token}"),
        format!("permit/4{token}"),
        format!("permit//{token}"),
        format!("READ/{token}"),
        format!("write/{token}/"),
        format!("reader/{token}"),
        "upgradeable/x".into(),
        format!("upgradeable/{token}/"),
        format!("upgradeable{token}"),
        format!("permit/4/03/{token}"),
        "permit/4/3/x".into(),
        format!("permit/4/3/{token}/"),
    ] {
        let entry = Entry::of(tagged.as_bytes(), value.as_bytes());
        assert_eq!(entry.kind, HoldKind::Mutex, "{value}");
        assert_eq!(entry.proposal, None, "{value}");
    }
    assert_eq!(
        Entry::of(tagged.as_bytes(), b"\xff\xfe").kind,
        HoldKind::Mutex
    );
}

#[test]
fn queue_keys_are_the_lease_in_hex_then_the_slot() {
    let candidate = candidate();
    assert_eq!(
        queue_key("locks/jobs/", 0x1f, 0, &candidate),
        "locks/jobs/1f"
    );
    assert_eq!(
        queue_key("locks/jobs/", 0x1f, 2, &candidate),
        "locks/jobs/1f_2"
    );
    let mutex = HoldKind::Mutex;
    assert_eq!(queue_key("l/", 0x1f, 0, &mutex), "l/1f.kind");
    let permit = HoldKind::permit(2);
    assert_eq!(queue_key("l/", 0x1f, 0, &permit), "l/1f.kind");
    assert_eq!(queue_key("l/", 0x1f, 2, &HoldKind::Write), "l/1f_2.kind");
    assert_eq!(twin_key("l/1f_2.kind"), "l/1f_2");
    assert_eq!(twin_key("l/1f"), "l/1f.kind");
}
