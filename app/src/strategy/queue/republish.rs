//! Republishing stale pending requests: the relay of a transactional outbox.
//!
//! A purchase writes its request row first and publishes its message second
//! (the [`Accept`](super) task). Between the two, three things leave a row
//! `pending` with no message behind it and its buyer answered `503`:
//! - the instance dies;
//! - its connection to Postgres is cut after the group's insert committed but
//!   before the reply arrived (`pg_terminate_backend`, a failover, a network
//!   partition), so the instance believes nothing was written;
//! - the publish is refused and the removal of the row fails as well.
//!
//! A buyer who retries finds the same request and publishes it again, but a
//! buyer who does not would leave the row pending forever (the retention job
//! keeps pending rows). So every instance runs this job: every
//! [`period`], it claims up to [`SLICE`] requests pending for longer than
//! `SECKILL_QUEUE_REPUBLISH_AFTER_MS` (counted from their acceptance, or from
//! their last republish), stamps `republished_at`, and publishes their
//! messages. The consumer settles a request id once, so a request whose
//! message was in the queue after all (a long backlog) costs one more
//! delivery, never a second order; a request's message is republished at
//! most once per `SECKILL_QUEUE_REPUBLISH_AFTER_MS`, and its copies count
//! toward the queue's `x-max-length` like any message. A publish the broker
//! refuses is tried again once the threshold has passed again. Instances
//! running the job at once claim disjoint rows (`FOR UPDATE SKIP LOCKED`). A
//! request the job published is no longer removed when its first publish is
//! refused ([`super::results::forget`]): its copy may be queued.
//!
//! The buyer answered `503` may thus end up with an order: a `503` after an
//! unknown outcome means "retry", and the retry answers the same request.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt;
use sqlx::PgPool;
use uuid::Uuid;

use super::{PurchaseMessage, Queue};

/// Most requests one pass claims.
const SLICE: i64 = 1_000;

/// Publishes in flight at once in one pass.
const CONCURRENT_PUBLISHES: usize = 32;

/// How often the job runs for a threshold of `after`: half of it, within
/// 100 ms and 30 s.
fn period(after: Duration) -> Duration {
    (after / 2).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// Runs [`republish`] every [`period`] until the strategy is dropped.
pub(super) async fn run(queue: Weak<Queue>, after: Duration) {
    loop {
        tokio::time::sleep(period(after)).await;
        let Some(queue) = queue.upgrade() else { return };
        match republish(&queue, after).await {
            Ok(Republished { claimed: 0, .. }) => {}
            Ok(done) => tracing::info!(
                claimed = done.claimed,
                published = done.published,
                "published stale pending requests again"
            ),
            Err(err) => {
                tracing::warn!(error = %err, "republishing stale requests failed; retrying")
            }
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Republished {
    /// Stale pending requests claimed (stamped `republished_at`).
    claimed: usize,
    /// Of those, the messages the broker confirmed.
    published: usize,
}

/// One pass: claims the requests pending for longer than `after` and
/// publishes their messages; counts the confirmed ones in
/// `seckill_queue_requests_republished_total`.
///
/// Errors: Postgres errors of the claim (a refused publish is not an error:
/// the request is claimed again once `after` has passed).
async fn republish(queue: &Queue, after: Duration) -> Result<Republished, sqlx::Error> {
    let stale = claim_stale(&queue.db, after).await?;
    let claimed = stale.len();
    let published = futures_util::stream::iter(stale)
        .map(|message| async move {
            match queue.publisher.publish(&message).await {
                Ok(()) => true,
                Err(err) => {
                    tracing::debug!(error = %err, request_id = %message.request_id,
                        "a stale request's message was refused; retried later");
                    false
                }
            }
        })
        .buffer_unordered(CONCURRENT_PUBLISHES)
        .filter(|published| std::future::ready(*published))
        .count()
        .await;
    metrics::counter!(crate::metric_names::QUEUE_REQUESTS_REPUBLISHED_TOTAL)
        .increment(published as u64);
    Ok(Republished { claimed, published })
}

/// Stamps `republished_at` on up to [`SLICE`] requests pending since more
/// than `after` (from `republished_at`, else `accepted_at`), oldest first,
/// skipping rows another transaction holds (a consumer settling them, another
/// instance's pass); answers their messages.
async fn claim_stale(db: &PgPool, after: Duration) -> Result<Vec<PurchaseMessage>, sqlx::Error> {
    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    let rows: Vec<(Uuid, i64, i64, i32)> = sqlx::query_as(
        "UPDATE purchase_requests r SET republished_at = clock_timestamp()
         FROM (SELECT id FROM purchase_requests
               WHERE status = 'pending'
                 AND coalesce(republished_at, accepted_at)
                     < clock_timestamp() - make_interval(secs => $1 / 1000.0)
               ORDER BY coalesce(republished_at, accepted_at)
               LIMIT $2
               FOR UPDATE SKIP LOCKED) stale
         WHERE r.id = stale.id
         RETURNING r.id, r.sale_id, r.user_id, r.quantity",
    )
    .bind(after_ms as f64)
    .bind(SLICE)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(request_id, sale_id, user_id, quantity)| PurchaseMessage {
            request_id,
            sale_id,
            user_id,
            quantity,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_half_the_threshold_within_its_bounds() {
        assert_eq!(period(Duration::from_secs(10)), Duration::from_secs(5));
        assert_eq!(period(Duration::from_millis(100)), Duration::from_millis(100));
        assert_eq!(period(Duration::from_secs(3600)), Duration::from_secs(30));
    }
}
