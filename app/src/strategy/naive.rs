//! `naive`: check-then-act with no protection — the baseline that oversells.
//!
//! Read the stock, check it in the application, then write back the value
//! computed from what was read and insert the order (one statement). Nothing
//! protects the gap between the read and the write: two buyers who read the
//! same stock both write `stock − 1`, the second write overwrites the first
//! (a lost update), and both orders stand. The ledger drifts
//! (`units_sold > total − remaining`) and, near the end, more units are sold
//! than exist.
//!
//! No delay is added to provoke the race; concurrency alone does it.
//!
//! The steps themselves, [`read_check_write`], are also the critical section of
//! every `lock/*` strategy: a lock is meant to make exactly this code safe, so
//! the lock strategies run it unchanged, with a [`WriteGuard`] that can refuse
//! the write of a holder that has lost its lock or its fencing claim. The
//! units for sale they read include those the lock strategies return
//! outside the lock (`sales.returned_stock` not yet `folded_stock`), which
//! the write folds in; `naive` returns onto `remaining_stock` itself, so for
//! it both columns stay 0.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::lock::fence::FenceToken;
use super::{
    Backend, Claim, Outcome, Registration, Returned, Strategy, StrategyError, StrategyName,
    already_purchased_or,
};
use crate::sale::{Quantity, Sale, UserId};

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("naive");

/// `naive` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "check-then-act with no protection: the baseline that oversells",
    needs: &[Backend::Postgres],
    build: |deps| Ok(Arc::new(Naive::new(deps.db.clone()))),
    // Lost updates: it reads the stock, checks it in the application and
    // writes back the computed value with nothing between read and write.
    // Its returns (`payment`) are relative updates its own absolute write
    // can overwrite: it breaks under every condition.
    expect: |_| super::Expectation::Breaks,
    ..Registration::DEFAULTS
};

pub struct Naive {
    db: PgPool,
}

impl Naive {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }
}

#[async_trait]
impl Strategy for Naive {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        match read_check_write(&self.db, sale, user, quantity, &OwnWrite).await? {
            Attempt::Done(outcome) => Ok(outcome),
            Attempt::Refused => unreachable!("`OwnWrite` admits every write"),
        }
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go back on the sale row, as for `sql`. A purchase that read
    /// the stock before the return and writes after it overwrites the return
    /// (its write is absolute): the lost update this baseline demonstrates,
    /// seen by the audit as ledger drift.
    async fn return_units(&self, _sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        super::sql::return_to_sale_row(claim).await
    }
}

/// What a writer must still satisfy when [`read_check_write`] reaches its
/// write: the holder's own belief that it may write ([`WriteGuard::admits`],
/// asked after the read and the simulated work) and, for fenced holders, a
/// fencing claim that Postgres checks in the write statement itself
/// ([`WriteGuard::fence`]).
#[async_trait]
pub trait WriteGuard: Send + Sync {
    /// Whether the write may go ahead as far as the holder knows (a lock
    /// holder whose watchdog reported the lock lost says no). `false`
    /// abandons the write: nothing is written.
    async fn admits(&self) -> bool;

    /// The fencing token whose claim on the sale (`sale_fences`) must still
    /// stand when the write runs; `None` for an unfenced writer. The write
    /// statement share-locks the claim row, so no newer claim can land
    /// between the check and the commit (`super::lock::fence`).
    fn fence(&self) -> Option<FenceToken> {
        None
    }

    /// The strategy whose serial hold is the write statement's own row lock
    /// (`super::serial`): `naive`, which nothing else serialises. `None`
    /// (the default) inside a lock, whose holder records the lock's hold.
    fn serial(&self) -> Option<StrategyName> {
        None
    }
}

/// The plain `naive` strategy's guard: admits every write, and records the
/// write's row lock as its serial hold.
struct OwnWrite;

#[async_trait]
impl WriteGuard for OwnWrite {
    async fn admits(&self) -> bool {
        true
    }

    fn serial(&self) -> Option<StrategyName> {
        Some(NAME)
    }
}

/// Admits every write: the plain `naive` strategy, and the lock strategies
/// that trust their lock.
pub struct Unguarded;

#[async_trait]
impl WriteGuard for Unguarded {
    async fn admits(&self) -> bool {
        true
    }
}

/// What [`read_check_write`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The steps ran to an outcome (an order, or sold out / already purchased).
    Done(Outcome),
    /// The [`WriteGuard`] refused the write, or its fence no longer stood;
    /// nothing was written.
    Refused,
}

