//! `redis-decr`: a Redis counter gates the buyers, Postgres writes the orders,
//! and every unit taken in Redis ends as an order or comes back.
//!
//! One purchase:
//! 1. If this instance has flagged the sale sold out, answer so at once — no
//!    Redis, no Postgres ([`sold_out_pubsub`]).
//! 2. `reserve.lua`: de-duplicate the buyer and `DECRBY qty` in one atomic
//!    step, recording a reservation under a random id. "Sold out" and
//!    "already purchased" are answered here, which is what keeps the hot row
//!    out of the request path for nearly every rejected buyer.
//! 3. The `sql` strategy's transaction (guarded `UPDATE` + order `INSERT`):
//!    Postgres stays the source of truth and its guard the last fence, so a
//!    counter above the truth can never oversell.
//! 4. Order placed → confirm (drop the reservation). Anything else —
//!    sold out or duplicate per Postgres, a connection error, a timeout —
//!    → `compensate.lua` returns the units exactly once.
//!
//! Steps 2–4 run in one task of their own, spawned before the reserve script
//! is sent, which the request awaits: a client that hangs up (a dropped
//! request future, a request timeout) cancels nothing of it, so a
//! reservation always ends confirmed or compensated. What the purchase
//! path cannot finish (the process dies, Redis is unreachable for the
//! compensation) is left as an open reservation, which the reconciler
//! ([`reconcile`]) returns after a grace period. The counter is warmed from
//! Postgres when a sale is created and, lazily, whenever Redis has none (a new
//! instance, a Redis restart); warming never overwrites an existing counter.
//!
//! Invariant: `counter + Σ qty(reservations without an order) =
//! sales.remaining_stock`, restored by reconciliation after any fault; the
//! audit reports the difference as `redis_drift`. This strategy never
//! oversells (Postgres refuses), and undersells only until reconciliation
//! returns what a crash left behind. docs/redis-decr.md tells the failure
//! cases one by one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis_lock::RedisConnection;
use sqlx::PgPool;

use super::sql::Sql;
use super::{
    Backend, Claim, Deps, Outcome, Reconciliation, Registration, Returned, Strategy, StrategyError,
    StrategyName,
};
use crate::backends::{RedisHandle, count_redis_round_trips, redis_error};
use crate::bounds::MAX_MS;
use crate::sale::{Quantity, Sale, SaleId, UserId};
use crate::unit_return::PendingOrder;

pub mod counter;
mod reconcile;
mod sold_out_pubsub;

use counter::{Buyer, ReservationId, Reserve, SaleCounter, sales_index_key};
use sold_out_pubsub::SoldOutFlags;

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("redis-decr");

/// `redis-decr` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "a Redis DECRBY gate (Lua, per-user de-duplication), then the sql transaction; \
            compensation and reconciliation",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| Ok(Arc::new(RedisDecr::new(deps, &deps.settings.redis_decr))),
    // Expected correct everywhere (the default): the Redis gate only
    // filters; the `sql` statement behind it still guards Postgres, and
    // every failure after the decrement is compensated. A reservation whose
    // instance died before its order is returned by the reconciler after
    // its grace, and a counter a restarted Redis lost is warmed again from
    // Postgres: exact once settled.
    ..Registration::DEFAULTS
};

/// Settings of the `redis-decr` strategy (`SECKILL_REDIS_DECR_*`), its part
/// of `crate::strategy::StrategySettings`.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Strategy redis-decr")]
#[group(id = "redis-decr")]
pub struct Settings {
    /// The period of the background reconciliation, in
    /// milliseconds: one pass over the sales this Redis prefix holds per
    /// period, run by one instance of those sharing the prefix; 0 turns the
    /// background job off (`POST /admin/sales/{id}/reconcile` still works).
    #[arg(
        id = "REDIS_DECR_RECONCILE_INTERVAL_MS",
        long = "redis-decr-reconcile-interval-ms",
        env = "SECKILL_REDIS_DECR_RECONCILE_INTERVAL_MS",
        default_value_t = 5000,
        value_parser = clap::value_parser!(u64).range(0..=MAX_MS)
    )]
    pub reconcile_interval_ms: u64,

    /// Age in milliseconds after which a reservation without an
    /// order counts as abandoned and is returned. Must exceed the longest
    /// purchase (pool wait `SECKILL_DB_ACQUIRE_TIMEOUT_MS` plus the
    /// transaction), or a slow purchase's unit is returned while it commits.
    #[arg(
        id = "REDIS_DECR_RECONCILE_GRACE_MS",
        long = "redis-decr-reconcile-grace-ms",
        env = "SECKILL_REDIS_DECR_RECONCILE_GRACE_MS",
        default_value_t = 15000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub reconcile_grace_ms: u64,

    /// Milliseconds the Redis keys of a sale are kept once the
    /// reconciler found it ended or sold out with its books settled; it then
    /// stops visiting the sale. A restock or a purchase that warms the
    /// counter again keeps the keys. Default: 1 hour.
    #[arg(
        id = "REDIS_DECR_KEY_TTL_MS",
        long = "redis-decr-key-ttl-ms",
        env = "SECKILL_REDIS_DECR_KEY_TTL_MS",
        default_value_t = 3_600_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub key_ttl_ms: u64,
}

