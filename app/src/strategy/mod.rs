//! Stock-deduction strategies behind one trait.
//!
//! A sale names its strategy when it is created (`sales.strategy`), and every
//! purchase of that sale goes through [`Strategy::purchase`]. Each strategy
//! lives in its own file and answers with the same [`Outcome`] /
//! [`StrategyError`] vocabulary, so the HTTP layer, the metrics and the load
//! test read all of them the same way.
//!
//! Every strategy sits on the same Postgres schema and its unique constraint
//! `orders_sale_user_key` (one order per user per sale). What differs is how
//! the stock is guarded; the audit (`crate::audit`) judges the result from
//! Postgres alone.
//!
//! This module also holds [`expectation`], the one table of which strategies
//! are expected to be correct and which are demonstrations that break.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::backends::{AmqpHandle, RedisHandle};
use crate::config::Config;
use crate::sale::{Quantity, Sale, SaleId, UserId};

pub mod lock;
pub mod naive;
pub mod queue;
pub mod redis_decr;
pub mod sql;
pub mod sql_for_update;

/// The wire name of a strategy, as in `POST /admin/sales {"strategy": …}` and
/// in the load test's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum StrategyName {
    /// Check-then-act with no protection: the baseline that oversells.
    Naive,
    /// Conditional `UPDATE … WHERE remaining_stock >= qty` and the order insert
    /// in one transaction.
    Sql,
    /// `SELECT … FOR UPDATE`, check, update, insert, in one transaction.
    SqlForUpdate,
    /// A Redis counter gates buyers (Lua: de-duplicate, `DECRBY`), then the
    /// `sql` transaction; every failure after the decrement is compensated,
    /// and a reconciler returns what a crash left behind.
    RedisDecr,
    /// The naive steps inside an in-process mutex per sale (`lock/local`).
    LockLocal,
    /// … inside a Redis `SETNX` key with no expiry (`lock/setnx`).
    LockSetnx,
    /// … inside a Redis `SET NX PX` key released by a blind `DEL` (`lock/ttl`).
    LockTtl,
    /// … inside a `SET NX PX` key with an owner token and a compare-and-delete
    /// release (`lock/token`).
    LockToken,
    /// … inside the lock library's lock, renewed by its watchdog
    /// (`lock/watchdog`).
    LockWatchdog,
    /// `lock/watchdog` plus a fencing token that Postgres checks across the
    /// read-modify-write (`lock/fenced`).
    LockFenced,
    /// The library's Redlock over `REDLOCK_URLS`, renewed and fenced like
    /// `lock/fenced` (`lock/redlock`).
    LockRedlock,
    /// Purchases are accepted (`202`) as messages in a RabbitMQ quorum queue
    /// and settled in batches by the sale's single active consumer.
    Queue,
}

impl StrategyName {
    /// Every implemented strategy, in the order the comparison reports them.
    pub const ALL: &'static [StrategyName] = &[
        StrategyName::Naive,
        StrategyName::Sql,
        StrategyName::SqlForUpdate,
        StrategyName::RedisDecr,
        StrategyName::LockLocal,
        StrategyName::LockSetnx,
        StrategyName::LockTtl,
        StrategyName::LockToken,
        StrategyName::LockWatchdog,
        StrategyName::LockFenced,
        StrategyName::LockRedlock,
        StrategyName::Queue,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            StrategyName::Naive => "naive",
            StrategyName::Sql => "sql",
            StrategyName::SqlForUpdate => "sql/for-update",
            StrategyName::LockLocal => "lock/local",
            StrategyName::LockSetnx => "lock/setnx",
            StrategyName::LockTtl => "lock/ttl",
            StrategyName::LockToken => "lock/token",
            StrategyName::LockWatchdog => "lock/watchdog",
            StrategyName::LockFenced => "lock/fenced",
            StrategyName::LockRedlock => "lock/redlock",
            StrategyName::RedisDecr => "redis-decr",
            StrategyName::Queue => "queue",
        }
    }

    /// The backing servers this strategy needs (the load test checks them).
    pub fn needs(self) -> &'static [Backend] {
        match self {
            StrategyName::Naive | StrategyName::Sql | StrategyName::SqlForUpdate => {
                &[Backend::Postgres]
            }
            StrategyName::RedisDecr
            | StrategyName::LockSetnx
            | StrategyName::LockTtl
            | StrategyName::LockToken
            | StrategyName::LockWatchdog
            | StrategyName::LockFenced
            | StrategyName::LockRedlock => &[Backend::Postgres, Backend::Redis],
            // The in-process mutex needs no Redis; its sold-out flag lives in memory.
            StrategyName::LockLocal => &[Backend::Postgres],
            StrategyName::Queue => &[Backend::Postgres, Backend::Rabbitmq],
        }
    }

    /// A file-name-safe form: `sql/for-update` → `sql-for-update`.
    pub fn slug(self) -> String {
        self.as_str().replace('/', "-")
    }
}

