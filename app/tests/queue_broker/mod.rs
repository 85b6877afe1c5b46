//! `queue` across failures of its servers: a broker restart, on a RabbitMQ
//! node this test owns (its own name, ports and directories beside the
//! shared broker), and repeated SIGKILLs of the instance holding the active
//! consumer ([`kills`]): no request that got a `202` is lost, and no order
//! is written twice. And `queue` through a broker user limited to the
//! service's prefix, on a node of its own too ([`least_privilege`]).
//!
//! Heavy (`test_support::heavy`): these tests start and stop brokers and
//! instances, which takes seconds, and no other heavy test shares those
//! seconds.

mod kills;
mod least_privilege;

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::RabbitMqNode;

use crate::support::{TestApp, drained, provoking};

const STOCK: i64 = 1000;
const BUYERS: i64 = 1500;

/// How long the buyers may take, restart included: about 4 s of buying and
/// 10–30 s of broker restart and reconnection on a busy 2-core machine. A
/// sale that stops accepting or settling after the restart fails the test
/// at this deadline instead of hanging it.
const SALE_DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_sale_loses_no_accepted_request_and_duplicates_no_order() {
    let _heavy = test_support::heavy();
    provoking("a restart of its own RabbitMQ node (lost connections, 503 busy or unavailable)");
    let mut broker = RabbitMqNode::start().await;
    let prefix = test_support::unique_prefix();
    let url = broker.url();
    let app = TestApp::spawn_with(move |config| {
        config.backends.amqp_url = url;
        config.backends.amqp_prefix = prefix;
        config.strategies.queue.partitions = 1;
        config.strategies.queue.consume = true;
        config.strategies.queue.batch_max = 10;
    })
    .await;
    let sale = app
        .create_sale(
            json!({ "name": "restart", "stock": STOCK, "strategy": "queue", "work_ms": 20 }),
        )
        .await["id"]
        .as_i64()
        .unwrap();
    // The first purchase declares the quorum queue; a fresh node needs a few
    // seconds before its queue leader survives a stop.
    let first = app.buy(sale, 1).await;
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.unwrap();
    let first_id = first["request_id"].as_str().expect("a request id").to_owned();
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Buyers keep coming through the restart, retrying `503`: ten at a
    // time, each taking ~25 ms per buyer, so the sale lasts longer than the
    // moment the broker stops.
    let buyers = Buyers {
        accepted: Arc::new(Mutex::new(vec![(1, first_id)])),
        next: Arc::new(AtomicI64::new(2)),
        refused: Arc::default(),
        deadline: tokio::time::Instant::now() + SALE_DEADLINE,
    };
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..10 {
        workers.spawn(buyers.clone().buy(app.client.clone(), app.base.clone(), sale));
    }
    // Stop the broker once the sale is under way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while buyers.accepted.lock().unwrap().len() < 50 {
        assert!(tokio::time::Instant::now() < deadline, "the sale got under way");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.stop();
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker.restart().await;
    workers.join_all().await;
    let refused = buyers.refused.load(Ordering::Relaxed);
    assert!(refused > 0, "the restart happened while buyers were buying");

    let accepted = buyers.accepted.lock().unwrap().clone();
    drained(&app, sale, Duration::from_secs(60)).await;
    assert_every_request_resolved_once(&app, sale, &accepted).await;
    let audit = app.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.oversold, audit.ledger_drift, audit.duplicate_orders),
        (STOCK, 0, 0, 0),
        "{audit:?}"
    );
    let requests_placed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM purchase_requests WHERE sale_id = $1 AND status = 'placed'",
    )
    .bind(sale)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(requests_placed, STOCK, "one placed request per order");
    broker.stop();
}

/// What the buyers of the test share: the requests accepted (buyer, request
/// id), the next buyer to come, how many `503 busy` answers they got, and
/// when they must be done.
#[derive(Clone)]
struct Buyers {
    accepted: Arc<Mutex<Vec<(i64, String)>>>,
    next: Arc<AtomicI64>,
    refused: Arc<AtomicU64>,
    deadline: tokio::time::Instant,
}

impl Buyers {
    /// One worker: takes the next buyer until there are none left, ~25 ms
    /// per buyer, each retrying `503 busy` until answered otherwise.
    ///
    /// Panics: a buyer still refused at the deadline (the sale never came
    /// back after the restart).
    async fn buy(self, client: reqwest::Client, base: String, sale: i64) {
        loop {
            let user = self.next.fetch_add(1, Ordering::Relaxed);
            if user > BUYERS {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
            loop {
                assert!(
                    tokio::time::Instant::now() < self.deadline,
                    "buyer {user} was still refused {SALE_DEADLINE:?} into the sale: the queue \
                     never accepted or settled again after the broker restart"
                );
                let response = client
                    .post(format!("{base}/sales/{sale}/orders"))
                    .json(&json!({ "user_id": user }))
                    .send()
                    .await
                    .unwrap();
                let status = response.status();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                match status {
                    StatusCode::ACCEPTED => {
                        let id = body["request_id"].as_str().unwrap().to_owned();
                        self.accepted.lock().unwrap().push((user, id));
                        break;
                    }
                    StatusCode::CONFLICT => break,
                    StatusCode::SERVICE_UNAVAILABLE => {
                        // Busy while the broker answers late, unavailable
                        // while it is gone: both are retried.
                        let kind = body["type"].as_str();
                        assert!(
                            kind == Some("/problems/busy")
                                || (kind == Some("/problems/unavailable")
                                    && body["backend"] == "rabbitmq"),
                            "{body}"
                        );
                        self.refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    other => panic!("unexpected {other}: {body}"),
                }
            }
        }
    }
}

/// Every 202 has a final result, and no order is the result of two
/// requests.
pub(crate) async fn assert_every_request_resolved_once(
    app: &TestApp,
    sale: i64,
    accepted: &[(i64, String)],
) {
    let mut placed = HashSet::new();
    for (user, id) in accepted {
        let result: Value = app
            .client
            .get(app.url(&format!("/sales/{sale}/requests/{id}")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let status = result["status"].as_str().unwrap();
        assert!(["placed", "sold_out"].contains(&status), "user {user}: {result}");
        if status == "placed" {
            assert!(placed.insert(result["order_id"].as_i64().unwrap()), "an order twice");
        }
    }
}
