//! The service's layering, checked from its sources: every `crate::…` path
//! (in a `use` or inline) of every file under `app/src` must point to a module
//! of the file's own layer or of a layer below, and the modules must not
//! import each other in a cycle.
//!
//! The layers, bottom first (the table [`LAYERS`]): the vocabulary every
//! module may use; the HTTP vocabulary shared by all routes; the strategies;
//! the purchase path and the audit; the HTTP router; start-up. A new
//! top-level module must be placed in a layer here before the check passes.
//! Paths inside comments and string literals do not count, nor does a file's
//! `#[cfg(test)]` part (its unit tests, which sit at its end): the layering
//! is that of the production code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules of the service, by layer, bottom first. A module may
/// import from its own layer (without a cycle) and from the layers below.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &[
            "strategy_name",
            "sale",
            "outcome",
            // Bounds every settings section shares.
            "bounds",
            "telemetry",
            "backends",
            // Buyer tokens (JWT), known to the configuration and the load test.
            "buyer_token",
            "backend_probe",
            // Metric names, defined once for the service and the load test.
            "metric_names",
            "unit_return",
            // Fault injection for tests (cargo feature `failpoints`).
            "failpoints",
        ],
    ),
    ("HTTP vocabulary", &["web"]),
    ("strategies", &["strategy"]),
    ("purchase path and audit", &["purchase", "known_buyers", "audit", "lifecycle"]),
    ("HTTP router", &["http"]),
    // The configuration composes the settings each layer below defines.
    ("start-up", &["startup", "config"]),
];

/// `crate::x::…` imports of each top-level module: module → imported modules.
type Imports = BTreeMap<String, BTreeSet<String>>;

#[test]
fn no_module_imports_from_a_layer_above_it_and_there_is_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let imports = imports_under(&src);
    assert!(imports.contains_key("sale") && imports.contains_key("strategy"), "{imports:?}");
    let problems = check(&imports);
    assert!(problems.is_empty(), "layering broken:\n{}", problems.join("\n"));
}

#[test]
fn an_upward_import_is_reported() {
    let mut imports = layered_example();
    imports.get_mut("sale").unwrap().insert("strategy".to_owned());
    let problems = check(&imports);
    let upward = "`sale` (vocabulary) imports `strategy` (strategies), a layer above it";
    assert!(problems.iter().any(|p| p == upward), "{problems:?}");
    // The strategies import the sale: the upward import closes a cycle too.
    assert!(problems.iter().any(|p| p.starts_with("cycle:")), "{problems:?}");
}

#[test]
fn a_cycle_inside_a_layer_is_reported() {
    let mut imports = layered_example();
    imports.get_mut("sale").unwrap().insert("outcome".to_owned());
    imports.get_mut("outcome").unwrap().insert("sale".to_owned());
    let problems = check(&imports);
    assert!(problems.iter().any(|p| p.contains("cycle")), "{problems:?}");
}

#[test]
fn a_module_in_no_layer_is_reported() {
    let mut imports = layered_example();
    imports.insert("gadgets".to_owned(), BTreeSet::new());
    let problems = check(&imports);
    assert!(problems.iter().any(|p| p.contains("`gadgets`")), "{problems:?}");
}

#[test]
fn super_chains_that_leave_the_top_level_module_are_imports() {
    let code = "use super::strategy::Sale; use super::super::http::AppState; use super::x;";
    let from = |file: &str| super_paths(Path::new(file), code);
    let all = ["http", "strategy", "x"].map(String::from);
    assert_eq!(from("sale.rs"), BTreeSet::from(all.clone()));
    assert_eq!(from("strategy/mod.rs"), BTreeSet::from(all));
    assert_eq!(from("strategy/naive.rs"), BTreeSet::from(["http".to_owned()]));
    assert_eq!(from("strategy/lock/ttl.rs"), BTreeSet::new());
}

#[test]
fn paths_are_found_in_uses_groups_and_code_but_not_in_comments_or_strings() {
    let source = r##"
        //! Docs may mention crate::http freely.
        use crate::sale::{Sale, SaleId};
        use crate::{backends::RedisHandle, config::Config};
        use super::sibling;
        /* crate::startup in a block comment */
        fn f() {
            let s = "crate::purchase in a string";
            let r = r#"crate::audit in a raw string"#;
            let c = '"';
            crate::telemetry::metrics_handle();
            let x: &'static str = "";
        }
    "##;
    let found = crate_paths(&strip_comments_and_strings(source));
    let expected = ["backends", "config", "sale", "telemetry"];
    assert_eq!(found, BTreeSet::from(expected.map(String::from)));
}

/// A tiny layered service without violations.
fn layered_example() -> Imports {
    let mut imports = Imports::new();
    for (module, uses) in [
        ("sale", vec!["strategy_name"]),
        ("strategy_name", vec![]),
        ("outcome", vec!["sale"]),
        ("strategy", vec!["outcome", "sale", "web"]),
        ("web", vec!["outcome"]),
        ("http", vec!["strategy", "web", "purchase"]),
        ("purchase", vec!["strategy"]),
    ] {
        imports.insert(module.to_owned(), uses.into_iter().map(String::from).collect());
    }
    imports
}

