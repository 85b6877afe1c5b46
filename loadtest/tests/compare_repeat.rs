//! End to end: `loadtest compare --repeat 3` of two cheap strategies on a
//! small sale measures every ceiling again before each round (`http_rps`
//! in each run, right before its rejection phase; `sql_tps` at the peak of
//! its scan), runs `sql` twice a round as the reference, judges each run
//! against its own round's ceilings and its own `http_rps`, gives every
//! ratio and the CPU per unit a 95 % confidence interval over the rounds,
//! and accounts for the CPU each group of processes used in every sale
//! phase and in its steady window (docs/report-format.md).

use serde_json::Value;

const STOCK: i64 = 200;
const ROUNDS: usize = 3;

fn number(value: &Value, what: &str) -> f64 {
    value.as_f64().unwrap_or_else(|| panic!("{what} is not a number: {value}"))
}

/// Every ceiling has one sample per round and their median as its value;
/// `sql_tps` is measured at the peak of its scan.
fn check_ceilings(ceilings: &Value) {
    let scan = ceilings["sql_tps"]["scan"].as_array().expect("a scan");
    let tried: Vec<u64> = scan.iter().map(|p| p["connections"].as_u64().unwrap()).collect();
    assert_eq!(tried, [1, 2, 4, 8, 16, 20], "2 instances × pool 10: {scan:?}");
    let best =
        scan.iter().max_by(|a, b| number(&a["per_s"], "a").total_cmp(&number(&b["per_s"], "b")));
    assert_eq!(ceilings["sql_tps"]["connections"], best.unwrap()["connections"], "{scan:?}");
    for name in ["http_rps", "sql_tps", "redis_ops"] {
        let ceiling = &ceilings[name];
        let mut samples: Vec<f64> = ceiling["samples"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} has no samples: {ceiling}"))
            .iter()
            .map(|s| number(s, name))
            .collect();
        assert_eq!(samples.len(), ROUNDS, "{name}: one sample per round");
        assert!(samples.iter().all(|s| *s > 0.0), "{name}: {samples:?}");
        samples.sort_by(f64::total_cmp);
        assert_eq!(number(&ceiling["value"], name), samples[1], "{name}: the median");
    }
}

/// A run's CPU accounting and its ratios to its own round's ceilings.
fn check_run(run: &Value, ceilings: &Value) {
    let name = format!("{} #{}", run["strategy"], run["repeat"]);
    assert_eq!(run["verdict"], "ok", "{name}: {run}");
    assert_eq!(run["units_sold"], STOCK, "{name}");
    let round = run["repeat"].as_u64().unwrap() as usize - 1;
    let sql_tps = number(&ceilings["sql_tps"]["samples"][round], "sql_tps sample");
    let sell_through = number(&run["sell_through_per_s"], "sell_through_per_s");
    let ratio = number(&run["ratio"]["sell_through_vs_sql_tps"], "ratio");
    assert!((ratio - sell_through / sql_tps).abs() < 1e-9, "{name}: its own round's sql_tps");
    let http_rps = number(&run["http_rps"], "the run's own http_rps");
    let rejections = number(&run["rejection_rps"], "rejection_rps");
    let ratio = number(&run["ratio"]["rejection_vs_http_rps"], "ratio");
    assert!((ratio - rejections / http_rps).abs() < 1e-9, "{name}: its own http_rps");
    assert!(number(&run["sell_through_whole_per_s"], "whole") > 0.0, "{name}");
    assert!(number(&run["steady_window_s"], "window") > 0.0, "{name}");
    assert!(run["ceiling_undershot"].is_boolean() && run["too_short_to_rank"].is_boolean());
    assert!(run["cpu_over_cores"].is_boolean(), "{name}");
    let cpu = &run["cpu"];
    for group in ["loadgen_s", "instances_s", "postgres_s"] {
        assert!(number(&cpu[group], group) > 0.0, "{name}: {group} in {cpu}");
    }
    // Redis and RabbitMQ run on this machine, so they are measured (a
    // number, not null). Their time in a 200-unit phase may be below the
    // 10 ms clock-tick resolution, so 0 is a true reading here.
    for group in ["redis_s", "rabbitmq_s"] {
        assert!(number(&cpu[group], group) >= 0.0, "{name}: {group} in {cpu}");
    }
    let share = number(&cpu["machine_share_loadgen"], "machine_share_loadgen");
    assert!(share > 0.0 && share <= 1.0, "{name}: {cpu}");
    // The CPU per unit is the steady window's: its service CPU ÷ its units.
    let steady = number(&cpu["steady_service_s"], "steady_service_s");
    let cores = number(&cpu["steady_service_cores"], "steady_service_cores");
    let window = number(&run["steady_window_s"], "window");
    assert!((cores - steady / window).abs() < 0.01, "{name}: {cpu}");
    let per_unit = number(&run["cost"]["cpu_ms_per_unit"], "cpu_ms_per_unit");
    let units = sell_through * window;
    assert!(
        per_unit > 0.0 && (per_unit - steady * 1000.0 / units).abs() < 0.05 * per_unit,
        "{name}"
    );
}

