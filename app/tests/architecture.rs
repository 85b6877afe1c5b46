//! The service's layering, checked from its sources: every `crate::…` path
//! (in a `use` or inline) of every file under `app/src` must point to a module
//! of the file's own layer or of a layer below, and the modules must not
//! import each other in a cycle.
//!
//! The layers, bottom first (the table [`LAYERS`]): the vocabulary every
//! module may use; the HTTP vocabulary shared by all routes; the strategies;
//! the purchase path and the audit; the HTTP router; start-up. A new
//! top-level module must be placed in a layer here before the check passes.
//! Paths inside comments and string literals do not count, nor do
//! `#[cfg(test)]` items (a file's unit tests): the layering is that of the
//! production code, read by `test_support::rust_source`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use test_support::rust_source;

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
    (
        "purchase path and audit",
        &["purchase", "known_buyers", "audit", "lifecycle", "waiting_room"],
    ),
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
    let from = |file: &str| imported_modules(Path::new(file), code);
    let all = ["http", "strategy", "x"].map(String::from);
    assert_eq!(from("sale.rs"), BTreeSet::from(all.clone()));
    assert_eq!(from("strategy/mod.rs"), BTreeSet::from(all));
    assert_eq!(from("strategy/naive.rs"), BTreeSet::from(["http".to_owned()]));
    assert_eq!(from("strategy/lock/ttl.rs"), BTreeSet::new());
}

#[test]
fn paths_are_found_in_uses_groups_code_and_macros_but_not_in_comments_strings_or_tests() {
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
            tracing::info!(metrics = ?crate::metric_names::X);
        }
        #[cfg(test)]
        mod tests { use crate::lifecycle::Sweep; }
    "##;
    let found = imported_modules(Path::new("strategy/naive.rs"), source);
    let expected = ["backends", "config", "metric_names", "sale", "telemetry"];
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
    for file in rust_source::rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let top = relative.components().next().expect("a file").as_os_str().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("readable source");
        let mut used = imported_modules(relative, &source);
        used.remove(&module);
        imports.entry(module).or_default().extend(used);
    }
    imports
}

/// The top-level modules the production code of `source`, the file at
/// `relative` under `src`, names (`test_support::rust_source` leaves
/// comments, strings and `#[cfg(test)]` items out: unit tests are no part
/// of the layering).
fn imported_modules(relative: &Path, source: &str) -> BTreeSet<String> {
    let Some(code) = rust_source::production(source) else { return BTreeSet::new() };
    code.paths.iter().filter_map(|path| top_level_module(relative, path)).collect()
}

/// The top-level module `path` (its segments) reaches from the file at
/// `relative`: the segment after `crate`, or after a chain of `super` that
/// leaves the file's top-level module (`super::strategy` in `sale.rs`,
/// `super::super::super::http` in `strategy/lock/ttl.rs`); `None` for any
/// other path.
fn top_level_module(relative: &Path, path: &[String]) -> Option<String> {
    // The module path of the file: `strategy/lock/mod.rs` → [strategy, lock].
    let mut module: Vec<String> =
        relative.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if module.last().is_some_and(|last| last == "mod") {
        module.pop();
    }
    let supers = path.iter().take_while(|segment| *segment == "super").count();
    let next = match path.first()?.as_str() {
        "crate" => path.get(1)?,
        "super" if supers >= module.len() => path.get(supers)?,
        _ => return None,
    };
    (next != "self" && next != "*").then(|| next.clone())
}
