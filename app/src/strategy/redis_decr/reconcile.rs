//! Reconciliation: compare a sale's Redis state with Postgres and heal drift.
//!
//! The purchase path keeps the books exact by itself; reconciliation is for
//! what it cannot finish — a process that died between the decrement and the
//! order, a compensation that could not reach Redis, a counter rebuilt while
//! an old purchase was still committing. One pass over a sale:
//!
//! 1. takes a Redis snapshot (`inspect.lua`: counter, sequence number, server
//!    clock, open reservations), then one Postgres statement (the sale's
//!    `remaining_stock`, and which of the reservations' buyers have an order);
//! 2. sorts the open reservations: *committed* (the buyer has an order: the
//!    reservation is confirmed, i.e. dropped, which is bookkeeping, not a
//!    fix), *in flight* (no order, younger than the grace period: left alone),
//!    *abandoned* (no order, older than the grace period: its units are
//!    returned with the idempotent compensation script);
//! 3. computes `drift = counter + units of uncommitted reservations −
//!    remaining_stock`. It is measured consistently: anything that commits
//!    between the two reads is a reservation of the snapshot and is seen as
//!    committed by the Postgres read. The one thing that would fool it — a
//!    reservation opened after the snapshot — bumps the sequence number, and
//!    the correction (`correct.lua`) is applied only if the sequence is
//!    unchanged. Otherwise — demand kept reservations landing — the pass
//!    closes the sale's correction gate (`gate_close.lua`: reservations are
//!    refused for a few milliseconds), measures again and corrects with the
//!    sequence standing still, then opens the gate: a drift is corrected
//!    within one pass however busy the sale is;
//! 4. retires a sale that ended or sold out with its books settled (no
//!    drift, no reservation left): its keys expire after
//!    `SECKILL_REDIS_DECR_KEY_TTL_MS` (`retire.lua`) and it leaves the index of
//!    sales the background passes visit.
//!
//! Each fix is logged, counted in `seckill_reconcile_fixes_total{kind}` and
//! added to `sales.reconcile_fixes`. Passes are safe to run concurrently
//! (the admin route runs one whenever asked): returns are idempotent and
//! corrections are compare-and-set. The background passes
//! ([`ScheduledPasses`]) run once per period across the instances, under the
//! lock library's scheduler, so that N instances do not make N passes; a
//! pass that crashed or lost its lock is simply run again.
//!
//! Not closed here: a purchase whose Postgres transaction takes longer than
//! the grace period has its unit returned while it commits. The counter then
//! stands above the truth — the Postgres guard still refuses the surplus, and
//! the next pass corrects it — which is why the grace period must exceed the
//! longest purchase.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::counter;
use redis_lock::{
    JobRun, LockClient, LockError, LockName, MIN_WATCHDOG_LEASE, PeriodicJob, RedisConnection,
    RunOutcome, Scheduler, SystemClock,
};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::RedisDecr;
use super::counter::{Buyer, ReservationId, SaleCounter, Snapshot, sales_index_key};
use crate::backends::{RedisHandle, redis_error};
use crate::sale::SaleId;
use crate::strategy::{Reconciliation, StrategyError};

/// A Redis snapshot and the Postgres figures read right after it.
pub(super) struct Measurement {
    pub snapshot: Snapshot,
    /// `sales.remaining_stock`.
    pub remaining: i64,
    /// `sales.created_at`, microseconds since the Unix epoch.
    pub origin: i64,
    /// Buyers of open reservations who have a live order.
    ordered: HashSet<i64>,
    /// Orders of the returns in progress that Postgres shows ended
    /// (`cancelled`, `expired`): their units are in `remaining`, not yet in
    /// the counter.
    ended_orders: HashSet<i64>,
    /// The sale's `ends_at` has passed: no purchase reaches it any more.
    ended: bool,
}

impl Measurement {
    /// False when the Redis keys were warmed for another database's sale of
    /// the same id (see `super::origin`): nothing here may be changed.
    pub fn same_sale(&self) -> bool {
        self.snapshot.origin.is_none_or(|origin| origin == self.origin)
    }

    fn committed(&self, user: i64) -> bool {
        self.ordered.contains(&user)
    }

    /// Whether Postgres committed the end of the order of a return in
    /// progress.
    fn return_committed(&self, order: i64) -> bool {
        self.ended_orders.contains(&order)
    }

