//! The reconciler converges under load: with Postgres at 0 and the counter 1
//! above it, every buyer takes the phantom unit, Postgres refuses, the unit
//! comes back — and the sequence the compare-and-set correction checks never
//! stands still. The correction behind the sale's gate still lands while
//! demand goes on: without the gate it waited for demand to stop. How soon
//! it lands (the first pass, on an idle machine) is a figure the test
//! prints, not what it asserts: on a machine whose cores are busy with other
//! work the passes and the test's own checks slow down alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;

use super::{RedisView, SHARED_REDIS, spawn_app, unique_prefix};

const INTERVAL_MS: u64 = 1000;

/// How long demand goes on at most while the test waits for the correction:
/// ten passes.
const PASSES_ALLOWED: u64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_above_postgres_converges_while_demand_goes_on() {
    crate::support::provoking("a Redis counter above Postgres under load (corrections)");
    let prefix = unique_prefix();
    let app = spawn_app(&SHARED_REDIS, &prefix, |config| {
        config.strategies.redis_decr.reconcile_interval_ms = INTERVAL_MS;
        // No sold-out flag: every buyer reaches Redis, as distinct buyers
        // arriving across many instances would.
        config.strategies.sold_out_flag_ttl_ms = 0;
    })
    .await;
    let sale = app.sale("redis-decr", 1).await;
    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
    let mut redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    assert_eq!(redis.stock().await, Some(0));

    // Demand: distinct buyers, back to back, from 16 clients.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicI64::new(2));
    let mut buyers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
        let (stop, next) = (stop.clone(), next.clone());
        buyers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let user = next.fetch_add(1, Ordering::Relaxed);
                let body = serde_json::json!({ "user_id": user });
                let status = client.post(&url).json(&body).send().await.unwrap().status();
                assert_ne!(status, StatusCode::CREATED, "Postgres has no unit to sell");
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The counter drifts 1 above Postgres while buyers keep coming (as when
    // a purchase slower than the grace period commits after its reservation
    // was returned). A pass may have retired the sold-out sale already (its
    // books were settled); what drifts is visited again.
    redis.set_stock(1).await;
    let handle = seckill::backends::RedisHandle::new(&SHARED_REDIS, &prefix).unwrap();
    redis::cmd("SADD")
        .arg(seckill::strategy::redis_decr::counter::sales_index_key(&handle))
        .arg(sale)
        .query_async::<i64>(&mut redis.conn)
        .await
        .unwrap();
    let drifted_at = tokio::time::Instant::now();
    let before = next.load(Ordering::Relaxed);
    let mut converged = None;
    while drifted_at.elapsed() < Duration::from_millis(PASSES_ALLOWED * INTERVAL_MS) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if redis.stock().await == Some(0) && app.audit(sale).await.redis_drift == Some(0) {
            converged = Some(drifted_at.elapsed());
            break;
        }
    }
    let buyers_meanwhile = next.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    buyers.join_all().await;
    assert!(buyers_meanwhile > 50, "demand went on ({buyers_meanwhile} buyers)");
    let converged = converged.unwrap_or_else(|| {
        panic!("the counter still stood above Postgres after {PASSES_ALLOWED} intervals of demand")
    });
    eprintln!(
        "note: converged after {converged:?} ({buyers_meanwhile} buyers meanwhile, interval {INTERVAL_MS} ms)"
    );
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.redis_drift, audit.ledger_drift), (1, Some(0), 0));
}
