//! End to end: without `--stock`, a comparison sizes each strategy's sale
//! from pilot sales so that its steady window lasts the target
//! (docs/report-format.md, "Steady windows").

use serde_json::Value;

/// The shortest ranked window of this test, seconds: short, so that the
/// test stays short; sizing aims at 5/3 of it.
const WINDOW_S: f64 = 1.0;

#[test]
fn sized_sales_give_every_run_a_steady_window_of_the_target() {
    let out = std::env::temp_dir().join(format!("loadtest-sizing-{}", std::process::id()));
    let window = WINDOW_S.to_string();
    let args = ["--strategies", "sql,lock/setnx", "--repeat", "2", "--steady-window-s", &window];
    let report = crate::support::compare(&out, &args);
    let pilots = report["pilots"].as_array().expect("pilots");
    for strategy in ["sql", "lock/setnx"] {
        let own: Vec<&Value> = pilots.iter().filter(|p| p["strategy"] == strategy).collect();
        assert!(!own.is_empty(), "{strategy} had a pilot sale: {pilots:?}");
        let first = own[0];
        assert_eq!(first["stock"], 1000, "{first}");
        assert_eq!(first["units_sold"], first["stock"], "a pilot sells out: {first}");
        assert_eq!(first["oversold"], 0, "{first}");
    }
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    for run in runs {
        let name = format!("{} #{}", run["strategy"], run["repeat"]);
        assert_eq!(run["verdict"], "ok", "{name}: {run}");
        assert_eq!(run["units_sold"], run["total_stock"], "{name}: sold out");
        let steady = run["steady_window_s"].as_f64().unwrap();
        assert!(steady >= WINDOW_S, "{name}: window {steady} s, stock {}", run["total_stock"]);
        assert_eq!(run["too_short_to_rank"], false, "{name}");
        // The stock follows the rate: rate × 5/3 × WINDOW_S ÷ 0.8, give or
        // take the estimate's error, not the profile's fixed 5000.
        let rate = run["sell_through_per_s"].as_f64().unwrap();
        let stock = run["total_stock"].as_f64().unwrap();
        let aimed = rate * WINDOW_S * 5.0 / 3.0 / 0.8;
        assert!(stock > aimed / 3.0 && stock < aimed * 3.0, "{name}: {stock} for {aimed}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
