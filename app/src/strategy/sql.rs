//! `sql`: a conditional `UPDATE … WHERE remaining_stock >= qty` and the order
//! insert, atomically.
//!
//! The guard lives in the `WHERE` clause, so Postgres re-checks it against the
//! latest committed row version after waiting for the row lock (the
//! EvalPlanQual recheck of READ COMMITTED; PostgreSQL manual, "Transaction
//! Isolation"): stock can never go below zero and no update is lost.
//!
//! Both steps are one statement — a data-modifying CTE whose `INSERT` reads
//! the `UPDATE`'s `RETURNING` — so the row lock is held only while Postgres
//! executes it, not across client round trips. That is what keeps a hot row
//! fast: the ceiling is the server's, not the network's. A unique violation on
//! `orders_sale_user_key` aborts the statement, which undoes the decrement
//! with it; a duplicate buyer never costs a unit (no `ON CONFLICT DO NOTHING`
//! after a decrement).
//!
//! When the sale simulates work (`work_ms`, `pause_ms`), the statement runs in
//! an explicit transaction and the work happens before `COMMIT`, while the row
//! lock is held — the honest place for a slow step inside the transaction.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, PgPool};

use super::serial::Marks;
use super::{
    Backend, Claim, Outcome, Registration, Returned, Strategy, StrategyError, StrategyName,
    already_purchased_or,
};
use crate::sale::{Quantity, Sale, SaleId, UserId};

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("sql");

/// `sql` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "conditional UPDATE … WHERE remaining_stock >= qty and the order insert, one statement",
    needs: &[Backend::Postgres],
    build: |deps| Ok(Arc::new(Sql::new(deps.db.clone(), NAME))),
    // Expected correct everywhere (the default): one conditional statement,
    // and under READ COMMITTED a waiter re-evaluates `remaining_stock >= q`
    // on the newest row version.
    transaction: Some(|db, sale, user, quantity| {
        Box::pin(async move { take_and_order(&db, sale, user, quantity).await })
    }),
    ..Registration::DEFAULTS
};

/// `$1` sale id, `$2` user id, `$3` quantity. Returns the order id and the
/// row's serial marks (`super::serial::Marks`: the previous holder's, this
/// one's, when the statement began), or no row when fewer than `$3` units
/// remain.
const TAKE_AND_ORDER: &str = "\
WITH taken AS (
    UPDATE sales SET remaining_stock = remaining_stock - $3,
                     held_before = held_at, held_at = clock_timestamp(),
                     held_units_before = held_units, held_units = $3
    WHERE id = $1 AND remaining_stock >= $3
    RETURNING id, held_before, held_at, held_units_before
), placed AS (
    INSERT INTO orders (sale_id, user_id, quantity)
    SELECT id, $2, $3 FROM taken
    RETURNING id
)
SELECT placed.id, taken.held_before, taken.held_units_before, taken.held_at,
       statement_timestamp()
FROM placed, taken";

/// `$1` sale id, `$2` units: units of an order that ended unpaid, back on
/// the sale row.
const RETURN_TO_SALE_ROW: &str =
    "UPDATE sales SET remaining_stock = remaining_stock + $2 WHERE id = $1";

/// Puts the units of `claim`'s orders back on their sale row, one write, in
/// the claim's transaction (the row lock it takes orders it after any
/// purchase holding the row), and ends the orders. The return of every strategy that keeps its
/// stock on the sale row and changes it relatively or under the row lock:
/// `sql`, `sql/for-update`, `sql/batched`, `naive`.
pub async fn return_to_sale_row(claim: Claim) -> Result<Returned, StrategyError> {
    let mut claim = claim;
    sqlx::query(RETURN_TO_SALE_ROW)
        .bind(claim.sale().0)
        .bind(claim.units())
        .execute(claim.conn())
        .await?;
    claim.end().await
}

pub struct Sql {
    db: PgPool,
    /// The strategy whose serial holds this one records: `sql`, or a
    /// strategy that runs the `sql` transaction as its own last step.
    label: StrategyName,
}

impl Sql {
    pub fn new(db: PgPool, label: StrategyName) -> Self {
        Self { db, label }
    }
}

/// The `sql` strategy's statement on `executor`: in autocommit (a pool) it
/// is the whole transaction. Public so that the load test's `sql_tps`
/// ceiling issues exactly the same transaction, and `sql/batched` the same
/// statement when it settles a batch one purchase at a time.
pub async fn take_and_order<'e>(
    executor: impl PgExecutor<'e>,
    sale: SaleId,
    user: UserId,
    quantity: Quantity,
) -> Result<Outcome, StrategyError> {
    Ok(take_and_order_marked(executor, sale, user, quantity).await?.0)
}

/// [`take_and_order`], with the sale row's serial marks when it placed an
/// order.
async fn take_and_order_marked<'e>(
    executor: impl PgExecutor<'e>,
    sale: SaleId,
    user: UserId,
    quantity: Quantity,
) -> Result<(Outcome, Option<Marks>), StrategyError> {
    type Row = (i64, Option<DateTime<Utc>>, Option<i32>, DateTime<Utc>, DateTime<Utc>);
    let row = sqlx::query_as::<_, Row>(TAKE_AND_ORDER)
        .bind(sale.0)
        .bind(user.get())
        .bind(quantity.get())
        .fetch_optional(executor)
        .await;
    match row {
        Ok(Some((order_id, held_before, units_before, held_at, began_at))) => Ok((
            Outcome::Placed { order_id, quantity: quantity.get() },
            Some(Marks { held_before, units_before, held_at, began_at }),
        )),
        Ok(None) => Ok((Outcome::SoldOut, None)),
        Err(err) => Ok((already_purchased_or(err)?, None)),
    }
}

#[async_trait]
impl Strategy for Sql {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        if !sale.knobs.simulates_work() {
            let (outcome, marks) = take_and_order_marked(&self.db, sale.id, user, quantity).await?;
            if let Some(marks) = marks {
                marks.record(self.label, 1);
            }
            return Ok(outcome);
        }
        let mut tx = self.db.begin().await?;
        let (outcome, marks) = take_and_order_marked(&mut *tx, sale.id, user, quantity).await?;
        if let (Outcome::Placed { .. }, Some(marks)) = (&outcome, marks) {
            sale.knobs.simulate_work().await;
            tx.commit().await?;
            marks.record(self.label, 1);
        }
        Ok(outcome)
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go back on the sale row (`UPDATE … + qty`), in the claim's
    /// transaction.
    async fn return_units(&self, _sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        return_to_sale_row(claim).await
    }
}
