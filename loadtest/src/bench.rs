//! The benchmarks behind the ceilings that a strategy's own transaction
//! bounds, driven without HTTP through the hooks of its registration
//! (`seckill::strategy::Ceiling`), and the broker's own ceiling:
//!
//! - [`amqp_round_trips`] (`amqp_rps`): what the broker sustains for a
//!   publish path — persistent publishes with confirms into a quorum queue,
//!   consumed and acknowledged at the same time;
//! - [`drain`] (`queue_drain_units_per_s`): what a queue consumer settles
//!   per second from a pre-filled queue, with its own batching and
//!   transaction ([`DrainBench`]);
//! - [`batch_units_per_s`] (`sql_batched_units_per_s`): a batch transaction
//!   ([`SettleBatch`]) driven directly against Postgres at a given batch
//!   size, by as many concurrent drivers as there are processes (each
//!   process settles one batch of a sale at a time).
//!
//! The AMQP benchmarks use scratch queues named after a prefix and delete
//! them afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use seckill::sale::{Quantity, SaleId, UserId};
use seckill::strategy::Outcome;
use seckill::strategy::descriptor::{Batching, DrainBench, DrainRun, DrainTimes, SettleBatch};
use sqlx::PgPool;
use uuid::Uuid;

/// Channels the publishers of [`amqp_round_trips`] share.
const CHANNELS: usize = 8;

