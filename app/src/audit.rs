//! Correctness figures of a sale, computed from Postgres alone.
//!
//! The load test reports oversell, drift and duplicates from here and never
//! from a strategy's own counters: a strategy that miscounts would otherwise
//! grade itself. All figures come from one statement, so they describe one
//! snapshot — of the sale row, its bucket rows (a sale whose stock is split,
//! `sql/buckets`) and its orders together.
//!
//! Table names are unqualified on purpose: a test can shadow `orders` with a
//! temporary table that lacks the unique constraint (temporary tables come
//! first in `search_path`) and check `duplicate_orders` on real duplicates.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::sale::SaleId;

/// The audit of one sale. Units are units of stock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Audit {
    pub sale_id: SaleId,
    /// `sales.strategy`.
    pub strategy: String,
    /// Units ever put on sale (initial stock + restocks).
    pub total_stock: i64,
    /// Units still for sale as stored: `sales.remaining_stock` plus the
    /// sale's bucket rows, for a strategy that splits its stock (the view
    /// `sale_stock`).
    pub remaining_stock: i64,
    /// Number of order rows.
    pub orders: i64,
    /// `sum(orders.quantity)`.
    pub units_sold: i64,
    /// `max(0, units_sold − total_stock)`: units sold that never existed.
    pub oversold: i64,
    /// `total_stock − remaining_stock − units_sold`. 0 for an exact ledger;
    /// negative after lost updates (more sold than the stock column lost),
    /// positive when stock was taken without an order (a leak).
    pub ledger_drift: i64,
    /// Order rows beyond the first per (sale, user). Always 0 while the unique
    /// constraint `orders_sale_user_key` exists.
    pub duplicate_orders: i64,
    /// `created_at` of the first and last order (`clock_timestamp()` at insert).
    pub first_order_at: Option<DateTime<Utc>>,
    pub last_order_at: Option<DateTime<Utc>>,
    /// Redis counter + open reservations without an order − Postgres
    /// `remaining_stock`, measured before any reconciliation: 0 when the
    /// strategy's counter mirrors Postgres exactly. `null` for strategies that
    /// keep no counter outside Postgres. Not computed here (this module reads
    /// Postgres alone): the audit route fills it in from the strategy.
    pub redis_drift: Option<i64>,
    /// Units a reconciler had to return or correct for this sale, over its
    /// life (`sales.reconcile_fixes`). `null` for strategies without a
    /// reconciler; 0 in a run without faults.
    pub reconcile_fixes: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct Row {
    strategy: String,
    total_stock: i64,
    remaining_stock: i64,
    orders: i64,
    units_sold: i64,
    duplicate_orders: i64,
    first_order_at: Option<DateTime<Utc>>,
    last_order_at: Option<DateTime<Utc>>,
    reconcile_fixes: Option<i64>,
}

const AUDIT: &str = "\
WITH per_user AS (
    SELECT count(*) AS n, sum(quantity) AS units,
           min(created_at) AS first_at, max(created_at) AS last_at
    FROM orders WHERE sale_id = $1 GROUP BY user_id
)
SELECT s.strategy, s.total_stock, st.remaining_stock, s.reconcile_fixes,
       coalesce(sum(p.n), 0)::bigint         AS orders,
       coalesce(sum(p.units), 0)::bigint     AS units_sold,
       coalesce(sum(p.n - 1), 0)::bigint     AS duplicate_orders,
       min(p.first_at)                       AS first_order_at,
       max(p.last_at)                        AS last_order_at
FROM sales s JOIN sale_stock st ON st.sale_id = s.id LEFT JOIN per_user p ON true
WHERE s.id = $1
GROUP BY s.id, st.remaining_stock";

/// Audits sale `id`. `Ok(None)` when the sale does not exist.
pub async fn audit(conn: &mut PgConnection, id: SaleId) -> Result<Option<Audit>, sqlx::Error> {
    let Some(row) = sqlx::query_as::<_, Row>(AUDIT).bind(id.0).fetch_optional(conn).await? else {
        return Ok(None);
    };
    Ok(Some(Audit {
        sale_id: id,
        strategy: row.strategy,
        total_stock: row.total_stock,
        remaining_stock: row.remaining_stock,
        orders: row.orders,
        units_sold: row.units_sold,
        oversold: (row.units_sold - row.total_stock).max(0),
        ledger_drift: row.total_stock - row.remaining_stock - row.units_sold,
        duplicate_orders: row.duplicate_orders,
        first_order_at: row.first_order_at,
        last_order_at: row.last_order_at,
        redis_drift: None,
        reconcile_fixes: row.reconcile_fixes,
    }))
}
