//! Reconciliation corrects a counter that disagrees with Postgres, and the
//! audit reports the drift before it does.

use reqwest::StatusCode;

use super::{RedisView, SHARED_REDIS, buy, reconcile, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_corrects_a_counter_that_disagrees_with_postgres() {
    reconciliation_corrects_a_counter_that_disagrees_with_postgres_on(&SHARED_REDIS).await;
}

/// The body of the test of that name on the Redis at `url` (one node or a cluster).
pub async fn reconciliation_corrects_a_counter_that_disagrees_with_postgres_on(url: &str) {
    crate::support::provoking("a Redis counter that disagrees with Postgres (corrections)");
    let prefix = unique_prefix();
    let app = spawn_app(url, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 10).await;
    for user in 1..=2 {
        assert_eq!(buy(&app, sale, user).await.0, StatusCode::CREATED);
    }
    let mut redis = RedisView::new(url, &prefix, sale).await;
    assert_eq!(redis.stock().await, Some(8));

    // Too low: units Redis would never sell (undersell).
    redis.set_stock(5).await;
    assert_eq!(app.audit(sale).await.redis_drift, Some(-3));
    let report = reconcile(&app, sale).await;
    assert_eq!(
        (report.redis_drift, report.corrected_units, report.returned_units),
        (Some(-3), 3, 0)
    );
    assert_eq!(redis.stock().await, Some(8));

    // Too high: Redis admits buyers that Postgres will refuse.
    redis.set_stock(12).await;
    assert_eq!(app.audit(sale).await.redis_drift, Some(4));
    let report = reconcile(&app, sale).await;
    assert_eq!((report.redis_drift, report.corrected_units), (Some(4), 4));
    assert_eq!(redis.stock().await, Some(8));

    // A pass over healthy books changes nothing.
    let report = reconcile(&app, sale).await;
    assert_eq!((report.redis_drift, report.fixes()), (Some(0), 0));
    let audit = app.audit(sale).await;
    assert_eq!((audit.redis_drift, audit.reconcile_fixes), (Some(0), Some(7)));
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (2, 8, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_leaves_alone_keys_warmed_for_another_database() {
    crate::support::provoking("Redis keys warmed for another database's sale");
    let prefix = unique_prefix();
    let app = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 5).await;
    let mut redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    // The service's own warm-up ties the keys to its sale: `created_at`, µs.
    let created_us: i64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM created_at) * 1000000)::bigint FROM sales WHERE id = $1",
    )
    .bind(sale)
    .fetch_one(&app.db)
    .await
    .unwrap();
    let stored: Option<i64> = redis::cmd("GET")
        .arg(&redis.counter.origin_key)
        .query_async(&mut redis.conn)
        .await
        .unwrap();
    assert_eq!(stored, Some(created_us), "the origin the warm-up stored");
    // Keys written by an instance on another database, for its own sale
    // that happens to have the same id.
    redis::cmd("SET")
        .arg(&redis.counter.origin_key)
        .arg(42)
        .query_async::<()>(&mut redis.conn)
        .await
        .unwrap();
    redis.set_stock(2).await;

    let report = reconcile(&app, sale).await;
    assert_eq!((report.redis_drift, report.fixes()), (None, 0));
    assert_eq!(redis.stock().await, Some(2), "another database's counter is not touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategies_without_a_counter_report_null_drift_and_nothing_to_reconcile() {
    let app = spawn_app(&SHARED_REDIS, &unique_prefix(), |_| {}).await;
    let sale = app.sale("sql", 2).await;
    let report = reconcile(&app, sale).await;
    assert_eq!((report.redis_drift, report.fixes()), (None, 0));
    let audit = app.audit(sale).await;
    assert_eq!((audit.redis_drift, audit.reconcile_fixes), (None, None));
}