    /// `counter + Σ qty(uncommitted reservations) + Σ qty(returns Postgres
    /// committed and Redis has not) − remaining`; `None` without a counter.
    pub fn drift(&self) -> Option<i64> {
        let uncommitted: i64 = self
            .snapshot
            .reservations
            .iter()
            .filter(|r| !self.committed(r.user))
            .map(|r| r.quantity)
            .sum();
        let returning: i64 = self
            .snapshot
            .returns
            .iter()
            .filter(|r| self.return_committed(r.order))
            .map(|r| r.quantity)
            .sum();
        Some(self.snapshot.counter? + uncommitted + returning - self.remaining)
    }
}

/// `$1` sale id, `$2` buyers of open reservations, `$3` orders of returns
/// in progress. One statement, so the stock and the orders come from one
/// snapshot.
const POSTGRES_SIDE: &str = "\
SELECT s.remaining_stock, s.created_at,
       coalesce((SELECT array_agg(o.user_id) FROM orders o
                 WHERE o.sale_id = s.id AND o.user_id = ANY($2)
                   AND o.status IN ('pending_payment', 'paid')), '{}') AS ordered,
       coalesce((SELECT array_agg(o.id) FROM orders o
                 WHERE o.id = ANY($3) AND o.status IN ('cancelled', 'expired')), '{}')
         AS ended_orders,
       coalesce(s.ends_at <= now(), false) AS ended
FROM sales s
WHERE s.id = $1 AND s.strategy = 'redis-decr'";

/// What [`POSTGRES_SIDE`] reads: `remaining_stock`, `created_at`, the
/// buyers with a live order, the ended orders, whether the sale ended.
type PostgresSide = (i64, DateTime<Utc>, Vec<i64>, Vec<i64>, bool);

/// Measures sale `sale`. `Ok(None)` when Postgres has no `redis-decr` sale
/// with that id, or when the Redis keys belong to another database's sale
/// (an index entry or keys written by instances on another database).
pub(super) async fn measure(
    db: &PgPool,
    conn: &mut RedisConnection,
    counter: &SaleCounter,
    sale: SaleId,
) -> Result<Option<Measurement>, StrategyError> {
    let snapshot = counter.snapshot(conn).await.map_err(redis_error)?;
    #[cfg(feature = "failpoints")]
    crate::failpoints::reached::<()>(&crate::failpoints::REDIS_DECR_AFTER_SNAPSHOT, sale.0).await;
    let buyers: Vec<i64> = snapshot.reservations.iter().map(|r| r.user).collect();
    let returning: Vec<i64> = snapshot.returns.iter().map(|r| r.order).collect();
    let row: Option<PostgresSide> = sqlx::query_as(POSTGRES_SIDE)
        .bind(sale.0)
        .bind(&buyers)
        .bind(&returning)
        .fetch_optional(db)
        .await?;
    let measurement =
        row.map(|(remaining, created_at, ordered, ended_orders, ended)| Measurement {
            snapshot,
            remaining,
            origin: created_at.timestamp_micros(),
            ordered: ordered.into_iter().collect(),
            ended_orders: ended_orders.into_iter().collect(),
            ended,
        });
    match measurement {
        Some(measurement) if !measurement.same_sale() => {
            tracing::warn!(
                sale_id = sale.0,
                "Redis keys of this sale were warmed for another database's sale; left alone \
                 (give each database its own SECKILL_REDIS_PREFIX)"
            );
            Ok(None)
        }
        other => Ok(other),
    }
}

/// Whether a sale's keys may be retired after a pass: it ended or sold out,
/// every reservation of the snapshot was committed (`quiet`), and the pass
/// measured no drift (a corrected counter waits for a pass that finds none).
fn retirable(ended: bool, remaining: i64, quiet: bool, drift: i64) -> bool {
    (ended || remaining == 0) && quiet && drift == 0
}

impl RedisDecr {
    /// The audit's `redis_drift`, without changing anything. Measures again
    /// (up to 5 times) while reservations keep landing between the two
    /// reads, so that a quiet sale always gets an exact figure.
    pub(super) async fn measure_drift(&self, sale: SaleId) -> Result<Option<i64>, StrategyError> {
        let mut conn = self.redis.conn().await?;
        let counter = SaleCounter::new(&self.redis, sale);
        let mut drift = None;
        for _ in 0..5 {
            let Some(measurement) = measure(&self.db, &mut conn, &counter, sale).await? else {
                return Ok(None);
            };
            drift = measurement.drift();
            let seq: Option<i64> = redis::cmd("GET")
                .arg(&counter.seq_key)
                .query_async(&mut conn)
                .await
                .map_err(redis_error)?;
            if seq.unwrap_or(0) == measurement.snapshot.seq {
                break;
            }
        }
        Ok(drift)
    }

