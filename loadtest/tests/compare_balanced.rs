//! End to end: `loadtest compare --haproxy` sends the buyers through an
//! HAProxy in front of two instances, as replicas behind a load balancer
//! are run: the books stay exact, and HAProxy's own statistics show that
//! each instance was given a share of the requests.

const STOCK: i64 = 200;

#[test]
fn a_comparison_through_a_load_balancer_keeps_exact_books_on_every_replica() {
    let out = std::env::temp_dir().join(format!("loadtest-balanced-{}", std::process::id()));
    let stock = STOCK.to_string();
    let args = ["--strategies", "sql,redis-decr", "--stock", &stock, "--repeat", "1", "--haproxy"];
    let report = crate::support::compare(&out, &args);
    for run in report["runs"].as_array().unwrap() {
        let name = run["strategy"].to_string();
        assert_eq!(run["verdict"], "ok", "{name}: {run}");
        assert_eq!(run["units_sold"], STOCK, "{name}");
        assert_eq!((run["oversold"].as_i64(), run["undersold"].as_i64()), (Some(0), Some(0)));
        assert_eq!(run["errors_5xx"], 0, "{name}");
    }
    let balancer = &report["balancer"];
    assert!(balancer["kind"].as_str().unwrap().starts_with("HAProxy"), "{balancer}");
    let shares: Vec<u64> = balancer["requests_per_instance"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(shares.len(), 2, "{balancer}");
    // Round robin: each instance got about half (the ceilings, both sale
    // phases and both rejection phases went through the balancer).
    let total: u64 = shares.iter().sum();
    let sent: u64 =
        report["runs"].as_array().unwrap().iter().map(|r| r["requests"].as_u64().unwrap()).sum();
    assert!(total >= sent, "every buyer's request went through HAProxy: {total} < {sent}");
    assert!(shares.iter().all(|&n| n * 3 > total), "both replicas served: {shares:?}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("through HAProxy"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}