/// The `redis-decr` strategy; one per process, built from the shared pool,
/// Redis handle and configuration.
pub struct RedisDecr {
    /// What a purchase's task needs (shared with it).
    core: Arc<Core>,
    /// Reservations younger than this (milliseconds) are never returned.
    grace_ms: i64,
    /// How long the keys of a sale that ended or sold out (books settled)
    /// are kept, milliseconds.
    key_ttl_ms: u64,
    /// Background reconciliation period; zero: no background job.
    interval: Duration,
    /// The `instance` label of the reconciler's metrics.
    instance: String,
}

/// The part of the strategy a purchase runs with, in a task of its own.
pub struct Core {
    db: PgPool,
    /// The Postgres half of a purchase: exactly the `sql` strategy.
    sql: Arc<Sql>,
    redis: RedisHandle,
    flags: Arc<SoldOutFlags>,
    /// The service's failpoints (`redis-decr-after-reserve`).
    #[cfg(feature = "failpoints")]
    failpoints: crate::failpoints::Failpoints,
}

impl std::ops::Deref for RedisDecr {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl RedisDecr {
    /// The strategy of one process, with `settings` (its part of the
    /// strategies' settings) over the connections of `deps`.
    pub fn new(deps: &Deps, settings: &Settings) -> Self {
        let core = Core {
            db: deps.db.clone(),
            sql: Arc::new(Sql::new(deps.db.clone(), NAME)),
            redis: deps.redis.clone(),
            flags: Arc::new(SoldOutFlags::new(deps.settings.sold_out_flag_ttl())),
            #[cfg(feature = "failpoints")]
            failpoints: deps.failpoints.clone(),
        };
        Self {
            core: Arc::new(core),
            grace_ms: i64::try_from(settings.reconcile_grace_ms).unwrap_or(i64::MAX),
            key_ttl_ms: settings.key_ttl_ms,
            interval: Duration::from_millis(settings.reconcile_interval_ms),
            instance: deps.instance.clone(),
        }
    }
}

impl Core {
    /// Sets the sale's counter from Postgres unless Redis has one, and lists
    /// the sale for the background reconciler. `origin`: see [`origin`];
    /// `remaining`: the sale's `remaining_stock` if just read, else it is read
    /// here. Returns the number of Redis round trips made.
    async fn warm(
        &self,
        conn: &mut RedisConnection,
        counter: &SaleCounter,
        sale: SaleId,
        origin: i64,
        remaining: Option<i64>,
    ) -> Result<u64, StrategyError> {
        let remaining = match remaining {
            Some(remaining) => remaining,
            None => {
                sqlx::query_scalar("SELECT remaining_stock FROM sales WHERE id = $1")
                    .bind(sale.0)
                    .fetch_one(&self.db)
                    .await?
            }
        };
        let (created, units) = counter.warm(conn, remaining, origin).await.map_err(redis_error)?;
        if !created {
            return Ok(1);
        }
        redis::cmd("SADD")
            .arg(sales_index_key(&self.redis))
            .arg(sale.0)
            .query_async::<i64>(conn)
            .await
            .map_err(redis_error)?;
        tracing::info!(sale_id = sale.0, counter = units, "Redis counter warmed from Postgres");
        Ok(2)
    }

