//! `naive`: check-then-act with no protection — the baseline that oversells.
//!
//! Read the stock, check it in the application, write back the value computed
//! from what was read, insert the order; all in one READ COMMITTED
//! transaction, which is exactly what it looks like it protects and does not:
//! two buyers who read the same stock both write `stock − 1`, the second
//! write overwrites the first (a lost update), and both orders stand. The
//! ledger drifts (`units_sold > total − remaining`) and, near the end, more
//! units are sold than exist.
//!
//! No delay is added to provoke the race; concurrency alone does it.
//!
//! The steps themselves, [`read_check_write`], are also the critical section of
//! every `lock/*` strategy: a lock is meant to make exactly this code safe, so
//! the lock strategies run it unchanged, with a [`WriteGuard`] that can refuse
//! the write of a holder that has lost its lock or its fencing claim.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};

use super::{Outcome, Strategy, StrategyError, already_purchased_or};
use crate::sale::{Quantity, Sale, UserId};

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
        match read_check_write(&self.db, sale, user, quantity, &Unguarded).await? {
            Attempt::Done(outcome) => Ok(outcome),
            Attempt::Refused => unreachable!("`Unguarded` admits every write"),
        }
    }
}

/// A condition checked inside the write transaction, after the simulated work
/// and just before the stock is written. Returning `false` abandons the
/// transaction: nothing is written.
#[async_trait]
pub trait WriteGuard: Send + Sync {
    /// Whether the write may go ahead. `tx` is the transaction the write will
    /// use, so a check made through it (a row lock) holds until the commit.
    async fn admits(&self, tx: &mut PgConnection) -> Result<bool, StrategyError>;
}

/// Admits every write: the plain `naive` strategy, and the lock strategies
/// that trust their lock.
pub struct Unguarded;

#[async_trait]
impl WriteGuard for Unguarded {
    async fn admits(&self, _tx: &mut PgConnection) -> Result<bool, StrategyError> {
        Ok(true)
    }
}

/// What [`read_check_write`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The steps ran to an outcome (an order, or sold out / already purchased).
    Done(Outcome),
    /// The [`WriteGuard`] refused the write; nothing was written.
    Refused,
}

/// The naive steps: in one READ COMMITTED transaction, read
/// `remaining_stock`, answer `SoldOut` when fewer than `quantity` units
/// remain, run the sale's simulated work (`Knobs::simulate_work`), ask
/// `guard`, then write `remaining − quantity` (the value computed from the
/// read, not a relative decrement) and insert the order.
///
/// Safe only when nothing else writes the sale's stock between the read and
/// the commit — which is what a lock, or a fencing guard, must ensure.
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
    let mut tx = db.begin().await?;
    let remaining: i64 = sqlx::query_scalar("SELECT remaining_stock FROM sales WHERE id = $1")
        .bind(sale.id.0)
        .fetch_one(&mut *tx)
        .await?;
    let wanted = i64::from(quantity.get());
    if remaining < wanted {
        return Ok(Attempt::Done(Outcome::SoldOut));
    }
    sale.knobs.simulate_work().await;
    if !guard.admits(&mut tx).await? {
        return Ok(Attempt::Refused);
    }
    sqlx::query("UPDATE sales SET remaining_stock = $2 WHERE id = $1")
        .bind(sale.id.0)
        .bind(remaining - wanted)
        .execute(&mut *tx)
        .await?;
    let order_id = match sqlx::query_scalar::<_, i64>(
        "INSERT INTO orders (sale_id, user_id, quantity) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(sale.id.0)
    .bind(user.get())
    .bind(quantity.get())
    .fetch_one(&mut *tx)
    .await
    {
        Ok(id) => id,
        // Dropping `tx` rolls the stock write back with the failed insert.
        Err(err) => return already_purchased_or(err).map(Attempt::Done),
    };
    tx.commit().await?;
    Ok(Attempt::Done(Outcome::Placed { order_id, quantity: quantity.get() }))
}
