//! What the `queue` strategy does not take on trust: a message on its
//! partition queue that no instance accepted, a sold-out event that the
//! service did not publish, and a result asked for by another buyer.

use std::time::Duration;

use chrono::Utc;
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use reqwest::StatusCode;
use seckill::strategy::queue::PurchaseMessage;
use serde_json::{Value, json};

use super::{Broker, SHARED_AMQP, buy, eventually, resolved, spawn_app, unique_prefix};
use crate::support::{buyer_token, provoking, with_buyer_auth};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_refuses_an_over_limit_message_published_directly_to_its_queue() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |_| {}).await;
    // One unit per buyer; and a sale that opens in an hour.
    let limited = app.sale("queue", 5).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    let not_started = app
        .create_sale(json!({ "name": "later", "stock": 5, "strategy": "queue",
                             "starts_at": later }))
        .await["id"]
        .as_i64()
        .unwrap();
    let broker = Broker::connect(&prefix).await;
    let over_limit = PurchaseMessage {
        request_id: uuid::Uuid::new_v4(),
        sale_id: limited,
        user_id: 500,
        quantity: 3,
    };
    let too_early = PurchaseMessage {
        request_id: uuid::Uuid::new_v4(),
        sale_id: not_started,
        user_id: 501,
        quantity: 1,
    };
    broker.publish(&over_limit).await;
    broker.publish(&too_early).await;

    // A request accepted by the service behind them on the same queue (one
    // consumer, in order) is settled with or after them.
    let (status, body) = buy(&app, limited, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = super::request_id(&body);
    let result = resolved(&app, limited, &id, Duration::from_secs(10)).await;
    assert_eq!(result["status"], "placed", "{result}");

    for (message, reason) in [(over_limit, "per_user_limit"), (too_early, "window")] {
        let (status, why): (String, Option<String>) =
            sqlx::query_as("SELECT status, rejection_reason FROM purchase_requests WHERE id = $1")
                .bind(message.request_id)
                .fetch_one(&app.db)
                .await
                .unwrap();
        assert_eq!(status, "rejected", "{message:?}");
        assert!(why.as_deref().is_some_and(|why| why.contains(reason)), "{why:?}");
    }
    let audit = app.audit(limited).await;
    assert_eq!((audit.orders, audit.units_sold, audit.remaining_stock), (1, 1, 4));
    let audit = app.audit(not_started).await;
    assert_eq!((audit.orders, audit.remaining_stock), (0, 5));
    broker.delete_queues().await;
}

/// Publishes a `sold_out` event for `sale` on the events exchange, with
/// `user_id` as its AMQP `user-id` property; whether the broker confirmed it.
async fn sold_out_event(
    channel: &Channel,
    exchange: &str,
    sale: i64,
    user_id: Option<&str>,
) -> bool {
    let mut properties = BasicProperties::default();
    if let Some(user) = user_id {
        properties = properties.with_user_id(user.into());
    }
    let payload = json!({ "event": "sold_out", "sale_id": sale }).to_string();
    let published = channel
        .basic_publish(
            exchange.into(),
            "".into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            properties,
        )
        .await;
    match published {
        Ok(confirm) => confirm.await.is_ok_and(|confirm| confirm.is_ack()),
        Err(_) => false,
    }
}

/// Buyers of the sold-out probes, each new (a buyer who holds a request is
/// answered with it, sold out or not).
static NEXT_BUYER: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1000);

/// `POST /sales/{sale}/orders` for a new buyer: `true` when refused as sold
/// out.
async fn refused_as_sold_out(app: &super::TestApp, sale: i64) -> bool {
    let user = NEXT_BUYER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (status, body) = buy(app, sale, user).await;
    status == StatusCode::CONFLICT && body["type"] == "/problems/sold-out"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_events_not_published_by_the_services_own_user_are_ignored() {
    provoking("a sale event without a user-id and one the broker refuses (channel closed)");
    let prefix = unique_prefix();
    // Flags trusted for a minute: a flag set by an event stays visible.
    let app = spawn_app(&prefix, |config| config.strategies.sold_out_flag_ttl_ms = 60_000).await;
    let (probe, forged, control) =
        (app.sale("queue", 5).await, app.sale("queue", 5).await, app.sale("queue", 5).await);
    let broker = Broker::connect(&prefix).await;
    let exchange = broker.topology.events_exchange();
    broker.topology.declare_events(&broker.channel).await.unwrap();
    let own = seckill::backends::AmqpHandle::new(SHARED_AMQP.as_str(), "x").user().unwrap();

    // The listener is up once an event of the service's user flags a sale.
    let listening = eventually(Duration::from_secs(10), || async {
        sold_out_event(&broker.channel, &exchange, probe, Some(&own)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        refused_as_sold_out(&app, probe).await
    })
    .await;
    assert!(listening, "the service's own event flags the sale");

    // An event without a user-id property is delivered, and ignored.
    assert!(sold_out_event(&broker.channel, &exchange, forged, None).await);
    // One with another user's id is refused by the broker itself (on a
    // channel of its own: the broker closes the channel).
    let conn = Connection::connect(&SHARED_AMQP, ConnectionProperties::default()).await.unwrap();
    let other = conn.create_channel().await.unwrap();
    other.confirm_select(Default::default()).await.unwrap();
    assert!(!sold_out_event(&other, &exchange, forged, Some("mallory")).await);
    // Behind them, an event of the service's user: once it is applied, the
    // ones before it have been read.
    assert!(sold_out_event(&broker.channel, &exchange, control, Some(&own)).await);
    let applied =
        eventually(Duration::from_secs(10), || async { refused_as_sold_out(&app, control).await })
            .await;
    assert!(applied, "the control event is applied");

    let (status, body): (StatusCode, Value) = buy(&app, forged, 3).await;
    assert_eq!(status, StatusCode::ACCEPTED, "the forged event closed the sale: {body}");
    broker.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_cannot_read_another_buyers_queued_result() {
    let prefix = unique_prefix();
    // No consumer: the request stays pending, so that a long poll would
    // wait for it.
    let app = spawn_app(&prefix, |config| {
        with_buyer_auth(config);
        config.strategies.queue.consume = false;
    })
    .await;
    let sale = app.sale("queue", 5).await;
    let purchase = app
        .client
        .post(app.url(&format!("/sales/{sale}/orders")))
        .bearer_auth(buyer_token(1))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(purchase.status(), StatusCode::ACCEPTED);
    let body: Value = purchase.json().await.unwrap();
    let location = body["location"].as_str().unwrap().to_owned();
    let read = |token: Option<String>, wait_ms: u64| {
        let mut request = app.client.get(app.url(&format!("{location}?wait_ms={wait_ms}")));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let own = read(Some(buyer_token(1)), 0).await.unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    let own: Value = own.json().await.unwrap();
    assert_eq!((&own["user_id"], &own["status"]), (&json!(1), &json!("pending")));
    // Buyer 2 is told there is no such request — at once, even with a long
    // poll, as for a request id that does not exist.
    let started = std::time::Instant::now();
    let other = read(Some(buyer_token(2)), 3000).await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
    let unknown = app
        .client
        .get(app.url(&format!("/sales/{sale}/requests/{}", uuid::Uuid::new_v4())))
        .bearer_auth(buyer_token(2))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let no_token = read(None, 0).await.unwrap();
    assert_eq!(no_token.status(), StatusCode::UNAUTHORIZED);
    Broker::connect(&prefix).await.delete_queues().await;
}
