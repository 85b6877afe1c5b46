//! The expiry sweep: orders still `pending_payment` at their `expires_at`
//! become `expired` and return their units.
//!
//! Every instance runs it, every `SECKILL_EXPIRY_SWEEP_INTERVAL_MS`. A pass
//! claims the due orders of one sale at a time with `FOR UPDATE SKIP LOCKED`
//! — the sale of the soonest due order, then up to
//! [`crate::unit_return::MAX_ORDERS`] of its due orders, soonest expiry
//! first, through the partial index `orders_pending_expiry_idx` — and hands
//! them to the sale's strategy in the claim's transaction, which returns
//! their units in one write. Instances sweeping at once take different
//! orders instead of queueing behind one another, and an order whose return
//! is under way elsewhere (a sweep, a cancel) is skipped, not returned twice.
//! An instance that dies mid-return leaves nothing behind: its transaction
//! rolls back, the row locks go with its connection, and the next pass
//! anywhere claims the orders again.
//!
//! Why a sale's due orders together: on a hot sale every write of its stock
//! waits for the buyers' purchases queued on the same row. A return per
//! order waited once per order, and under load a pass fell seconds behind
//! the expiries it was returning (docs/orders.md).
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

use super::{ClaimRow, Context, claim_of, return_units};
use crate::outcome::StrategyError;
use crate::sale::SaleCatalog;
use crate::strategy::Strategies;
use crate::unit_return::{Ending, MAX_ORDERS};

/// Most orders one pass expires; the rest wait for the next period.
pub const MAX_PER_PASS: usize = 10_000;

/// Most failed returns (claims of a sale's due orders) one pass goes past
/// before it gives up until the next period (a strategy whose backing server
/// is down fails every one of its claims).
pub const MAX_FAILURES_PER_PASS: usize = 32;

/// The sale of the oldest due order no other transaction holds and this pass
/// has not failed to return (`$1`); that order locked.
const DUE_SALE: &str = "\
SELECT sale_id
FROM orders
WHERE status = 'pending_payment' AND expires_at <= clock_timestamp() AND NOT (id = ANY($1))
ORDER BY expires_at
LIMIT 1
FOR UPDATE SKIP LOCKED";

/// Up to `$3` due orders of sale `$2` that no other transaction holds and this
/// pass has not failed to return (`$1`), oldest first, locked (the one
/// [`DUE_SALE`] locked among them: a transaction does not skip its own).
const CLAIM_DUE: &str = "\
SELECT id, sale_id, user_id, quantity, status, true AS due
FROM orders
WHERE status = 'pending_payment' AND expires_at <= clock_timestamp() AND NOT (id = ANY($1))
  AND sale_id = $2
ORDER BY expires_at
LIMIT $3
FOR UPDATE SKIP LOCKED";

/// One pass: expires due orders, a sale's at a time in one transaction,
/// until none is left that another transaction does not hold (or
/// [`MAX_PER_PASS`]). Orders whose return fails (their strategy's lock not
/// taken, its Redis down) stay pending for the next pass, and this pass goes
/// on with the others: one sale's outage does not hold up every other sale's
/// expiries. Returns how many orders this pass expired.
///
/// Errors: Postgres, when claiming the next orders fails.
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
    let (mut expired, mut failures, mut failed) = (0, 0, Vec::<i64>::new());
    while expired < MAX_PER_PASS && failures < MAX_FAILURES_PER_PASS {
        let mut tx = context.db.begin().await?;
        let due = sqlx::query_scalar::<_, i64>(DUE_SALE).bind(&failed);
        let Some(sale) = due.fetch_optional(&mut *tx).await? else {
            break;
        };
        let limit = MAX_ORDERS.min(MAX_PER_PASS - expired) as i64;
        let claimed = sqlx::query_as::<_, ClaimRow>(CLAIM_DUE).bind(&failed).bind(sale).bind(limit);
        let rows = claimed.fetch_all(&mut *tx).await?;
        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
        let claim = claim_of(tx, &rows, Ending::Expired)?;
        let claim = if hangs_before_commit() { claim.holding_before_commit() } else { claim };
        match return_units(context, claim).await {
            Ok(returned) => expired += returned.orders.len(),
            Err(err) => {
                tracing::warn!(
                    sale_id = sale,
                    orders = ids.len(),
                    error = %err,
                    "expiring a sale's due orders failed; the next pass retries"
                );
                failures += 1;
                failed.extend(ids);
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
