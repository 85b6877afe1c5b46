//! `queue` against a real RabbitMQ and a real Postgres: accepted purchases
//! and their results, exact books with two instances, fail-over of the active
//! consumer, redelivery, poison messages, a full queue, partial batch grants.
//!
//! Every test uses queue names of its own (`SECKILL_AMQP_PREFIX`) on the
//! shared broker and deletes its queues at the end; the broker-restart test
//! owns a broker node and lives in a module of its own (`queue_broker`).

mod acks;
mod batch;
mod books;
mod drain;
mod failover;
mod faults;
mod hangups;
mod overlaps;
mod purchase;
mod republish;
mod retention;
mod trust;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use reqwest::StatusCode;
use seckill::config::Config;
use seckill::strategy::queue::{PurchaseMessage, Topology};
use serde_json::Value;
use std::time::Duration;

use crate::support::TestApp;
pub use crate::support::{buy, drained, eventually, queue_stats, resolved, unique_prefix};
pub use test_support::scratch_database;

/// The shared RabbitMQ (`TEST_AMQP_URL`, else the service's default).
pub static SHARED_AMQP: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(test_support::amqp_url);

/// A service over the test database whose queues are named after `prefix`,
/// with one partition and its consumer on, after `tweak`.
pub async fn spawn_app(prefix: &str, tweak: impl FnOnce(&mut Config)) -> TestApp {
    let prefix = prefix.to_owned();
    TestApp::spawn_with(move |config| {
        config.backends.amqp_url = SHARED_AMQP.to_owned();
        config.backends.amqp_prefix = prefix;
        config.strategies.queue.partitions = 1;
        config.strategies.queue.consume = true;
        tweak(config);
    })
    .await
}

/// The topology the test services of `prefix` use (defaults of
/// [`spawn_app`]).
pub fn topology(prefix: &str) -> Topology {
    let config = Config::defaults();
    Topology::new(
        prefix,
        1,
        config.strategies.queue.max_length,
        config.strategies.queue.delivery_limit,
    )
}

/// The sum of `series` over the lines of `GET /metrics` whose labels hold
/// `label` (`name="value"`). The recorder is the test process's own, shared
/// by every test of this binary: a test reads a series only it moves.
pub async fn counted(app: &TestApp, series: &str, label: &str) -> u64 {
    let request = app.client.get(app.url("/metrics")).bearer_auth(crate::support::ADMIN_TOKEN);
    let page = request.send().await.unwrap().text().await.unwrap();
    page.lines()
        .filter(|line| line.starts_with(series) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|value| value as u64)
        .sum()
}

/// `GET /sales/{sale}/requests/{id}?wait_ms=…`: the status and the body.
pub async fn request(app: &TestApp, sale: i64, id: &str, wait_ms: u64) -> (StatusCode, Value) {
    let response = app
        .client
        .get(app.url(&format!("/sales/{sale}/requests/{id}?wait_ms={wait_ms}")))
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A raw AMQP client on the shared broker, for what the service never does
/// itself: publishing copies and poison, counting dead letters, cleaning up.
pub struct Broker {
    _conn: Connection,
    pub channel: Channel,
    pub topology: Topology,
}

impl Broker {
    pub async fn connect(prefix: &str) -> Broker {
        Self::connect_to(&SHARED_AMQP, topology(prefix)).await
    }

    pub async fn connect_to(url: &str, topology: Topology) -> Broker {
        let conn = Connection::connect(url, ConnectionProperties::default()).await.unwrap();
        let channel = conn.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        topology.declare_queues(&channel).await.unwrap();
        Broker { _conn: conn, channel, topology }
    }

    /// Publishes `body` to the partition queue of `sale`, confirmed.
    ///
    /// A publish the broker nacks is published again, up to 5 times in all:
    /// RabbitMQ nacks a publish its queue process could not take at that
    /// moment, and a quorum queue on a loaded 2-core machine did so once to
    /// the first publish of a test into its new, empty queue (a CI run
    /// where the next attempt would have been accepted is the likely case;
    /// the broker's log of that run was gone). Were a nacked message kept
    /// after all, the copy would be a redelivery, which the consumer settles
    /// once by its request id. No test here is about
    /// being refused by a full queue; `faults::a_full_queue_…` reads nacks
    /// through the service instead.
    pub async fn publish_raw(&self, sale: i64, body: &[u8]) {
        let queue = self.topology.queue_of(seckill::sale::SaleId(sale));
        for attempt in 1..=5 {
            let confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() },
                    body,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            if confirm.is_ack() {
                return;
            }
            eprintln!(
                "note: the broker nacked publish {attempt} of 5 to {}; publishing again",
                queue.as_str()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("the broker nacked 5 publishes in a row to {}", queue.as_str());
    }

    pub async fn publish(&self, message: &PurchaseMessage) {
        self.publish_raw(message.sale_id, &serde_json::to_vec(message).unwrap()).await;
    }

    /// Messages ready in `queue` (a passive declare).
    pub async fn ready(&self, queue: &str) -> u32 {
        let declared = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
            .unwrap();
        declared.message_count()
    }

    /// Deletes the test's queues.
    pub async fn delete_queues(self) {
        self.topology.delete_queues(&self.channel).await.unwrap();
    }
}

/// The request id of a `202` body.
pub fn request_id(body: &Value) -> String {
    body["request_id"].as_str().unwrap_or_else(|| panic!("no request id in {body}")).to_owned()
}
