//! Returning the units of an order that ends unpaid: the claim the order
//! lifecycle (`crate::lifecycle`) hands to the sale's strategy, and the one
//! status change every strategy's return ends with.
//!
//! Exactly once: the lifecycle claims `pending_payment` orders of one sale by
//! locking their rows (`SELECT … FOR UPDATE` for a cancel, `FOR UPDATE SKIP
//! LOCKED` in the expiry sweep) in a transaction, and the [`Claim`] carries
//! that transaction. The strategy puts the units back through its own path
//! inside it — the sale row, a bucket, under its lock, … — and then calls
//! [`Claim::end`], which changes the statuses with `WHERE status =
//! 'pending_payment'` and commits. A cancel racing a payment, two sweeps, a
//! sweep and a cancel: whichever locks a row second finds the order no longer
//! pending and changes nothing, so each order ends in one state and its units
//! come back at most once. If the process dies before the commit, Postgres
//! rolls the transaction back (the units and the statuses together) and the
//! orders are claimed again later.
//!
//! One claim, one return: a cancel claims its one order; the sweep claims
//! the due orders of a sale together ([`MAX_ORDERS`]), so that their units go
//! back in one write of the sale's stock. On a hot sale row every write
//! queues behind the buyers' purchases; a return per order queued once per
//! order, and a sweep that fell behind the expiries never caught up.
//!
//! Lock order: the order rows, then the stock row (the strategy's return),
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

/// Most orders one [`Claim`] carries: the sweep's claims of a sale's due
/// orders (a bound on the transaction's length, and on the rows its status
/// change locks while it holds the sale's stock row).
pub const MAX_ORDERS: usize = 500;

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

/// Pending orders of one sale, locked, on their way to [`Ending`]. Dropped
/// without [`Claim::end`], its transaction rolls back and nothing changes.
pub struct Claim {
    tx: Transaction<'static, Postgres>,
    /// One or more orders (at most [`MAX_ORDERS`]), all of one sale.
    orders: Vec<PendingOrder>,
    pub ending: Ending,
    /// Test-only: [`Claim::commit`] never commits, holding the order's row
    /// lock and the uncommitted return until the process dies
    /// ([`Claim::holding_before_commit`]).
    hold_before_commit: bool,
}

/// What a return did: the orders that ended and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Returned {
    /// The claim's orders, all of one sale.
    pub orders: Vec<PendingOrder>,
    pub ending: Ending,
}

impl Returned {
    /// Units that came back: the orders' quantities summed.
    pub fn units(&self) -> i64 {
        units_of(&self.orders)
    }
}

/// Why [`Claim::end`] changed nothing: an order was no longer pending. Cannot
/// happen while the claim holds the row locks; checked all the same, so that
/// a strategy's units never come back without the status change.
#[derive(Debug, thiserror::Error)]
#[error("{0} of the claimed orders were no longer pending when their units were returned")]
pub struct NoLongerPending(pub usize);

/// Why [`Claim::new`] refused its orders.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidClaim {
    #[error("a claim carries at least one order")]
    Empty,
    #[error("a claim carries at most {MAX_ORDERS} orders, not {0}")]
    TooMany(usize),
    #[error("a claim's orders are of one sale")]
    SalesMixed,
}

impl Claim {
    /// A claim over `orders`, whose rows `tx` has locked while they were
    /// `pending_payment`.
    ///
    /// Errors: [`InvalidClaim`] unless there are 1 to [`MAX_ORDERS`] orders,
    /// all of one sale.
    pub fn new(
        tx: Transaction<'static, Postgres>,
        orders: Vec<PendingOrder>,
        ending: Ending,
    ) -> Result<Self, InvalidClaim> {
        check(&orders)?;
        Ok(Self { tx, orders, ending, hold_before_commit: false })
    }

    /// The claim's orders: one or more, of one sale.
    pub fn orders(&self) -> &[PendingOrder] {
        &self.orders
    }

