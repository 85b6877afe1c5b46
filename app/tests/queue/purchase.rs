//! The request path: `202` with a request id and a `Location`, the result
//! behind it, resubmissions, the sold-out gate, and refusals.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Broker, buy, drained, request, request_id, resolved, spawn_app, unique_prefix};
use crate::support::{ADMIN_TOKEN, assert_problem, provoking};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_is_accepted_with_a_location_and_resolved_to_its_order() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |_| {}).await;
    let sale = app.sale("queue", 1).await;

    let response = app.buy(sale, 7).await;
    if response.status() != StatusCode::ACCEPTED {
        panic!("{}", response.text().await.unwrap());
    }
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let body: Value = response.json().await.unwrap();
    let id = request_id(&body);
    assert_eq!(location, format!("/sales/{sale}/requests/{id}"));
    assert_eq!(body["location"], location.as_str());
    assert_eq!((&body["sale_id"], &body["user_id"]), (&json!(sale), &json!(7)));

    let result = resolved(&app, sale, &id, Duration::from_secs(10)).await;
    assert_eq!(result["status"], "placed", "{result}");
    let order_id = result["order_id"].as_i64().expect("an order id");
    let owner: i64 = sqlx::query_scalar("SELECT user_id FROM orders WHERE id = $1")
        .bind(order_id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(owner, 7);

    // The same buyer again: the same request and its result, no new order.
    let (status, again) = buy(&app, sale, 7).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(request_id(&again), id);
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.remaining_stock, audit.ledger_drift), (1, 0, 0));

    // Another buyer of the sold-out sale is told so by the consumer…
    let (status, late) = buy(&app, sale, 8).await;
    if status == StatusCode::ACCEPTED {
        let result = resolved(&app, sale, &request_id(&late), Duration::from_secs(10)).await;
        assert_eq!(result["status"], "sold_out", "{result}");
    } else {
        assert_eq!(status, StatusCode::CONFLICT, "{late}");
    }
    // …and from then on by the instance itself, without a message.
    let response = app.buy(sale, 9).await;
    assert_problem(response, StatusCode::CONFLICT, "sold-out").await;
    Broker::connect(&prefix).await.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_reopens_a_sale_the_gate_had_closed() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |config| config.strategies.sold_out_flag_ttl_ms = 60_000).await;
    let sale = app.sale("queue", 1).await;
    let (status, first) = buy(&app, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let first = resolved(&app, sale, &request_id(&first), Duration::from_secs(10)).await;
    assert_eq!(first["status"], "placed", "{first}");
    // Accepted and then refused, or refused at once by a gate already closed.
    let (status, second) = buy(&app, sale, 2).await;
    match status {
        StatusCode::ACCEPTED => {
            let result = resolved(&app, sale, &request_id(&second), Duration::from_secs(10)).await;
            assert_eq!(result["status"], "sold_out", "{result}");
        }
        StatusCode::CONFLICT => assert_eq!(second["type"], "/problems/sold-out", "{second}"),
        other => panic!("buyer 2 after the last unit: {other} {second}"),
    }
    assert_problem(app.buy(sale, 3).await, StatusCode::CONFLICT, "sold-out").await;

    let restocked = app.restock(sale, json!({ "units": 1 })).await;
    assert_eq!(restocked.status(), StatusCode::OK);
    let (status, body) = buy(&app, sale, 3).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let result = resolved(&app, sale, &request_id(&body), Duration::from_secs(10)).await;
    assert_eq!(result["status"], "placed", "{result}");
    drained(&app, sale, Duration::from_secs(5)).await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.total_stock, audit.ledger_drift), (2, 2, 0));
    Broker::connect(&prefix).await.delete_queues().await;
}

