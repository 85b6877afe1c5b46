//! The sold-out gate: once a sale is sold out, instances stop publishing for
//! it and answer `409 sold-out` themselves.
//!
//! The gate learns the state from Postgres, and hears the news sooner. What
//! an instance knows of a sale (sold out or not, and since when) is trusted
//! for `SECKILL_SOLD_OUT_FLAG_TTL_MS`; past that, or when it knows nothing of
//! the sale yet (it started after the sale sold out, or missed the
//! broadcast), the next purchase reads `remaining_stock` from Postgres —
//! one plain read per sale and period, shared by every purchase of that
//! sale: the others answer from what was known meanwhile (nothing known:
//! not sold out, the consumer answers them). So whatever broadcast an
//! instance missed, its gate holds what Postgres held at most one period
//! ago, sold out or reopened (a unit returned by an expired order).
//!
//! The news: the active consumer is the first to know: after a batch it
//! records each sale's state locally, and for a sale it found sold out that
//! it did not know so it broadcasts `sold_out` on the events fanout
//! exchange; every instance's listener records it too. A restock or a return
//! clears the sale on its instance and broadcasts `reopened`. Each instance
//! listens on an exclusive queue of its own bound to the exchange.
//!
//! Only the service's own events count: each is published with the AMQP
//! `user-id` property set to the broker user the service connects as, which
//! RabbitMQ checks against the publishing connection's user (a publish with
//! another user's id is refused by the broker); the listener ignores every
//! event whose `user-id` is not that user. A process that reaches the broker
//! as another user therefore cannot keep a sale refusing buyers — as long
//! as the service has a broker user of its own (docs/queue.md): one that
//! shares the service's credentials can, for one period at a time.
//!
//! Memory: an entry older than one period is no better than none (both are
//! checked), so entries older than that are dropped, at most once per
//! period: the map holds the sales bought from or announced in the last
//! period, and an ended sale (its purchases stop before the strategy) leaves
//! it.

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

/// What this instance knows of the sales' stock ([`Knowledge`]), how it
/// learns it (Postgres, the consumer's batches, the events exchange), and
/// the broadcasts it sends.
pub struct SoldOutGate {
    knowledge: Arc<Mutex<Knowledge>>,
    amqp: AmqpHandle,
    topology: Topology,
    /// Channel for broadcasting events (opened on first use).
    events: tokio::sync::Mutex<Option<Channel>>,
    /// The broker user the service publishes its events as, and the only
    /// one whose events it applies (`None`: an unparsable URL, no events).
    user: Option<String>,
}

