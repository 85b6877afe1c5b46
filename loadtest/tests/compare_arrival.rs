//! End to end: `loadtest compare --profile arrival` at a constant rate this
//! machine keeps, on two real instances: every buyer arrives on its
//! schedule (no arrival late), latency is reported from the intended
//! arrival with p99.9, `queue`'s accepted requests are followed to their
//! results, the books stay exact, and every run says who got the units.

const STOCK: u64 = 100;

/// Buyers a second: well under what `sql` sells on two cores, so that the
/// generator never waits for a free slot.
const RATE: u64 = 200;

#[test]
fn compare_arrival_keeps_its_schedule_and_measures_from_the_intended_arrival() {
    let out = std::env::temp_dir().join(format!("loadtest-arrival-{}", std::process::id()));
    let (stock, rate) = (STOCK.to_string(), RATE.to_string());
    let args = [
        ["--strategies", "sql,queue", "--profile", "arrival"].as_slice(),
        &["--stock", &stock, "--repeat", "1", "--demand", "2"],
        &["--arrival-shape", "constant", "--arrival-rate", &rate],
    ]
    .concat();
    let report = crate::support::compare(&out, &args);
    let runs = report["runs"].as_array().unwrap();
    let strategies: Vec<&str> = runs.iter().filter_map(|r| r["strategy"].as_str()).collect();
    assert!(strategies.contains(&"sql") && strategies.contains(&"queue"), "{strategies:?}");
    for run in runs {
        let name = run["strategy"].as_str().unwrap();
        assert_eq!((&run["expected"], &run["verdict"]), (&"correct".into(), &"ok".into()), "{run}");
        for figure in ["oversold", "undersold", "ledger_drift", "duplicate_orders", "errors_5xx"] {
            assert_eq!(run[figure], 0, "{name}: {figure}: {run}");
        }
        let arrival = &run["arrival"];
        assert_eq!(arrival["scheduled"], 2 * STOCK, "{name}: {arrival}");
        assert_eq!(arrival["late"], 0, "{name}: the generator kept its schedule: {arrival}");
        let latency = &arrival["latency_from_arrival_ms"];
        assert_eq!(latency["count"], 2 * STOCK, "{name}: one latency per arrival: {latency}");
        let (p99, p999) = (latency["p99"].as_f64().unwrap(), latency["p999"].as_f64().unwrap());
        assert!(p999 >= p99 && p99 > 0.0, "{name}: {latency}");
        // 200 arrivals at 200 a second: the last is due 1 s after the first.
        assert!(run["duration_s"].as_f64().unwrap() >= 0.99, "{name}: {run}");
        let results = &arrival["result_from_arrival_ms"];
        if name == "queue" {
            assert_eq!(results["count"], 2 * STOCK, "{name}: every 202 followed: {results}");
            assert!(results["p50"].as_f64().unwrap() > 0.0, "{name}: {results}");
        } else {
            assert!(results.is_null(), "{name}: no 202, no result reads: {results}");
        }
        let fairness = &run["fairness"];
        assert_eq!(fairness["winners"], STOCK, "{name}: {fairness}");
        let served = fairness["first_served"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&served), "{name}: {fairness}");
        assert!(fairness["kendall_tau"].as_f64().is_some(), "{name}: {fairness}");
    }
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(markdown.contains("## Open arrivals"), "report.md shows the arrival runs");
    assert!(markdown.contains("## Who got the units"), "report.md shows fairness");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("id=\"chart-from-arrival\""), "report.html charts it");
}
