//! The dead-letter consumer: every message that reaches `PREFIX.orders.dead`
//! is recorded as a final result and counted, so that no request stays
//! `pending` because the broker (or the consumer) gave up on its message.
//!
//! What lands there: a message the consumer rejected (unreadable, or whose
//! request failed `SECKILL_QUEUE_DELIVERY_LIMIT` times and is already
//! recorded `rejected`), and a message the broker dead-lettered at the
//! partition queue's `x-delivery-limit` (`topology::BROKER_DELIVERY_LIMIT`,
//! a backstop). Each is read once: a readable one whose request is still
//! `pending` becomes `rejected` with the broker's reason (`x-death`); every
//! one is counted in `seckill_queue_dead_lettered_total{reason}` and then
//! acknowledged. Postgres down: the message waits, unacknowledged.
//!
//! Every instance that consumes runs one; the dead-letter queue has no
//! single active consumer (recording a rejection is idempotent), so a
//! message goes to whichever is free.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use sqlx::PgPool;

use super::{PurchaseMessage, Topology, settle};
use crate::backends::AmqpHandle;
use crate::strategy::StrategyError;

/// Pause before subscribing again, or retrying a record Postgres refused.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Drains the dead-letter queue until the service shuts down, subscribing
/// again after failures.
pub async fn run(db: PgPool, amqp: AmqpHandle, topology: Topology) {
    loop {
        let drained = drain(&db, &amqp, &topology).await;
        if amqp.is_closed() {
            return;
        }
        if let Err(err) = drained {
            tracing::debug!(error = %err, "dead-letter consumer stopped; retrying");
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

async fn drain(db: &PgPool, amqp: &AmqpHandle, topology: &Topology) -> anyhow::Result<()> {
    let conn = amqp.connection().await?;
    let channel = conn.create_channel().await?;
    topology.declare_queues(&channel).await?;
    channel.basic_qos(50, BasicQosOptions { global: false }).await?;
    let tag = format!("seckill-dead-{}", uuid::Uuid::new_v4().simple());
    let mut consumer = channel
        .basic_consume(
            topology.dead_letter_queue().as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = super::consumer::next(&channel, &mut consumer).await? {
        resolve(db, &delivery).await;
        super::consumer::acknowledge(&delivery, false).await;
    }
    Ok(())
}

/// Records the dead letter's request `rejected` (if it is readable and still
/// pending) and counts it; waits while Postgres is unavailable or refuses
/// the service's role.
async fn resolve(db: &PgPool, delivery: &Delivery) {
    let reason = death_reason(delivery);
    metrics::counter!(crate::metric_names::QUEUE_DEAD_LETTERED_TOTAL, "reason" => reason.clone())
        .increment(1);
    let Ok(message) = serde_json::from_slice::<PurchaseMessage>(&delivery.data) else {
        tracing::warn!(reason, "an unreadable dead letter was dropped");
        return;
    };
    let detail = format!("dead-lettered ({reason})");
    loop {
        match settle::mark_rejected(db, &message, &detail).await {
            Ok(()) => return,
            Err(err) => match StrategyError::from(err) {
                StrategyError::Unavailable { .. } => tokio::time::sleep(RETRY_PAUSE).await,
                // As the consumer's batches: kept until an operator corrects
                // the role, never acknowledged unrecorded.
                StrategyError::Misconfigured { backend, cause, source } => {
                    crate::outcome::log_misconfiguration(backend, cause, &source);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => {
                    tracing::warn!(request_id = %message.request_id, error = %other,
                        "could not record a dead-lettered request");
                    return;
                }
            },
        }
    }
}

/// Why the broker dead-lettered `delivery`: the `reason` of its latest
/// `x-death` entry (`rejected`, `delivery_limit`, `expired`, `maxlen`), or
/// `unknown`.
fn death_reason(delivery: &Delivery) -> String {
    let latest = delivery.properties.headers().as_ref().and_then(|headers| {
        match headers.inner().get("x-death") {
            Some(AMQPValue::FieldArray(deaths)) => deaths.as_slice().first().cloned(),
            _ => None,
        }
    });
    let reason = match latest {
        Some(AMQPValue::FieldTable(death)) => match death.inner().get("reason") {
            Some(AMQPValue::LongString(reason)) => Some(reason.to_string()),
            Some(AMQPValue::ShortString(reason)) => Some(reason.to_string()),
            _ => None,
        },
        _ => None,
    };
    reason.unwrap_or_else(|| "unknown".to_owned())
}
