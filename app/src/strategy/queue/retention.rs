//! Retention of request rows: `purchase_requests` keeps one row per buyer and
//! sale, which would grow with every sale ever run. A periodic job on every
//! instance deletes the resolved requests accepted more than
//! `SECKILL_QUEUE_RETENTION_MS` ago, in slices of [`SLICE`] rows, oldest
//! first (the block-range index on `accepted_at` finds them).
//!
//! A `pending` request is never deleted: its row is the index over a message
//! still in a queue. A buyer who comes back after their request was deleted
//! is registered anew and answered from the orders (`already_purchased`);
//! the orders themselves are kept. Instances running the job at once delete
//! disjoint or already-deleted rows, which costs a statement, nothing else.

use std::sync::Weak;
use std::time::Duration;

use sqlx::PgPool;

use super::Queue;

/// Most rows one statement deletes.
pub const SLICE: i64 = 5_000;

/// How often the job runs for a retention of `retention`: half of it, within
/// 100 ms and one minute.
pub fn period(retention: Duration) -> Duration {
    (retention / 2).clamp(Duration::from_millis(100), Duration::from_secs(60))
}

/// Runs [`expire`] every [`period`] until the strategy is dropped.
pub(super) async fn run(queue: Weak<Queue>, retention: Duration) {
    loop {
        tokio::time::sleep(period(retention)).await;
        let Some(queue) = queue.upgrade() else { return };
        match expire(&queue.db, retention).await {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(deleted, "expired resolved purchase requests"),
            Err(err) => tracing::debug!(error = %err, "request retention failed; retrying"),
        }
    }
}

/// Deletes every resolved request accepted more than `retention` ago;
/// returns how many, also counted in `seckill_queue_requests_expired_total`.
///
/// Errors: Postgres errors (what was deleted before stays deleted).
pub async fn expire(db: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut total = 0;
    loop {
        let deleted = sqlx::query(
            "DELETE FROM purchase_requests WHERE id IN (
                 SELECT id FROM purchase_requests
                 WHERE accepted_at < clock_timestamp() - make_interval(secs => $1 / 1000.0)
                   AND status <> 'pending'
                 LIMIT $2)",
        )
        .bind(retention_ms as f64)
        .bind(SLICE)
        .execute(db)
        .await?
        .rows_affected();
        total += deleted;
        metrics::counter!(crate::metric_names::QUEUE_REQUESTS_EXPIRED_TOTAL).increment(deleted);
        if deleted < SLICE as u64 {
            return Ok(total);
        }
    }
}
