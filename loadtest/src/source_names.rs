//! The load test names no strategy: every production source file under
//! `loadtest/src` is read, and a string literal that is a registered
//! strategy's wire name (`seckill::strategy::StrategyName::ALL`), starts
//! with one and a space, or is a family prefix of one (`"lock/"`) fails the
//! test. What the load test knows of a strategy comes from its
//! registration. Comments and `#[cfg(test)]` items (unit tests, fixtures)
//! do not count: tests name the strategies they check, and so does this
//! test-only file (`#![cfg(test)]`). The sources are read by
//! `test_support::rust_source`.

#![cfg(test)]

use std::path::Path;

use seckill::strategy::StrategyName;
use test_support::rust_source;

/// Whether `text` names a strategy: one of `names`, one of them followed by
/// a space, or a family prefix (`lock/`) of one.
fn names_a_strategy(text: &str, names: &[&str]) -> bool {
    names.iter().any(|name| {
        text == *name
            || text.strip_prefix(name).is_some_and(|rest| rest.starts_with(' '))
            || (text.ends_with('/') && name.starts_with(text))
    })
}

/// Each literal of `source`'s production code that names a strategy of
/// `names`.
fn hits(source: &str, names: &[&str]) -> Vec<String> {
    let literals = rust_source::production(source).map(|code| code.literals).unwrap_or_default();
    literals.into_iter().filter(|text| names_a_strategy(text, names)).collect()
}

#[test]
fn no_production_source_of_the_load_test_names_a_strategy() {
    let names: Vec<&str> = StrategyName::ALL.iter().map(|name| name.as_str()).collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_source::rust_files(&src);
    assert!(files.len() > 20, "{files:?}");
    let mut problems = Vec::new();
    for file in files {
        let source = std::fs::read_to_string(&file).expect("a readable source");
        for hit in hits(&source, &names) {
            problems.push(format!("{}: {hit:?}", file.strip_prefix(&src).unwrap().display()));
        }
    }
    assert!(
        problems.is_empty(),
        "strategy names in the load test's production code (read the registration instead):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scan_finds_names_and_leaves_other_literals_comments_and_tests_alone() {
    let names = ["sql", "lock/setnx"];
    let source = r##"
        // "sql" in a comment
        fn f(s: &str) -> bool { s == "sql" || s.starts_with("lock/") }
        const OTHER: &str = "sql_tps";
        const MESSAGE: &str = "lock/setnx needs a key";
        #[cfg(test)]
        mod tests { fn t() { let _ = ["sql"]; } }
        const AFTER: &str = concat!("sq", "l");
    "##;
    assert_eq!(hits(source, &names), ["sql", "lock/", "lock/setnx needs a key"]);
}