    /// Step 2 of a purchase, warming the counter first if Redis has none.
    /// Returns the answer and the Redis round trips made.
    async fn reserve(
        &self,
        conn: &mut RedisConnection,
        counter: &SaleCounter,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> (Result<Reserve, StrategyError>, u64) {
        let id = ReservationId::random();
        let mut trips = 1;
        let mut answer = counter.reserve(conn, user, quantity, id.clone()).await;
        if let Ok(Reserve::NotWarmed) = answer {
            match self.warm(conn, counter, sale.id, origin(sale), None).await {
                Ok(n) => trips += n,
                Err(err) => return (Err(err), trips),
            }
            trips += 1;
            answer = counter.reserve(conn, user, quantity, id.clone()).await;
        }
        match answer {
            Ok(answer) => (Ok(answer), trips),
            Err(err) => {
                // The outcome is unknown: the script may have run before the
                // connection failed. The compensation is idempotent and keyed
                // by this reservation's id, so trying it costs nothing when
                // there is nothing to return; if it cannot reach Redis either,
                // the reconciler returns the units after the grace period.
                trips += 1;
                if let Ok(units @ 1..) = counter.compensate(conn, &id, Buyer::Release).await {
                    tracing::warn!(
                        sale_id = sale.id.0,
                        units,
                        "returned a reservation of unknown outcome"
                    );
                }
                (Err(redis_error(err)), trips)
            }
        }
    }
    /// Steps 2–4 of a purchase (the module documentation), in the task that
    /// [`Strategy::purchase`] spawned.
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let generation = self.flags.generation();
        let mut conn = self.redis.conn().await?;
        let counter = SaleCounter::new(&self.redis, sale.id);
        let (answer, trips) = self.reserve(&mut conn, &counter, sale, user, quantity).await;
        count_redis_round_trips(NAME.as_str(), trips);
        let reservation = match answer? {
            Reserve::Reserved { id, .. } => id,
            Reserve::SoldOut { left } => {
                if left == 0 {
                    self.flags.set(sale.id, generation);
                }
                return Ok(Outcome::SoldOut);
            }
            Reserve::AlreadyHeld => return Ok(Outcome::AlreadyPurchased),
            Reserve::Gated => {
                return Err(StrategyError::Busy {
                    reason: "the sale's counter is being corrected; retry",
                    retry_after: Duration::from_secs(1),
                });
            }
            Reserve::NotWarmed => {
                // Warmed a moment ago and gone again: Redis restarted under us.
                return Err(StrategyError::Unavailable {
                    backend: Backend::Redis,
                    source: anyhow::anyhow!("the sale's counter vanished right after warming"),
                });
            }
        };
        // `exit` ends the process in `fire`, the reservation left open.
        #[cfg(feature = "failpoints")]
        let fails = self.failpoints.fire(&crate::failpoints::REDIS_DECR_AFTER_RESERVE)
            == Some(crate::failpoints::Action::Error);
        #[cfg(not(feature = "failpoints"))]
        let fails = false;
        let pending = Pending {
            sql: self.sql.clone(),
            conn,
            counter,
            sale: sale.clone(),
            user,
            quantity,
            reservation,
            fails,
        };
        let (result, trips) = pending.settle().await;
        count_redis_round_trips(NAME.as_str(), trips);
        result
    }
}

/// Forgets the returns of `orders` begun in Redis whose commit did not come
/// (best effort: a record left behind, the reconciler drops after its grace
/// period).
async fn abort_returns(counter: &SaleCounter, conn: &mut RedisConnection, orders: &[PendingOrder]) {
    for order in orders {
        let _ = counter.abort_return(conn, order.id).await;
    }
}

impl Core {
    /// The return of ended orders' units (see [`Strategy::return_units`]
    /// below): each recorded in Redis, committed in Postgres together, then
    /// each completed in Redis.
    async fn return_units(&self, sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        let orders = claim.orders().to_vec();
        let counter = SaleCounter::new(&self.redis, sale.id);
        let mut conn = self.redis.conn().await?;
        let mut trips = 0;
        for (begun, order) in orders.iter().enumerate() {
            trips += 1;
            let recorded =
                counter.begin_return(&mut conn, order.id, order.user, order.quantity).await;
            if let Err(err) = recorded {
                abort_returns(&counter, &mut conn, &orders[..begun]).await;
                count_redis_round_trips(NAME.as_str(), trips + begun as u64);
                return Err(redis_error(err));
            }
        }
        let committed = super::sql::return_to_sale_row(claim).await;
        let returned = match committed {
            Ok(returned) => returned,
            Err(err) => {
                // Not committed (or of unknown outcome, which the reconciler
                // settles from Postgres after the grace period: an order it
                // finds ended is completed, a live one dropped).
                if !matches!(err, StrategyError::Unavailable { .. }) {
                    abort_returns(&counter, &mut conn, &orders).await;
                    trips += orders.len() as u64;
                }
                count_redis_round_trips(NAME.as_str(), trips);
                return Err(err);
            }
        };
        for order in &orders {
            trips += 1;
            if let Err(err) = counter.complete_return(&mut conn, order.id).await {
                tracing::warn!(
                    sale_id = sale.id.0,
                    order_id = order.id,
                    error = %err,
                    "could not give returned units to the counter; the reconciler will"
                );
            }
        }
        // The reconciler visits the sale again (it may have left the index
        // when it sold out).
        trips += 1;
        let _ = redis::cmd("SADD")
            .arg(sales_index_key(&self.redis))
            .arg(sale.id.0)
            .query_async::<i64>(&mut conn)
            .await;
        count_redis_round_trips(NAME.as_str(), trips);
        self.flags.clear(sale.id);
        Ok(returned)
    }
}

/// What ties a sale's Redis keys to its Postgres row: `created_at` in
/// microseconds since the Unix epoch. Stored by the warm-up; the reconciler
/// leaves alone keys whose origin differs from its own database's sale of the
/// same id (two databases wrongly sharing one `SECKILL_REDIS_PREFIX`).
fn origin(sale: &Sale) -> i64 {
    sale.created_at.timestamp_micros()
}

/// A purchase between its reservation and its order. Owns everything it
/// needs, so that it can finish in its own task.
struct Pending {
    sql: Arc<Sql>,
    conn: RedisConnection,
    counter: SaleCounter,
    sale: Sale,
    user: UserId,
    quantity: Quantity,
    reservation: ReservationId,
    /// The failpoint `redis-decr-after-reserve=error` fired: Postgres is not
    /// asked, and the purchase fails as if it had failed.
    fails: bool,
}

impl Pending {
    /// Steps 3–4 of a purchase: the Postgres transaction, then confirm or
    /// compensate. Returns the answer and the Redis round trips made.
    async fn settle(self) -> (Result<Outcome, StrategyError>, u64) {
        let Pending { sql, mut conn, counter, sale, user, quantity, reservation, fails } = self;
        let result = if fails {
            Err(StrategyError::Unavailable {
                backend: Backend::Postgres,
                source: anyhow::anyhow!("failpoint redis-decr-after-reserve=error"),
            })
        } else {
            sql.purchase(&sale, user, quantity).await
        };
        let buyer = match &result {
            Ok(Outcome::Placed { .. }) => {
                if let Err(err) = counter.confirm(&mut conn, &[&reservation]).await {
                    // The order stands; the reconciler drops the reservation once
                    // it sees the order.
                    tracing::warn!(sale_id = sale.id.0, error = %err, "could not confirm a reservation");
                }
                return (result, 1);
            }
            Ok(Outcome::AlreadyPurchased) => Buyer::Keep,
            Ok(Outcome::SoldOut) => {
                tracing::debug!(
                    sale_id = sale.id.0,
                    "Redis admitted a buyer that Postgres refused: the counter is above the truth"
                );
                Buyer::Release
            }
            Ok(_) | Err(_) => Buyer::Release,
        };
        if let Err(err) = counter.compensate(&mut conn, &reservation, buyer).await {
            tracing::warn!(
                sale_id = sale.id.0,
                reservation = reservation.as_str(),
                error = %err,
                "compensation failed; the reconciler returns the units after the grace period"
            );
        }
        (result, 1)
    }
}

#[async_trait]
impl Strategy for RedisDecr {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        if self.flags.is_set(sale.id) {
            return Ok(Outcome::SoldOut);
        }
        // From here on nothing may be abandoned half-way: once the reserve
        // script is sent, only the task that sent it settles what it took.
        let (core, sale) = (self.core.clone(), sale.clone());
        let task = tokio::spawn(async move { core.purchase(&sale, user, quantity).await });
        task.await.map_err(|err| StrategyError::Internal(err.into()))?
    }

