//! What keeps two consumers from settling one sale at once, and what happens
//! when they do anyway, each produced on purpose: the partition queue (as the
//! strategy declares it) delivers to one consumer at a time, and the next
//! only after the first is gone; an old consumer still committing a batch
//! while a new one settles the same messages (a fail-over) is serialized by
//! the sale's row lock; a long poll waits for the result.

use std::str::FromStr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use reqwest::StatusCode;
use seckill::failpoints::{self, BATCH_BEFORE_TAKE_STOCK};
use seckill::strategy::queue::PurchaseMessage;
use seckill::strategy::queue::settle::{Resolution, settle};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::{Broker, SHARED_AMQP, buy, eventually, request, request_id, spawn_app, unique_prefix};
use crate::support::test_database_url;

/// A consumer of `queue` on a connection of its own (an instance of its
/// own), acknowledging nothing.
async fn consumer(queue: &str, tag: &str) -> (Connection, lapin::Consumer) {
    let conn = Connection::connect(&SHARED_AMQP, ConnectionProperties::default()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.basic_qos(100, BasicQosOptions::default()).await.unwrap();
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (conn, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_queue_delivers_to_one_consumer_and_to_the_next_only_once_it_is_gone() {
    let prefix = unique_prefix();
    let broker = Broker::connect(&prefix).await; // the strategy's own declaration
    let queue = broker.topology.queue(0);
    let (first_conn, mut first) = consumer(&queue, "first").await;
    let (_second_conn, mut second) = consumer(&queue, "second").await;
    for _ in 0..20 {
        broker.publish_raw(0, b"{}").await;
    }

    let mut received = 0;
    let within = tokio::time::timeout(Duration::from_secs(30), async {
        while received < 20 {
            tokio::select! {
                delivery = first.next() => {
                    delivery.expect("a delivery").expect("no error");
                    received += 1;
                }
                _ = second.next() => panic!("a second consumer got a delivery while the first was active"),
            }
        }
    })
    .await;
    assert!(within.is_ok(), "the first consumer got {received} of 20");

    // The first instance goes: its unacknowledged messages go to the next.
    first_conn.close(200, "gone".into()).await.unwrap();
    let mut taken_over = 0;
    let within = tokio::time::timeout(Duration::from_secs(30), async {
        while taken_over < 20 {
            second.next().await.expect("a delivery").expect("no error");
            taken_over += 1;
        }
    })
    .await;
    assert!(within.is_ok(), "the next consumer got {taken_over} of 20");
    broker.delete_queues().await;
}

/// A pool on the test database whose connections carry `application_name`.
async fn named_pool(application_name: &str) -> PgPool {
    let options = PgConnectOptions::from_str(&test_database_url())
        .unwrap()
        .application_name(application_name);
    PgPoolOptions::new().max_connections(2).connect_with(options).await.unwrap()
}

/// Whether a connection of `application_name` waits for a lock.
async fn waits_for_a_lock(db: &PgPool, application_name: &str) -> bool {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = $1 AND wait_event_type = 'Lock'",
    )
    .bind(application_name)
    .fetch_one(db)
    .await
    .unwrap();
    waiting > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_consumer_still_committing_and_a_new_one_settle_the_same_messages_once() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = app.sale("queue", 5).await;
    let batch: Vec<PurchaseMessage> = (1..=3)
        .map(|user| PurchaseMessage {
            request_id: uuid::Uuid::new_v4(),
            sale_id: sale,
            user_id: user,
            quantity: 1,
        })
        .collect();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (old_name, new_name) = (format!("old-{run}"), format!("new-{run}"));
    let (old_db, new_db) = (named_pool(&old_name).await, named_pool(&new_name).await);
    let mut stalled = failpoints::arm::<()>(&BATCH_BEFORE_TAKE_STOCK, sale);

    // The old consumer has locked the sale and decided; it has not written.
    let old = {
        let batch = batch.clone();
        tokio::spawn(async move { settle(&old_db, &batch, 1).await })
    };
    stalled.reached().await;
    // The new consumer got the same messages redelivered.
    let new = {
        let batch = batch.clone();
        tokio::spawn(async move { settle(&new_db, &batch, 2).await })
    };
    let overlapped = eventually(Duration::from_secs(30), || async {
        new.is_finished() || waits_for_a_lock(&app.db, &new_name).await
    })
    .await;
    assert!(overlapped, "the new consumer neither waited nor finished");
    stalled.resume(());

    let old = old.await.unwrap().expect("the old consumer's batch commits");
    let new = new.await.unwrap().expect("the new consumer's batch commits");
    assert!(old.resolutions.iter().all(|r| matches!(r, Resolution::Placed { .. })));
    assert_eq!(new.resolutions, old.resolutions, "the redelivery keeps the first results");
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold, audit.remaining_stock), (3, 3, 2));
    assert_eq!((audit.oversold, audit.duplicate_orders, audit.ledger_drift), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_waits_for_the_result_until_its_bound() {
    let prefix = unique_prefix();
    let front = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = front.sale("queue", 1).await;
    let (status, body) = buy(&front, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = request_id(&body);

    // Nothing settles: the poll answers `pending` at its bound, not before.
    let started = Instant::now();
    let (status, body) = request(&front, sale, &id, 600).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("pending")));
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "answered after {:?}",
        started.elapsed()
    );

    // A waiting poll answers with the result as soon as the request is
    // resolved (here by hand: the poll only reads the row).
    let poll = {
        let (client, url) =
            (front.client.clone(), front.url(&format!("/sales/{sale}/requests/{id}?wait_ms=5000")));
        tokio::spawn(async move {
            let started = Instant::now();
            let body: serde_json::Value =
                client.get(url).send().await.unwrap().json().await.unwrap();
            (body, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    sqlx::query(
        "UPDATE purchase_requests SET status = 'sold_out', resolved_at = now() WHERE id = $1",
    )
    .bind(uuid::Uuid::parse_str(&id).unwrap())
    .execute(&front.db)
    .await
    .unwrap();
    let (body, took) = poll.await.unwrap();
    assert_eq!(body["status"], "sold_out", "{body}");
    assert!(took < Duration::from_secs(4), "answered after {took:?}, not when resolved");
    Broker::connect(&prefix).await.delete_queues().await;
}
