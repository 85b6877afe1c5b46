//! Redelivery, poison messages and a full queue.

use std::time::Duration;

use reqwest::StatusCode;
use seckill::strategy::queue::{PurchaseMessage, Topology};

use super::{
    Broker, SHARED_AMQP, buy, drained, eventually, queue_stats, request_id, resolved, spawn_app,
    unique_prefix,
};
use crate::support::{assert_problem, provoking};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_twice_yields_one_order_and_one_result() {
    let prefix = unique_prefix();
    // Accept without settling: no consumer yet.
    let front = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = front.sale("queue", 5).await;
    let (status, body) = buy(&front, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = request_id(&body);
    let copy =
        PurchaseMessage { request_id: id.parse().unwrap(), sale_id: sale, user_id: 1, quantity: 1 };
    let broker = Broker::connect(&prefix).await;
    broker.publish(&copy).await;

    // Both copies reach the consumer.
    let settler = spawn_app(&prefix, |_| {}).await;
    let first = resolved(&settler, sale, &id, Duration::from_secs(10)).await;
    assert_eq!(first["status"], "placed", "{first}");
    let queue = broker.topology.queue(0);
    assert!(
        eventually(Duration::from_secs(10), || async { broker.ready(&queue).await == 0 }).await
    );

    // A third copy after the result was recorded: settled idempotently. A
    // request of another buyer behind it on the same queue (one consumer,
    // in order) is resolved only once the copy has been settled.
    broker.publish(&copy).await;
    let (status, behind) = buy(&front, sale, 2).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{behind}");
    let behind = resolved(&settler, sale, &request_id(&behind), Duration::from_secs(10)).await;
    assert_eq!(behind["status"], "placed", "{behind}");
    let (_, again) = super::request(&settler, sale, &id, 0).await;
    assert_eq!(again, first, "same request, same result");
    let audit = settler.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold, audit.ledger_drift), (2, 2, 0));
    assert_eq!(queue_stats(&settler, sale).await.accepted, 2);
    broker.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_rejected_after_bounded_retries_and_its_dead_letter_drained() {
    provoking("an unreadable and a poison message (failed batches, dead letters)");
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |_| {}).await;
    let sale = app.sale("queue", 3).await;
    let broker = Broker::connect(&prefix).await;
    // Readable, but Postgres refuses it every time (an order of 0 units).
    let poison = PurchaseMessage {
        request_id: uuid::Uuid::new_v4(),
        sale_id: sale,
        user_id: 999,
        quantity: 0,
    };
    broker.publish(&poison).await;
    // Unreadable: dead-lettered at once.
    broker.publish_raw(sale, b"not a purchase").await;

    let mut ids = Vec::new();
    for user in 1..=3 {
        let (status, body) = buy(&app, sale, user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        ids.push(request_id(&body));
    }
    for id in &ids {
        let result = resolved(&app, sale, id, Duration::from_secs(20)).await;
        assert_eq!(result["status"], "placed", "{result}");
    }
    // The poison's request is rejected by the consumer's own count, with
    // the error; both dead letters are drained and counted.
    let rejected = eventually(Duration::from_secs(20), || async {
        queue_stats(&app, sale).await.rejected == 1
    })
    .await;
    assert!(rejected, "{:?}", queue_stats(&app, sale).await);
    let reason: Option<String> =
        sqlx::query_scalar("SELECT rejection_reason FROM purchase_requests WHERE id = $1")
            .bind(poison.request_id)
            .fetch_one(&app.db)
            .await
            .unwrap();
    let reason = reason.expect("a rejection reason");
    assert!(reason.starts_with("settling failed 5 times"), "{reason}");
    let dead = broker.topology.dead_letter_queue();
    let counted = eventually(Duration::from_secs(20), || async {
        dead_letters_counted(&app, "rejected").await >= 2
    })
    .await;
    assert!(counted, "{} dead letters counted", dead_letters_counted(&app, "rejected").await);
    assert_eq!(broker.ready(&dead).await, 0, "the dead-letter queue is drained");
    assert_eq!(broker.ready(&broker.topology.queue(0)).await, 0, "no endless requeue");
    let stats = drained(&app, sale, Duration::from_secs(5)).await;
    assert_eq!((stats.placed, stats.rejected), (3, 1), "{stats:?}");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (3, 0, 0));
    broker.delete_queues().await;
}

/// `seckill_queue_dead_lettered_total{reason}` of this test process (no
/// other test of this binary dead-letters).
async fn dead_letters_counted(app: &crate::support::TestApp, reason: &str) -> u64 {
    let series = seckill::metric_names::QUEUE_DEAD_LETTERED_TOTAL;
    super::counted(app, series, &format!("reason=\"{reason}\"")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_busy_and_accepts_nothing_it_cannot_keep() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |config| {
        config.strategies.queue.consume = false;
        config.strategies.queue.max_length = 3;
    })
    .await;
    let sale = app.sale("queue", 10).await;
    // A quorum queue turns to rejecting once it is over its bound, so the
    // message that crosses it may still be taken: 3 or 4 are accepted.
    let mut accepted = 0;
    let mut refused = None;
    for user in 1..=6 {
        let response = app.buy(sale, user).await;
        if response.status() == StatusCode::ACCEPTED {
            assert!(refused.is_none(), "accepted after a refusal");
            accepted += 1;
        } else if refused.is_none() {
            refused = Some(response);
        }
    }
    assert!((3..=4).contains(&accepted), "{accepted} accepted with room for 3");
    let response = refused.expect("the full queue refused a purchase");
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    assert_problem(response, StatusCode::SERVICE_UNAVAILABLE, "busy").await;
    assert_eq!(retry_after.as_deref(), Some("1"));
    let stats = queue_stats(&app, sale).await;
    assert_eq!((stats.accepted, stats.accepted_unresolved), (accepted, accepted), "{stats:?}");
    let limit = seckill::config::Config::defaults().strategies.queue.delivery_limit;
    let broker = Broker::connect_to(&SHARED_AMQP, Topology::new(&prefix, 1, 3, limit)).await;
    assert_eq!(i64::from(broker.ready(&broker.topology.queue(0)).await), accepted);
    broker.delete_queues().await;
}