    /// The sale of the claim's orders.
    pub fn sale(&self) -> SaleId {
        self.orders[0].sale
    }

    /// Units the claim returns: its orders' quantities summed.
    pub fn units(&self) -> i64 {
        units_of(&self.orders)
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

    /// Changes the orders' status from `pending_payment` to the ending's, in
    /// the claim's transaction, after the strategy returned the units in it;
    /// nothing is committed yet ([`Claim::commit`]).
    ///
    /// Errors: Postgres; [`NoLongerPending`] (as [`StrategyError::Internal`])
    /// if an order was not pending: the caller drops the claim, which rolls
    /// its return back.
    pub async fn end_orders(&mut self) -> Result<(), StrategyError> {
        let ids: Vec<i64> = self.orders.iter().map(|order| order.id).collect();
        let changed = sqlx::query(
            "UPDATE orders SET status = $2, ended_at = clock_timestamp() \
             WHERE id = ANY($1) AND status = 'pending_payment'",
        )
        .bind(&ids)
        .bind(self.ending.status().as_str())
        .execute(&mut *self.tx)
        .await?
        .rows_affected();
        let missed = ids.len() - changed as usize;
        if missed != 0 {
            return Err(StrategyError::Internal(NoLongerPending(missed).into()));
        }
        Ok(())
    }

    /// Commits the return and the status change together.
    pub async fn commit(self) -> Result<Returned, sqlx::Error> {
        if self.hold_before_commit {
            tracing::warn!(
                orders = self.orders.len(),
                "failpoint: holding a return before its commit"
            );
            std::future::pending::<()>().await;
        }
        self.tx.commit().await?;
        Ok(Returned { orders: self.orders, ending: self.ending })
    }

    /// [`Claim::end_orders`], then [`Claim::commit`]: what a strategy whose
    /// return is all in Postgres calls after its return statement.
    pub async fn end(mut self) -> Result<Returned, StrategyError> {
        self.end_orders().await?;
        Ok(self.commit().await?)
    }
}

/// Whether `orders` may make a claim: 1 to [`MAX_ORDERS`], of one sale.
fn check(orders: &[PendingOrder]) -> Result<(), InvalidClaim> {
    let Some(first) = orders.first() else { return Err(InvalidClaim::Empty) };
    if orders.len() > MAX_ORDERS {
        return Err(InvalidClaim::TooMany(orders.len()));
    }
    if orders.iter().any(|order| order.sale != first.sale) {
        return Err(InvalidClaim::SalesMixed);
    }
    Ok(())
}

fn units_of(orders: &[PendingOrder]) -> i64 {
    orders.iter().map(|order| i64::from(order.quantity)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(id: i64, sale: i64, quantity: i32) -> PendingOrder {
        PendingOrder { id, sale: SaleId(sale), user: UserId::parse(id).unwrap(), quantity }
    }

    #[test]
    fn a_claim_is_one_to_max_orders_of_one_sale() {
        assert_eq!(check(&[]), Err(InvalidClaim::Empty));
        assert_eq!(check(&[order(1, 7, 1)]), Ok(()));
        let full: Vec<_> = (1..=MAX_ORDERS as i64).map(|id| order(id, 7, 1)).collect();
        assert_eq!(check(&full), Ok(()));
        let over: Vec<_> = (1..=MAX_ORDERS as i64 + 1).map(|id| order(id, 7, 1)).collect();
        assert_eq!(check(&over), Err(InvalidClaim::TooMany(MAX_ORDERS + 1)));
        assert_eq!(check(&[order(1, 7, 1), order(2, 8, 1)]), Err(InvalidClaim::SalesMixed));
    }

    #[test]
    fn the_units_are_the_quantities_summed() {
        assert_eq!(units_of(&[order(1, 7, 1), order(2, 7, 3)]), 4);
    }
}
