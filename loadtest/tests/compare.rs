//! End to end: `loadtest compare` on a small sale, against two real
//! instances, must write a report.json that follows docs/report-format.md and
//! judge the baselines as the expectation table says.

use std::process::Command;

use serde_json::Value;

#[test]
fn compare_writes_a_schema_v1_report_and_judges_naive_and_sql() {
    let out = std::env::temp_dir().join(format!("loadtest-{}", std::process::id()));
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(["compare", "--strategies", "naive,sql,sql/for-update", "--stock", "300"])
        .args(["--users", "40", "--instances", "2", "--rejection-phase", "1"])
        .args(["--ceiling-duration", "1", "--out"])
        .arg(&out)
        .status()
        .expect("loadtest runs");
    assert!(status.success(), "loadtest compare exited with {status}");

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["schema_version"], 1);
    for key in ["generated_at", "machine", "config", "ceilings", "runs"] {
        assert!(!report[key].is_null(), "report.{key} is missing");
    }
    assert!(report["ceilings"]["http_rps"]["value"].as_f64().unwrap() > 0.0);
    assert_eq!(report["ceilings"]["sql_tps"]["connections"], 20);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for run in runs {
        let name = run["strategy"].as_str().unwrap();
        assert_eq!(run["verdict"], "ok", "{name}: {run}");
        for key in ["outcomes", "status_counts", "latency_ms", "ratio", "cost"] {
            assert!(run[key].is_object(), "{name}: {key} is missing");
        }
        if name == "naive" {
            assert_eq!(run["expected"], "breaks");
            let broke = run["oversold"].as_i64().unwrap() > 0 || run["ledger_drift"] != 0;
            assert!(broke, "naive must visibly break: {run}");
        } else {
            assert_eq!(run["expected"], "correct");
            assert_eq!((run["oversold"].as_i64(), run["undersold"].as_i64()), (Some(0), Some(0)));
            assert_eq!(run["units_sold"], 300);
            assert_eq!(run["ledger_drift"], 0);
            assert_eq!(run["errors_5xx"], 0);
            assert_eq!(run["outcomes"]["placed"], 300);
            assert!(run["sell_through_per_s"].as_f64().unwrap() > 0.0);
            assert!(run["ratio"]["sell_through_vs_sql_strategy"].as_f64().unwrap() > 0.0);
        }
        assert!(
            run["redis_drift"].is_null() && run["cost"]["redis_round_trips_per_unit"].is_null()
        );
    }
    assert!(out.join("report.md").exists());
    assert!(out.join("goose-sql-for-update-burst-1.html").exists());
    let _ = std::fs::remove_dir_all(&out);
}
