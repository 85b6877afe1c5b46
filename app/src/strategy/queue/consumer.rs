//! The consumer of one partition queue.
//!
//! Every instance runs one per partition; the queue's single-active-consumer
//! flag makes the broker deliver to one of them at a time and hand the queue
//! to the next (with every unacknowledged message) when the active one's
//! channel closes. Serialization comes from that, not from the prefetch, so
//! the prefetch is twice the batch size: the next batch arrives while this
//! one commits.
//!
//! One round: wait for a delivery, take whatever else arrives within
//! `SECKILL_QUEUE_BATCH_WINDOW_MS` up to `SECKILL_QUEUE_BATCH_MAX`, settle
//! them in one transaction ([`settle`]), then acknowledge them with one
//! `basic.ack(multiple)` sent through the last delivery's own acker
//! ([`acknowledge`]): an acknowledgement goes to the channel the deliveries
//! came from or nowhere, never by delivery tag to whatever channel the
//! consumer holds by then (tags restart at 1 on every channel, so a tag of a
//! lost channel names other messages on a new one). Failures:
//! - an unreadable message is rejected without requeue: it goes straight to
//!   the dead-letter queue (it can never be settled);
//! - Postgres unavailable: the batch is retried until Postgres answers; the
//!   messages stay unacknowledged, so nothing is lost and no failure is
//!   counted against them;
//! - any other failure of the batch: each message is settled alone; one that
//!   still fails has failed once more. The consumer counts a message's
//!   failures itself, in the [`FAILURES_HEADER`] of a copy it publishes to
//!   the same queue before acknowledging the failed delivery; on the
//!   `SECKILL_QUEUE_DELIVERY_LIMIT`-th failure the request is recorded
//!   `rejected` (with the error) and the message rejected without requeue,
//!   into the dead-letter queue. The broker's `x-delivery-count` is not
//!   used: before RabbitMQ 4.3 it also counts the returns of a channel that
//!   closed at a fail-over, which are not failures of the message
//!   (docs/queue.md).
//!
//! The channel is opened on the consumers' connection. When the connection
//! or the channel is lost, the round's deliveries are left unacknowledged
//! (the broker hands them out again), and the loop opens a new connection,
//! redeclares the queues and subscribes again. A wait for the next delivery
//! looks at the channel every [`LIVENESS_PERIOD`], so a channel that died
//! without telling its consumer cannot stall the partition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ConstantBuilder, Retryable};
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Consumer};
use sqlx::PgPool;

use super::settle::{self, Resolution, Settled};
use super::sold_out_fanout::SoldOutGate;
use super::{PurchaseMessage, Topology};
use crate::backends::{AmqpHandle, count_amqp_messages};
use crate::strategy::StrategyError;
use crate::strategy::descriptor::DrainTimes;

/// Batching settings of a consumer.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// Most messages per transaction.
    pub batch_size: u16,
    /// How long to wait for more after a batch's first message.
    pub window: Duration,
    /// Failed settlements of one message before its request is rejected
    /// (`SECKILL_QUEUE_DELIVERY_LIMIT`).
    pub delivery_limit: u32,
    /// The service's failpoints (`queue-before-ack`); none by default.
    #[cfg(feature = "failpoints")]
    pub failpoints: crate::failpoints::Failpoints,
}

impl ConsumerSettings {
    /// The batching of the `queue` strategy's `settings`, with no failpoint.
    pub fn from_settings(settings: &super::Settings) -> Self {
        Self {
            batch_size: settings.batch_max,
            window: Duration::from_millis(settings.batch_window_ms),
            delivery_limit: settings.delivery_limit,
            #[cfg(feature = "failpoints")]
            failpoints: Default::default(),
        }
    }

    /// The settings of a service's consumers: the `queue` strategy's
    /// `settings`, with the failpoints of `deps`.
    #[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
    pub fn from_deps(deps: &crate::strategy::Deps, settings: &super::Settings) -> Self {
        #[cfg_attr(not(feature = "failpoints"), allow(unused_mut))]
        let mut settings = Self::from_settings(settings);
        #[cfg(feature = "failpoints")]
        {
            settings.failpoints = deps.failpoints.clone();
        }
        settings
    }

    /// Prefetch of the consumer channel: two batches, within AMQP's `u16`.
    pub fn prefetch(&self) -> u16 {
        self.batch_size.saturating_mul(2)
    }
}

