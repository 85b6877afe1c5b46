//! Settling a batch of one sale's purchases in one Postgres transaction: the
//! steps that `queue`'s consumer and `sql/batched`'s group commit share,
//! whoever collected the batch and however its buyers are answered.
//!
//! 1. [`lock_sale`]: `SELECT … FOR UPDATE` on the sale row, reading its
//!    stock and knobs. Batches of one sale, from any number of processes,
//!    settle one after the other; and since READ COMMITTED takes a snapshot
//!    per statement, every later statement of the transaction sees all that
//!    the previous batch committed.
//! 2. [`ordered_buyers`]: which of the batch's buyers already have an order.
//! 3. The caller decides, in arrival order, who gets units.
//! 4. [`take_stock_and_order`]: one statement takes the granted units with a
//!    guarded `UPDATE … WHERE remaining_stock >= units` and writes their
//!    orders with one multi-row `INSERT`.
//!
//! With `B` purchases per batch the stock row is updated once per batch
//! instead of once per unit, which is what lifts the
//! one-unit-per-transaction ceiling of `sql`.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::serial::Marks;
use crate::sale::Knobs;

/// The sale row, read under its lock.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct LockedSale {
    /// `sales.remaining_stock`.
    pub remaining_stock: i64,
    /// `sales.per_user_limit`: units one buyer may take.
    pub per_user_limit: i32,
    /// `sales.starts_at` (inclusive); `None`: open from the start.
    pub starts_at: Option<DateTime<Utc>>,
    /// `sales.ends_at` (exclusive); `None`: never ends.
    pub ends_at: Option<DateTime<Utc>>,
    /// The sale's simulated work, which a batch runs once, under the lock.
    #[sqlx(flatten)]
    pub knobs: Knobs,
    /// When the locking statement began, by Postgres' clock: whether the
    /// batch waited through the previous holder's hold
    /// (`super::serial::Marks`).
    pub began_at: DateTime<Utc>,
}

/// Locks the sale row (`SELECT … FOR UPDATE`) and reads its stock, limit,
/// window and knobs. `Ok(None)`: no such sale.
pub async fn lock_sale(
    conn: &mut PgConnection,
    sale_id: i64,
) -> Result<Option<LockedSale>, sqlx::Error> {
    sqlx::query_as(
        "SELECT remaining_stock, per_user_limit, starts_at, ends_at,
                lock_lease_ms, work_ms, pause_ms, pause_ratio,
                statement_timestamp() AS began_at
         FROM sales WHERE id = $1 FOR UPDATE",
    )
    .bind(sale_id)
    .fetch_optional(conn)
    .await
}

/// The buyers among `$2` who have an order for sale `$1`, one
/// `(sale_id, user_id)` index probe each: the lateral `LIMIT 1` keeps the
/// planner from reading every order of the sale when its statistics are
/// stale or missing (see `queue::settle`'s `read_known`).
const BUYERS_WITH_AN_ORDER: &str = "\
SELECT o.user_id
FROM unnest($2::bigint[]) AS m(user_id)
CROSS JOIN LATERAL (
    SELECT user_id FROM orders WHERE sale_id = $1 AND user_id = m.user_id
        AND status IN ('pending_payment', 'paid') LIMIT 1
) o";

/// Those of `users` who have a live order for the sale (pending payment or
/// paid; a buyer whose order was cancelled or expired may buy again). Read after
/// [`lock_sale`], it includes every order an earlier batch committed.
pub async fn ordered_buyers(
    conn: &mut PgConnection,
    sale_id: i64,
    users: &[i64],
) -> Result<HashSet<i64>, sqlx::Error> {
    let ordered: Vec<i64> =
        sqlx::query_scalar(BUYERS_WITH_AN_ORDER).bind(sale_id).bind(users).fetch_all(conn).await?;
    Ok(ordered.into_iter().collect())
}

/// `$1` sale id, `$2` units, `$3` buyers, `$4` their quantities. One order
/// per buyer, or none at all when fewer than `$2` units remain; each row
/// also carries the sale row's serial marks (`super::serial::Marks`).
const TAKE_STOCK_AND_ORDER: &str = "\
WITH taken AS (
    UPDATE sales SET remaining_stock = remaining_stock - $2,
                     held_before = held_at, held_at = clock_timestamp(),
                     held_units_before = held_units, held_units = $2
    WHERE id = $1 AND remaining_stock >= $2
    RETURNING id, held_before, held_units_before, held_at
), placed AS (
    INSERT INTO orders (sale_id, user_id, quantity)
    SELECT taken.id, t.u, t.q FROM taken, unnest($3::bigint[], $4::integer[]) AS t(u, q)
    RETURNING user_id, id
)
SELECT placed.user_id, placed.id, taken.held_before, taken.held_units_before, taken.held_at
FROM placed, taken";