/// The gate of an instance that missed the news: B starts after the sale
/// sold out (after A's `sold_out` broadcast), and never hears of a unit that
/// comes back. Its gate holds what Postgres holds all the same, within one
/// period (`SECKILL_SOLD_OUT_FLAG_TTL_MS`): its first buyer is refused
/// without a publish, and the returned unit is sold within the period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_after_the_sale_sold_out_refuses_at_once_and_sees_units_come_back() {
    const PERIOD: Duration = Duration::from_millis(1000);
    let prefix = unique_prefix();
    let period = |config: &mut seckill::config::Config| {
        config.strategies.sold_out_flag_ttl_ms = PERIOD.as_millis() as u64;
    };
    let a = spawn_app(&prefix, period).await;
    let sale = a.sale("queue", 1).await;
    let (status, first) = buy(&a, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let first = resolved(&a, sale, &request_id(&first), Duration::from_secs(10)).await;
    assert_eq!(first["status"], "placed", "{first}");

    // B has no consumer: A's settles whatever B publishes.
    let b = spawn_app(&prefix, |config| {
        period(config);
        config.strategies.queue.consume = false;
    })
    .await;
    let watched = std::time::Instant::now();
    let mut user = 100;
    while watched.elapsed() < 3 * PERIOD {
        let (status, body) = buy(&b, sale, user).await;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::CONFLICT, Some("/problems/sold-out")),
            "buyer {user} on the instance started after the sale sold out, {:?} after it \
             started: {body}",
            watched.elapsed()
        );
        user += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A unit comes back and nobody says so (a broadcast lost): B sells it
    // within one period of its last read.
    sqlx::query(
        "UPDATE sales SET total_stock = total_stock + 1, remaining_stock = remaining_stock + 1 \
         WHERE id = $1",
    )
    .bind(sale)
    .execute(&a.db)
    .await
    .unwrap();
    let returned = std::time::Instant::now();
    let request = loop {
        let (status, body) = buy(&b, sale, user).await;
        match status {
            StatusCode::ACCEPTED => break request_id(&body),
            StatusCode::CONFLICT => assert!(
                returned.elapsed() < PERIOD + Duration::from_millis(500),
                "still refused {:?} after the unit came back: {body}",
                returned.elapsed()
            ),
            other => panic!("buyer {user}: {other} {body}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let result = resolved(&b, sale, &request, Duration::from_secs(10)).await;
    assert_eq!(result["status"], "placed", "{result}");
    drained(&a, sale, Duration::from_secs(5)).await;
    let audit = a.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (2, 0, 0));
    Broker::connect(&prefix).await.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_requests_are_404_and_a_long_poll_is_bounded() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |_| {}).await;
    let sale = app.sale("queue", 5).await;
    let missing = uuid::Uuid::new_v4().to_string();
    let (status, body) = request(&app, sale, &missing, 0).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::NOT_FOUND, Some("/problems/not-found"))
    );
    let (status, _) = request(&app, sale, "not-a-uuid", 0).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, accepted) = buy(&app, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let id = request_id(&accepted);
    // Another sale's id does not reach this request.
    let (status, _) = request(&app, sale + 1_000_000, &id, 0).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = request(&app, sale, &id, 60_000).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("/problems/invalid-field"))
    );

    let stats = app
        .client
        .get(app.url("/admin/sales/999999999/queue"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_problem(stats, StatusCode::NOT_FOUND, "not-found").await;
    drained(&app, sale, Duration::from_secs(10)).await;
    Broker::connect(&prefix).await.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_rabbitmq_and_a_broker_out_of_reach_is_a_503() {
    provoking("a broker out of reach (503 unavailable)");
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |_| {}).await;
    let ready: Value =
        app.client.get(app.url("/readyz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(ready["rabbitmq"], "ok", "{ready}");

    // Nothing listens on this port: readiness names RabbitMQ, and a purchase
    // is refused with `unavailable` naming it and a Retry-After, never
    // accepted (a refused connection is an outage, not an overload).
    let port = test_support::free_port();
    let down = spawn_app(&unique_prefix(), |config| {
        config.backends.amqp_url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    })
    .await;
    let response = down.client.get(down.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["backend"], "rabbitmq", "{body}");
    let sale = down.sale("queue", 3).await;
    let response = down.buy(sale, 1).await;
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        (&body["type"], &body["backend"]),
        (&json!("/problems/unavailable"), &json!("rabbitmq"))
    );
    let stats = super::queue_stats(&down, sale).await;
    assert_eq!(stats.accepted, 0, "a refused request is not counted as accepted");
    Broker::connect(&prefix).await.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_larger_than_the_stock_left_does_not_close_the_sale() {
    let prefix = unique_prefix();
    // Flags that would outlive the test: only a wrong flag could refuse buyer 2.
    let app = spawn_app(&prefix, |config| config.strategies.sold_out_flag_ttl_ms = 60_000).await;
    let sale = crate::support::sale_of_three_for_up_to_five(&app, "queue").await;
    let order = |user: i64, quantity: i64| {
        let app = &app;
        async move {
            let response = app.order(sale, json!({ "user_id": user, "quantity": quantity })).await;
            let status = response.status();
            let body: Value = response.json().await.unwrap();
            assert_eq!(status, StatusCode::ACCEPTED, "buyer {user} of {quantity}: {body}");
            resolved(app, sale, &request_id(&body), Duration::from_secs(10)).await
        }
    };
    // Resolved one after the other: each batch settles before the next buy.
    assert_eq!(order(1, 5).await["status"], "sold_out");
    for user in 2..=4 {
        let result = order(user, 1).await;
        assert_eq!(result["status"], "placed", "buyer {user} of 1 unit: {result}");
    }
    let late = app.order(sale, json!({ "user_id": 5, "quantity": 1 })).await;
    if late.status() == StatusCode::ACCEPTED {
        let body: Value = late.json().await.unwrap();
        let result = resolved(&app, sale, &request_id(&body), Duration::from_secs(10)).await;
        assert_eq!(result["status"], "sold_out", "{result}");
    } else {
        assert_problem(late, StatusCode::CONFLICT, "sold-out").await;
    }
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (3, 0, 0));
    Broker::connect(&prefix).await.delete_queues().await;
}
