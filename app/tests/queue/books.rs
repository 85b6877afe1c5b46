//! Two instances, one partition queue, 200 buyers at once: the single active
//! consumer sells exactly the stock.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Broker, drained, spawn_app, unique_prefix};

const STOCK: i64 = 50;
const BUYERS: i64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_and_200_concurrent_buyers_sell_exactly_the_stock() {
    let prefix = unique_prefix();
    let a = spawn_app(&prefix, |_| {}).await;
    let b = spawn_app(&prefix, |_| {}).await;
    let sale = a.sale("queue", STOCK).await;

    let mut tasks = tokio::task::JoinSet::new();
    for user in 1..=BUYERS {
        let app = if user % 2 == 0 { &a } else { &b };
        let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
        tasks.spawn(async move {
            let response = client.post(url).json(&json!({ "user_id": user })).send().await;
            let response = response.expect("the service answers");
            let status = response.status();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        });
    }
    let answers = tasks.join_all().await;
    let accepted = answers.iter().filter(|(s, _)| *s == StatusCode::ACCEPTED).count() as i64;
    for (status, body) in &answers {
        let sold_out = *status == StatusCode::CONFLICT && body["type"] == "/problems/sold-out";
        assert!(*status == StatusCode::ACCEPTED || sold_out, "{status} {body}");
    }
    assert!(accepted >= STOCK, "at least the stock was accepted: {accepted}");

    let stats = drained(&a, sale, Duration::from_secs(20)).await;
    assert_eq!(stats.accepted, accepted, "every 202 has its request");
    assert_eq!(stats.placed, STOCK, "{stats:?}");
    assert_eq!(stats.placed + stats.sold_out, accepted, "{stats:?}");
    assert_eq!(stats.rejected, 0);
    let audit = a.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.oversold, audit.remaining_stock, audit.ledger_drift),
        (STOCK, 0, 0, 0)
    );
    assert_eq!(audit.duplicate_orders, 0);
    // Every placed request points at its own order.
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM purchase_requests r LEFT JOIN orders o ON o.id = r.order_id
         WHERE r.sale_id = $1 AND r.status = 'placed'
           AND (o.user_id IS DISTINCT FROM r.user_id OR o.sale_id IS DISTINCT FROM r.sale_id)",
    )
    .bind(sale)
    .fetch_one(&a.db)
    .await
    .unwrap();
    assert_eq!(mismatched, 0);
    Broker::connect(&prefix).await.delete_queues().await;
}
