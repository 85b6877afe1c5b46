//! An instance sweeps the due orders of a sale it never read. Its sweep has
//! one connection, held by the claim's transaction; the sale's row is read
//! through that transaction, not through the pool again (which waited for a
//! second connection until the pool's timeout, failed, and left the orders
//! locked for that long at every pass: units starved behind an instance
//! that happened to sweep first).
//!
//! On a database of its own: every other test service sweeps the shared one.

use std::time::Duration;

use sqlx::PgPool;

use super::harness::{bought, reaches, remaining, window_sale};
use crate::support::TestApp;

/// The order's payment window.
const WINDOW_MS: i64 = 300;

/// The claim: from the window's end, the order is expired and its unit back
/// within this (one sweep period, the statements, a loaded machine).
const BOUND: Duration = Duration::from_millis(1_000);

#[tokio::test]
async fn an_instance_expires_the_orders_of_a_sale_it_never_read() {
    let url = test_support::scratch_database("unread_sale").await;
    let (first, second) = (url.clone(), url.clone());
    // The selling instance does not sweep; the sweeping one never sees the
    // sale before its orders fall due, and would wait a minute for a second
    // connection.
    let seller = TestApp::spawn_with(move |config| {
        config.backends.database_url = first;
        config.lifecycle.expiry_sweep_interval_ms = 0;
    })
    .await;
    let _sweeper = TestApp::spawn_with(move |config| {
        config.backends.database_url = second;
        config.backends.db_acquire_timeout_ms = 60_000;
        config.lifecycle.expiry_sweep_interval_ms = 50;
    })
    .await;

    let sale = window_sale(&seller, "sql", 1, WINDOW_MS).await;
    let order = bought(&seller, sale, 1).await;
    tokio::time::sleep(Duration::from_millis(WINDOW_MS as u64)).await;
    let db = PgPool::connect(&url).await.unwrap();
    assert!(
        reaches(&db, order, "expired", BOUND).await,
        "the sweeping instance did not expire an order of a sale it had not read within {BOUND:?}"
    );
    assert_eq!(remaining(&db, sale).await, 1, "the unit is back on the sale");
    db.close().await;
    test_support::drop_scratch_database(&url).await;
}