/// Takes the units of the `granted` (buyer, quantity) pairs with one guarded
/// `UPDATE` and writes their orders with one multi-row `INSERT`, in one
/// statement; returns buyer → order id, and the sale row's serial marks of a
/// batch whose lock was taken by a statement that began at `began_at`.
/// Nothing when nothing is granted.
///
/// Errors: Postgres errors (a quantity below 1 or a second order of a buyer
/// fails the statement on the orders' checks), and a guarded update that
/// refuses — which cannot happen after [`lock_sale`] read enough stock; the
/// batch is refused rather than write orders the stock does not cover.
pub async fn take_stock_and_order(
    conn: &mut PgConnection,
    sale_id: i64,
    granted: &[(i64, i32)],
    began_at: DateTime<Utc>,
) -> Result<(HashMap<i64, i64>, Option<Marks>), sqlx::Error> {
    #[cfg(feature = "failpoints")]
    crate::failpoints::reached::<()>(&crate::failpoints::BATCH_BEFORE_TAKE_STOCK, sale_id).await;
    if granted.is_empty() {
        return Ok((HashMap::new(), None));
    }
    let units: i64 = granted.iter().map(|&(_, quantity)| i64::from(quantity)).sum();
    let (users, quantities): (Vec<i64>, Vec<i32>) = granted.iter().copied().unzip();
    type Row = (i64, i64, Option<DateTime<Utc>>, Option<i32>, DateTime<Utc>);
    let orders: Vec<Row> = sqlx::query_as(TAKE_STOCK_AND_ORDER)
        .bind(sale_id)
        .bind(units)
        .bind(&users)
        .bind(&quantities)
        .fetch_all(conn)
        .await?;
    if orders.len() != granted.len() {
        return Err(sqlx::Error::Protocol(format!(
            "sale {sale_id}: the guarded update refused {units} units under the row lock"
        )));
    }
    let marks = orders.first().map(|&(_, _, held_before, units_before, held_at)| Marks {
        held_before,
        units_before,
        held_at,
        began_at,
    });
    Ok((orders.into_iter().map(|(user, order, ..)| (user, order)).collect(), marks))
}

/// Sizes of the batches that settled a sale's purchases (purchases per
/// batch): the median (the mean of the two middle batches for an even
/// count, as `percentile_cont(0.5)`), the largest and the mean.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchSizes {
    pub p50: f64,
    pub max: f64,
    pub mean: f64,
}

impl BatchSizes {
    /// From `counts`: batch size → batches of that size. `None` when there
    /// was no batch.
    pub fn of(counts: &BTreeMap<u32, u64>) -> Option<BatchSizes> {
        let batches: u64 = counts.values().sum();
        if batches == 0 {
            return None;
        }
        // The size of the batch at 0-based position `i` in size order.
        let at = |i: u64| {
            let mut seen = 0;
            counts.iter().find_map(|(&size, &n)| {
                seen += n;
                (i < seen).then_some(f64::from(size))
            })
        };
        let p50 = (at((batches - 1) / 2)? + at(batches / 2)?) / 2.0;
        let purchases: f64 = counts.iter().map(|(&size, &n)| f64::from(size) * n as f64).sum();
        let max =
            counts.iter().rev().find(|&(_, &n)| n > 0).map_or(0.0, |(&size, _)| f64::from(size));
        Some(BatchSizes { p50, max, mean: purchases / batches as f64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_sizes_are_the_median_largest_and_mean_of_the_counts() {
        assert_eq!(BatchSizes::of(&BTreeMap::new()), None);
        let odd = BTreeMap::from([(1, 2), (10, 1)]);
        assert_eq!(BatchSizes::of(&odd), Some(BatchSizes { p50: 1.0, max: 10.0, mean: 4.0 }));
        let even = BTreeMap::from([(2, 1), (4, 1), (9, 2)]);
        assert_eq!(BatchSizes::of(&even), Some(BatchSizes { p50: 6.5, max: 9.0, mean: 6.0 }));
        let one = BTreeMap::from([(7, 1), (8, 0)]);
        assert_eq!(BatchSizes::of(&one), Some(BatchSizes { p50: 7.0, max: 7.0, mean: 7.0 }));
    }
}