    /// One reconciliation pass over `sale` (see the module documentation).
    pub(super) async fn reconcile_sale(
        &self,
        sale: SaleId,
    ) -> Result<Reconciliation, StrategyError> {
        let mut report = Reconciliation::nothing_to_reconcile(sale);
        let mut conn = self.redis.conn().await?;
        let counter = SaleCounter::new(&self.redis, sale);
        let Some(measurement) = measure(&self.db, &mut conn, &counter, sale).await? else {
            return Ok(report);
        };
        let Some(drift) = measurement.drift() else {
            // No counter (never warmed here, or lost with a Redis restart):
            // warming it from Postgres is the whole repair, and not a fix.
            self.warm(&mut conn, &counter, sale, measurement.origin, Some(measurement.remaining))
                .await?;
            return Ok(report);
        };
        report.redis_drift = Some(drift);

        let snapshot = &measurement.snapshot;
        let committed: Vec<&ReservationId> = snapshot
            .reservations
            .iter()
            .filter(|r| measurement.committed(r.user))
            .map(|r| &r.id)
            .collect();
        counter.confirm(&mut conn, &committed).await.map_err(redis_error)?;

        for reservation in snapshot.reservations.iter().filter(|r| !measurement.committed(r.user)) {
            let age_ms = snapshot.now_ms - reservation.created_ms;
            if age_ms < self.grace_ms {
                report.in_flight_reservations += 1;
                continue;
            }
            let returned = counter
                .compensate(&mut conn, &reservation.id, Buyer::Release)
                .await
                .map_err(redis_error)?;
            if returned > 0 {
                tracing::warn!(
                    sale_id = sale.0,
                    reservation = reservation.id.as_str(),
                    user_id = reservation.user,
                    units = returned,
                    age_ms,
                    "reconciliation returned an abandoned reservation (no order after the grace period)"
                );
                report.returned_units += returned;
            }
        }

        self.finish_returns(&mut conn, &counter, &measurement, &mut report).await?;

        if drift != 0 {
            self.correct_drift(&mut conn, &counter, &measurement, drift, &mut report).await?;
        }
        let quiet = snapshot.reservations.len() == committed.len() && snapshot.returns.is_empty();
        if retirable(measurement.ended, measurement.remaining, quiet, drift) {
            self.retire(&mut conn, &counter, sale, snapshot.seq).await?;
        }

        self.record_fixes(&report).await?;
        Ok(report)
    }

    /// Finishes the returns of ended orders that their instance did not
    /// (it died, or lost Redis, between the Postgres commit and
    /// `return_complete.lua`): bookkeeping, not a fix — the measured drift
    /// already counts their units. Drops a return whose order Postgres still
    /// shows live after the grace period (its transaction rolled back); if
    /// that transaction commits after all, the counter stands below the
    /// truth and a later pass corrects it.
    async fn finish_returns(
        &self,
        conn: &mut RedisConnection,
        counter: &SaleCounter,
        measurement: &Measurement,
        report: &mut Reconciliation,
    ) -> Result<(), StrategyError> {
        let snapshot = &measurement.snapshot;
        for pending in &snapshot.returns {
            if measurement.return_committed(pending.order) {
                let units =
                    counter.complete_return(conn, pending.order).await.map_err(redis_error)?;
                if units > 0 {
                    tracing::info!(
                        sale_id = report.sale_id.0,
                        order_id = pending.order,
                        units,
                        "reconciliation finished the return of an ended order"
                    );
                }
            } else if snapshot.now_ms - pending.created_ms >= self.grace_ms {
                counter.abort_return(conn, pending.order).await.map_err(redis_error)?;
            } else {
                report.in_flight_reservations += 1;
            }
        }
        Ok(())
    }

