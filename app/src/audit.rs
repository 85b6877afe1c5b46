//! Correctness figures of a sale, computed from Postgres alone.
//!
//! The load test reports oversell, drift and duplicates from here and never
//! from a strategy's own counters: a strategy that miscounts would otherwise
//! grade itself. All figures come from one statement, so they describe one
//! snapshot — of the sale row, its bucket rows (a sale whose stock is split,
//! `sql/buckets`) and its orders together.
//!
//! With a payment window (`crate::lifecycle`) an order may end unpaid and
//! return its units. The figures count *live* orders (`pending_payment`,
//! `paid`) as sold, and the ended ones (`cancelled`, `expired`) as returned:
//! the ledger identity stays `total_stock = remaining_stock + units_sold`,
//! where `remaining_stock` holds the returned units that have not sold again
//! (docs/report-format.md states it with them).
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
    /// sale's bucket rows, for a strategy that splits its stock, plus the
    /// units a `lock/*` sale's returns put back that no lock holder has
    /// folded in yet (the view `sale_stock`).
    pub remaining_stock: i64,
    /// Number of live order rows (`pending_payment` or `paid`; every order
    /// of a sale without a payment window).
    pub orders: i64,
    /// `sum(quantity)` of the live orders: units held by buyers.
    pub units_sold: i64,
    /// Of `units_sold`, the units of orders still `pending_payment`.
    pub units_pending: i64,
    /// `sum(quantity)` of the orders that ended unpaid (`cancelled`,
    /// `expired`): units returned to the sale, once each.
    pub units_returned: i64,
    /// Of `units_returned`, the units sold again ([`resold`]): the units
    /// ever placed in an order beyond `total_stock`. 0 for a sale that
    /// never sold out.
    pub units_resold: i64,
    /// `max(0, units_sold − total_stock)`: units sold that never existed.
    pub oversold: i64,
    /// `total_stock − remaining_stock − units_sold`. 0 for an exact ledger;
    /// negative after lost updates (more sold than the stock column lost),
    /// positive when stock was taken without an order (a leak).
    pub ledger_drift: i64,
    /// Live order rows beyond the first per (sale, user). Always 0 while the
    /// unique index `orders_sale_user_key` exists.
    pub duplicate_orders: i64,
    /// `created_at` of the first and last order written, live or ended
    /// (`clock_timestamp()` at insert).
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
    units_pending: i64,
    units_returned: i64,
    duplicate_orders: i64,
    first_order_at: Option<DateTime<Utc>>,
    last_order_at: Option<DateTime<Utc>>,
    reconcile_fixes: Option<i64>,
}

const AUDIT: &str = "\
WITH per_user AS (
    SELECT count(*) FILTER (WHERE live)                     AS n,
           coalesce(sum(quantity) FILTER (WHERE live), 0)   AS units,
           coalesce(sum(quantity) FILTER (WHERE status = 'pending_payment'), 0) AS pending,
           coalesce(sum(quantity) FILTER (WHERE NOT live), 0) AS returned,
           min(created_at) AS first_at, max(created_at) AS last_at
    FROM (SELECT user_id, quantity, status, created_at,
                 status IN ('pending_payment', 'paid') AS live
          FROM orders WHERE sale_id = $1) o
    GROUP BY user_id
)
SELECT s.strategy, s.total_stock, st.remaining_stock, s.reconcile_fixes,
       coalesce(sum(p.n), 0)::bigint                     AS orders,
       coalesce(sum(p.units), 0)::bigint                 AS units_sold,
       coalesce(sum(p.pending), 0)::bigint               AS units_pending,
       coalesce(sum(p.returned), 0)::bigint              AS units_returned,
       coalesce(sum(greatest(p.n - 1, 0)), 0)::bigint    AS duplicate_orders,
       min(p.first_at)                                   AS first_order_at,
       max(p.last_at)                                    AS last_order_at
FROM sales s JOIN sale_stock st ON st.sale_id = s.id LEFT JOIN per_user p ON true
WHERE s.id = $1
GROUP BY s.id, st.remaining_stock";

/// Units of `returned` sold again, given the sale's `total_stock` and the
/// units it holds in live orders (`sold`). Units are interchangeable, so
/// which unit a buyer got cannot be told; the figure counts as resold the
/// units ever placed in an order (`sold + returned`) beyond the stock ever
/// put on sale — i.e. a purchase takes a never-sold unit while there is one.
/// Then `remaining = never-sold + (returned − resold)` and
/// `total_stock = never-sold + units_sold + (returned − resold)` on exact
/// books. Clamped to `0..=returned`, so broken books (an oversell) do not
/// make returns out of nothing.
pub fn resold(total_stock: i64, sold: i64, returned: i64) -> i64 {
    (sold + returned - total_stock).clamp(0, returned.max(0))
}

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
        units_pending: row.units_pending,
        units_returned: row.units_returned,
        units_resold: resold(row.total_stock, row.units_sold, row.units_returned),
        oversold: (row.units_sold - row.total_stock).max(0),
        ledger_drift: row.total_stock - row.remaining_stock - row.units_sold,
        duplicate_orders: row.duplicate_orders,
        first_order_at: row.first_order_at,
        last_order_at: row.last_order_at,
        redis_drift: None,
        reconcile_fixes: row.reconcile_fixes,
    }))
}

