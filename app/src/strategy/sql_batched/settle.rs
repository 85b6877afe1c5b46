//! Settling one batch of one sale's purchases in one transaction, with the
//! answer the `sql` strategy would give each purchase had they run one after
//! the other in arrival order.
//!
//! The set-based path ([`settle`]'s first try) is the steps every batch
//! shares (`crate::strategy::batch`): lock the sale row, read which buyers
//! already have an order, decide in arrival order ([`allocate`]), take the
//! granted units and write their orders in one statement, commit. Five
//! round trips whatever the batch size, three of them under the row lock.
//!
//! A statement of that path fails as a whole: one order Postgres refuses
//! (a check, a trigger, any error that is not the connection's) would fail
//! every purchase with it. So when the set-based path fails with such an
//! error, the batch is settled again one purchase at a time, in arrival
//! order, inside one transaction: each purchase runs the `sql` strategy's
//! own statement under a savepoint, and a purchase whose statement fails
//! gets that statement's answer (`sql`'s answer, error included) while its
//! savepoint is rolled back and the others go on. That path costs three
//! round trips per purchase under the row lock, which is why it is the
//! fallback and not the rule (docs/hot-row.md gives both measured).
//!
//! A serialization failure or deadlock (`40001`, `40P01`) retries the
//! set-based path, up to [`ATTEMPTS`] times. An error of the connection
//! (it was closed, reset or terminated; the pool has none to give) fails the
//! whole batch with `unavailable`: the transaction is rolled back by
//! Postgres, so nothing of the batch is applied.

use std::collections::{HashMap, HashSet};

use sqlx::PgPool;

use super::NAME;
use crate::outcome::{Outcome, StrategyError};
use crate::sale::{Quantity, SaleId, UserId};
use crate::strategy::{batch, serial, sql};

/// One purchase of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purchase {
    pub user: UserId,
    pub quantity: Quantity,
}

/// What one purchase is answered.
pub type Answer = Result<Outcome, StrategyError>;

/// Tries of the set-based path when Postgres reports a serialization
/// failure or a deadlock.
pub const ATTEMPTS: u32 = 3;

/// The `sql` strategy's answer to one purchase at its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Its units are taken and its order written.
    Grant,
    /// Fewer units are left than it asks for (checked first, as the `sql`
    /// statement's guard is).
    SoldOut,
    /// Enough units are left, but the buyer has an order already (in
    /// Postgres, or granted earlier in this batch): the unique constraint
    /// refuses it and it takes nothing.
    AlreadyPurchased,
}

/// The turn of each purchase, in arrival order, from `remaining_stock` and
/// the buyers who already have an order (`ordered`): a purchase is granted
/// if the units left cover its quantity and its buyer has no order; a larger
/// purchase refused for stock does not stop a smaller one after it.
pub fn allocate(purchases: &[Purchase], remaining_stock: i64, ordered: HashSet<i64>) -> Vec<Turn> {
    let mut left = remaining_stock;
    let mut buyers = ordered;
    purchases
        .iter()
        .map(|purchase| {
            let quantity = i64::from(purchase.quantity.get());
            if quantity > left {
                Turn::SoldOut
            } else if !buyers.insert(purchase.user.get()) {
                Turn::AlreadyPurchased
            } else {
                left -= quantity;
                Turn::Grant
            }
        })
        .collect()
}

/// Settles `purchases` (in arrival order) of `sale`; one answer per
/// purchase, in the same order.
///
/// Errors: the batch failed as a whole (its connection was lost, the pool
/// had none, a savepoint command failed); nothing of it was applied.
pub async fn settle(
    db: &PgPool,
    sale: SaleId,
    purchases: &[Purchase],
) -> Result<Vec<Answer>, StrategyError> {
    let mut attempt = 1;
    let failure = loop {
        match together(db, sale, purchases).await {
            Ok(outcomes) => return Ok(outcomes.into_iter().map(Ok).collect()),
            Err(err) if is_transient(&err) && attempt < ATTEMPTS => attempt += 1,
            Err(err) => break err,
        }
    };
    let message = failure.to_string();
    match StrategyError::from(failure) {
        unavailable @ StrategyError::Unavailable { .. } => Err(unavailable),
        _ => {
            tracing::warn!(
                sale_id = sale.0,
                purchases = purchases.len(),
                error = %message,
                "a batch failed as a whole; settling it again one purchase at a time"
            );
            one_by_one(db, sale, purchases).await
        }
    }
}

/// A serialization failure or a deadlock (PostgreSQL manual, appendix A).
fn is_transient(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

/// The set-based path: one transaction, five round trips (three once the
/// sale is sold out).
async fn together(
    db: &PgPool,
    sale: SaleId,
    purchases: &[Purchase],
) -> Result<Vec<Outcome>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let Some(locked) = batch::lock_sale(&mut tx, sale.0).await? else {
        // No such sale: the `sql` statement finds no row to take from.
        return Ok(vec![Outcome::SoldOut; purchases.len()]);
    };
    // Only the buyers whose quantity the stock covers can be refused for an
    // order they have; a sold-out sale reads none.
    let users: Vec<i64> = purchases
        .iter()
        .filter(|p| i64::from(p.quantity.get()) <= locked.remaining_stock)
        .map(|p| p.user.get())
        .collect();
    let ordered = if users.is_empty() {
        HashSet::new()
    } else {
        batch::ordered_buyers(&mut tx, sale.0, &users).await?
    };
    let turns = allocate(purchases, locked.remaining_stock, ordered);
    let granted: Vec<(i64, i32)> = purchases
        .iter()
        .zip(&turns)
        .filter(|(_, turn)| **turn == Turn::Grant)
        .map(|(p, _)| (p.user.get(), p.quantity.get()))
        .collect();
    let (order_of, marks) =
        batch::take_stock_and_order(&mut tx, sale.0, &granted, locked.began_at).await?;
    let outcomes = outcomes(purchases, &turns, &order_of)?;
    if !granted.is_empty() {
        locked.knobs.simulate_work().await;
    }
    tx.commit().await?;
    if let Some(marks) = marks {
        marks.record(NAME, 1);
    }
    Ok(outcomes)
}

