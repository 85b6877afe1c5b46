//! `sql/batched`: group commit in the application. Concurrent purchases of
//! one sale share one Postgres transaction, and each still gets its own
//! synchronous answer (`201`, `409` …), the one `sql` would have given it.
//!
//! Why: every synchronous strategy that takes one row lock per sold unit
//! stops at the rate Postgres commits one transaction on one hot row (the
//! `sql_tps` ceiling). Databases built for hot rows batch the updates of a
//! row inside the engine (statement queues, hot-row group commit); Postgres
//! does not, so this strategy batches in front of it: one guarded update of
//! the row per batch instead of per unit.
//!
//! How: in each process, the purchases of a sale that arrive while one of
//! its batches settles queue up and form the next batch, up to
//! `SECKILL_SQL_BATCHED_BATCH_MAX` ([`group_commit`]: a leader task and its followers;
//! a purchase of an idle sale goes at once). A batch is one transaction that
//! locks the sale row and applies the `sql` strategy's rule to each purchase
//! in arrival order ([`settle`]): units while the stock covers the quantity
//! (a smaller purchase after a refused larger one may still fit), `already
//! purchased` for a buyer with an order (in Postgres or earlier in the
//! batch), and the stock falls by exactly the units written, under the guard
//! `remaining_stock >= units`. Batches of several processes serialise on the
//! row lock.
//!
//! Invariants: the ledger of `sql`; each purchase answered once, by its own
//! channel; a batch applied entirely or not at all. A purchase Postgres
//! refuses fails alone (the batch is settled again one purchase at a time);
//! an error of the connection fails its batch, `503 unavailable`. The
//! batch runs in a task of its own, so a client that disconnects neither
//! loses nor duplicates its order.
//!
//! The sale's batch statistics (per process) are at
//! `GET /admin/sales/{id}/batches` ([`BatchStats`]).
//!
//! Memory: a sale's queue, with its statistics, is dropped once it has been
//! idle (no leader, nothing waiting) for [`crate::sale::IDLE_SALE_STATE`]:
//! purchases look for such queues at most every [`PRUNE_EVERY`]. A sale
//! sold from again gets a new queue; the statistics of a sale idle that long
//! read zeros.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::oneshot;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::batch::BatchSizes;
use super::{
    Backend, Claim, Deps, Outcome, Registration, Returned, Strategy, StrategyError, StrategyName,
    StrategyRoutes,
};
use crate::sale::{Quantity, Sale, SaleCatalog, SaleId, UserId};
use crate::web::{AppError, SalePath};

pub mod group_commit;
pub mod settle;

use group_commit::{Batching, SaleQueue, Waiter};
use settle::Purchase;

/// Default of `SECKILL_SQL_BATCHED_BATCH_MAX`, the largest batch.
///
/// Chosen by measurement of the batch transaction alone against Postgres
/// (docs/hot-row.md, "Batch size"): a batch costs about one commit whatever
/// its size, so units per second grow almost with the cap; 256 is the
/// smallest cap measured whose rate was above what HTTP delivered to two
/// instances on the same machine, so the cap does not hold the strategy
/// below its front end, while a full batch still commits quickly.
pub const DEFAULT_BATCH_MAX: u16 = 256;

/// Settings of the `sql/batched` strategy (`SECKILL_SQL_BATCHED_*`), its
/// part of `crate::strategy::StrategySettings`.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Strategy sql/batched")]
#[group(id = "sql/batched")]
pub struct Settings {
    /// Most purchases of one sale this instance settles in one
    /// transaction; purchases beyond it wait for the next batch.
    #[arg(
        id = "SQL_BATCHED_BATCH_MAX",
        long = "sql-batched-batch-max",
        env = "SECKILL_SQL_BATCHED_BATCH_MAX",
        default_value_t = DEFAULT_BATCH_MAX,
        value_parser = clap::value_parser!(u16).range(1..=10_000)
    )]
    pub batch_max: u16,

    /// Microseconds a batch waits for more purchases before it
    /// settles; 0 settles at once what has gathered (group commit, no timer).
    /// In microseconds, not milliseconds: a window worth trying is shorter
    /// than one batch transaction, itself a matter of milliseconds
    /// (docs/hot-row.md).
    #[arg(
        id = "SQL_BATCHED_BATCH_WINDOW_US",
        long = "sql-batched-batch-window-us",
        env = "SECKILL_SQL_BATCHED_BATCH_WINDOW_US",
        default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=1_000_000)
    )]
    pub batch_window_us: u64,
}

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("sql/batched");