    /// Moves the counter by `-drift` towards Postgres: at the measured
    /// sequence, else behind the sale's gate, else deferred to a later pass;
    /// what happened goes into `report`.
    async fn correct_drift(
        &self,
        conn: &mut RedisConnection,
        counter: &SaleCounter,
        measurement: &Measurement,
        drift: i64,
        report: &mut Reconciliation,
    ) -> Result<(), StrategyError> {
        let sale = report.sale_id;
        let seq = measurement.snapshot.seq;
        match counter.correct(conn, seq, -drift).await.map_err(redis_error)? {
            Some(change) => report.corrected_units = change.abs(),
            None => match self.correct_behind_gate(conn, counter, sale).await? {
                Some(change) => report.corrected_units = change.abs(),
                None => report.correction_deferred = true,
            },
        }
        if report.corrected_units > 0 {
            tracing::warn!(
                sale_id = sale.0,
                drift,
                change = report.corrected_units,
                remaining_stock = measurement.remaining,
                "reconciliation corrected the Redis counter to Postgres truth"
            );
        } else if report.correction_deferred {
            tracing::info!(sale_id = sale.0, drift, "counter correction deferred");
        }
        Ok(())
    }

    /// The correction of a sale whose sequence keeps moving: closes its
    /// gate (at most [`GATE_HOLD`]), measures again, corrects with the
    /// sequence standing still, opens the gate. Returns the change applied
    /// (`Some(0)` when the drift was gone by then), or `None` when another
    /// reconciler holds the gate or the sequence moved anyway (a restock, a
    /// warm-up).
    async fn correct_behind_gate(
        &self,
        conn: &mut RedisConnection,
        counter: &SaleCounter,
        sale: SaleId,
    ) -> Result<Option<i64>, StrategyError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        if !counter.close_gate(conn, &token, GATE_HOLD).await.map_err(redis_error)? {
            return Ok(None);
        }
        let corrected = async {
            let Some(measurement) = measure(&self.db, conn, counter, sale).await? else {
                return Ok(None);
            };
            match measurement.drift() {
                None | Some(0) => Ok(Some(0)),
                Some(drift) => counter
                    .correct(conn, measurement.snapshot.seq, -drift)
                    .await
                    .map_err(redis_error),
            }
        }
        .await;
        // Opened even when the correction failed; otherwise it opens by
        // itself after GATE_HOLD.
        let opened = counter.open_gate(conn, &token).await.map_err(redis_error);
        let corrected = corrected?;
        opened?;
        Ok(corrected)
    }

    /// Lets the keys of a sale that ended or sold out, books settled at
    /// sequence `seq`, expire after `SECKILL_REDIS_DECR_KEY_TTL_MS`, and takes it
    /// off the index the background passes visit (unless the sale moved on
    /// since `seq`).
    async fn retire(
        &self,
        conn: &mut RedisConnection,
        counter: &SaleCounter,
        sale: SaleId,
        seq: i64,
    ) -> Result<(), StrategyError> {
        let ttl = Duration::from_millis(self.key_ttl_ms);
        if !counter.retire(conn, seq, ttl).await.map_err(redis_error)? {
            return Ok(());
        }
        redis::cmd("SREM")
            .arg(sales_index_key(&self.redis))
            .arg(sale.0)
            .query_async::<i64>(conn)
            .await
            .map_err(redis_error)?;
        tracing::info!(sale_id = sale.0, ttl_ms = self.key_ttl_ms, "sale retired: its keys expire");
        Ok(())
    }

    /// Counts the fixes of a pass in `/metrics` and in `sales.reconcile_fixes`.
    async fn record_fixes(&self, report: &Reconciliation) -> Result<(), StrategyError> {
        if report.fixes() == 0 {
            return Ok(());
        }
        let returned = u64::try_from(report.returned_units).unwrap_or(0);
        let corrected = u64::try_from(report.corrected_units).unwrap_or(0);
        counter!(
            crate::metric_names::RECONCILE_FIXES_TOTAL,
            "strategy" => "redis-decr",
            "kind" => "returned"
        )
        .increment(returned);
        counter!(
            crate::metric_names::RECONCILE_FIXES_TOTAL,
            "strategy" => "redis-decr",
            "kind" => "corrected"
        )
        .increment(corrected);
        sqlx::query(
            "UPDATE sales SET reconcile_fixes = coalesce(reconcile_fixes, 0) + $2 WHERE id = $1",
        )
        .bind(report.sale_id.0)
        .bind(report.fixes())
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// One pass over every sale in this prefix's index; the number visited
    /// is `seckill_reconcile_sales_visited{instance}`.
    async fn reconcile_all(&self) -> Result<(), StrategyError> {
        let mut conn = self.redis.conn().await?;
        let sales: Vec<i64> = redis::cmd("SMEMBERS")
            .arg(sales_index_key(&self.redis))
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        metrics::gauge!(crate::metric_names::RECONCILE_SALES_VISITED, "instance" => self.instance.clone())
            .set(sales.len() as f64);
        for sale in sales {
            if let Err(err) = self.reconcile_sale(SaleId(sale)).await {
                tracing::warn!(sale_id = sale, error = %err, "reconciliation pass failed");
            }
        }
        Ok(())
    }
}

