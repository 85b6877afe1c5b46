//! Mutual exclusion measured across instances: with a lock that works, at
//! most one buyer is inside a sale's critical section at any instant, over
//! every instance (`max_concurrency` = 1), and the books are exact.

use serde_json::json;

use crate::harness::{lock_stats_of_all, sale_with, spawn, unique_prefix};

/// Two instances on one Redis prefix sell `strategy`'s sale to 16 buyers.
async fn one_holder_at_a_time_across_two_instances(strategy: &str) {
    let prefix = unique_prefix();
    let (one, two) = (spawn(&prefix, 5000).await, spawn(&prefix, 5000).await);
    let sale = sale_with(&one, strategy, 6, json!({ "work_ms": 4 })).await;
    tokio::join!(one.burst(sale, 1, 8), two.burst(sale, 101, 8));
    let audit = one.audit(sale).await;
    assert_eq!((audit.oversold, audit.ledger_drift, audit.units_sold), (0, 0, 6), "{audit:?}");
    let stats = lock_stats_of_all(&[&one, &two], sale).await;
    assert_eq!(stats.max_concurrency, 1, "{stats:?}");
    assert!(stats.critical_sections >= 6, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setnx_lock_admits_one_holder_at_a_time_across_instances() {
    one_holder_at_a_time_across_two_instances("lock/setnx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_lock_within_its_lease_admits_one_holder_at_a_time_across_instances() {
    one_holder_at_a_time_across_two_instances("lock/ttl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_lock_within_its_lease_admits_one_holder_at_a_time_across_instances() {
    one_holder_at_a_time_across_two_instances("lock/token").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_lock_admits_one_holder_at_a_time_on_one_instance() {
    let app = spawn(&unique_prefix(), 5000).await;
    let sale = sale_with(&app, "lock/local", 6, json!({ "work_ms": 4 })).await;
    app.burst(sale, 1, 16).await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.oversold, audit.ledger_drift, audit.units_sold), (0, 0, 6), "{audit:?}");
    let stats = lock_stats_of_all(&[&app], sale).await;
    assert_eq!(stats.max_concurrency, 1, "{stats:?}");
}