impl fmt::Display for StrategyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A strategy name that is not one of [`StrategyName::ALL`].
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown strategy `{0}`; expected one of: {known}", known = StrategyName::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))]
pub struct UnknownStrategy(pub String);

impl FromStr for StrategyName {
    type Err = UnknownStrategy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategyName::ALL
            .iter()
            .copied()
            .find(|name| name.as_str() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

impl TryFrom<String> for StrategyName {
    type Error = UnknownStrategy;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<StrategyName> for String {
    fn from(name: StrategyName) -> String {
        name.as_str().to_owned()
    }
}

/// The answer to one purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An order was written: `orders.id`, with the units it took.
    Placed { order_id: i64, quantity: i32 },
    /// No stock left for this quantity.
    SoldOut,
    /// This user already has an order for this sale.
    AlreadyPurchased,
    /// Before the sale's `starts_at`.
    NotStarted,
    /// At or after the sale's `ends_at`.
    Ended,
    /// Accepted for later settlement (`queue`): the result will be at
    /// `GET /sales/{id}/requests/{request_id}`.
    Accepted { request_id: uuid::Uuid },
}

impl Outcome {
    /// Label used in metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Placed { .. } => "placed",
            Outcome::SoldOut => "sold_out",
            Outcome::AlreadyPurchased => "already_purchased",
            Outcome::NotStarted => "not_started",
            Outcome::Ended => "ended",
            Outcome::Accepted { .. } => "accepted",
        }
    }
}

/// Which backing server failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Postgres,
    Redis,
    Rabbitmq,
}

/// Why a purchase produced no [`Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// Designed back-pressure (a lock wait ran out, a queue is full): the client
    /// should retry after `retry_after`. Becomes `503` + `Retry-After`, problem
    /// type `busy`.
    #[error("busy: {reason}")]
    Busy { reason: &'static str, retry_after: Duration },
    /// A backing server is down or unreachable. Becomes `503`, problem type
    /// `unavailable`.
    #[error("{backend:?} unavailable: {source}")]
    Unavailable {
        backend: Backend,
        #[source]
        source: anyhow::Error,
    },
    /// Anything else: a bug or an unexpected server answer. Becomes `500`.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for StrategyError {
    /// Connection-level failures (refused, reset, pool exhausted while
    /// connecting, server shutting down) are `Unavailable`; everything else is
    /// `Internal`. SQLSTATE classes from the PostgreSQL manual, appendix A:
    /// `08` connection exception, `57P0x` operator intervention, `53300` too
    /// many connections.
    fn from(err: sqlx::Error) -> Self {
        let unavailable = match &err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                code.starts_with("08") || code.starts_with("57P") || code == "53300"
            }),
            _ => false,
        };
        if unavailable {
            StrategyError::Unavailable { backend: Backend::Postgres, source: err.into() }
        } else {
            StrategyError::Internal(err.into())
        }
    }
}

/// One way of deducting stock.
///
/// Implementations must keep the ledger invariant
/// `total_stock = remaining_stock + sum(orders.quantity)` and must never write
/// two orders for one (sale, user) — or, for a baseline that is expected to
/// break, must break only through the race they demonstrate.
#[async_trait]
pub trait Strategy: Send + Sync + 'static {
    /// Tries to sell `quantity` units of `sale` to `user`. The caller has
    /// already checked the sale's time window and the per-user limit.
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError>;

    /// Called once after `sale` was inserted with `stock` units, before the
    /// creating request is answered (e.g. to pre-warm a counter).
    async fn sale_created(&self, _sale: &Sale, _stock: i64) -> Result<(), StrategyError> {
        Ok(())
    }

    /// Called after `units` were added to `sale` in Postgres.
    async fn restocked(&self, _sale: &Sale, _units: i64) -> Result<(), StrategyError> {
        Ok(())
    }

    /// How far the strategy's own stock counter strays from Postgres, in
    /// units (see [`crate::audit::Audit::redis_drift`]), measured without
    /// changing anything. `None` (the default) for strategies that keep no
    /// stock outside Postgres.
    async fn redis_drift(&self, _sale: &Sale) -> Result<Option<i64>, StrategyError> {
        Ok(None)
    }

    /// One reconciliation pass over `sale` now: compare the strategy's own
    /// state with Postgres and heal drift. The default has nothing to
    /// reconcile and reports so (`redis_drift: None`, no fixes).
    async fn reconcile(&self, sale: &Sale) -> Result<Reconciliation, StrategyError> {
        Ok(Reconciliation::nothing_to_reconcile(sale.id))
    }
}

