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

use async_trait::async_trait;
use sqlx::PgPool;

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
        let mut tx = self.db.begin().await?;
        let remaining: i64 = sqlx::query_scalar("SELECT remaining_stock FROM sales WHERE id = $1")
            .bind(sale.id.0)
            .fetch_one(&mut *tx)
            .await?;
        let wanted = i64::from(quantity.get());
        if remaining < wanted {
            return Ok(Outcome::SoldOut);
        }
        sale.knobs.simulate_work().await;
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
            Err(err) => return already_purchased_or(err),
        };
        tx.commit().await?;
        Ok(Outcome::Placed { order_id, quantity: quantity.get() })
    }
}
