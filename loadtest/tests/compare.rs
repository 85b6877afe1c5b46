//! End to end: `loadtest compare` on small sales, against two real
//! instances, under every profile, must write a report.json that follows
//! docs/report-format.md, judge the baselines as the expectation table says,
//! add up the sales of `multi-sale`, show the resubmissions of `retry-storm`
//! and the flooding buyer of `flood` apart, and give each run its cost per
//! unit.

const STOCK: i64 = 200;

#[test]
fn compare_writes_a_schema_v3_report_and_judges_every_profile() {
    let out = std::env::temp_dir().join(format!("loadtest-{}", std::process::id()));
    let stock = STOCK.to_string();
    let profiles = ["--profile", "burst,retry-storm,multi-sale,flood", "--storm", "3"];
    let profiles = [&profiles[..], &["--sales", "4", "--flood", "300"]].concat();
    let mut args = vec!["--strategies", "naive,sql", "--stock", &stock, "--repeat", "1"];
    args.extend(profiles);
    let report = crate::support::compare(&out, &args);
    assert_eq!(report["schema_version"], 4);
    for key in ["generated_at", "machine", "config", "ceilings", "runs", "summary"] {
        assert!(!report[key].is_null(), "report.{key} is missing");
    }
    assert!(report["ceilings"]["http_rps"]["value"].as_f64().unwrap() > 0.0);
    // Measured at the connections the test gave, without a scan.
    assert_eq!(report["ceilings"]["sql_tps"]["connections"], 4, "{}", report["ceilings"]);
    assert_eq!(report["ceilings"]["sql_tps"]["scan"], serde_json::json!([]));
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    for run in runs {
        let name = format!("{} / {}", run["strategy"].as_str().unwrap(), run["profile"]);
        let profile = run["profile"].as_str().unwrap();
        assert_eq!(run["verdict"], "ok", "{name}: {run}");
        for key in ["outcomes", "status_counts", "latency_ms", "ratio", "cost"] {
            assert!(run[key].is_object(), "{name}: {key} is missing");
        }
        let sales = if profile == "multi-sale" { 4 } else { 1 };
        if profile == "flood" {
            // Buyer 1's 300 extra purchases, apart from the others' timings.
            let flood = &run["flood"];
            assert!(flood["requests"].as_u64().unwrap() >= 300, "{name}: {flood}");
            assert!(flood["latency_ms"]["p99"].as_f64().unwrap() > 0.0, "{name}: {flood}");
            let refused = flood["status_counts"]["409"].as_u64().unwrap_or(0);
            assert!(refused >= 299, "{name}: one buyer buys at most once: {flood}");
        } else {
            assert!(run["flood"].is_null(), "{name}");
        }
        assert_eq!(run["sales"], sales, "{name}");
        assert_eq!(run["total_stock"], STOCK, "{name}: the sales add up to the stock");
        let cost = &run["cost"];
        // Every unit sold took at least its own committed transaction, and a
        // buyer costs a handful at most (3 buyers per unit, up to 3 sends each).
        let xacts = cost["pg_xacts_per_unit"].as_f64().expect("pg_xacts_per_unit");
        assert!((1.0..40.0).contains(&xacts), "{name}: pg_xacts_per_unit {xacts}");
        assert!(cost["amqp_messages_per_unit"].is_null(), "{name} does not use RabbitMQ");
        let rss = cost["peak_rss_mb"].as_f64().expect("peak_rss_mb of started instances");
        assert!(rss > 1.0, "{name}: peak_rss_mb {rss}");
        if run["strategy"] == "naive" {
            assert_eq!(run["expected"], "breaks");
            let broke = run["oversold"].as_i64().unwrap() > 0 || run["ledger_drift"] != 0;
            assert!(broke, "naive must visibly break: {run}");
        } else {
            assert_eq!(run["expected"], "correct");
            assert_eq!((run["oversold"].as_i64(), run["undersold"].as_i64()), (Some(0), Some(0)));
            assert_eq!(run["units_sold"], STOCK, "{name}");
            assert_eq!(run["ledger_drift"], 0);
            assert_eq!(run["errors_5xx"], 0);
            assert_eq!(run["outcomes"]["placed"], STOCK, "{name}");
            assert!(run["sell_through_per_s"].as_f64().unwrap() > 0.0);
            assert!(run["ratio"]["sell_through_vs_sql_strategy"].as_f64().unwrap() > 0.0);
            if profile == "retry-storm" {
                // Each buyer sent 3 times back to back, and the repeats of
                // those who got a unit met the one-order-per-buyer rule.
                let buyers = run["buyers"].as_i64().unwrap();
                assert!(run["requests"].as_i64().unwrap() >= 3 * buyers, "{name}: {run}");
                let again = run["outcomes"]["already_purchased"].as_i64().unwrap();
                assert!(again > 0, "{name}: no resubmission was told `already purchased`");
            }
        }
        assert!(
            run["redis_drift"].is_null() && cost["redis_round_trips_per_unit"].is_null(),
            "{name}: no Redis"
        );
    }
    let summary = report["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 8, "one summary per (strategy, profile)");
    for s in summary {
        assert_eq!(s["runs"], 1);
        let sold = &s["figures"]["units_sold"];
        assert!(sold["median"].as_f64().unwrap() > 0.0 && sold["n"] == 1, "{s}");
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## One buyer's flood") && md.contains("without the flood"), "{md}");
    assert!(out.join("report.html").exists());
    assert!(out.join("charts").join("oversold.svg").exists());
    assert!(out.join("goose-naive-retry-storm-1.html").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn with_buyer_auth_on_every_purchase_carries_a_verified_token_and_the_books_hold() {
    let out = std::env::temp_dir().join(format!("loadtest-auth-{}", std::process::id()));
    let stock = STOCK.to_string();
    let args = ["--strategies", "sql", "--stock", &stock, "--repeat", "1", "--buyer-auth", "on"];
    let report = crate::support::compare(&out, &args);
    assert_eq!(report["config"]["buyer_auth"], "on");
    let run = &report["runs"][0];
    assert_eq!(run["verdict"], "ok", "{run}");
    // Every buyer was who their token says: no 401 or 403, each unit sold
    // once, to a distinct buyer.
    let statuses = &run["status_counts"];
    assert!(statuses.get("401").is_none() && statuses.get("403").is_none(), "{statuses}");
    assert_eq!(run["outcomes"]["placed"], STOCK);
    assert_eq!((run["units_sold"].as_i64(), run["oversold"].as_i64()), (Some(STOCK), Some(0)));
    std::fs::remove_dir_all(&out).ok();
}