impl SoldOutGate {
    /// A gate whose knowledge of a sale is trusted for `ttl`
    /// (`SECKILL_SOLD_OUT_FLAG_TTL_MS`).
    pub fn new(ttl: Duration, amqp: AmqpHandle, topology: Topology) -> Self {
        Self {
            knowledge: Arc::new(Mutex::new(Knowledge::new(ttl, Instant::now()))),
            user: amqp.user(),
            amqp,
            topology,
            events: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether `sale` is sold out, as Postgres held it at most one period
    /// ago. Fresh knowledge answers at once; otherwise this purchase reads
    /// Postgres (and the others answer from what was known meanwhile).
    ///
    /// Errors: Postgres errors of that read.
    pub async fn is_sold_out(&self, db: &PgPool, sale: SaleId) -> Result<bool, StrategyError> {
        let generation = match self.knowledge().look(sale, Instant::now()) {
            Look::Known(sold_out) => return Ok(sold_out),
            Look::Check(generation) => generation,
        };
        // In a task of its own: a purchase that goes away mid-read still
        // records what it read, so the next read is due one period later.
        let (db, knowledge) = (db.clone(), self.knowledge.clone());
        let read = tokio::spawn(async move {
            let stock = crate::sale::stock(&db, sale).await?;
            let sold_out = stock.is_some_and(|s| s.remaining_stock <= 0);
            let mut knowledge = knowledge.lock().expect("sold-out knowledge");
            knowledge.checked(sale, sold_out, generation, Instant::now());
            Ok::<_, StrategyError>(sold_out)
        });
        read.await.map_err(|err| StrategyError::Internal(err.into()))?
    }

    fn knowledge(&self) -> std::sync::MutexGuard<'_, Knowledge> {
        self.knowledge.lock().expect("sold-out knowledge")
    }

    /// The generation to pass to [`Self::after_batch`]: taken before the
    /// batch's transaction begins.
    pub fn generation(&self) -> u64 {
        self.knowledge().generation
    }

    /// After a committed batch begun in `generation` ([`Self::generation`]):
    /// records what it found of each of its sales (the consumer is the only
    /// writer that takes stock, so this is the newest state there is, unless
    /// units came back to the sale on this instance since the batch began:
    /// a return that waited for the batch's row lock commits right after
    /// it), and announces the sales it found sold out that were not known
    /// so.
    pub async fn after_batch(&self, settled: &Settled, generation: u64) {
        for sale in &settled.sales {
            let id = SaleId(sale.sale_id);
            let since = Some(generation);
            let news = self.knowledge().learned(id, sale.sold_out, since, Instant::now());
            if news && sale.sold_out {
                self.broadcast(Event::SoldOut { sale_id: sale.sale_id }).await;
            }
        }
    }

    /// Restock: this instance publishes again for `sale` at once, and tells
    /// the others.
    pub async fn reopen(&self, sale: SaleId) {
        self.knowledge().reopened(sale, Instant::now());
        self.broadcast(Event::Reopened { sale_id: sale.0 }).await;
    }

    /// Publishes `event` on the events exchange (no confirm: best effort,
    /// backed by the periodic read of Postgres).
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
        let mut knowledge = self.knowledge();
        match event {
            // Another instance's batch, of unknown age against this
            // instance's reopenings.
            Event::SoldOut { sale_id } => {
                knowledge.learned(SaleId(sale_id), true, None, Instant::now());
            }
            Event::Reopened { sale_id } => knowledge.reopened(SaleId(sale_id), Instant::now()),
        }
    }
}

/// What one instance knows of its sales' stock: sold out or not, and since
/// when. Pure: the caller gives the time.
struct Knowledge {
    /// How long an entry is trusted (`SECKILL_SOLD_OUT_FLAG_TTL_MS`).
    ttl: Duration,
    sales: HashMap<SaleId, Known>,
    /// Bumped by every reopening, and kept in the reopened sale's entry: a
    /// read of Postgres or a batch begun before that sale's reopening is
    /// not recorded as sold out (it may have read the stock before the
    /// units came back); another sale's reopening does not matter.
    generation: u64,
    /// When entries older than `ttl` were last dropped.
    pruned: Instant,
}

/// One sale's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    sold_out: bool,
    /// When it was learned, or when a read to refresh it began.
    at: Instant,
    /// The generation of the sale's last reopening (0: none known).
    reopened: u64,
}

/// The answer of [`Knowledge::look`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Sold out or not, learned less than one period ago (or being read
    /// again by another purchase).
    Known(bool),
    /// Nothing fresh: read Postgres, and record it with
    /// [`Knowledge::checked`] and this generation.
    Check(u64),
}

impl Knowledge {
    fn new(ttl: Duration, now: Instant) -> Self {
        Self { ttl, sales: HashMap::new(), generation: 0, pruned: now }
    }

    /// What to answer for `sale` at `now`. The first purchase to find its
    /// entry stale (or missing) is told to check; the entry is marked fresh
    /// meanwhile, so the purchases behind it answer from what was known
    /// (nothing known: not sold out).
    fn look(&mut self, sale: SaleId, now: Instant) -> Look {
        self.prune(now);
        match self.sales.get_mut(&sale) {
            Some(known) if now.duration_since(known.at) < self.ttl => Look::Known(known.sold_out),
            Some(known) => {
                known.at = now;
                Look::Check(self.generation)
            }
            None => {
                self.sales.insert(sale, Known { sold_out: false, at: now, reopened: 0 });
                Look::Check(self.generation)
            }
        }
    }

