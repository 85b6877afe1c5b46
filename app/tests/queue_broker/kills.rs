//! The instance whose consumer is active is SIGKILLed and restarted, five
//! times, with a backlog held by slow settlement and a delivery limit of 1:
//! each kill comes while the active consumer holds the sale's row lock in
//! its first batch, so the same messages at the head of the queue are in
//! flight (unacknowledged) at every kill, and RabbitMQ before 4.3 counts
//! every such return as a delivery. No accepted request is lost: every one
//! ends with a final result.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use test_support::{ChildService, ServiceLauncher};

use super::assert_every_request_resolved_once;
use crate::support::drained;
use crate::support::{TestApp, provoking, seckill_child};

const SHARED_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const STOCK: i64 = 20;
const BUYERS: i64 = 30;
const KILLS: usize = 5;

/// A consuming instance of `prefix`: one partition, batches of 5 (10
/// unacknowledged messages in flight), delivery limit 1.
fn consumer(prefix: &str) -> ServiceLauncher {
    seckill_child(&[
        ("AMQP_URL", SHARED_AMQP.to_owned()),
        ("SECKILL_AMQP_PREFIX", prefix.to_owned()),
        ("SECKILL_QUEUE_PARTITIONS", "1".into()),
        ("SECKILL_QUEUE_CONSUME", "true".into()),
        ("SECKILL_QUEUE_BATCH_MAX", "5".into()),
        ("SECKILL_QUEUE_DELIVERY_LIMIT", "1".into()),
    ])
}

/// Requests of the sale resolved so far.
async fn resolved_count(front: &TestApp, sale: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM purchase_requests WHERE sale_id = $1 AND status <> 'pending'",
    )
    .bind(sale)
    .fetch_one(&front.db)
    .await
    .unwrap()
}

/// Whether a consumer is settling a batch of the sale right now: it holds
/// the sale's row lock (for the batch's `work_ms`), so its deliveries are
/// unacknowledged.
async fn settling(front: &TestApp, sale: i64) -> bool {
    let mut tx = front.db.begin().await.unwrap();
    let locked = sqlx::query("SELECT 1 FROM sales WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(sale)
        .execute(&mut *tx)
        .await;
    tx.rollback().await.unwrap();
    match locked {
        Ok(_) => false,
        Err(err) => {
            let code = err.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
            assert_eq!(code.as_deref(), Some("55P03"), "{err}");
            true
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_kills_of_the_active_consumer_with_delivery_limit_1_lose_no_accepted_request() {
    let _heavy = test_support::heavy();
    provoking("five SIGKILLs of the instance holding the active consumer");
    let prefix = test_support::unique_prefix();
    // The front accepts; it does not consume.
    let front = {
        let prefix = prefix.clone();
        TestApp::spawn_with(move |config| {
            config.backends.amqp_url = SHARED_AMQP.to_owned();
            config.backends.amqp_prefix = prefix;
            config.strategies.queue.partitions = 1;
            config.strategies.queue.delivery_limit = 1;
        })
        .await
    };
    // Each batch of at most 5 holds the sale's row for about a second: the
    // kills come while the first batch of each consumer is in flight.
    let sale = front
        .create_sale(
            json!({ "name": "kills", "stock": STOCK, "strategy": "queue", "work_ms": 1000 }),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    // Every buyer is accepted before anything settles: the backlog.
    let accepted = buy_all(&front, sale).await;
    assert_eq!(accepted.len() as i64, BUYERS);
    let mut instances: [Option<ChildService>; 2] = [None, None];
    for instance in &mut instances {
        *instance = Some(consumer(&prefix).start().await);
    }

    // The first to subscribe is active; when it dies the other one takes
    // over, and the restarted one waits behind it: kill them in turn.
    for kill in 0..KILLS {
        let victim = kill % 2;
        let in_flight =
            crate::support::eventually(Duration::from_secs(20), || settling(&front, sale)).await;
        assert!(in_flight, "kill {kill}: the active consumer settles a batch");
        instances[victim].take().expect("running").kill();
        instances[victim] = Some(consumer(&prefix).start().await);
    }
    assert_eq!(
        resolved_count(&front, sale).await,
        0,
        "no batch committed before the last kill: the same messages were in flight at each"
    );

    drained(&front, sale, Duration::from_secs(60)).await;
    let ids: Vec<(i64, String)> =
        accepted.into_iter().enumerate().map(|(i, id)| (i as i64, id)).collect();
    assert_every_request_resolved_once(&front, sale, &ids).await;
    let audit = front.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.oversold, audit.ledger_drift, audit.duplicate_orders),
        (STOCK, 0, 0, 0),
        "{audit:?}"
    );
    drop(instances);
    let conn = lapin::Connection::connect(SHARED_AMQP, Default::default()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let topology = seckill::strategy::queue::Topology::new(
        &prefix,
        1,
        seckill::config::Config::from_env().strategies.queue.max_length,
        1,
    );
    topology.delete_queues(&channel).await.unwrap();
}

/// Every buyer once, ten at a time; the request ids (all `202`).
async fn buy_all(front: &TestApp, sale: i64) -> Vec<String> {
    let mut ids = Vec::new();
    for first in (1..=BUYERS).step_by(10) {
        let mut batch = tokio::task::JoinSet::new();
        for user in first..first + 10 {
            let (client, url) = (front.client.clone(), front.url(&format!("/sales/{sale}/orders")));
            batch.spawn(async move {
                let response =
                    client.post(url).json(&json!({ "user_id": user })).send().await.unwrap();
                let status = response.status();
                let body: serde_json::Value = response.json().await.unwrap();
                assert_eq!(status, StatusCode::ACCEPTED, "{body}");
                body["request_id"].as_str().unwrap().to_owned()
            });
        }
        ids.extend(batch.join_all().await);
    }
    ids
}
