//! Returning the units of an order that ends unpaid: the claim the order
//! lifecycle (`crate::lifecycle`) hands to the sale's strategy, and the one
//! status change every strategy's return ends with.
//!
//! Exactly once: the lifecycle claims a `pending_payment` order by locking its
//! row (`SELECT … FOR UPDATE`, or `FOR UPDATE SKIP LOCKED` in the expiry
//! sweep) in a transaction, and the [`Claim`] carries that transaction. The
//! strategy puts the units back through its own path inside it — the sale
//! row, the bucket, under its lock, … — and then calls [`Claim::end`], which
//! changes the status with `WHERE status = 'pending_payment'` and commits. A
//! cancel racing a payment, two sweeps, a sweep and a cancel: whichever locks
//! the row second finds the order no longer pending and changes nothing, so
//! the order ends in one state and its units come back at most once. If the
//! process dies before the commit, Postgres rolls the transaction back (the
//! units and the status together) and the order is claimed again later.
//!
//! Lock order: the order row, then the stock row (the strategy's return),
//! then the status change. A purchase locks the stock row and then inserts
//! its order; it never waits for an order row lock, so the two cannot
//! deadlock.
//!
//! This module knows no strategy; it sits with the vocabulary.

use sqlx::{PgConnection, Postgres, Transaction};

use crate::outcome::StrategyError;
use crate::sale::{OrderStatus, SaleId, UserId};

/// How a pending order ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The buyer cancelled it (`POST /orders/{id}/cancel`).
    Cancelled,
    /// Its payment window ended unpaid (the expiry sweep, or a cancel that
    /// came after `expires_at`).
    Expired,
}

impl Ending {
    /// The status the order ends in.
    pub fn status(self) -> OrderStatus {
        match self {
            Ending::Cancelled => OrderStatus::Cancelled,
            Ending::Expired => OrderStatus::Expired,
        }
    }
}

/// A `pending_payment` order whose row this claim's transaction has locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingOrder {
    /// `orders.id`.
    pub id: i64,
    pub sale: SaleId,
    pub user: UserId,
    /// Units of stock the order holds (≥ 1).
    pub quantity: i32,
}

/// A pending order, locked, on its way to [`Ending`]. Dropped without
/// [`Claim::end`], its transaction rolls back and nothing changes.
pub struct Claim {
    tx: Transaction<'static, Postgres>,
    pub order: PendingOrder,
    pub ending: Ending,
    /// Test-only: [`Claim::commit`] never commits, holding the order's row
    /// lock and the uncommitted return until the process dies
    /// ([`Claim::holding_before_commit`]).
    hold_before_commit: bool,
}

/// What a return did: the order's id and the units that came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Returned {
    pub order: PendingOrder,
    pub ending: Ending,
}

/// Why [`Claim::end`] changed nothing: the order was no longer pending. Cannot
/// happen while the claim holds the row lock; checked all the same, so that a
/// strategy's units never come back without the status change.
#[derive(Debug, thiserror::Error)]
#[error("order {0} was no longer pending when its units were returned")]
pub struct NoLongerPending(pub i64);

impl Claim {
    /// A claim over `order`, whose row `tx` has locked while it was
    /// `pending_payment`.
    pub fn new(tx: Transaction<'static, Postgres>, order: PendingOrder, ending: Ending) -> Self {
        Self { tx, order, ending, hold_before_commit: false }
    }

    /// This claim, armed to hang in [`Claim::commit`] instead of committing:
    /// the expiry sweep's test-only failpoint `expiry-sweep-before-commit=hang`
    /// (docs/testing.md), to kill an instance while it holds a swept order
    /// with its units returned and its status changed, uncommitted.
    pub fn holding_before_commit(mut self) -> Self {
        self.hold_before_commit = true;
        self
    }

    /// The claim's transaction, for the strategy's return statement.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// Changes the order's status from `pending_payment` to the ending's, in
    /// the claim's transaction, after the strategy returned the units in it;
    /// nothing is committed yet ([`Claim::commit`]).
    ///
    /// Errors: Postgres; [`NoLongerPending`] (as [`StrategyError::Internal`])
    /// if the order was not pending: the caller drops the claim, which rolls
    /// its return back.
    pub async fn end_order(&mut self) -> Result<(), StrategyError> {
        let changed = sqlx::query(
            "UPDATE orders SET status = $2, ended_at = clock_timestamp() \
             WHERE id = $1 AND status = 'pending_payment'",
        )
        .bind(self.order.id)
        .bind(self.ending.status().as_str())
        .execute(&mut *self.tx)
        .await?
        .rows_affected();
        if changed != 1 {
            return Err(StrategyError::Internal(NoLongerPending(self.order.id).into()));
        }
        Ok(())
    }

    /// Commits the return and the status change together.
    pub async fn commit(self) -> Result<Returned, sqlx::Error> {
        if self.hold_before_commit {
            tracing::warn!(
                order_id = self.order.id,
                "failpoint: holding a return before its commit"
            );
            std::future::pending::<()>().await;
        }
        self.tx.commit().await?;
        Ok(Returned { order: self.order, ending: self.ending })
    }

    /// [`Claim::end_order`], then [`Claim::commit`]: what a strategy whose
    /// return is all in Postgres calls after its return statement.
    pub async fn end(mut self) -> Result<Returned, StrategyError> {
        self.end_order().await?;
        Ok(self.commit().await?)
    }
}