    /// Records a read of Postgres begun in `generation`, unless the sale
    /// was reopened since (its entry then says open, from the reopening).
    fn checked(&mut self, sale: SaleId, sold_out: bool, generation: u64, now: Instant) {
        let reopened = self.sales.get(&sale).map_or(0, |known| known.reopened);
        if reopened <= generation {
            self.sales.insert(sale, Known { sold_out, at: now, reopened });
        }
    }

    /// Records news of `sale` (a batch's result, a `sold_out` event) begun
    /// in generation `since` (`None`: unknown, another instance's). News of
    /// a sold-out sale older than the sale's reopening here is dropped; so
    /// is news of unknown age of a sale once reopened here while its entry
    /// says open and is fresh: the next read of Postgres, at most one period
    /// later, settles it, and until then the gate errs on the side of open
    /// (a purchase the consumer refuses, never a unit hidden). Returns
    /// whether it changes what was known.
    fn learned(&mut self, sale: SaleId, sold_out: bool, since: Option<u64>, now: Instant) -> bool {
        self.prune(now);
        let before = self.sales.get(&sale).copied();
        let reopened = before.map_or(0, |known| known.reopened);
        if sold_out
            && let Some(before) = before
            && reopened > 0
        {
            let stale = match since {
                Some(since) => reopened > since,
                None => now.duration_since(before.at) < self.ttl && !before.sold_out,
            };
            if stale {
                return false;
            }
        }
        self.sales.insert(sale, Known { sold_out, at: now, reopened });
        before.is_none_or(|before| before.sold_out != sold_out)
    }

    /// Units came back to `sale` (a restock, a return): open, and any read
    /// of Postgres or batch begun before is not recorded as sold out.
    fn reopened(&mut self, sale: SaleId, now: Instant) {
        self.generation += 1;
        self.sales.insert(sale, Known { sold_out: false, at: now, reopened: self.generation });
    }

    /// Drops the entries older than one period (no better than none), at
    /// most once per period.
    fn prune(&mut self, now: Instant) {
        if now.duration_since(self.pruned) < self.ttl {
            return;
        }
        let ttl = self.ttl;
        self.sales.retain(|_, known| now.duration_since(known.at) < ttl);
        self.pruned = now;
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

    const TTL: Duration = Duration::from_millis(1000);

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn a_sale_never_heard_of_is_read_from_postgres_once_per_period() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        let sale = SaleId(1);
        // An instance that missed the broadcast: the first purchase reads.
        assert_eq!(knowledge.look(sale, start), Look::Check(0));
        // The purchases behind it answer from what was known (nothing).
        assert_eq!(knowledge.look(sale, at(start, 10)), Look::Known(false));
        knowledge.checked(sale, true, 0, at(start, 20));
        assert_eq!(knowledge.look(sale, at(start, 30)), Look::Known(true));
        assert_eq!(knowledge.look(sale, at(start, 1019)), Look::Known(true));
        // One period after the read: read again.
        assert_eq!(knowledge.look(sale, at(start, 1020)), Look::Check(0));
        assert_eq!(knowledge.look(sale, at(start, 1030)), Look::Known(true), "one read at a time");
        knowledge.checked(sale, false, 0, at(start, 1040));
        assert_eq!(knowledge.look(sale, at(start, 1050)), Look::Known(false), "units came back");
    }

