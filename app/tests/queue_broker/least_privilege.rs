//! `queue` through a broker user of the service's own, on a virtual host of
//! its own, with only the permissions docs/queue.md lists — configure, write
//! and read of the names under its prefix, write on the default exchange —
//! as `scripts/services.sh` creates it (with `rabbitmqctl`, here on a node
//! this test owns).

use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use reqwest::StatusCode;
use serde_json::Value;
use test_support::RabbitMqNode;

use super::assert_every_request_resolved_once;
use crate::support::{TestApp, drained, eventually, provoking};

const PASSWORD: &str = "the-broker-password-of-this-test";

/// A node with the virtual host `seckill` and its user `seckill`, allowed
/// the names under the prefix `seckill.` only (docs/queue.md).
async fn node_with_the_services_user() -> RabbitMqNode {
    let node = RabbitMqNode::start().await;
    node.ctl(&["add_vhost", "seckill"], "").unwrap();
    // The password on standard input, as scripts/services.sh passes it.
    node.ctl(&["add_user", "seckill"], PASSWORD).unwrap();
    let (configure, write, read) = (r"^seckill\.", r"^(seckill\..*|amq\.default)$", r"^seckill\.");
    node.ctl(&["set_permissions", "-p", "seckill", "seckill", configure, write, read], "").unwrap();
    node
}

fn url(node: &RabbitMqNode, vhost: &str) -> String {
    format!("amqp://seckill:{PASSWORD}@127.0.0.1:{}/{vhost}", node.port)
}

/// The limits are in force: the user declares nothing outside its prefix
/// and cannot open the default virtual host.
async fn assert_the_user_is_limited(node: &RabbitMqNode) {
    let props = ConnectionProperties::default;
    let conn = Connection::connect(&url(node, "seckill"), props()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let options = QueueDeclareOptions::default();
    let refused =
        channel.queue_declare("elsewhere.orders".into(), options, FieldTable::default()).await;
    assert!(format!("{refused:?}").contains("ACCESS_REFUSED"), "{refused:?}");
    let _ = conn.close(200, "checked".into()).await;
    let default_vhost = Connection::connect(&url(node, "%2f"), props()).await;
    assert!(default_vhost.is_err(), "the service's user has no access to `/`");
}

/// Every buyer of `users` once; the request ids of the `202`s. A `409` is a
/// sold-out sale; anything else fails the test.
async fn buy_once_each(
    app: &TestApp,
    sale: i64,
    users: std::ops::Range<i64>,
) -> Vec<(i64, String)> {
    let mut accepted = Vec::new();
    for user in users {
        let response = app.buy(sale, user).await;
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        match status {
            StatusCode::ACCEPTED => {
                accepted.push((user, body["request_id"].as_str().unwrap().to_owned()))
            }
            StatusCode::CONFLICT => assert_eq!(body["type"], "/problems/sold-out", "{body}"),
            other => panic!("buyer {user}: {other} {body}"),
        }
    }
    accepted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_sale_runs_through_a_broker_user_limited_to_the_services_prefix() {
    let _heavy = test_support::heavy();
    provoking("refusals of a queue outside the user's prefix and of the virtual host `/`");
    let node = node_with_the_services_user().await;
    assert_the_user_is_limited(&node).await;
    let service_url = url(&node, "seckill");
    let app = TestApp::spawn_with(move |config| {
        config.backends.amqp_url = service_url;
        config.backends.amqp_prefix = "seckill".to_owned();
        config.strategies.queue.partitions = 1;
        config.strategies.queue.consume = true;
    })
    .await;
    let sale = app.sale("queue", 3).await;
    let accepted = buy_once_each(&app, sale, 1..6).await;
    // Buyers after the third may be told `sold-out` at once, or accepted and
    // resolved `sold_out`, depending on when the consumer settled the first.
    assert!(accepted.len() >= 3, "{accepted:?}");
    drained(&app, sale, Duration::from_secs(60)).await;
    assert_every_request_resolved_once(&app, sale, &accepted).await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.oversold), (3, 0), "{audit:?}");
    // The consumer's sold-out event, published as `seckill` to the events
    // exchange and received through the instance's own queue, closes the
    // sale's gate: a later buyer is answered at once.
    let closed = eventually(Duration::from_secs(10), || async {
        app.buy(sale, 100).await.status() == StatusCode::CONFLICT
    })
    .await;
    assert!(closed, "the sold-out event reached the gate");
}

/// A service on `amqp_url` with the queue prefix `prefix` answers a purchase
/// of a `queue` sale `503 misconfigured` naming RabbitMQ, twice (the second
/// within the pause between connection attempts), without the password, and
/// stays alive.
async fn assert_purchases_are_misconfigured(amqp_url: String, prefix: &str, what: &str) {
    let prefix = prefix.to_owned();
    let app = TestApp::spawn_with(move |config| {
        config.backends.amqp_url = amqp_url;
        config.backends.amqp_prefix = prefix;
        config.strategies.queue.partitions = 1;
    })
    .await;
    let sale = app.sale("queue", 3).await;
    for user in [1, 2] {
        let response = app.buy(sale, user).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
        assert!(!response.headers().contains_key("retry-after"), "{what}: retrying cannot help");
        let body = response.text().await.unwrap();
        assert!(!body.contains(PASSWORD), "{body}");
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["type"], "/problems/misconfigured", "{what}: {body}");
        assert_eq!(problem["backend"], "rabbitmq", "{what}: {body}");
    }
    assert_eq!(app.client.get(app.url("/healthz")).send().await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_refuses_the_services_names_vhost_or_password_is_answered_503_misconfigured()
{
    let _heavy = test_support::heavy();
    provoking("a broker that refuses the service's queue names, virtual host and password");
    let node = node_with_the_services_user().await;
    let names = "queue names outside the user's permissions (ACCESS_REFUSED)";
    assert_purchases_are_misconfigured(url(&node, "seckill"), "elsewhere", names).await;
    let vhost = "a virtual host the user may not open";
    assert_purchases_are_misconfigured(url(&node, "%2f"), "seckill", vhost).await;
    let wrong = format!("amqp://seckill:wrong-{PASSWORD}@127.0.0.1:{}/seckill", node.port);
    assert_purchases_are_misconfigured(wrong, "seckill", "a wrong password").await;
}
