//! An expiry does not wait for a buyer's connection: while slow purchases
//! hold every connection of the service's pool (and more buyers queue for
//! one), an order whose payment window ended is still expired and its unit
//! returned within one sweep period and its statements.
//!
//! The service runs on a database of its own: every other test service
//! sweeps the shared test database, and any of them could expire the order
//! in its place.

use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;

use super::harness::{bought, reaches, remaining, window_sale};
use crate::support::TestApp;

/// The expiry sweep's period.
const SWEEP_MS: u64 = 50;

/// The order's payment window: long enough for the slow purchases to hold
/// both connections before it ends.
const WINDOW_MS: i64 = 1_000;

/// Each slow purchase holds its connection for `work_ms` 6000 ± 50 %, so at
/// least 3 s: far past the window's end and [`BOUND`].
const SLOW_WORK_MS: i64 = 6_000;

/// The claim: from the window's end, the order is expired and its unit back
/// within this (one period, the statements, a loaded machine's scheduling).
const BOUND: Duration = Duration::from_millis(1_000);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_returns_its_unit_while_slow_buyers_hold_every_connection() {
    let url = test_support::scratch_database("full_pool").await;
    let database = url.clone();
    let app = TestApp::spawn_with(move |config| {
        config.backends.database_url = database;
        config.backends.db_pool_size = 2;
        // The slow purchases and the ones queued behind them wait, not fail.
        config.backends.db_acquire_timeout_ms = 60_000;
        config.http.request_timeout_ms = 60_000;
        config.lifecycle.expiry_sweep_interval_ms = SWEEP_MS;
    })
    .await;
    let returning = window_sale(&app, "sql", 1, WINDOW_MS).await;
    let slow = app
        .create_sale(
            json!({ "name": "slow", "stock": 10, "strategy": "sql", "work_ms": SLOW_WORK_MS }),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    // Both connections open before the slow purchases take them.
    tokio::join!(app.sale_status(slow), app.sale_status(slow));

    let order = bought(&app, returning, 1).await;
    let window_ends = tokio::time::Instant::now() + Duration::from_millis(WINDOW_MS as u64);
    // Two purchases take both connections; a third queues for one.
    let buyers: Vec<_> = (1..=3)
        .map(|user| {
            let (client, url) = (app.client.clone(), app.url(&format!("/sales/{slow}/orders")));
            tokio::spawn(async move {
                client.post(url).json(&json!({ "user_id": user })).send().await.unwrap().status()
            })
        })
        .collect();

    tokio::time::sleep_until(window_ends).await;
    let db = PgPool::connect(&url).await.unwrap();
    assert!(
        reaches(&db, order, "expired", BOUND).await,
        "the order was not expired within {BOUND:?} of its window's end while buyers held the pool"
    );
    assert_eq!(remaining(&db, returning).await, 1, "the unit is back on the sale");

    for buyer in buyers {
        assert!(buyer.await.unwrap().is_success(), "the slow purchases complete");
    }
    db.close().await;
    drop(app);
    test_support::drop_scratch_database(&url).await;
}