/// What one reconciliation pass over a sale found and fixed. Units are units
/// of stock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    pub sale_id: SaleId,
    /// As the audit's `redis_drift`, measured before this pass fixed
    /// anything. `None` when the strategy keeps no counter (or Redis holds
    /// none for this sale yet).
    pub redis_drift: Option<i64>,
    /// Units of abandoned reservations (no order after the grace period)
    /// returned to the counter.
    pub returned_units: i64,
    /// Units by which the counter was corrected towards Postgres (absolute).
    pub corrected_units: i64,
    /// Open reservations younger than the grace period, left alone.
    pub in_flight_reservations: i64,
    /// A correction was due but postponed to a later pass, because new
    /// reservations landed while this pass was measuring.
    pub correction_deferred: bool,
}

impl Reconciliation {
    /// The report of a strategy with nothing to reconcile.
    pub fn nothing_to_reconcile(sale_id: SaleId) -> Self {
        Self {
            sale_id,
            redis_drift: None,
            returned_units: 0,
            corrected_units: 0,
            in_flight_reservations: 0,
            correction_deferred: false,
        }
    }

    /// Units fixed by this pass: returned plus corrected.
    pub fn fixes(&self) -> i64 {
        self.returned_units + self.corrected_units
    }
}

/// The strategies of one process, built once at start-up.
#[derive(Clone)]
pub struct Strategies {
    naive: Arc<naive::Naive>,
    sql: Arc<sql::Sql>,
    sql_for_update: Arc<sql_for_update::SqlForUpdate>,
    redis_decr: Arc<redis_decr::RedisDecr>,
    locks: Arc<lock::Shared>,
    lock_local: Arc<lock::Locked<lock::process_mutex::LocalLock>>,
    lock_setnx: Arc<lock::Locked<lock::setnx::SetnxLock>>,
    lock_ttl: Arc<lock::Locked<lock::ttl::TtlLock>>,
    lock_token: Arc<lock::Locked<lock::token::TokenLock>>,
    lock_watchdog: Arc<lock::Locked<lock::library_lock::WatchdogLock>>,
    lock_fenced: Arc<lock::Locked<lock::library_lock::WatchdogLock>>,
    lock_redlock: Arc<lock::Locked<lock::library_redlock::RedlockLock>>,
    queue: Arc<queue::Queue>,
}

/// Connections and settings the strategies are built from.
#[derive(Clone)]
pub struct Deps {
    pub db: PgPool,
    pub redis: RedisHandle,
    pub amqp: AmqpHandle,
    pub config: Arc<Config>,
}

impl Strategies {
    /// Errors: an invalid lock configuration (`REDLOCK_URLS`), or an invalid
    /// `DATABASE_URL` for the `queue` strategy's request pool.
    pub fn new(deps: &Deps) -> anyhow::Result<Self> {
        let db = deps.db.clone();
        let locks = lock::Shared::new(db.clone(), deps.config.lock_wait());
        let redis = &deps.redis;
        let library = |name| lock::library_lock::WatchdogLock::new(redis, name);
        let redlock = lock::library_redlock::RedlockLock::new(
            &deps.config.redlock_urls,
            &redis.prefix,
            StrategyName::LockRedlock,
        )?;
        Ok(Self {
            naive: Arc::new(naive::Naive::new(db.clone())),
            sql: Arc::new(sql::Sql::new(db.clone())),
            sql_for_update: Arc::new(sql_for_update::SqlForUpdate::new(db)),
            redis_decr: Arc::new(redis_decr::RedisDecr::new(deps)),
            lock_local: locks.locked(StrategyName::LockLocal, lock::process_mutex::LocalLock::default()),
            lock_setnx: locks
                .locked(StrategyName::LockSetnx, lock::setnx::SetnxLock::new(redis.clone())),
            lock_ttl: locks.locked(StrategyName::LockTtl, lock::ttl::TtlLock::new(redis.clone())),
            lock_token: locks
                .locked(StrategyName::LockToken, lock::token::TokenLock::new(redis.clone())),
            lock_watchdog: locks
                .locked(StrategyName::LockWatchdog, library(StrategyName::LockWatchdog)?),
            lock_fenced: locks.fenced(StrategyName::LockFenced, library(StrategyName::LockFenced)?),
            lock_redlock: locks.fenced(StrategyName::LockRedlock, redlock),
            queue: Arc::new(queue::Queue::new(deps)?),
            locks,
        })
    }