/// Every violation of [`LAYERS`] in `imports`, one line each.
fn check(imports: &Imports) -> Vec<String> {
    let layer_of = |module: &str| LAYERS.iter().position(|(_, modules)| modules.contains(&module));
    let mut problems = Vec::new();
    for (module, uses) in imports {
        let Some(layer) = layer_of(module) else {
            problems.push(format!("`{module}` is in no layer: add it to LAYERS"));
            continue;
        };
        for used in uses {
            match layer_of(used) {
                Some(other) if other > layer => problems.push(format!(
                    "`{module}` ({}) imports `{used}` ({}), a layer above it",
                    LAYERS[layer].0, LAYERS[other].0
                )),
                None if !imports.contains_key(used) => {
                    problems.push(format!("`{module}` imports `{used}`, which is no module"));
                }
                _ => {}
            }
        }
    }
    problems.extend(cycles(imports).into_iter().map(|c| format!("cycle: {}", c.join(" → "))));
    problems
}

/// One cycle per strongly connected group of modules found by a depth-first
/// search, as the path that closes it.
fn cycles(imports: &Imports) -> Vec<Vec<String>> {
    fn visit(
        module: &str,
        imports: &Imports,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        if let Some(start) = path.iter().position(|m| m == module) {
            let mut cycle = path[start..].to_vec();
            cycle.push(module.to_owned());
            found.push(cycle);
            return;
        }
        if !done.insert(module.to_owned()) {
            return;
        }
        path.push(module.to_owned());
        for used in imports.get(module).into_iter().flatten() {
            visit(used, imports, path, done, found);
        }
        path.pop();
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for module in imports.keys() {
        visit(module, imports, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

/// The top-level modules under `src` (files and directories, `lib.rs` and
/// `main.rs` excepted) and the other top-level modules each one imports.
fn imports_under(src: &Path) -> Imports {
    let mut imports = Imports::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let top = relative.components().next().expect("a file").as_os_str().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("readable source");
        let code = strip_comments_and_strings(&source);
        // Unit tests sit in an inline `mod tests` at the end of a file; its
        // `super::` is the file itself, and tests are no part of the layering.
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        let mut used = crate_paths(code);
        used.extend(super_paths(relative, code));
        used.remove(&module);
        imports.entry(module).or_default().extend(used);
    }
    imports
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The first segment after each `crate::` (not `$crate::`), including each
/// item of a `crate::{a::…, b}` group.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = closing_brace(group);
            for item in split_top_level(&group[..end]) {
                found.extend(first_segment(item.trim()));
            }
        } else {
            found.extend(first_segment(rest));
        }
    }
    found
}

/// Top-level modules reached through `super::` chains from the file at
/// `relative` (e.g. `super::strategy` in `sale.rs`, or
/// `super::super::super::http` in `strategy/lock/ttl.rs`, is
/// `crate::strategy`, resp. `crate::http`).
fn super_paths(relative: &Path, code: &str) -> BTreeSet<String> {
    // The module path of the file: `strategy/lock/mod.rs` → [strategy, lock].
    let mut path: Vec<String> =
        relative.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("super::") {
        let starts_chain = !rest[..at].ends_with("::") && !ident_before_str(&rest[..at]);
        rest = &rest[at..];
        let mut depth = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            depth += 1;
            rest = after;
        }
        if starts_chain && depth >= path.len() {
            found.extend(first_segment(rest));
        }
    }
    found
}

fn ident_before_str(before: &str) -> bool {
    before.chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_')
}

fn first_segment(path: &str) -> Option<String> {
    let segment: String = path.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!segment.is_empty() && segment != "self").then_some(segment)
}

/// Index of the `}` that closes a group whose `{` was just consumed.
fn closing_brace(group: &str) -> usize {
    let mut depth = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    group.len()
}

/// Items of a `use` group, split at commas outside nested braces.
fn split_top_level(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// `code` with comments, string literals and char literals replaced by a
/// space (lifetimes are kept: `'a` is not a char literal).
fn strip_comments_and_strings(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < chars.len() {
        let end = match (chars[i], chars.get(i + 1)) {
            ('/', Some('/')) => {
                chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n)
            }
            ('/', Some('*')) => skip_block_comment(&chars, i),
            ('r', Some('#' | '"')) if !ident_before(&chars, i) => skip_raw_string(&chars, i),
            ('"', _) => skip_quoted(&chars, i, '"'),
            ('\'', _) if is_char_literal(&chars, i) => skip_quoted(&chars, i, '\''),
            (c, _) => {
                out.push(c);
                i += 1;
                continue;
            }
        };
        out.push(' ');
        i = end;
    }
    out
}

/// Index just past the (possibly nested) block comment that starts at `i`.
fn skip_block_comment(chars: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1)) {
            ('/', Some('*')) => (depth, i) = (depth + 1, i + 2),
            ('*', Some('/')) if depth == 1 => return i + 2,
            ('*', Some('/')) => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    i
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `'x'`, `'\n'`, `'\''`, `'\u{1F600}'` — as opposed to a lifetime `'a`.
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// Index just past the literal opened by `quote` at `i`.
fn skip_quoted(chars: &[char], mut i: usize, quote: char) -> usize {
    i += 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Index just past the raw string (`r"…"`, `r#"…"#`, …) that starts at `i`.
fn skip_raw_string(chars: &[char], mut i: usize) -> usize {
    i += 1;
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    if chars.get(i) != Some(&'"') {
        return i; // `r#ident`, a raw identifier
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}