    #[test]
    fn a_read_begun_before_a_reopening_is_not_recorded() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        let sale = SaleId(1);
        let Look::Check(generation) = knowledge.look(sale, start) else { panic!("a check") };
        knowledge.reopened(sale, at(start, 5));
        knowledge.checked(sale, true, generation, at(start, 10));
        assert_eq!(knowledge.look(sale, at(start, 20)), Look::Known(false));
    }

    #[test]
    fn news_is_trusted_for_a_period_and_only_a_change_is_news() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        let sale = SaleId(1);
        assert!(knowledge.learned(sale, true, Some(0), start), "first heard");
        assert!(!knowledge.learned(sale, true, Some(0), at(start, 10)), "known already");
        assert_eq!(knowledge.look(sale, at(start, 500)), Look::Known(true));
        assert!(knowledge.learned(sale, false, Some(0), at(start, 600)), "a change");
        assert_eq!(knowledge.look(sale, at(start, 700)), Look::Known(false));
    }

    #[test]
    fn another_sales_reopening_does_not_discard_a_read() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        let (sale, other) = (SaleId(1), SaleId(2));
        let Look::Check(generation) = knowledge.look(sale, start) else { panic!("a check") };
        knowledge.reopened(other, at(start, 5));
        knowledge.checked(sale, true, generation, at(start, 10));
        assert_eq!(knowledge.look(sale, at(start, 20)), Look::Known(true));
    }

    #[test]
    fn a_batch_begun_before_a_reopening_does_not_close_the_sale() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        let sale = SaleId(1);
        // The batch begins; a return waiting for its row lock commits right
        // after it and reopens; the batch's result (sold out) comes last.
        let since = knowledge.generation;
        knowledge.reopened(sale, at(start, 5));
        assert!(!knowledge.learned(sale, true, Some(since), at(start, 10)), "no news");
        assert_eq!(knowledge.look(sale, at(start, 20)), Look::Known(false));
        // A batch begun after the reopening does close it.
        let since = knowledge.generation;
        assert!(knowledge.learned(sale, true, Some(since), at(start, 30)));
        assert_eq!(knowledge.look(sale, at(start, 40)), Look::Known(true));
    }

    #[test]
    fn another_instances_sold_out_does_not_close_a_freshly_reopened_sale_here() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        let sale = SaleId(1);
        knowledge.reopened(sale, start);
        assert!(!knowledge.learned(sale, true, None, at(start, 100)), "may predate the return");
        assert_eq!(knowledge.look(sale, at(start, 200)), Look::Known(false));
        // Once the entry is stale, the event counts (and a read follows a
        // period later as always).
        assert!(knowledge.learned(sale, true, None, at(start, 1200)));
        assert_eq!(knowledge.look(sale, at(start, 1300)), Look::Known(true));
        // A sale never reopened here takes the event at once.
        assert!(knowledge.learned(SaleId(2), true, None, at(start, 1300)));
    }

    #[test]
    fn entries_of_sales_no_longer_bought_are_dropped() {
        let start = Instant::now();
        let mut knowledge = Knowledge::new(TTL, start);
        for id in 0..1000 {
            knowledge.learned(SaleId(id), id % 2 == 0, None, at(start, 10));
        }
        assert_eq!(knowledge.sales.len(), 1000);
        // Within the period nothing goes; after it, every entry not
        // refreshed does, whatever it said.
        knowledge.look(SaleId(5000), at(start, 900));
        assert_eq!(knowledge.sales.len(), 1001);
        knowledge.look(SaleId(7), at(start, 1500));
        assert_eq!(knowledge.sales.len(), 2, "{:?}", knowledge.sales.keys());
        knowledge.look(SaleId(7), at(start, 5000));
        assert_eq!(knowledge.sales.len(), 1);
    }

    #[test]
    fn only_events_published_as_the_services_own_user_count() {
        assert!(from_user(Some("seckill"), Some("seckill")));
        assert!(!from_user(Some("mallory"), Some("seckill")), "another user");
        assert!(!from_user(None, Some("seckill")), "no user-id property");
        assert!(!from_user(Some("seckill"), None), "no known user of its own");
        assert!(!from_user(Some(""), Some("")), "an empty name is no user");
    }
}
