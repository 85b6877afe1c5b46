//! What the end-to-end tests of `loadtest compare` share: the database they
//! write into, and one comparison run on two small instances.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The test suite's database (`TEST_DATABASE_URL`, as for every test), never
/// the comparison's or a service's.
pub fn test_database_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/seckill_test".to_owned())
}

/// Runs `loadtest compare` with `args` on 2 instances and 40 users, short
/// phases and ceilings, into the test database and a fresh directory named
/// after `name`; panics unless it succeeds. Returns its report.json and the
/// directory (the caller removes it).
pub fn compare(name: &str, args: &[&str]) -> (Value, PathBuf) {
    let out = std::env::temp_dir().join(format!("loadtest-{name}-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("compare")
        .args(args)
        .args(["--users", "40", "--instances", "2", "--rejection-phase", "1"])
        .args(["--database-url", &test_database_url()])
        .args(["--ceiling-duration", "1", "--quiet", "--out"])
        .arg(&out)
        .status()
        .expect("loadtest runs");
    assert!(status.success(), "loadtest compare exited with {status}");
    let report = std::fs::read_to_string(out.join("report.json")).expect("report.json");
    (serde_json::from_str(&report).expect("report.json is JSON"), out)
}
