//! A request left `pending` with no message behind it — its instance died,
//! or its connection to Postgres was cut after the registration committed
//! but before the reply came, so the buyer was answered `503` and nothing was
//! published — is published again by the republish job and settled, without
//! the buyer coming back.
//!
//! The tests write that state themselves: a request row as the registrar
//! writes it, and no message. The job republishes every sale's requests, so
//! each test's service runs on a scratch database of its own (created by the
//! service, dropped at the end), where no other test's requests live.

use std::time::Duration;

use serde_json::json;

use super::{Broker, SHARED_AMQP, eventually, scratch_database, unique_prefix};
use crate::support::{ADMIN_TOKEN, create_sale_at, seckill_child};

/// A `queue` service on `database` with queues named after `prefix`, one
/// partition, its consumer on or off and a republish threshold of
/// `after_ms`; its pool on `database`, and a sale of `stock` units.
async fn start(
    database: &str,
    prefix: &str,
    consume: bool,
    after_ms: u64,
    stock: i64,
) -> (test_support::ChildService, sqlx::PgPool, i64) {
    let service = seckill_child(&[
        ("DATABASE_URL", database.to_owned()),
        ("AMQP_URL", SHARED_AMQP.to_owned()),
        ("SECKILL_AMQP_PREFIX", prefix.to_owned()),
        ("SECKILL_QUEUE_PARTITIONS", "1".into()),
        ("SECKILL_QUEUE_CONSUME", consume.to_string()),
        ("SECKILL_QUEUE_REPUBLISH_AFTER_MS", after_ms.to_string()),
    ])
    .start()
    .await;
    let body = json!({ "name": "republish", "stock": stock, "strategy": "queue" });
    let sale = create_sale_at(&service.base, ADMIN_TOKEN, body).await;
    let db = sqlx::PgPool::connect(database).await.unwrap();
    (service, db, sale)
}

/// Inserts a pending request of `user` for one unit of `sale`, accepted
/// `age_s` seconds ago (negative: in the future), as the registrar does;
/// publishes nothing. Returns its id.
async fn orphaned_request(db: &sqlx::PgPool, sale: i64, user: i64, age_s: f64) -> uuid::Uuid {
    request_row(db, sale, user, age_s, "pending").await
}

/// Inserts a request of `user` for one unit of `sale` with `status`,
/// accepted `age_s` seconds ago. Returns its id.
async fn request_row(
    db: &sqlx::PgPool,
    sale: i64,
    user: i64,
    age_s: f64,
    status: &str,
) -> uuid::Uuid {
    let id = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO purchase_requests (id, sale_id, user_id, quantity, accepted_at, status)
         VALUES ($1, $2, $3, 1, clock_timestamp() - make_interval(secs => $4), $5)",
    )
    .bind(id)
    .bind(sale)
    .bind(user)
    .bind(age_s)
    .bind(status)
    .execute(db)
    .await
    .unwrap();
    id
}

/// `(status, republished_at is set)` of request `id`.
async fn state(db: &sqlx::PgPool, id: uuid::Uuid) -> (String, bool) {
    sqlx::query_as("SELECT status, republished_at IS NOT NULL FROM purchase_requests WHERE id = $1")
        .bind(id)
        .fetch_one(db)
        .await
        .unwrap()
}

/// `republished_at` of request `id`, in seconds since the epoch.
async fn stamp(db: &sqlx::PgPool, id: uuid::Uuid) -> f64 {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM republished_at)::float8 FROM purchase_requests WHERE id = $1",
    )
    .bind(id)
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_request_whose_message_was_never_published_is_published_again_and_settled() {
    let prefix = unique_prefix();
    let database = scratch_database("republish_settle").await;
    let (service, db, sale) = start(&database, &prefix, true, 500, 1).await;
    let id = orphaned_request(&db, sale, 7, 0.0).await;

    let settled =
        eventually(Duration::from_secs(30), || async { state(&db, id).await.0 != "pending" }).await;
    assert!(settled, "the request is still pending");
    assert_eq!(state(&db, id).await, ("placed".to_owned(), true), "settled by the republish job");
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE sale_id = $1 AND user_id = 7")
            .bind(sale)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(orders, 1);

    drop(service);
    db.close().await;
    Broker::connect(&prefix).await.delete_queues().await;
    test_support::drop_scratch_database(&database).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_requests_pending_past_the_threshold_are_republished_and_each_once_per_threshold() {
    let prefix = unique_prefix();
    let database = scratch_database("republish_claim").await;
    // No consumer: what the job publishes stays in the queue to be counted.
    // A threshold of 10 s: the job runs every 5 s.
    let (service, db, sale) = start(&database, &prefix, false, 10_000, 10).await;
    let broker = Broker::connect(&prefix).await;
    let queue = broker.topology.queue(0);
    let stale = orphaned_request(&db, sale, 1, 60.0).await;
    let young = orphaned_request(&db, sale, 2, -3600.0).await;
    let settled = request_row(&db, sale, 3, 60.0, "sold_out").await;

    let published =
        eventually(Duration::from_secs(20), || async { broker.ready(&queue).await >= 1 }).await;
    assert!(published, "the stale request was not published");
    assert!(state(&db, stale).await.1, "the stale request is stamped");
    assert!(!state(&db, young).await.1, "a request younger than the threshold is left alone");
    assert!(!state(&db, settled).await.1, "a settled request is left alone");

    // A pass comes every 5 s, and each republish stamps the request anew:
    // the second copy must carry a stamp at least 10 s after the first, and
    // be the only other one. Read from the stamps, not from a sleep, so a
    // slow host cannot make the check pass or fail by itself.
    let first = stamp(&db, stale).await;
    let again =
        eventually(Duration::from_secs(30), || async { broker.ready(&queue).await >= 2 }).await;
    assert!(again, "the stale request was not republished after the threshold");
    let second = stamp(&db, stale).await;
    assert!(
        second - first >= 10.0,
        "republished {:.1} s after its previous stamp, within its 10 s threshold",
        second - first
    );
    assert_eq!(broker.ready(&queue).await, 2, "one copy per threshold");

    drop(service);
    db.close().await;
    broker.delete_queues().await;
    test_support::drop_scratch_database(&database).await;
}