/// One order of a sale, as [`resale_delays_ms`] reads it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OrderTimes {
    pub id: i64,
    pub quantity: i32,
    /// When the order was written (`clock_timestamp()` at insert).
    pub created_at: DateTime<Utc>,
    /// `pending_payment`, `paid`, `cancelled` or `expired`.
    pub status: String,
    /// The end of its payment window; `None` without one.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was cancelled or expired (its units came back).
    pub ended_at: Option<DateTime<Utc>>,
}

/// Milliseconds from the expiry of each resold unit to its resale, in the
/// order the units came back; as many as [`resold`] counts on books that did
/// not oversell.
///
/// Units are interchangeable, so the pairing follows the convention of
/// [`resold`]: the unit placements of the sale in the order they were
/// written (`created_at`, then order id) take never-sold units while there
/// are any, so placement `total_stock + k` is the resale of the `k`-th unit
/// that came back (returns ordered by `ended_at`, then order id). Its delay
/// is that placement's `created_at` minus the returned order's `expires_at`
/// (the moment the unit was due back, so the sweep's lag counts), or its
/// `ended_at` for a cancelled order. Placements beyond the returns (an
/// oversell) pair with nothing.
///
/// Under that pairing a unit that comes back while others are still for
/// sale — never-sold units, or units that came back before it — is resold
/// only after them: its delay holds the sale's own line, as long as the
/// strategy takes to sell what is ahead of it. [`resale_waits_ms`] leaves
/// the line out.
pub fn resale_delays_ms(total_stock: i64, orders: &[OrderTimes]) -> Vec<f64> {
    resales(total_stock, orders).map(|r| ms(r.placed - r.due)).collect()
}

/// For each resold unit, as [`resale_delays_ms`] pairs them, the
/// milliseconds it waited beyond the sale's line: from the later of its due
/// time and the placement before its resale (the unit ahead of it in line
/// sold) to its resale. This is the time a returned unit stood for sale
/// with nothing ahead of it — what a return path that starves adds —,
/// whatever the strategy's pace of selling.
pub fn resale_waits_ms(total_stock: i64, orders: &[OrderTimes]) -> Vec<f64> {
    resales(total_stock, orders).map(|r| ms(r.placed - r.due.max(r.ahead))).collect()
}

/// One resale of [`resale_delays_ms`]'s pairing.
struct Resale {
    /// When the unit was due back (expiry, or the cancel).
    due: DateTime<Utc>,
    /// When the placement that resold it was written.
    placed: DateTime<Utc>,
    /// When the placement before that one was written.
    ahead: DateTime<Utc>,
}

fn resales(total_stock: i64, orders: &[OrderTimes]) -> impl Iterator<Item = Resale> {
    let mut placed: Vec<(DateTime<Utc>, i64)> = orders
        .iter()
        .flat_map(|o| std::iter::repeat_n((o.created_at, o.id), o.quantity.max(0) as usize))
        .collect();
    placed.sort();
    let mut returned: Vec<(DateTime<Utc>, i64, DateTime<Utc>)> = orders
        .iter()
        .filter(|o| o.status == "cancelled" || o.status == "expired")
        .filter_map(|o| {
            let ended = o.ended_at?;
            let due = if o.status == "expired" { o.expires_at.unwrap_or(ended) } else { ended };
            Some(std::iter::repeat_n((ended, o.id, due), o.quantity.max(0) as usize))
        })
        .flatten()
        .collect();
    returned.sort_by_key(|&(ended, id, _)| (ended, id));
    let first = usize::try_from(total_stock).unwrap_or(0);
    let times: Vec<DateTime<Utc>> = placed.into_iter().map(|(at, _)| at).collect();
    returned.into_iter().enumerate().filter_map(move |(k, (_, _, due))| {
        let placed = *times.get(first + k)?;
        let ahead = if first + k > 0 { times[first + k - 1] } else { placed };
        Some(Resale { due, placed, ahead })
    })
}

fn ms(delta: chrono::TimeDelta) -> f64 {
    delta.num_microseconds().unwrap_or(0) as f64 / 1000.0
}

