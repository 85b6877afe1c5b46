//! Ceilings of the `queue` strategy's two halves, measured without HTTP (the
//! load test's `amqp_rps` and `queue_drain_units_per_s`):
//!
//! - [`amqp_round_trips`]: what the broker sustains for the publish path —
//!   persistent publishes with confirms into a quorum queue, consumed and
//!   acknowledged at the same time;
//! - [`drain`]: what the consumer settles per second from a pre-filled queue,
//!   with the strategy's own batching and transaction ([`super::settle`]).
//!
//! Both use scratch queues named after `prefix` and delete them afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sqlx::PgPool;
use uuid::Uuid;

use super::PurchaseMessage;
use super::consumer::{self, ConsumerSettings, DrainTimes};
use super::publisher::{PublishOutcome, publish_confirmed};
use crate::sale::SaleId;

/// Channels the publishers share, as the strategy's publisher does.
const CHANNELS: usize = 8;

/// `clients` concurrent tasks publishing persistent messages with confirms
/// into a scratch quorum queue (single active consumer) while one consumer
/// (prefetch 500) acknowledges them, for `seconds`. Returns messages consumed
/// per second.
///
/// Errors: the broker at `amqp_url` cannot be reached or refuses a declare.
pub async fn amqp_round_trips(
    amqp_url: &str,
    prefix: &str,
    clients: u64,
    seconds: f64,
) -> anyhow::Result<f64> {
    let conn = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let queue = format!("{prefix}.ceiling.{}", Uuid::new_v4().simple());
    let setup = conn.create_channel().await?;
    declare_scratch(&setup, &queue).await?;
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        let channel = conn.create_channel().await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        channels.push(channel);
    }
    let consumed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let consumer_channel = conn.create_channel().await?;
    consumer_channel.basic_qos(500, BasicQosOptions { global: false }).await?;
    let mut consumer = consumer_channel
        .basic_consume(
            queue.as_str().into(),
            "ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let counter = consumed.clone();
    let consuming = tokio::spawn(async move {
        let mut unacked = 0;
        while Instant::now() < deadline {
            let Ok(Some(delivery)) =
                tokio::time::timeout(Duration::from_millis(100), consumer.next()).await
            else {
                continue;
            };
            let delivery = delivery?;
            counter.fetch_add(1, Relaxed);
            unacked += 1;
            if unacked == 100 {
                delivery.ack(BasicAckOptions { multiple: true }).await?;
                unacked = 0;
            }
        }
        // Handed back so that it is dropped only after its channel closed:
        // dropping a live consumer sends a cancel that lapin 4.12 does not
        // expect the answer to.
        Ok::<_, lapin::Error>(consumer)
    });
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let channel = channels[i as usize % CHANNELS].clone();
        let queue = queue.clone();
        tasks.spawn(async move {
            let payload = [0u8; 96];
            while Instant::now() < deadline {
                publish_confirmed(&channel, &queue, &payload, "ceiling").await?;
            }
            Ok::<_, lapin::Error>(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    let consumer = consuming.await??;
    let elapsed = start.elapsed().as_secs_f64();
    consumer_channel.close(200, "measured".into()).await?;
    drop(consumer);
    setup.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let _ = conn.close(200, "done".into()).await;
    Ok(consumed.load(Relaxed) as f64 / elapsed)
}

/// What [`drain`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drain {
    /// Messages settled (one unit each).
    pub units: u64,
    /// Units settled per second, from the first delivery to the last commit.
    pub units_per_s: f64,
    /// Where the consumer's time went.
    pub times: DrainTimes,
}

/// Fills a scratch queue with `units` one-unit purchases of `sale` by
/// distinct buyers (`first_user..`), then settles them with the consumer's
/// batching (`settings`) and measures units per second. The sale must have
/// at least `units` units left; its stock is really taken (orders written).
///
/// Errors: the broker or Postgres fails, or a message could not be stored.
pub async fn drain(
    db: &PgPool,
    amqp_url: &str,
    prefix: &str,
    sale: SaleId,
    first_user: i64,
    units: u64,
    settings: ConsumerSettings,
) -> anyhow::Result<Drain> {
    let conn = Connection::connect(amqp_url, ConnectionProperties::default()).await?;
    let queue = format!("{prefix}.drain.{}", Uuid::new_v4().simple());
    let channel = conn.create_channel().await?;
    declare_scratch(&channel, &queue).await?;
    fill(&conn, &queue, sale, first_user, units).await?;
    // Open every pool connection the consumer will use before the clock.
    drop(db.acquire().await?);
    let consumer_channel = conn.create_channel().await?;
    let start = Instant::now();
    let times =
        consumer::drain(db, &consumer_channel, &queue, settings, Duration::from_secs(5), units)
            .await?;
    let elapsed = start.elapsed().as_secs_f64();
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let _ = conn.close(200, "done".into()).await;
    if times.settled < units {
        anyhow::bail!("the drain settled {} of {units} messages", times.settled);
    }
    Ok(Drain { units: times.settled, units_per_s: times.settled as f64 / elapsed, times })
}

/// Publishes the purchases, pipelined, and waits for every confirm.
async fn fill(
    conn: &Connection,
    queue: &str,
    sale: SaleId,
    first_user: i64,
    units: u64,
) -> anyhow::Result<()> {
    let channel = conn.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    for chunk_start in (0..units).step_by(1000) {
        let mut confirms = Vec::new();
        for i in chunk_start..(chunk_start + 1000).min(units) {
            let message = PurchaseMessage {
                request_id: Uuid::new_v4(),
                sale_id: sale.0,
                user_id: first_user + i as i64,
                quantity: 1,
            };
            let payload = serde_json::to_vec(&message)?;
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    lapin::options::BasicPublishOptions { mandatory: true, ..Default::default() },
                    &payload,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            let confirmation = confirm.await?;
            let outcome = match confirmation {
                lapin::Confirmation::Ack(None) => PublishOutcome::Stored,
                lapin::Confirmation::Ack(Some(_)) => PublishOutcome::Unroutable,
                _ => PublishOutcome::Refused,
            };
            if outcome != PublishOutcome::Stored {
                anyhow::bail!("filling the drain queue: a message was {outcome:?}");
            }
        }
    }
    Ok(())
}

/// A durable quorum queue with a single active consumer, as the partition
/// queues are (without their bound, which the fill would hit).
async fn declare_scratch(channel: &Channel, queue: &str) -> lapin::Result<()> {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    channel.queue_declare(queue.into(), QueueDeclareOptions::durable(), args).await?;
    Ok(())
}