/// The write of [`read_check_write`]: set the stock to the value computed
/// from the read (`$2`, not a relative decrement) and insert the order, in one
/// statement, so that a duplicate buyer's failed insert also undoes its stock
/// write. Units a restock added since the read (`total_stock` grew past `$6`,
/// the total that was read) are carried into the written value: a restock is
/// an administrative write that no purchase lock covers, and it must never be
/// lost; purchases between the read and the write still are, which is what a
/// lock must prevent. The returned units that were read (`$7`, the
/// `returned_stock` read) are folded into the written value by setting
/// `folded_stock` to them: a return committed since the read is above `$7`,
/// and stays for sale. With a fencing token (`$5`), the stock row is written
/// only while the sale is still claimed by that token, and the claim stays
/// share-locked until the statement commits; with `$5` NULL the fence is not
/// consulted. No row back means the fence refused the write; the row is the
/// order id and the sale row's serial marks (`super::serial::Marks`).
const WRITE: &str = "
    WITH fence AS (
        SELECT 1 FROM sale_fences WHERE sale_id = $1 AND token = $5 FOR SHARE
    ), stock AS (
        UPDATE sales SET remaining_stock = $2 + (total_stock - $6), folded_stock = $7,
                         held_before = held_at, held_at = clock_timestamp(),
                         held_units_before = held_units, held_units = $4
        WHERE id = $1 AND ($5::bigint IS NULL OR EXISTS (SELECT 1 FROM fence))
        RETURNING id, held_before, held_units_before, held_at
    ), placed AS (
        INSERT INTO orders (sale_id, user_id, quantity)
        SELECT id, $3, $4 FROM stock
        RETURNING id
    )
    SELECT placed.id, stock.held_before, stock.held_units_before, stock.held_at,
           statement_timestamp()
    FROM placed, stock";

/// The naive steps: read the units for sale ([`ForSale`]); answer `SoldOut`
/// when fewer than `quantity` units remain; run the sale's simulated work
/// (`Knobs::simulate_work`); ask `guard`; then, in one statement, write
/// `remaining − quantity` (the value computed from the read, plus whatever a
/// restock added meanwhile) and insert the order. Two round trips to Postgres
/// and no transaction around them, which is the point: nothing stops another
/// purchase between the read and the write.
///
/// Safe only when no other purchase writes the sale's stock between the read
/// and the write — which is what a lock, or a fencing guard, must ensure.
///
/// Errors: Postgres failures as in `From<sqlx::Error>`; a duplicate buyer is
/// `Ok(Attempt::Done(Outcome::AlreadyPurchased))` and leaves the stock as it was.
pub async fn read_check_write(
    db: &PgPool,
    sale: &Sale,
    user: UserId,
    quantity: Quantity,
    guard: &dyn WriteGuard,
) -> Result<Attempt, StrategyError> {
    let read: ForSale = sqlx::query_as(
        "SELECT remaining_stock, returned_stock, folded_stock, total_stock FROM sales WHERE id = $1",
    )
    .bind(sale.id.0)
    .fetch_one(db)
    .await?;
    let wanted = i64::from(quantity.get());
    let Some(written_stock) = read.after(wanted) else {
        return Ok(Attempt::Done(Outcome::SoldOut));
    };
    sale.knobs.simulate_work().await;
    if !guard.admits().await {
        return Ok(Attempt::Refused);
    }
    type Row = (i64, Option<DateTime<Utc>>, Option<i32>, DateTime<Utc>, DateTime<Utc>);
    let written = sqlx::query_as::<_, Row>(WRITE)
        .bind(sale.id.0)
        .bind(written_stock)
        .bind(user.get())
        .bind(quantity.get())
        .bind(guard.fence().map(|token| token.0))
        .bind(read.total_stock)
        .bind(read.returned_stock)
        .fetch_optional(db)
        .await;
    match written {
        Ok(Some((order_id, held_before, units_before, held_at, began_at))) => {
            if let Some(strategy) = guard.serial() {
                let marks = super::serial::Marks { held_before, units_before, held_at, began_at };
                marks.record(strategy, 1);
            }
            Ok(Attempt::Done(Outcome::Placed { order_id, quantity: quantity.get() }))
        }
        Ok(None) => Ok(Attempt::Refused),
        Err(err) => already_purchased_or(err).map(Attempt::Done),
    }
}

/// The sale row as [`read_check_write`] reads it. Units of stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::FromRow)]
pub struct ForSale {
    /// `sales.remaining_stock`: the units on the row as last written.
    pub remaining_stock: i64,
    /// `sales.returned_stock`: units ever returned outside the sale's lock
    /// (the `lock/*` strategies' returns).
    pub returned_stock: i64,
    /// `sales.folded_stock`: how many of those a write has folded into
    /// `remaining_stock`.
    pub folded_stock: i64,
    /// `sales.total_stock`, to carry a concurrent restock into the write.
    pub total_stock: i64,
}

impl ForSale {
    /// Units for sale: the row's, plus the returns not folded yet.
    pub fn available(&self) -> i64 {
        self.remaining_stock + (self.returned_stock - self.folded_stock)
    }

    /// The `remaining_stock` to write once `wanted` units are taken and the
    /// returns read are folded in; `None` when fewer than `wanted` are for
    /// sale.
    pub fn after(&self, wanted: i64) -> Option<i64> {
        let available = self.available();
        (available >= wanted).then_some(available - wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::ForSale;

    fn row(remaining_stock: i64, returned_stock: i64, folded_stock: i64) -> ForSale {
        ForSale { remaining_stock, returned_stock, folded_stock, total_stock: 10 }
    }

    #[test]
    fn units_returned_and_not_folded_are_for_sale() {
        assert_eq!(row(0, 0, 0).after(1), None);
        assert_eq!(row(0, 3, 2).after(1), Some(0), "one return not folded yet");
        assert_eq!(row(0, 3, 3).after(1), None, "every return folded already");
        assert_eq!(row(2, 5, 4).after(3), Some(0));
        assert_eq!(row(2, 5, 4).after(4), None);
    }
}