/// The outcome of each purchase from its turn and the order written for
/// each granted buyer. Errors: a granted buyer without an order, which
/// [`batch::take_stock_and_order`] rules out.
fn outcomes(
    purchases: &[Purchase],
    turns: &[Turn],
    order_of: &HashMap<i64, i64>,
) -> Result<Vec<Outcome>, sqlx::Error> {
    purchases
        .iter()
        .zip(turns)
        .map(|(purchase, turn)| match turn {
            Turn::SoldOut => Ok(Outcome::SoldOut),
            Turn::AlreadyPurchased => Ok(Outcome::AlreadyPurchased),
            Turn::Grant => match order_of.get(&purchase.user.get()) {
                Some(&order_id) => {
                    Ok(Outcome::Placed { order_id, quantity: purchase.quantity.get() })
                }
                None => Err(sqlx::Error::Protocol(format!(
                    "no order was written for granted buyer {}",
                    purchase.user.get()
                ))),
            },
        })
        .collect()
}

/// The fallback: the `sql` statement per purchase, each under a savepoint,
/// in one transaction that first locks the sale row.
async fn one_by_one(
    db: &PgPool,
    sale: SaleId,
    purchases: &[Purchase],
) -> Result<Vec<Answer>, StrategyError> {
    let mut tx = db.begin().await?;
    let locked = batch::lock_sale(&mut tx, sale.0).await?;
    let hold = serial::Hold::start(NAME);
    let mut answers = Vec::with_capacity(purchases.len());
    for purchase in purchases {
        let mut savepoint = sqlx::Connection::begin(&mut *tx).await?;
        match sql::take_and_order(&mut *savepoint, sale, purchase.user, purchase.quantity).await {
            // The transaction went with the connection.
            Err(unavailable @ StrategyError::Unavailable { .. }) => return Err(unavailable),
            placed @ Ok(Outcome::Placed { .. }) => {
                savepoint.commit().await?;
                answers.push(placed);
            }
            refused => {
                savepoint.rollback().await?;
                answers.push(refused);
            }
        }
    }
    if let Some(locked) = locked
        && answers.iter().any(|a| matches!(a, Ok(Outcome::Placed { .. })))
    {
        locked.knobs.simulate_work().await;
    }
    tx.commit().await?;
    let placed = answers.iter().map(|answer| match answer {
        Ok(Outcome::Placed { quantity, .. }) => *quantity as u64,
        _ => 0,
    });
    hold.end(placed.sum());
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn purchase(user: i64, quantity: i64) -> Purchase {
        Purchase {
            user: UserId::parse(user).unwrap(),
            quantity: Quantity::parse(quantity, 10).unwrap(),
        }
    }

    use Turn::{AlreadyPurchased, Grant, SoldOut};

    #[test]
    fn units_go_in_arrival_order_and_a_smaller_purchase_may_pass_a_larger_one() {
        let batch = [purchase(1, 2), purchase(2, 2), purchase(3, 1), purchase(4, 1)];
        assert_eq!(allocate(&batch, 3, HashSet::new()), [Grant, SoldOut, Grant, SoldOut]);
    }

    #[test]
    fn a_buyer_with_an_order_or_granted_earlier_in_the_batch_takes_nothing() {
        let batch = [purchase(1, 1), purchase(2, 1), purchase(2, 1), purchase(3, 1)];
        let ordered = HashSet::from([1]);
        assert_eq!(
            allocate(&batch, 2, ordered),
            [AlreadyPurchased, Grant, AlreadyPurchased, Grant]
        );
    }

    #[test]
    fn stock_is_checked_before_the_buyer_as_the_sql_statement_does() {
        // Buyer 1 has an order and asks for more than is left: the `sql`
        // statement's guard refuses it before the insert could conflict.
        let batch = [purchase(1, 3), purchase(1, 1), purchase(2, 2)];
        assert_eq!(allocate(&batch, 2, HashSet::from([1])), [SoldOut, AlreadyPurchased, Grant]);
    }

    #[test]
    fn a_refused_buyer_may_buy_later_in_the_batch() {
        // Refused for stock, then a smaller purchase of the same buyer fits.
        let batch = [purchase(1, 3), purchase(1, 1)];
        assert_eq!(allocate(&batch, 1, HashSet::new()), [SoldOut, Grant]);
    }

    #[test]
    fn each_turn_becomes_its_outcome_and_a_grant_needs_its_order() {
        let batch = [purchase(1, 2), purchase(2, 1), purchase(3, 1)];
        let turns = [Grant, SoldOut, AlreadyPurchased];
        let outcomes = outcomes(&batch, &turns, &HashMap::from([(1, 70)])).unwrap();
        assert_eq!(
            outcomes,
            [
                Outcome::Placed { order_id: 70, quantity: 2 },
                Outcome::SoldOut,
                Outcome::AlreadyPurchased
            ]
        );
        assert!(super::outcomes(&batch, &turns, &HashMap::new()).is_err());
    }
}