/// `sql/batched` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "group commit: concurrent purchases of a sale share one transaction, each answered \
            as sql would answer it",
    needs: &[Backend::Postgres],
    build: |deps| Ok(Arc::new(SqlBatched::new(deps, &deps.settings.sql_batched))),
    // Expected correct everywhere (the default): each batch locks the sale
    // row, applies the `sql` rule to its purchases in arrival order and
    // takes the units with one guarded update, in one transaction; batches
    // of several instances serialise on the row.
    //
    // Many units per transaction: `sql_tps` does not bound it; its own
    // batch transaction does (`sql_batched_units_per_s`).
    ceiling: super::Ceiling::Batches(|db, sale, purchases| {
        Box::pin(async move {
            let purchases: Vec<settle::Purchase> = purchases
                .into_iter()
                .map(|(user, quantity)| settle::Purchase { user, quantity })
                .collect();
            settle::settle(&db, sale, &purchases).await
        })
    }),
    ..Registration::DEFAULTS
};

/// How often purchases drop the queues idle for longer than
/// [`crate::sale::IDLE_SALE_STATE`].
pub const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The `sql/batched` strategy; one per process.
pub struct SqlBatched {
    db: PgPool,
    catalog: SaleCatalog,
    batching: Batching,
    queues: Mutex<Queues>,
}

/// One queue per sale this process has sold from lately.
struct Queues {
    by_sale: HashMap<SaleId, Arc<SaleQueue>>,
    pruned_at: Instant,
}

impl Queues {
    /// Drops the queues idle since before `now − IDLE_SALE_STATE`. A queue
    /// in use is kept: its leader and waiters hold it, and a purchase that
    /// joins it finds it in the map.
    fn prune(&mut self, now: Instant) {
        let idle = crate::sale::IDLE_SALE_STATE;
        self.by_sale.retain(|_, queue| {
            queue.idle_since().is_none_or(|since| now.saturating_duration_since(since) < idle)
        });
        self.pruned_at = now;
    }
}

