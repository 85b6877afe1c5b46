//! What the end-to-end tests of `loadtest compare` share: the database they
//! write into and the invocation on small sales, one comparison at a time.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The test suite's database (`TEST_DATABASE_URL`, as for every test), never
/// the comparison's or a service's.
pub use test_support::test_database_url;

/// Connections at which the tests measure `sql_tps` unless they pass
/// `--sql-tps-connections` themselves or scan ([`compare_scanning`]): the
/// scan costs every comparison six one-second measurements, and only one
/// test checks it.
const SQL_TPS_CONNECTIONS: &str = "4";

/// Runs `loadtest compare` with `args` on two instances, 40 goose users,
/// one-second ceilings and rejection phase, `sql_tps` at
/// [`SQL_TPS_CONNECTIONS`], into the test database, quietly, writing into
/// `out`; asserts that it succeeded and answers its report.json.
pub fn compare(out: &Path, args: &[&str]) -> Value {
    compare_on(2, out, args)
}

/// [`compare`] with the scan for `sql_tps`'s peak before the first round.
pub fn compare_scanning(out: &Path, args: &[&str]) -> Value {
    run(2, out, args, true)
}

/// [`compare`] on `instances` instances. A comparison is heavy (seconds of
/// load on every core): it waits for its turn ([`test_support::heavy`]).
pub fn compare_on(instances: u32, out: &Path, args: &[&str]) -> Value {
    run(instances, out, args, false)
}

fn run(instances: u32, out: &Path, args: &[&str], scan: bool) -> Value {
    let _heavy = test_support::heavy();
    let fixed = scan || args.contains(&"--sql-tps-connections");
    let instances = instances.to_string();
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("compare")
        .args(args)
        .args(["--users", "40", "--instances", &instances, "--rejection-phase", "1"])
        .args(["--ceiling-duration", "1", "--database-url", &test_database_url()])
        // One `sql` run a round unless the test asks for more: the tests
        // check what a run does, and a second reference run only costs time.
        .args(if args.contains(&"--reference-runs") { &[][..] } else { &["--reference-runs", "1"] })
        .args(if fixed { &[][..] } else { &["--sql-tps-connections", SQL_TPS_CONNECTIONS] })
        .args(["--quiet", "--out"])
        .arg(out)
        .status()
        .expect("loadtest runs");
    let report = std::fs::read_to_string(out.join("report.json"))
        .map(|text| serde_json::from_str::<Value>(&text).expect("report.json is JSON"));
    if !status.success() {
        // A comparison that found a run broke still writes its report:
        // show the runs that broke, so the failure says what they did.
        let broke = report.as_ref().map(broke_runs).unwrap_or_default();
        panic!("loadtest compare exited with {status}; runs that broke: {broke:#?}");
    }
    report.expect("report.json")
}

/// The runs of `report` whose verdict is `broke`, whole.
fn broke_runs(report: &Value) -> Vec<Value> {
    let runs = report["runs"].as_array().cloned().unwrap_or_default();
    runs.into_iter().filter(|run| run["verdict"] == "broke").collect()
}
