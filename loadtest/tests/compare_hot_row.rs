//! End to end: `loadtest compare --strategies sql,sql/batched,sql/buckets` on
//! a small sale and two real instances: both hot-row strategies keep exact
//! books; the `sql/batched` run reports its batch sizes (added up over the
//! instances), fewer Postgres transactions per unit than `sql`, and its ratio
//! to the `sql_batched_units_per_s` ceiling, measured at the batch size it
//! reached (docs/report-format.md).

use serde_json::Value;

const STOCK: i64 = 200;

#[test]
fn compare_reports_the_hot_row_strategies_with_batch_sizes_and_their_ceiling() {
    let stock = STOCK.to_string();
    let strategies = "sql,sql/batched,sql/buckets";
    let out = std::env::temp_dir().join(format!("loadtest-hot-row-{}", std::process::id()));
    let args = ["--strategies", strategies, "--stock", &stock, "--repeat", "1"];
    let report = crate::support::compare(&out, &args);
    let runs = report["runs"].as_array().unwrap();
    let run = |strategy: &str| runs.iter().find(|r| r["strategy"] == strategy).unwrap();
    for strategy in ["sql/batched", "sql/buckets"] {
        let run = run(strategy);
        assert_eq!((&run["expected"], &run["verdict"]), (&"correct".into(), &"ok".into()), "{run}");
        assert_eq!(
            (run["units_sold"].as_i64(), run["remaining_stock"].as_i64()),
            (Some(STOCK), Some(0))
        );
        for figure in ["oversold", "undersold", "ledger_drift", "duplicate_orders", "errors_5xx"] {
            assert_eq!(run[figure], 0, "{strategy}: {figure}");
        }
    }

    let batched = run("sql/batched");
    let sizes = &batched["batch_sizes"];
    let mean = sizes["mean"].as_f64().expect("sql/batched reports its batch sizes");
    assert!(mean >= 1.0 && sizes["max"].as_f64().unwrap() >= mean, "{sizes}");
    let xacts = |run: &Value| run["cost"]["pg_xacts_per_unit"].as_f64().unwrap();
    assert!(xacts(batched) < xacts(run("sql")), "a batch settles several units per transaction");
    let ceiling = &report["ceilings"]["sql_batched_units_per_s"];
    assert_eq!(ceiling["batch_size"], mean.round().max(1.0) as i64, "{ceiling}");
    assert_eq!(ceiling["connections"], 2, "one driver per instance");
    assert!(ceiling["value"].as_f64().unwrap() > 0.0, "{ceiling}");
    assert!(ceiling["ratio_vs_sql_tps"].as_f64().unwrap() > 0.0, "{ceiling}");
    let ratio = batched["ratio"]["sell_through_vs_batched_ceiling"].as_f64().unwrap();
    let expected =
        batched["sell_through_per_s"].as_f64().unwrap() / ceiling["value"].as_f64().unwrap();
    assert!((ratio - expected).abs() < 1e-9, "{ratio} against {expected}");

    for other in ["sql", "sql/buckets"] {
        let run = run(other);
        assert!(run["batch_sizes"].is_null(), "{other}");
        assert!(run["ratio"]["sell_through_vs_batched_ceiling"].is_null(), "{other}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
