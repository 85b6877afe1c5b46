//! End to end: `loadtest compare --redis-cluster` starts a local Redis
//! Cluster of 3 masters and runs `redis-decr` and `lock/fenced` on it: the
//! books stay exact, and the report names the cluster and where its keys
//! went.

const STOCK: i64 = 200;

#[test]
fn a_comparison_on_a_three_master_redis_cluster_keeps_exact_books() {
    let out = std::env::temp_dir().join(format!("loadtest-cluster-{}", std::process::id()));
    let stock = STOCK.to_string();
    let args = [
        "--strategies",
        "redis-decr,lock/fenced",
        "--stock",
        &stock,
        "--repeat",
        "1",
        "--redis-cluster",
    ];
    let report = crate::support::compare(&out, &args);
    for run in report["runs"].as_array().unwrap() {
        let name = run["strategy"].to_string();
        assert_eq!(run["verdict"], "ok", "{name}: {run}");
        assert_eq!(run["units_sold"], STOCK, "{name}");
        assert_eq!((run["oversold"].as_i64(), run["undersold"].as_i64()), (Some(0), Some(0)));
        assert_eq!(run["ledger_drift"], 0, "{name}");
        assert_eq!(run["errors_5xx"], 0, "{name}");
    }
    assert_eq!(report["config"]["redis_cluster"], true);
    assert!(report["config"]["redis_url"].as_str().unwrap().starts_with("redis+cluster://"));
    let masters = report["redis_cluster"]["masters"].as_array().unwrap();
    assert_eq!(masters.len(), 3, "{masters:?}");
    let keys: u64 = masters.iter().map(|m| m["keys"].as_u64().unwrap()).sum();
    assert!(keys > 0, "the runs wrote their keys on the cluster: {masters:?}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("Redis Cluster of 3 masters"), "{md}");
    let _ = std::fs::remove_dir_all(&out);
}