impl SqlBatched {
    /// The strategy of one process, with `settings` (its part of the
    /// strategies' settings) over the pool of `deps`.
    pub fn new(deps: &Deps, settings: &Settings) -> Self {
        let batching = Batching {
            max: usize::from(settings.batch_max.max(1)),
            window: Duration::from_micros(settings.batch_window_us),
        };
        Self {
            db: deps.db.clone(),
            catalog: deps.catalog.clone(),
            batching,
            queues: Mutex::new(Queues { by_sale: HashMap::new(), pruned_at: Instant::now() }),
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The queue of `sale`, made on first use; drops the idle queues first
    /// when the last prune is [`PRUNE_EVERY`] old.
    fn queue(&self, sale: SaleId) -> Arc<SaleQueue> {
        let mut queues = self.queues();
        let now = Instant::now();
        if now.duration_since(queues.pruned_at) >= PRUNE_EVERY {
            queues.prune(now);
        }
        queues.by_sale.entry(sale).or_default().clone()
    }

    /// The batches this process settled for `sale` since its queue was made.
    pub fn stats(&self, sale: SaleId) -> BatchStats {
        let known = self.queues().by_sale.get(&sale).cloned();
        BatchStats::of(sale, known.map(|queue| queue.sizes()).unwrap_or_default())
    }

    /// Drops the queues idle since before `now − IDLE_SALE_STATE`, as
    /// purchases do every [`PRUNE_EVERY`]; tests call it with a later `now`.
    pub fn forget_idle(&self, now: Instant) {
        self.queues().prune(now);
    }

    /// Sales with a queue in this process.
    pub fn len(&self) -> usize {
        self.queues().by_sale.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Strategy for SqlBatched {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let (answer, answered) = oneshot::channel();
        let queue = self.queue(sale.id);
        let waiter =
            Waiter { purchase: Purchase { user, quantity }, since: Instant::now(), answer };
        if queue.join(waiter) {
            let leader = group_commit::lead(queue, self.db.clone(), sale.id, self.batching);
            tokio::spawn(leader);
        }
        answered.await.unwrap_or_else(|_| {
            Err(StrategyError::Internal(anyhow::anyhow!(
                "the batch of this purchase ended without answering it"
            )))
        })
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go back on the sale row, as for `sql`, outside the batches:
    /// a batch locks the sale row (`FOR UPDATE`) before it reads the stock
    /// it decides from, so the return's relative update lands before that
    /// read or after the batch's write, never between them.
    async fn return_units(&self, _sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        super::sql::return_to_sale_row(claim).await
    }

    fn routes(self: Arc<Self>, _deps: &Deps) -> Option<StrategyRoutes> {
        let admin = OpenApiRouter::new().routes(routes!(batches)).with_state(self);
        Some(StrategyRoutes { key: "batches", public: OpenApiRouter::new(), admin })
    }
}

/// `GET /admin/sales/{id}/batches`: the batches of the sale in this process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchStats {
    pub sale_id: SaleId,
    /// Batches settled.
    pub batches: u64,
    /// Purchases they settled.
    pub purchases: u64,
    /// `null` until a batch settled.
    pub batch_sizes: Option<BatchSizes>,
    /// Batch size → batches of that size, so that the figures of several
    /// processes add up exactly ([`BatchStats::merge`]). In JSON the sizes
    /// are object keys, hence strings of digits (the schema says so: an
    /// integer-keyed map would promise integer property names, which JSON
    /// cannot have).
    #[schema(value_type = BTreeMap<String, u64>)]
    pub size_counts: BTreeMap<u32, u64>,
}

impl BatchStats {
    /// The statistics of `size_counts`.
    pub fn of(sale_id: SaleId, size_counts: BTreeMap<u32, u64>) -> BatchStats {
        BatchStats {
            sale_id,
            batches: size_counts.values().sum(),
            purchases: size_counts.iter().map(|(&size, &n)| u64::from(size) * n).sum(),
            batch_sizes: BatchSizes::of(&size_counts),
            size_counts,
        }
    }

    /// The statistics of several processes (or sales) together.
    pub fn merge(sale_id: SaleId, all: &[BatchStats]) -> BatchStats {
        let mut counts = BTreeMap::new();
        for (&size, &n) in all.iter().flat_map(|stats| &stats.size_counts) {
            *counts.entry(size).or_insert(0) += n;
        }
        BatchStats::of(sale_id, counts)
    }
}

/// `200` with the sale's [`BatchStats`] in this process (zeros for a sale it
/// has not sold from lately, [`crate::sale::IDLE_SALE_STATE`]); `404` for an
/// unknown sale.
#[utoipa::path(
    get,
    path = "/admin/sales/{id}/batches",
    tag = "admin",
    params(SalePath),
    responses((status = 200, description = "The sale's sql/batched batches in this instance", body = BatchStats)),
)]
async fn batches(
    State(strategy): State<Arc<SqlBatched>>,
    SalePath(id): SalePath,
) -> Result<Json<BatchStats>, AppError> {
    strategy.catalog.get(&strategy.db, id).await?.ok_or_else(|| AppError::no_such_sale(id))?;
    Ok(Json(strategy.stats(id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statistics_of_several_processes_add_up() {
        let one = BatchStats::of(SaleId(3), BTreeMap::from([(1, 2), (10, 1)]));
        assert_eq!((one.batches, one.purchases), (3, 12));
        let other = BatchStats::of(SaleId(3), BTreeMap::from([(10, 1), (20, 1)]));
        let both = BatchStats::merge(SaleId(3), &[one, other]);
        assert_eq!((both.batches, both.purchases), (5, 42));
        assert_eq!(both.size_counts, BTreeMap::from([(1, 2), (10, 2), (20, 1)]));
        let sizes = both.batch_sizes.unwrap();
        assert_eq!((sizes.p50, sizes.max, sizes.mean), (10.0, 20.0, 8.4));
        let none = BatchStats::of(SaleId(3), BTreeMap::new());
        assert_eq!((none.batches, none.batch_sizes), (0, None));
    }
}
