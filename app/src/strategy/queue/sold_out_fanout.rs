//! The sold-out gate: once a sale is sold out, instances stop publishing for
//! it and answer `409 sold-out` themselves.
//!
//! The active consumer is the first to know: after a batch that found no
//! stock left it flags the sale locally and broadcasts `sold_out` on the
//! events fanout exchange; every instance's listener flags it too. A restock
//! clears the flag on its instance and broadcasts `reopened`. Each instance
//! listens on an exclusive queue of its own bound to the exchange.
//!
//! Only the service's own events count: each is published with the AMQP
//! `user-id` property set to the broker user the service connects as, which
//! RabbitMQ checks against the publishing connection's user (a publish with
//! another user's id is refused by the broker); the listener ignores every
//! event whose `user-id` is not that user. A process that reaches the broker
//! as another user therefore cannot keep a sale refusing buyers — as long
//! as the service has a broker user of its own (docs/queue.md): one that
//! shares the service's credentials can.
//!
//! Broadcasts are best effort (a listener may be reconnecting), so a flag
//! lives `SECKILL_SOLD_OUT_FLAG_TTL_MS`: when it expires, the next purchase
//! re-reads `remaining_stock` from Postgres (one plain read per sale and
//! period, not per request) and flags the sale again if it is still 0. A lost
//! `reopened` therefore hides restocked stock for at most one period, and a
//! lost `sold_out` only costs publishes that the consumer answers `sold_out`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::Topology;
use super::settle::Settled;
use crate::backends::AmqpHandle;
use crate::sale::SaleId;
use crate::strategy::StrategyError;

/// One event on the events exchange.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Event {
    SoldOut { sale_id: i64 },
    Reopened { sale_id: i64 },
}

/// Sales this instance answers "sold out" for, each until its flag expires.
pub struct SoldOutGate {
    ttl: Duration,
    flags: Mutex<HashMap<SaleId, Instant>>,
    amqp: AmqpHandle,
    topology: Topology,
    /// Channel for broadcasting events (opened on first use).
    events: tokio::sync::Mutex<Option<Channel>>,
    /// The broker user the service publishes its events as, and the only
    /// one whose events it applies (`None`: an unparsable URL, no events).
    user: Option<String>,
}

