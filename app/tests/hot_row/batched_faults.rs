//! `sql/batched` under faults: a batch whose Postgres connection is
//! terminated mid-transaction, and clients that leave before their batch
//! commits.

use std::collections::BTreeMap;
use std::task::Poll;
use std::time::Duration;

use seckill::sale::{Quantity, UserId};
use seckill::strategy::Strategy;
use serde_json::json;
use sqlx::PgPool;

use super::{Direct, assert_exact, burst, buy, orders, tally};
use crate::support::{TestApp, eventually, provoking};

/// A `sql/batched` sale of `stock` units whose batches hold the sale row for
/// `work_ms` ±50 % after writing their orders, before they commit.
async fn slow_sale(app: &TestApp, stock: i64, work_ms: i32) -> i64 {
    let body =
        json!({ "name": "slow", "stock": stock, "strategy": "sql/batched", "work_ms": work_ms });
    app.create_sale(body).await["id"].as_i64().unwrap()
}

/// Terminates the Postgres backend whose open transaction holds `sale`'s
/// row — a batch that wrote its orders and has not committed (`idle in
/// transaction`: it is in the sale's simulated work). Whether one was.
async fn terminate_the_batch_of(db: &PgPool, sale: i64) -> bool {
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid))
         FROM sales s JOIN pg_stat_activity a ON a.backend_xid = s.xmax
         WHERE s.id = $1 AND a.state = 'idle in transaction'",
    )
    .bind(sale)
    .fetch_one(db)
    .await
    .unwrap();
    terminated > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_connection_is_terminated_answers_503_and_applies_nothing() {
    provoking("Postgres connections terminated in the middle of a batch");
    let app = TestApp::spawn().await;
    let sale = slow_sale(&app, 100, 300).await;
    let terminate = eventually(Duration::from_secs(10), || terminate_the_batch_of(&app.db, sale));
    let apps = [&app];
    let (answers, terminated) = tokio::join!(burst(&apps, sale, 1..41), terminate);
    assert!(terminated, "a batch was caught before its commit");
    let all: Vec<String> = answers.iter().map(|(_, answer)| answer.clone()).collect();
    let counts = tally(&all);
    let failed = counts.get("503 /problems/unavailable").copied().unwrap_or(0);
    assert!(failed > 0, "{counts:?}");
    assert_eq!(failed + counts.get("201 ×1").copied().unwrap_or(0), 40, "{counts:?}");
    // The failed batch left nothing behind: only the 201s have orders.
    let placed: BTreeMap<i64, i32> = answers
        .iter()
        .filter(|(_, answer)| answer == "201 ×1")
        .map(|&(user, _)| (user, 1))
        .collect();
    assert_eq!(orders(&app.db, sale).await, placed);
    assert_exact(&app.audit(sale).await, 100, placed.len() as i64);
    // The service goes on: the refused buyers buy now.
    for (user, answer) in &answers {
        if answer != "201 ×1" {
            assert_eq!(buy(&app, sale, *user, 1).await, "201 ×1", "buyer {user} again");
        }
    }
    assert_exact(&app.audit(sale).await, 100, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_batch_gets_its_order_exactly_once() {
    let app = TestApp::spawn().await;
    let sale = slow_sale(&app, 5, 400).await;
    // Over HTTP: the client gives up long before its batch commits.
    let url = app.url(&format!("/sales/{sale}/orders"));
    let request = app.client.post(url).json(&json!({ "user_id": 7 }));
    let gave_up = request.timeout(Duration::from_millis(50)).send().await;
    assert!(gave_up.is_err_and(|err| err.is_timeout()), "the client left before its answer");
    let written = eventually(Duration::from_secs(5), || async {
        orders(&app.db, sale).await == BTreeMap::from([(7, 1)])
    });
    assert!(written.await, "the batch went on without the client");
    assert_eq!(buy(&app, sale, 7, 1).await, "409 /problems/already-purchased");
    assert_exact(&app.audit(sale).await, 5, 1);

    // Directly: the purchase future is dropped once it has joined its batch.
    let direct = Direct::new().await;
    let record = direct.sale(sale).await;
    let mut purchase = direct.strategy.purchase(&record, UserId::parse(8).unwrap(), Quantity::ONE);
    let first = std::future::poll_fn(|cx| Poll::Ready(purchase.as_mut().poll(cx))).await;
    assert!(first.is_pending(), "the purchase waits for its batch");
    drop(purchase);
    let written = eventually(Duration::from_secs(5), || async {
        orders(&app.db, sale).await == BTreeMap::from([(7, 1), (8, 1)])
    });
    assert!(written.await, "the dropped purchase's batch went on");
    assert_eq!(buy(&app, sale, 8, 1).await, "409 /problems/already-purchased");
    assert_exact(&app.audit(sale).await, 5, 2);
}
