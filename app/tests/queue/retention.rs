//! Nothing grows forever: resolved requests older than
//! `SECKILL_QUEUE_RETENTION_MS` are deleted by a periodic job; a pending one
//! (the index of a message still queued) and the orders stay.
//!
//! The job deletes every sale's old requests, so the instance under test
//! runs on a scratch database beside the test database (created by the
//! instance, dropped at the end), where no other test's requests live.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use super::{Broker, SHARED_AMQP, eventually, scratch_database, unique_prefix};
use crate::support::{ADMIN_TOKEN, create_sale_at, seckill_child};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_requests_older_than_the_retention_are_deleted_and_pending_ones_kept() {
    let prefix = unique_prefix();
    let database = scratch_database("retention").await;
    let service = seckill_child(&[
        ("DATABASE_URL", database.clone()),
        ("AMQP_URL", SHARED_AMQP.to_owned()),
        ("SECKILL_AMQP_PREFIX", prefix.clone()),
        ("SECKILL_QUEUE_PARTITIONS", "1".into()),
        ("SECKILL_QUEUE_CONSUME", "true".into()),
        ("SECKILL_QUEUE_RETENTION_MS", "500".into()),
    ])
    .start()
    .await;
    let client = reqwest::Client::new();
    let body = json!({ "name": "retention", "stock": 1, "strategy": "queue" });
    let sale = create_sale_at(&service.base, ADMIN_TOKEN, body).await;
    let db = sqlx::PgPool::connect(&database).await.unwrap();
    let count = |status: &'static str| {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM purchase_requests WHERE sale_id = $1 AND status = $2",
            )
            .bind(sale)
            .bind(status)
            .fetch_one(&db)
            .await
            .unwrap()
        }
    };
    for user in 1..=2 {
        let response = client
            .post(format!("{}/sales/{sale}/orders", service.base))
            .json(&json!({ "user_id": user }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }
    // A request whose message is still queued somewhere: never deleted.
    sqlx::query(
        "INSERT INTO purchase_requests (id, sale_id, user_id, quantity, accepted_at)
         VALUES ($1, $2, 99, 1, now() - interval '1 hour')",
    )
    .bind(uuid::Uuid::new_v4())
    .bind(sale)
    .execute(&db)
    .await
    .unwrap();
    let resolved =
        eventually(Duration::from_secs(10), || async { count("placed").await == 1 }).await;
    assert!(resolved, "the purchase was settled");

    let expired = eventually(Duration::from_secs(5), || async {
        count("placed").await + count("sold_out").await == 0
    })
    .await;
    assert!(expired, "resolved requests outlived the retention");
    assert_eq!(count("pending").await, 1, "a pending request is kept");
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1")
        .bind(sale)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(orders, 1, "orders are kept");
    drop(service);
    db.close().await;
    Broker::connect(&prefix).await.delete_queues().await;
    test_support::drop_scratch_database(&database).await;
}