/// Milliseconds from the end of each expired order's payment window
/// (`expires_at`) to the moment its units came back (`ended_at`, set by the
/// sweep that expired it), one figure per expired order, in no particular
/// order: the lag of the return itself, before any buyer could take the
/// units again. Cancelled orders are left out (a cancel returns at once).
pub fn return_delays_ms(orders: &[OrderTimes]) -> Vec<f64> {
    orders
        .iter()
        .filter(|o| o.status == "expired")
        .filter_map(|o| Some((o.ended_at? - o.expires_at?).num_microseconds().unwrap_or(0)))
        .map(|us| us as f64 / 1000.0)
        .collect()
}

/// The orders of sale `id`, for [`resale_delays_ms`], [`resale_waits_ms`]
/// and [`return_delays_ms`].
pub async fn order_times(
    conn: &mut PgConnection,
    id: SaleId,
) -> Result<Vec<OrderTimes>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, quantity, created_at, status, expires_at, ended_at \
         FROM orders WHERE sale_id = $1",
    )
    .bind(id.0)
    .fetch_all(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::{OrderTimes, resale_delays_ms, resale_waits_ms, resold, return_delays_ms};
    use chrono::{DateTime, TimeZone, Utc};

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    fn order(id: i64, created: i64, status: &str, ended: Option<i64>) -> OrderTimes {
        OrderTimes {
            id,
            quantity: 1,
            created_at: at(created),
            status: status.to_owned(),
            expires_at: Some(at(created + 1000)),
            ended_at: ended.map(at),
        }
    }

    #[test]
    fn the_kth_unit_back_is_resold_by_the_kth_placement_beyond_the_stock() {
        // 2 units: orders 1 and 2 take them; 1 expires (due at 1000, swept at
        // 1200), 2 expires (due at 1010, swept at 1300); order 3 at 1500
        // resells the first back, order 4 at 2000 the second.
        let orders = [
            order(1, 0, "expired", Some(1200)),
            order(2, 10, "expired", Some(1300)),
            order(4, 2000, "paid", None),
            order(3, 1500, "pending_payment", None),
        ];
        assert_eq!(resale_delays_ms(2, &orders), vec![500.0, 990.0]);
        // A cancelled order's unit is due back when it was cancelled.
        let cancelled = [order(1, 0, "cancelled", Some(300)), order(2, 700, "paid", None)];
        assert_eq!(resale_delays_ms(1, &cancelled), vec![400.0]);
        // Returned but not resold (stock left): no delay.
        assert!(resale_delays_ms(5, &orders).is_empty());
        assert_eq!(resale_delays_ms(2, &orders).len() as i64, resold(2, 2, 2));
    }

    #[test]
    fn a_resale_waits_beyond_the_line_only_once_the_unit_ahead_of_it_sold() {
        // 3 units; order 1 expires (due 1000, swept 1100) while the two
        // never-sold units are still for sale: they sell at 1500 and 4000,
        // and the returned unit at 4200. Its delay, 3200 ms, is mostly the
        // line; it waited 200 ms beyond the unit ahead of it.
        let mut orders = vec![
            order(1, 0, "expired", Some(1100)),
            order(2, 1500, "paid", None),
            order(3, 4000, "paid", None),
            order(4, 4200, "paid", None),
        ];
        assert_eq!(resale_delays_ms(3, &orders), vec![3200.0]);
        assert_eq!(resale_waits_ms(3, &orders), vec![200.0]);
        // Sold out when it came back: its whole delay is beyond the line.
        (orders[1].created_at, orders[2].created_at) = (at(400), at(500));
        assert_eq!(resale_waits_ms(3, &orders), resale_delays_ms(3, &orders));
        assert_eq!(resale_waits_ms(3, &orders), vec![3200.0]);
    }

    #[test]
    fn an_expired_orders_return_lag_runs_from_its_window_end_to_its_sweep() {
        // Window ends 1000 after creation; swept at 1200 and 1300 (lags 200
        // and 290); a cancel, a paid and a pending order have no return lag.
        let orders = [
            order(1, 0, "expired", Some(1200)),
            order(2, 10, "expired", Some(1300)),
            order(3, 20, "cancelled", Some(500)),
            order(4, 30, "paid", None),
            order(5, 40, "pending_payment", None),
        ];
        assert_eq!(return_delays_ms(&orders), vec![200.0, 290.0]);
    }

    #[test]
    fn returned_units_count_as_resold_only_beyond_the_stock_ever_put_on_sale() {
        // 10 units, 4 sold, 3 of them returned and nothing else sold: nothing
        // resold (the 3 are among the 9 remaining).
        assert_eq!(resold(10, 1, 3), 0);
        // Sold out (10 live), 3 returned and bought again: all 3 resold.
        assert_eq!(resold(10, 10, 3), 3);
        // Sold out, 5 returned, 2 of them bought again.
        assert_eq!(resold(10, 7, 5), 2);
        // No returns, nothing resold, whatever was sold.
        assert_eq!(resold(10, 12, 0), 0);
        // An oversell does not make more resold units than were returned.
        assert_eq!(resold(10, 14, 2), 2);
    }
}