    /// Marks the sale as watched by a reconciler (`reconcile_fixes = 0`) and
    /// warms its counter. If Redis is down, the sale is still created: the
    /// first purchase warms the counter.
    async fn sale_created(&self, sale: &Sale, stock: i64) -> Result<(), StrategyError> {
        sqlx::query(
            "UPDATE sales SET reconcile_fixes = 0 WHERE id = $1 AND reconcile_fixes IS NULL",
        )
        .bind(sale.id.0)
        .execute(&self.db)
        .await?;
        let counter = SaleCounter::new(&self.redis, sale.id);
        let warmed = async {
            let mut conn = self.redis.conn().await?;
            self.warm(&mut conn, &counter, sale.id, origin(sale), Some(stock)).await
        };
        if let Err(err) = warmed.await {
            tracing::warn!(sale_id = sale.id.0, error = %err, "could not warm the counter; the first purchase will");
        }
        Ok(())
    }

    /// Raises the counter by `units` and clears the sold-out flag everywhere.
    /// Postgres has already committed the restock, so a Redis failure is not
    /// an error of the request (retrying it would restock twice): the
    /// reconciler raises the counter to the truth instead.
    async fn restocked(&self, sale: &Sale, units: i64) -> Result<(), StrategyError> {
        let counter = SaleCounter::new(&self.redis, sale.id);
        let raised = async {
            let mut conn = self.redis.conn().await?;
            counter.restock(&mut conn, units).await.map_err(redis_error)?;
            // The reconciler visits the sale again (it may have left the
            // index when it sold out).
            redis::cmd("SADD")
                .arg(sales_index_key(&self.redis))
                .arg(sale.id.0)
                .query_async::<i64>(&mut conn)
                .await
                .map_err(redis_error)
        };
        if let Err(err) = raised.await {
            tracing::warn!(sale_id = sale.id.0, error = %err, "could not raise the counter; reconciliation will");
        }
        self.flags.clear(sale.id);
        Ok(())
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// Postgres first, Redis after, with the return recorded in Redis
    /// before Postgres commits so that the reconciler's drift stays 0 in
    /// between: `return_begin.lua` records the order's units as on their
    /// way back; the claim's transaction puts them on the sale row and ends
    /// the order (as `sql` does); `return_complete.lua` raises the counter,
    /// releases the buyer (who may buy again) and tells every instance to
    /// drop its sold-out flag. An instance that dies between the commit and
    /// the completion leaves the record, which the reconciler completes. In
    /// a task of its own, like a purchase: a caller that goes away cancels
    /// nothing of it.
    async fn return_units(&self, sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        let (core, sale) = (self.core.clone(), sale.clone());
        let task = tokio::spawn(async move { core.return_units(&sale, claim).await });
        task.await.map_err(|err| StrategyError::Internal(err.into()))?
    }

    async fn redis_drift(&self, sale: &Sale) -> Result<Option<i64>, StrategyError> {
        self.measure_drift(sale.id).await
    }

    async fn reconcile(&self, sale: &Sale) -> Result<Reconciliation, StrategyError> {
        let report = self.reconcile_sale(sale.id).await?;
        if report.fixes() > 0 {
            self.flags.clear(sale.id);
        }
        Ok(report)
    }

    /// Spawns the sold-out listener and, unless the interval is zero, the
    /// background reconciler: one pass per interval across the instances
    /// sharing the Redis prefix, under the lock library's scheduler. Both end
    /// when the strategy is dropped.
    fn start_background(self: Arc<Self>) {
        tokio::spawn(sold_out_pubsub::listen(
            self.redis.client().pubsub_clients().to_vec(),
            counter::stock_returned_channel(&self.redis),
            Arc::downgrade(&self.flags),
        ));
        if !self.interval.is_zero() {
            match reconcile::ScheduledPasses::new(&self.redis, self.interval, &self.instance) {
                Ok(passes) => {
                    tokio::spawn(passes.run(Arc::downgrade(&self)));
                }
                Err(err) => tracing::error!(error = %err, "background reconciliation not started"),
            }
        }
    }
}
