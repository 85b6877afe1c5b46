//! A process that dies between the decrement and the Postgres insert leaves
//! an open reservation; reconciliation returns it after the grace period.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use seckill::failpoints;

use super::{RedisView, SHARED_REDIS, eventually, reconcile, spawn_app, unique_prefix};
use crate::support::seckill_child;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_decrement_and_insert_is_returned_after_the_grace_period() {
    crate::support::provoking("a crash between decrement and insert (an abandoned reservation)");
    const GRACE_MS: u64 = 3000;
    let prefix = unique_prefix();
    // The survivor runs the background reconciler.
    let survivor = spawn_app(&SHARED_REDIS, &prefix, |config| {
        config.strategies.redis_decr.reconcile_interval_ms = 200;
        config.strategies.redis_decr.reconcile_grace_ms = GRACE_MS;
    })
    .await;
    let sale = survivor.sale("redis-decr", 3).await;
    let mut redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;

    // A second instance that dies right after its first decrement.
    let mut doomed = seckill_child(&[
        ("SECKILL_REDIS_PREFIX", prefix.clone()),
        ("SECKILL_REDIS_DECR_RECONCILE_INTERVAL_MS", "0".into()),
        ("SECKILL_FAILPOINTS", "redis-decr-after-reserve=exit".into()),
    ])
    .start()
    .await;
    let answer = reqwest::Client::new()
        .post(format!("{}/sales/{sale}/orders", doomed.base))
        .json(&json!({ "user_id": 1 }))
        .send()
        .await;
    assert!(answer.is_err(), "the process died before answering");
    assert_eq!(doomed.exit_code().await, Some(failpoints::EXIT_CODE));

    // The unit is taken in Redis, with no order: an open reservation. Within
    // the grace period it is left alone (it could be a slow purchase).
    assert_eq!(redis.stock().await, Some(2));
    assert_eq!(redis.open_reservations().await, 1);
    let early = reconcile(&survivor, sale).await;
    assert_eq!(
        (early.redis_drift, early.returned_units, early.in_flight_reservations),
        (Some(0), 0, 1)
    );

    // After the grace period the background job returns it.
    let survivor_ref = &survivor;
    let returned = eventually(Duration::from_millis(GRACE_MS + 5000), || async move {
        survivor_ref.audit(sale).await.reconcile_fixes == Some(1)
    })
    .await;
    assert!(returned, "the background reconciler returned the abandoned unit");
    assert_eq!(redis.stock().await, Some(3));
    assert_eq!(redis.open_reservations().await, 0);
    assert!(!redis.is_buyer(1).await);

    // The sale then sells out exactly — the crashed buyer included.
    let statuses = survivor.burst(sale, 1, 6).await;
    let placed = statuses.iter().filter(|s| **s == StatusCode::CREATED).count();
    assert_eq!(placed, 3);
    let audit = survivor.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.remaining_stock, audit.oversold, audit.ledger_drift),
        (3, 0, 0, 0)
    );
    assert_eq!((audit.redis_drift, audit.reconcile_fixes), (Some(0), Some(1)));
}