/// Longest a correction keeps a sale's gate closed (reservations refused):
/// one measurement and one script take a few milliseconds; the expiry only
/// matters when the reconciler dies with the gate closed.
const GATE_HOLD: Duration = Duration::from_millis(500);

/// The `job` label of the background reconciler's runs.
pub const JOB: &str = "redis-decr-reconcile";

/// The background reconciler: [`RedisDecr::reconcile_all`] once per
/// interval across every instance that shares the Redis prefix, under the
/// lock library's [`Scheduler`] (lock `PREFIX:{job:redis-decr-reconcile}`,
/// its last period done beside it). Each completed run is counted in
/// `seckill_scheduled_job_runs_total{job, instance}`.
pub(super) struct ScheduledPasses {
    scheduler: Scheduler,
    job: PeriodicJob,
    instance: String,
}

impl ScheduledPasses {
    /// One pass per `interval`, with a lease of the interval (at least the
    /// library's watchdog minimum, at most 10 s), renewed while a pass runs.
    pub(super) fn new(
        redis: &RedisHandle,
        interval: Duration,
        instance: &str,
    ) -> Result<Self, LockError> {
        let name = LockName::new(format!("{}:{{job:{JOB}}}", redis.prefix))?;
        let lease = interval.clamp(MIN_WATCHDOG_LEASE, Duration::from_secs(10));
        let job = PeriodicJob::new(name, interval, lease)?;
        let scheduler =
            Scheduler::new(&LockClient::new(redis.client().clone()), Arc::new(SystemClock));
        Ok(Self { scheduler, job, instance: instance.to_owned() })
    }

    /// Runs the passes until the strategy is dropped. A pass that fails
    /// (Redis or Postgres down) is logged and its period tried again; a pass
    /// cut off by a lost lock leaves its period to another instance.
    pub(super) async fn run(self, strategy: Weak<RedisDecr>) {
        let runs = counter!(
            crate::metric_names::SCHEDULED_JOB_RUNS_TOTAL,
            "job" => JOB,
            "instance" => self.instance.clone()
        );
        runs.increment(0);
        let stop = CancellationToken::new();
        let pass = |_: JobRun| {
            let (strategy, stop) = (strategy.clone(), stop.clone());
            async move {
                let Some(strategy) = strategy.upgrade() else {
                    stop.cancel();
                    return Ok(());
                };
                strategy.reconcile_all().await
            }
        };
        let report = |outcome: &Result<RunOutcome<StrategyError>, LockError>| match outcome {
            Ok(RunOutcome::Ran { .. }) => runs.increment(1),
            Ok(RunOutcome::Failed { error, .. }) => {
                tracing::warn!(error = %error, "background reconciliation failed");
            }
            Ok(RunOutcome::Lost { reason, .. }) => {
                tracing::warn!(%reason, "background reconciliation cut off: its lock was lost");
            }
            Ok(RunOutcome::AlreadyDone { .. } | RunOutcome::Busy { .. }) => {}
            Err(err) => tracing::warn!(error = %err, "background reconciliation not scheduled"),
        };
        self.scheduler.run_every(&self.job, stop.clone(), pass, report).await;
    }
}

#[cfg(test)]
mod retire_tests {
    use super::retirable;

    #[test]
    fn only_a_finished_quiet_sale_without_drift_is_retired() {
        assert!(retirable(true, 3, true, 0), "ended");
        assert!(retirable(false, 0, true, 0), "sold out");
        assert!(!retirable(false, 3, true, 0), "still selling");
        assert!(!retirable(true, 0, false, 0), "a reservation still open");
        assert!(!retirable(true, 0, true, 1), "drift measured this pass");
    }
}
