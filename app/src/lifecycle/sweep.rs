//! The expiry sweep: orders still `pending_payment` at their `expires_at`
//! become `expired` and return their units.
//!
//! Every instance runs it, every `SECKILL_EXPIRY_SWEEP_INTERVAL_MS`. A pass
//! claims one due order at a time with `FOR UPDATE SKIP LOCKED` (soonest
//! expiry first, through the partial index `orders_pending_expiry_idx`) and
//! hands it to its sale's strategy in the claim's transaction: instances
//! sweeping at once take different orders instead of queueing behind one
//! another, and an order whose return is under way elsewhere (a sweep, a
//! cancel) is skipped, not returned twice. An instance that dies mid-return
//! leaves nothing behind: its transaction rolls back, the row lock goes with
//! its connection, and the next pass anywhere claims the order again.
//!
//! Why a sweep rather than a RabbitMQ delay (a per-queue TTL with a
//! dead-letter exchange): the sweep reads the orders themselves, so it needs
//! no message per order that could be lost, duplicated or published for an
//! order whose transaction then rolled back; it works for every strategy,
//! the ones without a broker too; and an order is expired as soon as a pass
//! runs after its window, whatever the window's length, whereas one TTL per
//! queue means one queue per window length. Its cost is one indexed query
//! per instance and period when nothing is due.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{ClaimRow, Context, return_units};
use crate::outcome::StrategyError;
use crate::sale::SaleCatalog;
use crate::strategy::Strategies;
use crate::unit_return::Ending;

/// Most orders one pass expires; the rest wait for the next period.
pub const MAX_PER_PASS: usize = 10_000;

/// Most failed returns one pass goes past before it gives up until the next
/// period (a strategy whose backing server is down fails every one of its
/// orders).
pub const MAX_FAILURES_PER_PASS: usize = 32;

/// The oldest due order no other transaction holds and this pass has not
/// failed to return (`$1`), locked.
const CLAIM_DUE: &str = "\
SELECT id, sale_id, user_id, quantity, status, true AS due
FROM orders
WHERE status = 'pending_payment' AND expires_at <= clock_timestamp() AND NOT (id = ANY($1))
ORDER BY expires_at
LIMIT 1
FOR UPDATE SKIP LOCKED";

/// One pass: expires due orders, one transaction each, until none is left
/// that another transaction does not hold (or [`MAX_PER_PASS`]). An order
/// whose return fails (its strategy's lock not taken, its Redis down) stays
/// pending for the next pass, and this pass goes on with the others: one
/// sale's outage does not hold up every other sale's expiries. Returns how
/// many this pass expired.
///
/// Errors: Postgres, when claiming the next order fails.
pub async fn sweep_once(context: Context<'_>) -> Result<usize, StrategyError> {
    sweep_pass(context, || false).await
}

/// [`sweep_once`]; a claim for which `hangs_before_commit` answers true is
/// held before its commit until the process dies (the failpoint
/// `expiry-sweep-before-commit=hang`, [`Sweeper::hangs_before_commit`]).
async fn sweep_pass(
    context: Context<'_>,
    hangs_before_commit: impl Fn() -> bool,
) -> Result<usize, StrategyError> {
    let (mut expired, mut failed) = (0, Vec::<i64>::new());
    while expired < MAX_PER_PASS && failed.len() < MAX_FAILURES_PER_PASS {
        let mut tx = context.db.begin().await?;
        let claimed = sqlx::query_as::<_, ClaimRow>(CLAIM_DUE).bind(&failed);
        let Some(row) = claimed.fetch_optional(&mut *tx).await? else {
            break;
        };
        let order_id = row.id;
        let claim = row.claim(tx, Ending::Expired).map_err(|err| match err {
            super::LifecycleError::Strategy(err) => err,
            other => StrategyError::Internal(other.into()),
        })?;
        let claim = if hangs_before_commit() { claim.holding_before_commit() } else { claim };
        match return_units(context, claim).await {
            Ok(_) => expired += 1,
            Err(err) => {
                tracing::warn!(order_id, error = %err, "expiring an order failed; the next pass retries");
                failed.push(order_id);
            }
        }
    }
    Ok(expired)
}

/// The sweep of one instance: a pass every `period` until `stop`.
pub struct Sweeper {
    /// The sweep's own pool (`crate::startup::sweep_pool`), closed when the
    /// sweep stops.
    pub db: PgPool,
    pub catalog: SaleCatalog,
    pub strategies: Strategies,
    pub period: Duration,
    /// The service's failpoints (`expiry-sweep-before-commit`).
    #[cfg(feature = "failpoints")]
    pub failpoints: crate::failpoints::Failpoints,
}

impl Sweeper {
    /// Runs passes every period until `stop` is cancelled. A failed pass is
    /// logged and the next one runs on time.
    pub async fn run(self, stop: CancellationToken) {
        let mut ticks = tokio::time::interval(self.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    self.db.close().await;
                    return;
                }
                _ = ticks.tick() => {}
            }
            let context =
                Context { db: &self.db, catalog: &self.catalog, strategies: &self.strategies };
            match sweep_pass(context, || self.hangs_before_commit()).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(expired = n, "expiry sweep"),
                Err(err) => tracing::warn!(error = %err, "expiry sweep failed"),
            }
        }
    }

    /// Whether the failpoint `expiry-sweep-before-commit=hang` fires for the
    /// claim at hand: its transaction then hangs uncommitted, its order's
    /// row locked, until the process dies. For a test that kills an
    /// instance mid-sweep. Never without the cargo feature `failpoints`.
    fn hangs_before_commit(&self) -> bool {
        #[cfg(feature = "failpoints")]
        {
            use crate::failpoints::{Action, EXPIRY_SWEEP_BEFORE_COMMIT};
            self.failpoints.fire(&EXPIRY_SWEEP_BEFORE_COMMIT) == Some(Action::Hang)
        }
        #[cfg(not(feature = "failpoints"))]
        false
    }
}
