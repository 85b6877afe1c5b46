//! Measuring how many holders were inside a sale's critical section at once,
//! across every instance: `max_concurrency`, the figure that tells a lock that
//! works (1) from one that does not (> 1).
//!
//! Each critical section is recorded as a wall-clock interval — taken right
//! after the lock was acquired and right before it is released — in memory,
//! and written to `lock_intervals` in batches by a background task, so the
//! measurement adds no round trip to the critical section or to the purchase.
//! The maximum overlap is computed afterwards, in SQL, over the intervals of
//! all instances. Intervals that only touch (one ends at the instant the next
//! starts) do not count as overlapping.
//!
//! The clock is the host's wall clock: instances on one host share it; on
//! several hosts the figure is only as good as their clock sync. The batching
//! means a reader must flush first: [`Intervals::flush`] for this process, and
//! a call of `GET /admin/sales/{id}/lock-stats` on every instance (each call
//! flushes its own instance before it reads).
//!
//! Memory: nothing per sale stays here. Intervals wait in one list until the
//! next flush (at most [`MAX_PENDING`] while Postgres is unreachable) and
//! are then in `lock_intervals` only, pruned there after the retention.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::sale::SaleId;
use crate::strategy::StrategyError;

/// How often the background task writes pending intervals.
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How often the background task deletes intervals past their retention.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Intervals kept in memory while Postgres is unreachable; older ones are
/// dropped beyond this (with a warning), so memory stays bounded.
const MAX_PENDING: usize = 200_000;

/// One critical section.
#[derive(Debug, Clone, Copy)]
struct Interval {
    sale: SaleId,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
}

/// The interval recorder of one process.
pub struct Intervals {
    db: PgPool,
    /// A random id of this process (`lock_intervals.instance`).
    instance: String,
    pending: Mutex<Vec<Interval>>,
    /// Serialises flushes, so two flushes never reorder or double-write a batch.
    flushing: tokio::sync::Mutex<()>,
    /// Intervals that ended longer ago than this are deleted (every instance
    /// prunes every sale's, about once a minute).
    retention: Duration,
}

impl Intervals {
    /// A recorder writing to `db` and deleting what ended more than
    /// `retention` ago (`SECKILL_LOCK_INTERVALS_RETENTION_MS`); starts its
    /// flushing task when called inside a Tokio runtime (the task ends when
    /// the recorder is dropped).
    pub fn new(db: PgPool, retention: Duration) -> Arc<Self> {
        let instance =
            format!("{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let intervals = Arc::new(Self {
            db,
            instance,
            pending: Mutex::default(),
            flushing: tokio::sync::Mutex::new(()),
            retention,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(flush_periodically(Arc::downgrade(&intervals)));
        }
        intervals
    }

    /// Notes that a critical section of `sale` ran from `started_at` to
    /// `ended_at` (raised to `started_at` if the wall clock stepped back).
    /// Never blocks on I/O.
    pub fn record(&self, sale: SaleId, started_at: DateTime<Utc>, ended_at: DateTime<Utc>) {
        let ended_at = ended_at.max(started_at);
        let mut pending = self.pending.lock().expect("pending intervals");
        if pending.len() >= MAX_PENDING {
            tracing::warn!(
                dropped = pending.len(),
                "lock intervals could not be written; dropping"
            );
            pending.clear();
        }
        pending.push(Interval { sale, started_at, ended_at });
    }

    /// Writes every pending interval. When Postgres is unreachable they stay
    /// pending; any other error drops the batch (retrying it could not help).
    pub async fn flush(&self) -> Result<(), StrategyError> {
        let _one_at_a_time = self.flushing.lock().await;
        let batch = std::mem::take(&mut *self.pending.lock().expect("pending intervals"));
        if batch.is_empty() {
            return Ok(());
        }
        let sales: Vec<i64> = batch.iter().map(|i| i.sale.0).collect();
        let started: Vec<DateTime<Utc>> = batch.iter().map(|i| i.started_at).collect();
        let ended: Vec<DateTime<Utc>> = batch.iter().map(|i| i.ended_at).collect();
        let written = sqlx::query(
            "INSERT INTO lock_intervals (sale_id, instance, started_at, ended_at)
             SELECT sale_id, $2, started_at, ended_at
             FROM unnest($1::bigint[], $3::timestamptz[], $4::timestamptz[])
                  AS t (sale_id, started_at, ended_at)",
        )
        .bind(&sales)
        .bind(&self.instance)
        .bind(&started)
        .bind(&ended)
        .execute(&self.db)
        .await;
        match written {
            Ok(_) => Ok(()),
            Err(err) => {
                let err = StrategyError::from(err);
                if matches!(err, StrategyError::Unavailable { .. }) {
                    let mut pending = self.pending.lock().expect("pending intervals");
                    let newer = std::mem::replace(&mut *pending, batch);
                    pending.extend(newer);
                } else {
                    tracing::warn!(dropped = batch.len(), error = %err, "lock intervals refused");
                }
                Err(err)
            }
        }
    }

    /// Deletes the intervals of every sale that ended more than the
    /// retention ago; answers how many. Errors are Postgres errors.
    pub async fn prune(&self) -> Result<u64, StrategyError> {
        let deleted = sqlx::query(
            "DELETE FROM lock_intervals WHERE ended_at < now() - make_interval(secs => $1)",
        )
        .bind(self.retention.as_secs_f64())
        .execute(&self.db)
        .await?;
        Ok(deleted.rows_affected())
    }
}

async fn flush_periodically(intervals: Weak<Intervals>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pruned_at = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let Some(intervals) = intervals.upgrade() else { return };
        if let Err(err) = intervals.flush().await {
            tracing::warn!(error = %err, "writing lock intervals failed; will retry");
        }
        if pruned_at.elapsed() >= PRUNE_EVERY {
            pruned_at = tokio::time::Instant::now();
            if let Err(err) = intervals.prune().await {
                tracing::warn!(error = %err, "deleting old lock intervals failed; will retry");
            }
        }
    }
}

/// The lock figures of one sale, over every instance's flushed intervals.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    serde::Deserialize,
    sqlx::FromRow,
    utoipa::ToSchema,
)]
pub struct LockStats {
    /// The most critical sections of this sale that overlapped in time: 1 for
    /// a lock that excludes, more when holders ran side by side, 0 when none
    /// was recorded.
    pub max_concurrency: i64,
    /// Critical sections recorded.
    pub critical_sections: i64,
}

/// Sweeps the sale's interval endpoints in time order (+1 at a start, −1 at an
/// end, ends first on ties) and returns the highest running sum.
const MAX_OVERLAP: &str = "\
WITH edges AS (
    SELECT started_at AS at, 1 AS delta FROM lock_intervals WHERE sale_id = $1
    UNION ALL
    SELECT ended_at, -1 FROM lock_intervals WHERE sale_id = $1
), running AS (
    SELECT delta, sum(delta) OVER (ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS inside
    FROM edges
)
SELECT coalesce(max(inside), 0)::bigint AS max_concurrency,
       count(*) FILTER (WHERE delta = 1) AS critical_sections
FROM running";

/// The [`LockStats`] of `sale` from what has been flushed so far.
pub async fn lock_stats(db: &PgPool, sale: SaleId) -> Result<LockStats, sqlx::Error> {
    sqlx::query_as::<_, LockStats>(MAX_OVERLAP).bind(sale.0).fetch_one(db).await
}
