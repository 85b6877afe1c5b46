//! The instance whose consumer is active dies mid-sale: the broker makes
//! another instance's consumer active and hands it the unacknowledged
//! messages; every accepted request still ends resolved, nothing oversold.

use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use seckill::metric_names::QUEUE_CONSUMER_SUBSCRIPTIONS_TOTAL;
use serde_json::json;

use super::{Broker, SHARED_AMQP, drained, eventually, request_id, spawn_app, unique_prefix};
use crate::support::{TestApp, seckill_child};

const STOCK: i64 = 30;
const BUYERS: i64 = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_instance_with_the_active_consumer_hands_the_sale_to_another() {
    let prefix = unique_prefix();
    let broker = Broker::connect(&prefix).await;
    let queue = broker.topology.queue(0);
    let consumers = || async {
        let declared = broker
            .channel
            .queue_declare(
                queue.as_str().into(),
                lapin::options::QueueDeclareOptions { passive: true, ..Default::default() },
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        declared.consumer_count()
    };

    // The first consumer to subscribe is the active one: a child process,
    // so that the test can kill it.
    let doomed = seckill_child(&[
        ("AMQP_URL", SHARED_AMQP.to_owned()),
        ("SECKILL_AMQP_PREFIX", prefix.clone()),
        ("SECKILL_QUEUE_PARTITIONS", "1".into()),
        ("SECKILL_QUEUE_CONSUME", "true".into()),
        ("SECKILL_QUEUE_BATCH_MAX", "3".into()),
    ])
    .start()
    .await;
    assert!(eventually(Duration::from_secs(10), || async { consumers().await == 1 }).await);
    let survivor = spawn_app(&prefix, |config| config.strategies.queue.batch_max = 3).await;
    // A single-active-consumer queue reports its active consumer only; give
    // the survivor's (waiting) consumer time to subscribe.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Each batch of at most 3 holds the sale for ~400 ms: the sale takes seconds.
    let sale = survivor
        .create_sale(
            json!({ "name": "fail-over", "stock": STOCK, "strategy": "queue", "work_ms": 400 }),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    let accepted = buy_all(&survivor, sale).await;
    // Kill the active consumer once it has settled something, mid-sale.
    let survivor_ref = &survivor;
    let started =
        eventually(
            Duration::from_secs(10),
            || async move { survivor_ref.audit(sale).await.orders > 0 },
        )
        .await;
    assert!(started, "the active consumer settles");
    drop(doomed); // SIGKILL
    let killed_at = Utc::now();
    let before = survivor.audit(sale).await.units_sold;
    assert!(before < STOCK, "the sale was still selling when the consumer died ({before})");

    let stats = drained(&survivor, sale, Duration::from_secs(60)).await;
    assert_eq!(stats.accepted, accepted.len() as i64);
    assert_eq!(stats.rejected, 0);
    let audit = survivor.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.oversold, audit.ledger_drift, audit.duplicate_orders),
        (STOCK, 0, 0, 0)
    );
    let after_kill: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM purchase_requests WHERE sale_id = $1 AND resolved_at > $2",
    )
    .bind(sale)
    .bind(killed_at)
    .fetch_one(&survivor.db)
    .await
    .unwrap();
    assert!(after_kill > 0, "the survivor's consumer took over");
    broker.delete_queues().await;
}

/// Every buyer at once; the request ids of the accepted (each buyer is
/// either accepted or told the sale is sold out).
async fn buy_all(survivor: &TestApp, sale: i64) -> Vec<String> {
    let mut buyers = tokio::task::JoinSet::new();
    for user in 1..=BUYERS {
        let (client, url) =
            (survivor.client.clone(), survivor.url(&format!("/sales/{sale}/orders")));
        buyers.spawn(async move {
            let response = client.post(url).json(&json!({ "user_id": user })).send().await.unwrap();
            let status = response.status();
            (status, response.json::<serde_json::Value>().await.unwrap())
        });
    }
    let mut accepted = Vec::new();
    for (status, body) in buyers.join_all().await {
        if status == StatusCode::ACCEPTED {
            accepted.push(request_id(&body));
        } else {
            assert_eq!(status, StatusCode::CONFLICT, "{body}");
        }
    }
    accepted
}

/// A consumer with nothing to do keeps its subscription: its wait for a
/// delivery looks at the channel every second and goes on waiting while the
/// channel is open, instead of giving up and subscribing again (which a
/// partition's consumer would then do every idle second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_consumer_keeps_its_subscription() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |_| {}).await;
    let queue = super::topology(&prefix).queue(0);
    let label = format!("queue=\"{queue}\"");
    let subscriptions = || super::counted(&app, QUEUE_CONSUMER_SUBSCRIPTIONS_TOTAL, &label);
    let subscribed = eventually(Duration::from_secs(10), || async { subscriptions().await >= 1 });
    assert!(subscribed.await, "the consumer subscribed");
    // Idle for 2.5 liveness periods of 1 s: the channel was looked at twice.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(subscriptions().await, 1, "subscribed once, and still subscribed");
    Broker::connect(&prefix).await.delete_queues().await;
}