/// `clients` concurrent tasks publishing persistent messages with confirms
/// into a scratch quorum queue (single active consumer) while one consumer
/// (prefetch 500) acknowledges them, for `seconds`. Returns messages consumed
/// per second.
///
/// Errors: the broker at `amqp_url` cannot be reached, refuses a declare, or
/// does not store a message.
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
    let consuming = consume(&consumer_channel, &queue, deadline, consumed.clone()).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let channel = channels[i as usize % CHANNELS].clone();
        let queue = queue.clone();
        tasks.spawn(async move {
            let payload = [0u8; 96];
            while Instant::now() < deadline {
                publish_stored(&channel, &queue, &payload).await?;
            }
            Ok::<_, anyhow::Error>(())
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

/// Consumes `queue` on `channel` until `deadline`, counting into `counter`
/// and acknowledging every 100 messages. The task hands its consumer back
/// so that it is dropped only after its channel closed: dropping a live
/// consumer sends a cancel whose answer lapin 4.12 does not expect.
async fn consume(
    channel: &Channel,
    queue: &str,
    deadline: Instant,
    counter: Arc<AtomicU64>,
) -> lapin::Result<tokio::task::JoinHandle<lapin::Result<lapin::Consumer>>> {
    channel.basic_qos(500, BasicQosOptions { global: false }).await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(tokio::spawn(async move {
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
        Ok(consumer)
    }))
}

/// Publishes `payload` persistently to `queue` (default exchange,
/// `mandatory`) on a confirm-mode `channel` and waits for the broker's
/// confirm. Errors: the broker refused it, or no queue has that name.
async fn publish_stored(channel: &Channel, queue: &str, payload: &[u8]) -> anyhow::Result<()> {
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions { mandatory: true, ..Default::default() },
            payload,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?;
    match confirm.await? {
        lapin::Confirmation::Ack(None) => Ok(()),
        lapin::Confirmation::Ack(Some(_)) => anyhow::bail!("no queue `{queue}` took a message"),
        _ => anyhow::bail!("the broker refused a message to `{queue}`"),
    }
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

/// Where a [`drain`] runs: the sale's database and the broker.
pub struct DrainTarget<'a> {
    pub db: &'a PgPool,
    pub amqp_url: &'a str,
    /// The prefix of the scratch queue's name.
    pub prefix: &'a str,
    /// A sale with at least the drained units left; its stock is really
    /// taken (orders written).
    pub sale: SaleId,
}

/// Fills a scratch queue with `units` one-unit purchases of the target's
/// sale by distinct buyers (`first_user..`), then settles them with the
/// strategy's consumer (`bench`) at `batching`, and measures units per
/// second.
///
/// Errors: the broker or Postgres fails, a message could not be stored, or
/// the consumer settled fewer than `units`.
pub async fn drain(
    on: DrainTarget<'_>,
    bench: DrainBench,
    batching: Batching,
    first_user: i64,
    units: u64,
) -> anyhow::Result<Drain> {
    let conn = Connection::connect(on.amqp_url, ConnectionProperties::default()).await?;
    let queue = format!("{}.drain.{}", on.prefix, Uuid::new_v4().simple());
    let channel = conn.create_channel().await?;
    declare_scratch(&channel, &queue).await?;
    fill(&conn, &queue, &bench, on.sale, first_user, units).await?;
    // Open every pool connection the consumer will use before the clock.
    drop(on.db.acquire().await?);
    let consumer_channel = conn.create_channel().await?;
    let start = Instant::now();
    let run = DrainRun {
        db: on.db,
        channel: &consumer_channel,
        queue: &queue,
        batching,
        expected: units,
    };
    let times = (bench.drain)(run).await?;
    let elapsed = start.elapsed().as_secs_f64();
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let _ = conn.close(200, "done".into()).await;
    if times.settled < units {
        anyhow::bail!("the drain settled {} of {units} messages", times.settled);
    }
    Ok(Drain { units: times.settled, units_per_s: times.settled as f64 / elapsed, times })
}

/// Publishes the purchases, pipelined by the thousand, and waits for every
/// confirm.
async fn fill(
    conn: &Connection,
    queue: &str,
    bench: &DrainBench,
    sale: SaleId,
    first_user: i64,
    units: u64,
) -> anyhow::Result<()> {
    let channel = conn.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    for chunk_start in (0..units).step_by(1000) {
        let mut confirms = Vec::new();
        for i in chunk_start..(chunk_start + 1000).min(units) {
            let user = UserId::parse(first_user + i as i64)?;
            let payload = (bench.message)(sale, user, Quantity::ONE);
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions { mandatory: true, ..Default::default() },
                    &payload,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?;
            confirms.push(confirm);
        }
        for confirm in confirms {
            if !matches!(confirm.await?, lapin::Confirmation::Ack(None)) {
                anyhow::bail!("filling the drain queue: a message was not stored");
            }
        }
    }
    Ok(())
}

/// A durable quorum queue with a single active consumer, as a consumer's
/// partition queues are (without their bound, which the fill would hit).
async fn declare_scratch(channel: &Channel, queue: &str) -> lapin::Result<()> {
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    channel.queue_declare(queue.into(), QueueDeclareOptions::durable(), args).await?;
    Ok(())
}

/// `drivers` concurrent tasks each settle batches of `batch_size` one-unit
/// purchases of `sale` by fresh buyers (ids from `first_user` on) with
/// `settle` for `seconds`; returns units sold per second. The sale must
/// have far more stock than can sell in that time; its stock is really
/// taken.
///
/// Errors: a batch failed, or a purchase was not placed (the sale ran out,
/// a buyer had an order already).
pub async fn batch_units_per_s(
    db: &PgPool,
    settle: SettleBatch,
    sale: SaleId,
    first_user: i64,
    batch_size: usize,
    drivers: usize,
    seconds: f64,
) -> anyhow::Result<f64> {
    let next_user = Arc::new(AtomicI64::new(first_user));
    let sold = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..drivers.max(1) {
        let (db, next_user, sold) = (db.clone(), next_user.clone(), sold.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let first = next_user.fetch_add(batch_size as i64, Relaxed);
                let purchases = (first..first + batch_size as i64)
                    .map(|user| Ok((UserId::parse(user)?, Quantity::ONE)))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                for answer in settle(db.clone(), sale, purchases).await? {
                    match answer? {
                        Outcome::Placed { .. } => sold.fetch_add(1, Relaxed),
                        other => anyhow::bail!("the ceiling sale answered {other:?}"),
                    };
                }
            }
            Ok(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    Ok(sold.load(Relaxed) as f64 / start.elapsed().as_secs_f64())
}