impl SoldOutGate {
    pub fn new(ttl: Duration, amqp: AmqpHandle, topology: Topology) -> Self {
        Self {
            ttl,
            flags: Mutex::new(HashMap::new()),
            user: amqp.user(),
            amqp,
            topology,
            events: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether `sale` is known sold out. A fresh flag answers at once; an
    /// expired one is checked against Postgres (other purchases meanwhile
    /// keep answering from the flag).
    ///
    /// Errors: Postgres errors of that check.
    pub async fn is_sold_out(&self, db: &PgPool, sale: SaleId) -> Result<bool, StrategyError> {
        {
            let mut flags = self.flags.lock().expect("sold-out flags");
            match flags.get_mut(&sale) {
                None => return Ok(false),
                Some(at) if at.elapsed() < self.ttl => return Ok(true),
                // Expired: this caller checks; extend it for the others.
                Some(at) => *at = Instant::now(),
            }
        }
        let stock = crate::sale::stock(db, sale).await?;
        let sold_out = stock.is_some_and(|s| s.remaining_stock == 0);
        if !sold_out {
            self.flags.lock().expect("sold-out flags").remove(&sale);
        }
        Ok(sold_out)
    }

    fn flag(&self, sale: SaleId) {
        self.flags.lock().expect("sold-out flags").insert(sale, Instant::now());
    }

    fn clear(&self, sale: SaleId) {
        self.flags.lock().expect("sold-out flags").remove(&sale);
    }

    /// After a committed batch: flags (and announces) the sales it found
    /// sold out that were not flagged yet.
    pub async fn after_batch(&self, settled: &Settled) {
        for sale in settled.sales.iter().filter(|s| s.sold_out) {
            let id = SaleId(sale.sale_id);
            let known = self.flags.lock().expect("sold-out flags").contains_key(&id);
            self.flag(id);
            if !known {
                self.broadcast(Event::SoldOut { sale_id: sale.sale_id }).await;
            }
        }
    }

    /// Restock: this instance publishes again for `sale` at once, and tells
    /// the others.
    pub async fn reopen(&self, sale: SaleId) {
        self.clear(sale);
        self.broadcast(Event::Reopened { sale_id: sale.0 }).await;
    }

    /// Publishes `event` on the events exchange (no confirm: best effort,
    /// backed by the flags' expiry).
    async fn broadcast(&self, event: Event) {
        let result = async {
            let mut slot = self.events.lock().await;
            let channel = match slot.as_ref() {
                Some(channel) if channel.status().connected() => channel.clone(),
                _ => {
                    let conn = self.amqp.connection().await?;
                    let channel = conn.create_channel().await.map_err(anyhow::Error::from)?;
                    self.topology.declare_events(&channel).await.map_err(anyhow::Error::from)?;
                    *slot = Some(channel.clone());
                    channel
                }
            };
            let payload = serde_json::to_vec(&event).map_err(anyhow::Error::from)?;
            let user = self.user.clone().unwrap_or_default();
            channel
                .basic_publish(
                    self.topology.events_exchange().as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &payload,
                    BasicProperties::default().with_user_id(user.into()),
                )
                .await
                .map_err(anyhow::Error::from)?;
            Ok::<_, anyhow::Error>(())
        }
        .await;
        if let Err(err) = result {
            tracing::debug!(error = %err, ?event, "could not broadcast a sale event");
        }
    }

    /// Whether an event published with `user_id` (its AMQP property) is
    /// the service's own.
    fn is_own(&self, user_id: Option<&str>) -> bool {
        from_user(user_id, self.user.as_deref())
    }

    fn apply(&self, event: Event) {
        match event {
            Event::SoldOut { sale_id } => self.flag(SaleId(sale_id)),
            Event::Reopened { sale_id } => self.clear(SaleId(sale_id)),
        }
    }
}

/// Listens to the events exchange (an exclusive queue per instance) until
/// the service shuts down, reconnecting after failures.
pub async fn listen(amqp: AmqpHandle, topology: Topology, gate: Arc<SoldOutGate>) {
    loop {
        let listened = listen_once(&amqp, &topology, &gate).await;
        if amqp.is_closed() {
            return; // the service is shutting down
        }
        if let Err(err) = listened {
            tracing::debug!(error = %err, "sale event listener stopped; retrying");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn listen_once(
    amqp: &AmqpHandle,
    topology: &Topology,
    gate: &SoldOutGate,
) -> anyhow::Result<()> {
    let conn = amqp.connection().await?;
    let channel = conn.create_channel().await?;
    topology.declare_events(&channel).await?;
    let name = format!("{}.{}", topology.events_exchange(), uuid::Uuid::new_v4().simple());
    let queue = channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions::exclusive(),
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.name().clone(),
            topology.events_exchange().as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.name().clone(),
            "".into(),
            BasicConsumeOptions { no_ack: true, ..BasicConsumeOptions::default() },
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = super::consumer::next(&channel, &mut consumer).await? {
        let user_id = delivery.properties.user_id().as_ref().map(|id| id.as_str());
        if !gate.is_own(user_id) {
            tracing::warn!(
                user_id = ?user_id,
                "ignored a sale event that the service did not publish (another broker user)"
            );
            continue;
        }
        match serde_json::from_slice::<Event>(&delivery.data) {
            Ok(event) => gate.apply(event),
            Err(err) => tracing::debug!(error = %err, "unreadable sale event"),
        }
    }
    Ok(())
}

/// Whether an event whose `user-id` property is `published_by` came from
/// `own`, the service's broker user: both known and equal. An event without
/// the property is not the service's.
fn from_user(published_by: Option<&str>, own: Option<&str>) -> bool {
    matches!((published_by, own), (Some(by), Some(own)) if !own.is_empty() && by == own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_events_published_as_the_services_own_user_count() {
        assert!(from_user(Some("seckill"), Some("seckill")));
        assert!(!from_user(Some("mallory"), Some("seckill")), "another user");
        assert!(!from_user(None, Some("seckill")), "no user-id property");
        assert!(!from_user(Some("seckill"), None), "no known user of its own");
        assert!(!from_user(Some(""), Some("")), "an empty name is no user");
    }
}
