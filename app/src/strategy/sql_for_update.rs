//! `sql/for-update`: the pessimistic form of `sql`.
//!
//! `SELECT … FOR UPDATE` locks the sale row, the application checks the stock
//! it read, then updates it and inserts the order, all in one transaction.
//! Correct — the row lock serialises every buyer from the read to the commit —
//! but the lock is held across four client round trips instead of one
//! statement, which is what it costs compared with `sql`.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{
    Backend, Claim, Outcome, Registration, Returned, Strategy, StrategyError, StrategyName,
    already_purchased_or, serial,
};
use crate::sale::{Quantity, Sale, UserId};

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("sql/for-update");

/// `sql/for-update` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "SELECT … FOR UPDATE, check, update, insert, in one transaction",
    needs: &[Backend::Postgres],
    build: |deps| Ok(Arc::new(SqlForUpdate::new(deps.db.clone()))),
    // Expected correct everywhere (the default): the row lock is held from
    // the read to the commit.
    ..Registration::DEFAULTS
};

pub struct SqlForUpdate {
    db: PgPool,
}

impl SqlForUpdate {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }
}

#[async_trait]
impl Strategy for SqlForUpdate {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let mut tx = self.db.begin().await?;
        let (remaining, began_at): (i64, DateTime<Utc>) = sqlx::query_as(
            "SELECT remaining_stock, statement_timestamp() FROM sales WHERE id = $1 FOR UPDATE",
        )
        .bind(sale.id.0)
        .fetch_one(&mut *tx)
        .await?;
        let wanted = i64::from(quantity.get());
        if remaining < wanted {
            return Ok(Outcome::SoldOut);
        }
        sale.knobs.simulate_work().await;
        // The serial marks (`super::serial`): this holder's lands at the
        // update, the same point of every holder's critical section.
        type Row = (Option<DateTime<Utc>>, Option<i32>, DateTime<Utc>);
        let (held_before, units_before, held_at): Row = sqlx::query_as(
            "UPDATE sales SET remaining_stock = remaining_stock - $2,
                              held_before = held_at, held_at = clock_timestamp(),
                              held_units_before = held_units, held_units = $2
             WHERE id = $1 RETURNING held_before, held_units_before, held_at",
        )
        .bind(sale.id.0)
        .bind(wanted)
        .fetch_one(&mut *tx)
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
            Err(err) => return already_purchased_or(err),
        };
        tx.commit().await?;
        serial::Marks { held_before, units_before, held_at, began_at }.record(NAME, 1);
        Ok(Outcome::Placed { order_id, quantity: quantity.get() })
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go back on the sale row, as for `sql`: the relative update
    /// waits for the row lock a purchase's `SELECT … FOR UPDATE` holds, so
    /// the purchase's read-and-write is not overtaken.
    async fn return_units(&self, _sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        super::sql::return_to_sale_row(claim).await
    }
}