/// Pause before reopening a channel after a failure.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Declares the dead-letter queue and every partition queue, retrying every
/// [`RETRY_PAUSE`] until the broker answers, then closes its channel.
pub async fn declare_queues(amqp: &AmqpHandle, topology: &Topology) {
    let declare = || async {
        let channel = amqp.connection().await?.create_channel().await?;
        topology.declare_queues(&channel).await?;
        channel.close(200, "declared".into()).await?;
        Ok::<_, anyhow::Error>(())
    };
    let retries = ConstantBuilder::default().with_delay(RETRY_PAUSE).without_max_times();
    // Without a limit on attempts, the retries end only once declared.
    let _declared = declare
        .retry(retries)
        .sleep(tokio::time::sleep)
        .notify(|err, _| tracing::debug!(error = %err, "declaring the queues failed; retrying"))
        .await;
}

/// Consumes partition `partition` until the service shuts down
/// ([`AmqpHandle::close`]), reopening its channel after failures.
pub async fn run(
    db: PgPool,
    amqp: AmqpHandle,
    topology: Topology,
    partition: u16,
    settings: ConsumerSettings,
    gate: Arc<SoldOutGate>,
) {
    let queue = topology.queue(partition);
    loop {
        let consumed = consume(&db, &amqp, &topology, &queue, settings.clone(), &gate).await;
        if amqp.is_closed() {
            tracing::debug!(queue, "consumer stopped: the service is shutting down");
            return;
        }
        match consumed {
            Ok(()) => tracing::info!(queue, "consumer cancelled; subscribing again"),
            Err(err) => tracing::debug!(queue, error = %err, "consumer stopped; retrying"),
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

async fn consume(
    db: &PgPool,
    amqp: &AmqpHandle,
    topology: &Topology,
    queue: &str,
    settings: ConsumerSettings,
    gate: &SoldOutGate,
) -> anyhow::Result<()> {
    let conn = amqp.connection().await?;
    let channel = conn.create_channel().await?;
    topology.declare_queues(&channel).await?;
    // Confirms for the copies of failed messages (acknowledgements are not
    // affected).
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    channel.basic_qos(settings.prefetch(), BasicQosOptions { global: false }).await?;
    let tag = format!("seckill-{}", uuid::Uuid::new_v4().simple());
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    tracing::debug!(queue, tag, "consumer subscribed");
    metrics::counter!(crate::metric_names::QUEUE_CONSUMER_SUBSCRIPTIONS_TOTAL, "queue" => queue.to_owned())
        .increment(1);
    let mut batch = Batch::new(settings.clone());
    while let Some(first) = next(&channel, &mut consumer).await? {
        batch.deliveries.push(first);
        collect(&channel, &mut consumer, &mut batch, &settings).await?;
        batch.settle(db, amqp, &channel, queue, gate).await;
    }
    Ok(())
}

/// How often a wait for a delivery checks that its channel is still open.
const LIVENESS_PERIOD: Duration = Duration::from_secs(1);

/// The next delivery. `Ok(None)` when the consumer was cancelled.
///
/// Errors: the consumer's error, or the channel found no longer connected
/// while waiting.
pub(super) async fn next(
    channel: &Channel,
    consumer: &mut Consumer,
) -> anyhow::Result<Option<Delivery>> {
    loop {
        match tokio::time::timeout(LIVENESS_PERIOD, consumer.next()).await {
            Ok(Some(Ok(delivery))) => return Ok(Some(delivery)),
            Ok(Some(Err(err))) => return Err(err.into()),
            Ok(None) => return Ok(None),
            Err(_) if channel.status().connected() => {}
            Err(_) => anyhow::bail!("the channel closed while waiting for a delivery"),
        }
    }
}

/// Adds what arrives within the window to `batch`, up to the batch size.
async fn collect(
    channel: &Channel,
    consumer: &mut Consumer,
    batch: &mut Batch,
    settings: &ConsumerSettings,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + settings.window;
    while batch.deliveries.len() < usize::from(settings.batch_size) {
        match tokio::time::timeout_at(deadline, next(channel, consumer)).await {
            Ok(Ok(Some(delivery))) => batch.deliveries.push(delivery),
            Ok(Ok(None)) | Err(_) => break,
            Ok(Err(err)) => return Err(err),
        }
    }
    Ok(())
}

/// The deliveries of one round.
struct Batch {
    settings: ConsumerSettings,
    deliveries: Vec<Delivery>,
}

impl Batch {
    fn new(settings: ConsumerSettings) -> Self {
        Self { settings, deliveries: Vec::new() }
    }

    /// Settles and acknowledges the batch (see the module documentation),
    /// leaving it empty. `channel` is the one the deliveries came from, for
    /// the copies of failed messages (to `queue`).
    async fn settle(
        &mut self,
        db: &PgPool,
        amqp: &AmqpHandle,
        channel: &Channel,
        queue: &str,
        gate: &SoldOutGate,
    ) {
        let deliveries = std::mem::take(&mut self.deliveries);
        count_amqp_messages("consumed", deliveries.len() as u64);
        let mut readable = Vec::with_capacity(deliveries.len());
        for delivery in deliveries {
            match serde_json::from_slice::<PurchaseMessage>(&delivery.data) {
                Ok(message) => readable.push((delivery, message)),
                Err(err) => {
                    tracing::warn!(error = %err, "unreadable message; dead-lettering it");
                    let _ = delivery.reject(BasicRejectOptions { requeue: false }).await;
                }
            }
        }
        if readable.is_empty() {
            return;
        }
        let messages: Vec<PurchaseMessage> = readable.iter().map(|(_, m)| *m).collect();
        let generation = gate.generation();
        match settle_until_postgres_answers(db, &messages).await {
            Ok(settled) => {
                record_batch(&messages, &settled);
                gate.after_batch(&settled, generation).await;
                let last = &readable.last().expect("not empty").0;
                before_ack(&self.settings, amqp).await;
                acknowledge(last, true).await;
            }
            Err(err) => {
                tracing::warn!(
                    error = %err,
                    messages = messages.len(),
                    "batch failed; settling its messages one by one"
                );
                for (delivery, message) in readable {
                    self.settle_alone(db, channel, queue, gate, delivery, message).await;
                }
            }
        }
    }

    /// Settles one message in a transaction of its own; on failure, counts
    /// the failure (a copy with [`FAILURES_HEADER`] raised, then the delivery
    /// acknowledged) or, on the last allowed failure, rejects the request
    /// and dead-letters the message.
    async fn settle_alone(
        &self,
        db: &PgPool,
        channel: &Channel,
        queue: &str,
        gate: &SoldOutGate,
        delivery: Delivery,
        message: PurchaseMessage,
    ) {
        let generation = gate.generation();
        let err = match settle_until_postgres_answers(db, std::slice::from_ref(&message)).await {
            Ok(settled) => {
                record_batch(std::slice::from_ref(&message), &settled);
                gate.after_batch(&settled, generation).await;
                acknowledge(&delivery, false).await;
                return;
            }
            Err(err) => err,
        };
        let failures = failures(&delivery.properties).saturating_add(1);
        if failures >= self.settings.delivery_limit {
            tracing::warn!(
                request_id = %message.request_id,
                failures,
                error = %err,
                "message failed for the last allowed time; rejecting its request"
            );
            let reason = format!("settling failed {failures} times: {err}");
            if let Err(err) = settle::mark_rejected(db, &message, &reason).await {
                tracing::warn!(error = %err, "could not record the rejection");
            }
            let _ = delivery.reject(BasicRejectOptions { requeue: false }).await;
            return;
        }
        tracing::debug!(request_id = %message.request_id, failures, error = %err,
            "message failed; publishing it again with its failure count");
        match publish_again(channel, queue, &delivery, failures).await {
            Ok(()) => acknowledge(&delivery, false).await,
            Err(err) => {
                // Returned as it is: counted by the broker (a backstop far
                // above the retry limit), not by the application.
                tracing::debug!(error = %err, "could not publish a failed message again");
                let _ = delivery
                    .nack(BasicNackOptions { requeue: true, ..BasicNackOptions::default() })
                    .await;
            }
        }
    }
}

/// Header in which the consumer counts a message's failed settlements
/// (absent: none). Written only by [`publish_again`].
pub const FAILURES_HEADER: &str = "x-seckill-failures";

/// The failed settlements so far of the message with `properties`
/// ([`FAILURES_HEADER`]). [`publish_again`] writes a 64-bit integer; a 32-bit
/// one, signed or not (another client's copy), is read too. Absent or of
/// another type: 0.
fn failures(properties: &BasicProperties) -> u32 {
    let Some(headers) = properties.headers() else { return 0 };
    match headers.inner().get(FAILURES_HEADER) {
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(*n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongUInt(n)) => *n,
        _ => 0,
    }
}

/// Publishes a copy of `delivery`'s message to `queue` (its own partition
/// queue) with [`FAILURES_HEADER`] = `failures`, persistent, and waits for
/// the confirm. A crash between this and the acknowledgement of the original
/// leaves two messages of one request, which settle it once.
///
/// Errors: the publish failed or the broker did not take the copy.
async fn publish_again(
    channel: &Channel,
    queue: &str,
    delivery: &Delivery,
    failures: u32,
) -> anyhow::Result<()> {
    let mut headers = delivery.properties.headers().clone().unwrap_or_default();
    headers.insert(FAILURES_HEADER.into(), AMQPValue::LongLongInt(i64::from(failures)));
    let mut properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
    if let Some(id) = delivery.properties.message_id() {
        properties = properties.with_message_id(id.clone());
    }
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            lapin::options::BasicPublishOptions::default(),
            &delivery.data,
            properties,
        )
        .await?
        .await?;
    anyhow::ensure!(confirm.is_ack(), "the broker refused the copy");
    Ok(())
}

/// Acknowledges `last` (and, with `multiple`, every earlier delivery of its
/// channel) through `last`'s own acker: the ack goes to the channel the
/// deliveries came from. If that channel is gone (a lost connection),
/// nothing is acknowledged anywhere: the broker hands the messages out again
/// and they are settled idempotently.
pub(super) async fn acknowledge(last: &Delivery, multiple: bool) {
    match last.acker.ack(BasicAckOptions { multiple }).await {
        Ok(true) => {}
        Ok(false) => tracing::debug!("acknowledgement dropped: its channel is gone"),
        Err(err) => tracing::debug!(error = %err, "acknowledgement failed; the broker redelivers"),
    }
}

/// The failpoint `queue-before-ack=lose-connection` (tests only): the first
/// time it is reached, closes the consumers' connection and opens a new one,
/// so that the acknowledgement that follows finds its channel gone and a new
/// channel (whose delivery tags start again at 1) in its place.
#[cfg(feature = "failpoints")]
async fn before_ack(settings: &ConsumerSettings, amqp: &AmqpHandle) {
    use crate::failpoints::{Action, QUEUE_BEFORE_ACK};
    if settings.failpoints.fire(&QUEUE_BEFORE_ACK) != Some(Action::LoseConnection) {
        return;
    }
    if let Ok(conn) = amqp.connection().await {
        let _ = conn.close(320, "failpoint".into()).await;
    }
    // The other partitions' consumers and the new subscription of this one
    // open the next connection; wait until one is there.
    for _ in 0..100 {
        if amqp.connection().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Without the cargo feature `failpoints`: nothing.
#[cfg(not(feature = "failpoints"))]
async fn before_ack(_settings: &ConsumerSettings, _amqp: &AmqpHandle) {}

/// [`settle::settle`], retried every 500 ms while Postgres is unreachable.
/// Errors: any other failure.
async fn settle_until_postgres_answers(
    db: &PgPool,
    messages: &[PurchaseMessage],
) -> Result<Settled, sqlx::Error> {
    let batch_id: i64 = rand::random();
    loop {
        match settle::settle(db, messages, batch_id).await {
            Ok(settled) => return Ok(settled),
            Err(err) => match StrategyError::from(err) {
                StrategyError::Unavailable { source, .. } => {
                    tracing::warn!(error = %source, "Postgres unavailable; the batch waits");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                // Kept in the queue until an operator corrects the role.
                StrategyError::Misconfigured { backend, cause, source } => {
                    crate::outcome::log_misconfiguration(backend, cause, &source);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                StrategyError::Internal(err) => {
                    return Err(sqlx::Error::Protocol(format!("{err:#}")));
                }
                StrategyError::Busy { reason, .. } => {
                    return Err(sqlx::Error::Protocol(reason.to_owned()));
                }
            },
        }
    }
}

/// Metrics of one settled batch.
fn record_batch(messages: &[PurchaseMessage], settled: &Settled) {
    metrics::histogram!(crate::metric_names::QUEUE_BATCH_SIZE).record(messages.len() as f64);
    for resolution in &settled.resolutions {
        let label = match resolution {
            Resolution::Placed { .. } => "placed",
            Resolution::SoldOut => "sold_out",
            Resolution::AlreadyPurchased => "already_purchased",
            Resolution::Rejected | Resolution::Refused(_) => "rejected",
        };
        metrics::counter!(crate::metric_names::QUEUE_RESOLUTIONS_TOTAL, "resolution" => label)
            .increment(1);
    }
}

/// Settles every message of a pre-filled queue with the consumer's batching,
/// without HTTP: the `queue_drain_units_per_s` ceiling's drain
/// ([`super::REGISTRATION`]'s `ceiling`). Returns the messages
/// settled and where the time went; stops once the queue stayed empty for
/// `idle`, and closes `channel`.
pub(super) async fn drain(
    db: &PgPool,
    channel: &Channel,
    queue: &str,
    settings: ConsumerSettings,
    idle: Duration,
    expected: u64,
) -> anyhow::Result<DrainTimes> {
    channel.basic_qos(settings.prefetch(), BasicQosOptions { global: false }).await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "seckill-drain".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut times = DrainTimes::default();
    let mut deliveries: Vec<Delivery> = Vec::new();
    let mut last_progress = Instant::now();
    while times.settled < expected && last_progress.elapsed() < idle {
        let clock = Instant::now();
        let first = match tokio::time::timeout(idle, next(channel, &mut consumer)).await {
            Ok(Ok(Some(delivery))) => delivery,
            Ok(Ok(None)) | Err(_) => break,
            Ok(Err(err)) => return Err(err),
        };
        times.waiting_s += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        deliveries.push(first);
        let deadline = tokio::time::Instant::now() + settings.window;
        while deliveries.len() < usize::from(settings.batch_size) {
            match tokio::time::timeout_at(deadline, next(channel, &mut consumer)).await {
                Ok(Ok(Some(delivery))) => deliveries.push(delivery),
                Ok(Ok(None)) | Err(_) => break,
                Ok(Err(err)) => return Err(err),
            }
        }
        times.collecting_s += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let messages: Vec<PurchaseMessage> =
            deliveries.iter().map(|d| serde_json::from_slice(&d.data)).collect::<Result<_, _>>()?;
        settle::settle(db, &messages, rand::random()).await?;
        times.settling_s += clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let last = deliveries.last().expect("not empty").delivery_tag;
        channel.basic_ack(last, BasicAckOptions { multiple: true }).await?;
        times.acking_s += clock.elapsed().as_secs_f64();
        times.settled += deliveries.len() as u64;
        times.batches += 1;
        deliveries.clear();
        last_progress = Instant::now();
    }
    // Close before the consumer is dropped: dropping a live consumer sends a
    // cancel whose answer lapin 4.12 does not expect.
    channel.close(200, "drained".into()).await?;
    drop(consumer);
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefetch_is_two_batches_within_amqps_u16() {
        let settings = |batch_size| ConsumerSettings {
            batch_size,
            window: Duration::from_millis(5),
            delivery_limit: 5,
            #[cfg(feature = "failpoints")]
            failpoints: Default::default(),
        };
        assert_eq!(settings(1).prefetch(), 2);
        assert_eq!(settings(200).prefetch(), 400);
        assert_eq!(settings(u16::MAX).prefetch(), u16::MAX);
    }

    #[test]
    fn the_failure_count_is_read_from_any_integer_header_and_is_0_otherwise() {
        let with = |value: AMQPValue| {
            let mut headers = FieldTable::default();
            headers.insert(FAILURES_HEADER.into(), value);
            BasicProperties::default().with_headers(headers)
        };
        assert_eq!(failures(&BasicProperties::default()), 0);
        assert_eq!(failures(&with(AMQPValue::LongLongInt(3))), 3);
        assert_eq!(failures(&with(AMQPValue::LongInt(4))), 4);
        assert_eq!(failures(&with(AMQPValue::LongUInt(5))), 5);
        assert_eq!(failures(&with(AMQPValue::LongLongInt(-1))), u32::MAX, "unreadable: give up");
        assert_eq!(failures(&with(AMQPValue::LongString("2".into()))), 0);
    }
}
