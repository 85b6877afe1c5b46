//! One pass of the expiry sweep returns a sale's due orders together: one
//! transaction (one write of the sale's stock) per sale, whatever the
//! strategy, with the books exact. A return per order queued behind a hot
//! sale's buyers once per order, and fell seconds behind the expiries.

use std::time::Duration;

use seckill::lifecycle::sweep::sweep_once;
use sqlx::PgPool;

use super::harness::{Sweeps, bought, queued, remaining, window_sale};
use super::returns::RETURNING;
use crate::support::{TestApp, eventually};

/// Every strategy that returns units and needs no server of its own
/// (`lock/redlock` does; its return is `lock`'s, which the other `lock/*`
/// cover): those of the return tests, and `queue`.
fn swept() -> impl Iterator<Item = &'static str> {
    RETURNING.iter().copied().chain(["queue"])
}

/// Orders per sale: more than one, fewer than a claim's bound.
const ORDERS: i64 = 25;

/// How many transactions last wrote the orders of `sale` (the distinct
/// `xmin` of their rows).
async fn writers(db: &PgPool, sale: i64) -> i64 {
    sqlx::query_scalar("SELECT count(DISTINCT xmin::text) FROM orders WHERE sale_id = $1")
        .bind(sale)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Whether every order of `sale` is pending and past its window.
async fn all_due(db: &PgPool, sale: i64) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE sale_id = $1
           AND NOT (status = 'pending_payment' AND expires_at <= clock_timestamp())",
    )
    .bind(sale)
    .fetch_one(db)
    .await
    .unwrap();
    waiting == 0
}

/// In a database of its own, with the service's sweep off: the test's pass
/// is the only one.
#[tokio::test]
async fn a_pass_returns_the_due_orders_of_each_sale_in_one_transaction() {
    let url = test_support::scratch_database("sweep_per_sale").await;
    let (redis_prefix, amqp_prefix) =
        (test_support::unique_prefix(), test_support::unique_prefix());
    let (own, keys, queues) = (url.clone(), redis_prefix.clone(), amqp_prefix.clone());
    let app = TestApp::spawn_with(move |config| {
        config.backends.database_url = own;
        config.backends.redis_prefix = keys;
        config.backends.amqp_prefix = queues;
        config.lifecycle.expiry_sweep_interval_ms = 0;
        config.strategies.queue.partitions = 1;
        config.strategies.queue.consume = true;
    })
    .await;
    let db = PgPool::connect(&url).await.unwrap();
    let mut sales = Vec::new();
    for strategy in swept() {
        let sale = window_sale(&app, strategy, ORDERS, 500).await;
        for user in 0..ORDERS {
            if strategy == "queue" {
                queued(&app, sale, user).await.unwrap();
            } else {
                bought(&app, sale, user).await;
            }
        }
        assert_eq!(remaining(&db, sale).await, 0, "{strategy}: sold out");
        sales.push((strategy, sale));
    }
    for &(strategy, sale) in &sales {
        let due = eventually(Duration::from_secs(10), || all_due(&db, sale)).await;
        assert!(due, "{strategy}: every order pending and due");
    }

    let sweeps = Sweeps::sharing(&url, &redis_prefix, &amqp_prefix).await;
    let expired = sweep_once(sweeps.context()).await.unwrap();
    assert_eq!(expired, swept().count() * ORDERS as usize, "every due order, in one pass");
    for &(strategy, sale) in &sales {
        assert_eq!(writers(&db, sale).await, 1, "{strategy}: the sale's orders ended together");
        assert_eq!(remaining(&db, sale).await, ORDERS, "{strategy}: every unit back, once");
        let audit = app.audit(sale).await;
        assert_eq!(audit.units_returned, ORDERS, "{strategy}");
        assert_eq!((audit.units_sold, audit.units_pending), (0, 0), "{strategy}");
        assert_eq!((audit.ledger_drift, audit.oversold), (0, 0), "{strategy}");
        assert!(matches!(audit.redis_drift, None | Some(0)), "{strategy}: {:?}", audit.redis_drift);
    }
    let placed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM purchase_requests WHERE status = 'placed' AND sale_id = $1",
    )
    .bind(sales.iter().find(|(strategy, _)| *strategy == "queue").unwrap().1)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(placed, 0, "queue: every ended order's request is returned, its buyer free again");
    assert_eq!(sweep_once(sweeps.context()).await.unwrap(), 0, "nothing left");

    drop(sweeps);
    crate::support::delete_queues(&amqp_prefix, 1).await;
    db.close().await;
    test_support::drop_scratch_database(&url).await;
}
