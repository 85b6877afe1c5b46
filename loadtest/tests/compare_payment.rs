//! End to end: `loadtest compare --profile payment` on a small sale and two
//! real instances, with buyer tokens: orders expire unpaid, their units come
//! back and sell again, and the books stay exact — for `sql` and for
//! `redis-decr`, whose returns also go through its Redis counter.

const STOCK: i64 = 100;

#[test]
fn compare_payment_returns_and_resells_units_with_exact_books() {
    let out = std::env::temp_dir().join(format!("loadtest-payment-{}", std::process::id()));
    let stock = STOCK.to_string();
    let args = [
        ["--strategies", "sql,redis-decr", "--profile", "payment"].as_slice(),
        &["--stock", &stock, "--repeat", "1", "--buyer-auth", "on"],
        &["--payment-window-ms", "500", "--unpaid-share", "0.3", "--sale-window-s", "50"],
    ]
    .concat();
    let report = crate::support::compare(&out, &args);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let name = run["strategy"].as_str().unwrap();
        assert_eq!((&run["expected"], &run["verdict"]), (&"correct".into(), &"ok".into()), "{run}");
        for figure in ["oversold", "undersold", "ledger_drift", "duplicate_orders", "errors_5xx"] {
            assert_eq!(run[figure], 0, "{name}: {figure}: {run}");
        }
        // Exact books once every unit is paid: nothing left, every unit in
        // a live (paid) order, none pending.
        let (sold, left) = (run["units_sold"].as_i64().unwrap(), run["remaining_stock"].as_i64());
        assert_eq!((sold, left), (STOCK, Some(0)), "{name}: {run}");
        let payment = &run["payment"];
        assert_eq!(payment["units_pending"], 0, "{name}: {payment}");
        assert_eq!(payment["payment_window_ms"], 500, "{name}: {payment}");
        assert!(payment["settled_s"].as_f64().is_some(), "{name}: every unit paid: {payment}");
        assert_eq!(payment["payments"]["paid"], STOCK, "{name}: one payment per unit: {payment}");
        // Units came back and sold again, counted from Postgres.
        let returned = run["units_returned"].as_i64().unwrap();
        let resold = run["units_resold"].as_i64().unwrap();
        assert!(returned > 0 && resold > 0, "{name}: returned {returned}, resold {resold}");
        assert!(resold <= returned, "{name}");
        let delays = &payment["expiry_to_resale_ms"];
        assert_eq!(delays["units"], resold, "{name}: one delay per resold unit: {delays}");
        let (p50, p90) = (delays["p50"].as_f64().unwrap(), delays["p90"].as_f64().unwrap());
        assert!(p50 >= 0.0 && p90 >= p50, "{name}: {delays}");
        assert!(payment["later_buyers"].as_u64().unwrap() > 0, "{name}: {payment}");
        if name == "redis-decr" {
            assert_eq!(run["redis_drift"], 0, "{run}");
        }
    }
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(markdown.contains("## Payment window"), "report.md shows the payment runs");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("id=\"payment\""), "report.html shows the payment runs");
}
