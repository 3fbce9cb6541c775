//! The documented lists of rules follow the one list the tests are generated from: the
//! trait's `# Contract` (one bullet per rule, linking to its function) and the table of
//! docs/conformance.md name exactly [`conformance::rules::RULES`], in that order.

use std::path::Path;

use conformance::rules::RULES;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The names between `open` and `close` on the lines of `text` that contain both, in
/// order.
fn names_between(text: &str, open: &str, close: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let start = line.find(open)? + open.len();
            let end = line[start..].find(close)? + start;
            Some(line[start..end].to_owned())
        })
        .collect()
}

#[test]
fn the_contract_links_every_rule_in_order() {
    let contract = read("../lock-core/src/lock.rs");
    let linked = names_between(&contract, "/// [`", "`]: ../conformance/rules/fn.");
    assert_eq!(linked, RULES, "lock-core/src/lock.rs # Contract");
    for rule in RULES {
        let target = format!("`]: ../conformance/rules/fn.{rule}.html");
        assert!(contract.contains(&target), "{rule} links elsewhere");
        assert!(
            contract.contains(&format!("([`{rule}`])")),
            "no bullet cites {rule}"
        );
    }
}

#[test]
fn the_docs_table_lists_every_rule() {
    let doc = read("../docs/conformance.md");
    // The rule is the last cell of each table row.
    let listed: Vec<&str> = doc
        .lines()
        .filter_map(|line| line.strip_suffix("` |")?.rsplit_once("| `"))
        .map(|(_, rule)| rule)
        .collect();
    assert_eq!(listed, RULES, "docs/conformance.md rules table");
}