    /// State shared by the `lock/*` strategies (sold-out flags, the
    /// critical-section recorder behind `max_concurrency`).
    pub fn locks(&self) -> &lock::Shared {
        &self.locks
    }

    /// Starts the background work of the strategies that have some (the
    /// `redis-decr` reconciler and sold-out listener, the `queue` consumers
    /// and sold-out listener). Call once, from inside the Tokio runtime; the
    /// tasks end with the runtime.
    pub fn start_background(&self) {
        self.redis_decr.start_background();
        self.queue.start_background();
    }

    /// The `queue` strategy, for its routes (request results, queue stats).
    pub fn queue(&self) -> &queue::Queue {
        &self.queue
    }

    /// The strategy that serves sales named `name`.
    pub fn get(&self, name: StrategyName) -> &dyn Strategy {
        match name {
            StrategyName::Naive => self.naive.as_ref(),
            StrategyName::Sql => self.sql.as_ref(),
            StrategyName::SqlForUpdate => self.sql_for_update.as_ref(),
            StrategyName::RedisDecr => self.redis_decr.as_ref(),
            StrategyName::LockLocal => self.lock_local.as_ref(),
            StrategyName::LockSetnx => self.lock_setnx.as_ref(),
            StrategyName::LockTtl => self.lock_ttl.as_ref(),
            StrategyName::LockToken => self.lock_token.as_ref(),
            StrategyName::LockWatchdog => self.lock_watchdog.as_ref(),
            StrategyName::LockFenced => self.lock_fenced.as_ref(),
            StrategyName::LockRedlock => self.lock_redlock.as_ref(),
            StrategyName::Queue => self.queue.as_ref(),
        }
    }
}

/// Whether a strategy is expected to keep the books exact in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expectation {
    /// No oversell, no undersell, no drift, no unexpected 5xx.
    Correct,
    /// A demonstration: the run is expected to show oversell or drift.
    Breaks,
}

/// The expected result of `strategy` under load `profile` on `instances` app
/// processes. The one table of expectations: the load test's verdicts and
/// `docs/strategies.md` both follow it.
///
/// | strategy | any profile, any instance count |
/// |---|---|
/// | `naive` | breaks (lost updates: read-check-write without protection) |
/// | `sql` | correct |
/// | `sql/for-update` | correct |
/// | `redis-decr` | correct (the Postgres guard backs the Redis gate) |
/// | `lock/local` | correct on 1 instance; breaks on more (one mutex per process) |
/// | `lock/setnx` | correct (it breaks only when a holder dies: the sale is stuck, shown by its test) |
/// | `lock/ttl`, `lock/token` | correct in `burst`; break in `slow` (holders stall past the lease) |
/// | `lock/watchdog`, `lock/fenced`, `lock/redlock` | correct (renewed through stalls; fenced against whole-process pauses) |
/// | `queue` | correct (one active consumer per partition settles in Postgres; every accepted request is resolved) |
pub fn expectation(strategy: StrategyName, profile: &str, instances: usize) -> Expectation {
    match strategy {
        StrategyName::Naive => Expectation::Breaks,
        StrategyName::Sql | StrategyName::SqlForUpdate | StrategyName::RedisDecr => {
            Expectation::Correct
        }
        StrategyName::LockLocal if instances > 1 => Expectation::Breaks,
        StrategyName::LockLocal | StrategyName::LockSetnx => Expectation::Correct,
        StrategyName::LockTtl | StrategyName::LockToken if profile == "slow" => Expectation::Breaks,
        StrategyName::LockTtl | StrategyName::LockToken => Expectation::Correct,
        StrategyName::LockWatchdog
        | StrategyName::LockFenced
        | StrategyName::LockRedlock
        | StrategyName::Queue => Expectation::Correct,
    }
}

/// Maps the unique violation on `orders_sale_user_key` to `AlreadyPurchased`,
/// and any other error through `From<sqlx::Error>`.
pub(crate) fn already_purchased_or(err: sqlx::Error) -> Result<Outcome, StrategyError> {
    match &err {
        sqlx::Error::Database(db) if db.constraint() == Some(ORDERS_SALE_USER_KEY) => {
            Ok(Outcome::AlreadyPurchased)
        }
        _ => Err(err.into()),
    }
}

/// Name of the constraint that allows one order per (sale, user).
pub const ORDERS_SALE_USER_KEY: &str = "orders_sale_user_key";