/// Every ratio has an interval — the paired ones holding all three rounds'
/// values —, and a verdict against sql unless a window was too short to
/// rank.
fn check_summary(summary: &Value) {
    let name = summary["strategy"].to_string();
    for path in [
        "ratio.sell_through_vs_sql_tps",
        "ratio.rejection_vs_http_rps",
        "ratio.sell_through_vs_sql_strategy",
        "cost.cpu_ms_per_unit",
    ] {
        let figure = &summary["figures"][path];
        let ci = figure["ci95"].as_array().unwrap_or_else(|| panic!("{name} {path}: {figure}"));
        let (lo, hi) = (number(&ci[0], "lo"), number(&ci[1], "hi"));
        assert!(lo <= hi, "{name} {path}: {figure}");
        // With 3 values the paired t-interval is wider than their range
        // (not so with sql's 6: two takes a round). × sql's is unpaired
        // (checked in the test).
        if figure["n"] == 3 && path != "ratio.sell_through_vs_sql_strategy" {
            assert!(lo <= number(&figure["min"], "min") + 1e-9, "{name} {path}: {figure}");
            assert!(hi >= number(&figure["max"], "max") - 1e-9, "{name} {path}: {figure}");
        }
    }
    let verdict = &summary["vs_sql"];
    if summary["too_short_to_rank"] == true {
        assert!(verdict.is_null(), "{name}: a short window is not ranked: {summary}");
    } else {
        let known = ["faster", "slower", "indistinguishable"];
        assert!(known.contains(&verdict.as_str().unwrap_or("")), "{name}: {summary}");
    }
    if summary["strategy"] == "sql" && summary["too_short_to_rank"] == false {
        assert_eq!(summary["vs_sql"], "indistinguishable", "sql against itself");
    }
}

#[test]
fn three_rounds_give_per_round_ceilings_intervals_and_cpu_accounting() {
    let out = std::env::temp_dir().join(format!("loadtest-repeat-{}", std::process::id()));
    let (stock, rounds) = (STOCK.to_string(), ROUNDS.to_string());
    let args = ["--strategies", "sql,redis-decr", "--stock", &stock, "--repeat", &rounds];
    let args = [&args[..], &["--reference-runs", "2"]].concat();
    let report = crate::support::compare_scanning(&out, &args);
    assert_eq!(report["schema_version"], 4);
    assert_eq!(report["pilots"], serde_json::json!([]), "--stock: no pilot sales");
    check_ceilings(&report["ceilings"]);
    let runs = report["runs"].as_array().unwrap();
    // Each round: sql (take 1), redis-decr, sql (take 2).
    assert_eq!(runs.len(), 3 * ROUNDS);
    for run in runs {
        check_run(run, &report["ceilings"]);
    }
    for (round, runs) in runs.chunks(3).enumerate() {
        let takes: Vec<(&str, u64)> = runs
            .iter()
            .map(|r| (r["strategy"].as_str().unwrap(), r["take"].as_u64().unwrap()))
            .collect();
        assert_eq!(takes, [("sql", 1), ("redis-decr", 1), ("sql", 2)], "round {round}");
        let mut own: Vec<f64> = runs.iter().map(|r| number(&r["http_rps"], "http_rps")).collect();
        own.sort_by(f64::total_cmp);
        let sample = number(&report["ceilings"]["http_rps"]["samples"][round], "sample");
        // serde_json reads a float back within a unit in the last place.
        let median = own[1];
        assert!((sample - median).abs() <= 1e-9 * median, "round {round}: {sample} ≠ {median}");
        // The reference: the geometric mean of the round's two sql runs.
        let rate = |r: &Value| number(&r["sell_through_per_s"], "sell_through_per_s");
        let reference = (rate(&runs[0]) * rate(&runs[2])).sqrt();
        let ratio = number(&runs[1]["ratio"]["sell_through_vs_sql_strategy"], "ratio");
        assert!((ratio - rate(&runs[1]) / reference).abs() < 1e-9 * ratio, "round {round}");
    }
    let summary = report["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2);
    // × sql's interval is centred on the ratio of the geometric means of
    // redis-decr's three rates and sql's six.
    let log_mean = |strategy: &str| {
        let rates: Vec<f64> = runs
            .iter()
            .filter(|r| r["strategy"] == strategy)
            .map(|r| number(&r["sell_through_per_s"], "sell_through_per_s").ln())
            .collect();
        rates.iter().sum::<f64>() / rates.len() as f64
    };
    let expected = (log_mean("redis-decr") - log_mean("sql")).exp();
    let ci = &summary[1]["figures"]["ratio.sell_through_vs_sql_strategy"]["ci95"];
    let centre = (number(&ci[0], "lo") * number(&ci[1], "hi")).sqrt();
    assert!((centre - expected).abs() < 1e-6 * expected, "{centre} ≠ {expected}: {ci}");
    for s in summary {
        let takes = if s["strategy"] == "sql" { 2 } else { 1 };
        assert_eq!(s["runs"], (takes * ROUNDS) as u64);
        check_summary(s);
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("## Warnings") && md.contains("the load generator used"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}
