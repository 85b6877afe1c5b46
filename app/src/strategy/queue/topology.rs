//! The RabbitMQ objects of the `queue` strategy, and how a sale maps to them.
//!
//! - `PREFIX.orders.N`, `N` in `0..SECKILL_QUEUE_PARTITIONS`: durable quorum
//!   queues with `x-single-active-consumer` (one consumer receives, across all
//!   instances), bounded by `x-max-length` with `x-overflow = reject-publish`
//!   (a publish beyond the bound is nacked, never silently dropped), and
//!   the broker's `x-delivery-limit` ([`BROKER_DELIVERY_LIMIT`], a backstop
//!   far above what fail-overs produce) with a dead-letter route to the
//!   dead-letter queue. Sale `id` always goes to partition `id mod N`, so one
//!   consumer serializes each sale.
//! - `PREFIX.orders.dead`: the dead-letter queue (durable quorum queue). Every
//!   instance that consumes drains it (`super::dead_letters`): each message is
//!   recorded as a final result (`rejected`, with the reason) and counted.
//!
//! The application's retry limit (`SECKILL_QUEUE_DELIVERY_LIMIT`) is not the
//! broker's: the consumer counts a message's failures itself (a header it
//! writes when it publishes a failed message again, `super::consumer`), so
//! that returns of unacknowledged messages at a fail-over — which RabbitMQ
//! before 4.3 counts as deliveries — never reject a request.
//! - `PREFIX.events`: a fanout exchange carrying sold-out and reopened events
//!   to every instance (each binds an exclusive queue of its own); it deletes
//!   itself with its last binding.
//!
//! Declaring is idempotent: every instance declares the same objects with the
//! same arguments (RabbitMQ refuses a redeclaration with different ones, so
//! every instance must run with the same queue settings).

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

use crate::sale::SaleId;

/// Names and arguments of the queues of one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    partitions: u16,
    max_length: u32,
    retry_limit: u32,
}

/// The partition queues' `x-delivery-limit`: a backstop for a message that
/// makes every consumer crash before it can count a failure, not a retry
/// limit. RabbitMQ before 4.3 counts every return toward it, the
/// unacknowledged messages of a channel that closes at a fail-over included
/// (up to the prefetch, near the head of the queue, so the same ones at each
/// fail-over); a thousand fail-overs with the same message in flight are far
/// beyond any deployment's. What it dead-letters is still resolved
/// (`rejected`, reason `delivery_limit`) by the dead-letter consumer.
pub const BROKER_DELIVERY_LIMIT: u32 = 1000;

impl Topology {
    /// The topology under `prefix` (`SECKILL_AMQP_PREFIX`) that the `queue`
    /// strategy's `settings` describe.
    pub fn of(prefix: &str, settings: &super::Settings) -> Self {
        Self::new(prefix, settings.partitions, settings.max_length, settings.delivery_limit)
    }

    /// `partitions` ≥ 1 queues of at most `max_length` messages; a request is
    /// rejected when its settlement failed `retry_limit` times (the
    /// application's limit, `SECKILL_QUEUE_DELIVERY_LIMIT`; the broker's is
    /// [`BROKER_DELIVERY_LIMIT`] whatever it is).
    pub fn new(prefix: &str, partitions: u16, max_length: u32, retry_limit: u32) -> Self {
        Self {
            prefix: prefix.to_owned(),
            partitions: partitions.max(1),
            max_length,
            retry_limit: retry_limit.max(1),
        }
    }

    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// The application's retry limit: failed settlements of a request before
    /// it is rejected.
    pub fn retry_limit(&self) -> u32 {
        self.retry_limit
    }

    /// The partition of `sale`: `id mod partitions` (stable across instances
    /// and restarts).
    pub fn partition_of(&self, sale: SaleId) -> u16 {
        sale.0.rem_euclid(i64::from(self.partitions)) as u16
    }

    /// Name of partition queue `partition`.
    pub fn queue(&self, partition: u16) -> String {
        format!("{}.orders.{partition}", self.prefix)
    }

    /// Name of the partition queue that serializes `sale`.
    pub fn queue_of(&self, sale: SaleId) -> String {
        self.queue(self.partition_of(sale))
    }

    /// Name of the dead-letter queue.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.orders.dead", self.prefix)
    }

    /// Name of the fanout exchange of sold-out / reopened events.
    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.prefix)
    }

    /// Declares the dead-letter queue, every partition queue and the events
    /// exchange on `channel`.
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        self.declare_queues(channel).await?;
        self.declare_events(channel).await
    }

    /// Declares the dead-letter queue and every partition queue.
    pub async fn declare_queues(&self, channel: &Channel) -> lapin::Result<()> {
        let mut dead = FieldTable::default();
        dead.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        channel
            .queue_declare(
                self.dead_letter_queue().as_str().into(),
                QueueDeclareOptions::durable(),
                dead,
            )
            .await?;
        for partition in 0..self.partitions {
            channel
                .queue_declare(
                    self.queue(partition).as_str().into(),
                    QueueDeclareOptions::durable(),
                    self.partition_arguments(),
                )
                .await?;
        }
        Ok(())
    }

    /// Declares the events exchange (auto-delete: it goes with the last
    /// instance's binding).
    pub async fn declare_events(&self, channel: &Channel) -> lapin::Result<()> {
        channel
            .exchange_declare(
                self.events_exchange().as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions { auto_delete: true, ..ExchangeDeclareOptions::default() },
                FieldTable::default(),
            )
            .await
    }

    /// Connects to `amqp_url` and declares every queue of this topology (the
    /// load test's own prefix, before it starts instances that consume them
    /// all at once: see [`super::Queue::start_background`] for the broker's
    /// race this avoids).
    ///
    /// Errors: the broker cannot be reached or refuses.
    pub async fn declare_at(&self, amqp_url: &str) -> anyhow::Result<()> {
        let props = lapin::ConnectionProperties::default();
        let conn = lapin::Connection::connect(amqp_url, props).await?;
        let channel = conn.create_channel().await?;
        self.declare_queues(&channel).await?;
        let _ = conn.close(200, "declared".into()).await;
        Ok(())
    }

    /// Connects to `amqp_url` and deletes every queue of this topology (the
    /// load test's own prefix after a run).
    ///
    /// Errors: the broker cannot be reached or refuses.
    pub async fn delete_at(&self, amqp_url: &str) -> anyhow::Result<()> {
        let props = lapin::ConnectionProperties::default();
        let conn = lapin::Connection::connect(amqp_url, props).await?;
        let channel = conn.create_channel().await?;
        self.delete_queues(&channel).await?;
        let _ = conn.close(200, "done".into()).await;
        Ok(())
    }

    /// Deletes every queue of this topology (tests and scratch runs; a
    /// deployment keeps its queues).
    pub async fn delete_queues(&self, channel: &Channel) -> lapin::Result<()> {
        use lapin::options::QueueDeleteOptions;
        for partition in 0..self.partitions {
            channel
                .queue_delete(self.queue(partition).as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        channel
            .queue_delete(self.dead_letter_queue().as_str().into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    }

    fn partition_arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(i64::from(self.max_length)));
        args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(i64::from(BROKER_DELIVERY_LIMIT)),
        );
        // Dead-letter through the default exchange, straight to the queue.
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(self.dead_letter_queue().as_str().into()),
        );
        args
    }
}
