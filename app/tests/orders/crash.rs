//! An instance killed (`SIGKILL`) in the middle of a sweep: it had claimed a
//! due order (`FOR UPDATE SKIP LOCKED`), returned its unit and changed its
//! status, and had not committed. Deterministic: the child `seckill` is armed
//! with the failpoint `expiry-sweep-before-commit=hang`, so it holds the
//! claim until it is killed, and the test waits for Postgres to show it there
//! (no timer decides anything).
//!
//! The test runs in a database of its own: the child's sweep must find only
//! this test's orders, and the other tests' sweeps must not take them.

use std::time::Duration;

use reqwest::StatusCode;
use seckill::lifecycle::sweep::sweep_once;
use serde_json::json;
use sqlx::PgPool;

use super::harness::{Sweeps, remaining};
use crate::support::{ADMIN_TOKEN, buy_at, create_sale_at, eventually, seckill_child};

/// The backend of a connection to this database that is inside a
/// transaction whose last statement was a return's status change
/// (`Claim::end_order`): a claim held, uncommitted. Only the child writes
/// such statements before the test's own sweeps run.
async fn claim_holder(db: &PgPool) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'idle in transaction'
           AND query LIKE 'UPDATE orders SET status = $2, ended_at%'",
    )
    .fetch_optional(db)
    .await
    .unwrap()
}

/// Whether Postgres still has backend `pid`.
async fn backend_alive(db: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(pid)
        .fetch_one(db)
        .await
        .unwrap()
}

/// `(id, status)` of every order of `sale`, by id.
async fn orders_of(db: &PgPool, sale: i64) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT id, status FROM orders WHERE sale_id = $1 ORDER BY id")
        .bind(sale)
        .fetch_all(db)
        .await
        .unwrap()
}

/// A `sql` sale of `stock` units with a 200 ms payment window, created
/// through `base`; its id.
async fn window_sale(base: &str, stock: i64) -> i64 {
    let body = json!({ "name": "killed mid-sweep", "stock": stock, "strategy": "sql",
                       "payment_window_ms": 200 });
    create_sale_at(base, ADMIN_TOKEN, body).await
}

/// Buyers `users` buy one unit each of `sale` through `base`.
async fn buy(
    client: &reqwest::Client,
    base: &str,
    sale: i64,
    users: std::ops::RangeInclusive<i64>,
) {
    for user in users {
        let answer = buy_at(client, base, sale, user).await;
        assert_eq!(answer.status(), StatusCode::CREATED, "buyer {user}");
    }
}

/// Whether every pending order of `sale` is past its window.
async fn all_due(db: &PgPool, sale: i64) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE sale_id = $1 AND status = 'pending_payment'
           AND expires_at > clock_timestamp()",
    )
    .bind(sale)
    .fetch_one(db)
    .await
    .unwrap();
    waiting == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_sweep_returns_nothing_and_the_next_sweep_ends_each_order_once() {
    crate::support::provoking("an instance killed while it holds a swept order");
    let url = test_support::scratch_database("sweep_kill").await;
    let mut doomed = seckill_child(&[
        ("DATABASE_URL", url.clone()),
        ("SECKILL_EXPIRY_SWEEP_INTERVAL_MS", "20".into()),
        ("SECKILL_FAILPOINTS", "expiry-sweep-before-commit=hang".into()),
    ])
    .start()
    .await;
    let (client, base) = (reqwest::Client::new(), doomed.base.clone());
    let db = PgPool::connect(&url).await.unwrap();

    // The child's sweep claims sale A's order once it is due, returns its
    // unit, changes its status and hangs before the commit, holding the
    // order's row and the sale row.
    let held_sale = window_sale(&base, 1).await;
    buy(&client, &base, held_sale, 1..=1).await;
    let held_by =
        eventually(Duration::from_secs(20), || async { claim_holder(&db).await.is_some() }).await;
    assert!(held_by, "the child holds a swept order, uncommitted");
    let holder = claim_holder(&db).await.expect("the child's backend");
    let held = orders_of(&db, held_sale).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].1, "pending_payment", "to everyone else the order is still pending");
    assert_eq!(remaining(&db, held_sale).await, 0, "its unit is not back yet");

    // Another instance's sweep meanwhile skips the held order and expires
    // the due orders of another sale (the child's sweep is stuck).
    let other_sale = window_sale(&base, 2).await;
    buy(&client, &base, other_sale, 1..=2).await;
    assert!(eventually(Duration::from_secs(10), || all_due(&db, other_sale)).await);
    let sweeps = Sweeps::on(&url).await;
    // Bounded, so that a sweep that waited for the held row (no `SKIP
    // LOCKED`) fails the test instead of hanging it.
    let skipping = tokio::time::timeout(Duration::from_secs(30), sweep_once(sweeps.context()));
    let expired = skipping.await.expect("the sweep did not wait for the held order");
    assert_eq!(expired.unwrap(), 2, "the held order was skipped");
    assert_eq!(remaining(&db, other_sale).await, 2);

    // SIGKILL: Postgres rolls the held return back with the connection.
    doomed.kill();
    let gone =
        eventually(Duration::from_secs(20), || async { !backend_alive(&db, holder).await }).await;
    assert!(gone, "Postgres ended the killed instance's backend, rolling its transaction back");
    assert_eq!(orders_of(&db, held_sale).await, held, "the killed return left nothing behind");
    assert_eq!(remaining(&db, held_sale).await, 0, "its unit did not come back");

    // The next sweep takes the order over: every order ends expired once,
    // every unit came back once, and a further sweep finds nothing.
    assert_eq!(sweep_once(sweeps.context()).await.unwrap(), 1);
    assert_eq!(sweep_once(sweeps.context()).await.unwrap(), 0);
    for (sale, units) in [(held_sale, 1), (other_sale, 2)] {
        let ended = orders_of(&db, sale).await;
        assert!(ended.iter().all(|(_, s)| s == "expired"), "{ended:?}");
        assert_eq!(remaining(&db, sale).await, units, "every unit back, once");
        let mut conn = db.acquire().await.unwrap();
        let audit = seckill::audit::audit(&mut conn, seckill::sale::SaleId(sale)).await.unwrap();
        let audit = audit.expect("the sale exists");
        assert_eq!((audit.units_returned, audit.units_sold, audit.ledger_drift), (units, 0, 0));
    }
    drop(sweeps);
    db.close().await;
    test_support::drop_scratch_database(&url).await;
}
