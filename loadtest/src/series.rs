//! How a sale unfolded, second by second: the units sold in each second of
//! a run's sale phase (saved in report.json as `sold_per_second`, drawn in
//! report.html), and the live samples of the run in progress that
//! `--serve-progress` shows (`crate::live`).
//!
//! Units sold are read from Postgres — the orders' `created_at`
//! (`clock_timestamp()` at insert) for the saved series, the orders' sum for
//! a live sample — never from the answers the load generator received: a
//! `202` is not a sale, and an oversold unit is one the books hold.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Most entries of a saved series: an hour of sale phase. Later orders
/// count in the last entry (a sale phase ends long before: the `queue`
/// drain is given 2 minutes).
pub const MAX_SECONDS: usize = 3600;

/// Units sold in each whole second after `start` (the sale phase's first
/// send): entry `i` adds up the quantities of the orders whose `created_at`
/// falls in `[start + i s, start + (i + 1) s)`. An order stamped before
/// `start` (the database's clock a little behind the load generator's)
/// counts in entry 0. Empty when there is no order.
pub fn sold_per_second(orders: &[(DateTime<Utc>, i64)], start: DateTime<Utc>) -> Vec<i64> {
    let second = |at: DateTime<Utc>| {
        let micros = (at - start).num_microseconds().unwrap_or(i64::MAX).max(0);
        ((micros / 1_000_000) as usize).min(MAX_SECONDS - 1)
    };
    let Some(last) = orders.iter().map(|(at, _)| second(*at)).max() else { return Vec::new() };
    let mut series = vec![0; last + 1];
    for (at, quantity) in orders {
        series[second(*at)] += quantity;
    }
    series
}

/// The first second in which the units sold so far exceed `stock`: where
/// oversell began; `None` when it never did.
pub fn oversell_began(series: &[i64], stock: i64) -> Option<usize> {
    let mut sold = 0;
    series.iter().position(|units| {
        sold += units;
        sold > stock
    })
}

/// The run's sales as Postgres holds them at one moment, added up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Books {
    pub total_stock: i64,
    pub remaining_stock: i64,
    /// Units of the sales' orders.
    pub sold: i64,
    /// Units sold beyond each sale's stock, added up over the sales (one
    /// sale's oversell is never offset by another's unsold stock).
    pub oversold: i64,
}

impl Books {
    /// The books of `sales` now: one query over `sale_stock` and the live
    /// `orders` (those that ended unpaid returned their units).
    pub async fn read(db: &sqlx::PgPool, sales: &[i64]) -> Result<Books, sqlx::Error> {
        sqlx::query_as(
            "SELECT COALESCE(SUM(s.total_stock), 0)::bigint AS total_stock, \
                    COALESCE(SUM(s.remaining_stock), 0)::bigint AS remaining_stock, \
                    COALESCE(SUM(o.units), 0)::bigint AS sold, \
                    COALESCE(SUM(GREATEST(COALESCE(o.units, 0) - s.total_stock, 0)), 0)::bigint \
                      AS oversold \
             FROM sale_stock s \
             LEFT JOIN (SELECT sale_id, SUM(quantity) AS units FROM orders \
                        WHERE sale_id = ANY($1) AND status IN ('pending_payment', 'paid') \
                        GROUP BY sale_id) o USING (sale_id) \
             WHERE s.sale_id = ANY($1)",
        )
        .bind(sales)
        .fetch_one(db)
        .await
    }
}

/// One second (or so) of a run in progress, as the live view draws it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the sale phase began.
    pub t_s: f64,
    /// Units sold so far (Postgres).
    pub sold: i64,
    /// Units sold per second since the previous sample.
    pub sold_per_s: f64,
    /// Purchase answers other than `201` and `202` (sold out, already
    /// purchased, busy, …) so far, as the load generator received them.
    pub rejected: u64,
    /// The same, per second since the previous sample.
    pub rejected_per_s: f64,
    /// Remaining stock (Postgres; a baseline's lost updates show here as
    /// stock that does not match the units sold).
    pub stock_left: i64,
    /// Units sold beyond the stock so far, as the audit counts them.
    pub oversold: i64,
}

impl Sample {
    /// The sample at `t_s` of `books` and `rejected` answers so far, after
    /// the previous sample (`None` for the first: its rates run from 0 at
    /// the phase's start).
    pub fn next(previous: Option<&Sample>, t_s: f64, books: Books, rejected: u64) -> Sample {
        let (t0, sold0, rejected0) = previous.map_or((0.0, 0, 0), |p| (p.t_s, p.sold, p.rejected));
        let dt = t_s - t0;
        let rate = |delta: f64| if dt > 0.0 { (delta / dt).max(0.0) } else { 0.0 };
        Sample {
            t_s,
            sold: books.sold,
            sold_per_s: rate((books.sold - sold0) as f64),
            rejected,
            rejected_per_s: rate(rejected.saturating_sub(rejected0) as f64),
            stock_left: books.remaining_stock,
            oversold: books.oversold,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn orders_are_counted_in_the_second_they_were_written() {
        let orders = [(at(100), 1), (at(999), 2), (at(1_000), 1), (at(3_500), 4), (at(-20), 1)];
        assert_eq!(sold_per_second(&orders, at(0)), vec![4, 1, 0, 4]);
        assert_eq!(sold_per_second(&[], at(0)), Vec::<i64>::new());
        let late = [(at(10_000_000), 1)];
        assert_eq!(sold_per_second(&late, at(0)).len(), MAX_SECONDS, "capped");
    }

    #[test]
    fn oversell_begins_in_the_second_the_units_pass_the_stock() {
        assert_eq!(oversell_began(&[4, 1, 0, 4], 5), Some(3));
        assert_eq!(oversell_began(&[4, 1, 0, 4], 9), None);
        assert_eq!(oversell_began(&[6], 5), Some(0));
    }

    #[test]
    fn a_sample_rates_what_changed_since_the_previous_one() {
        let books = |sold, remaining, oversold| Books {
            total_stock: 100,
            remaining_stock: remaining,
            sold,
            oversold,
        };
        let first = Sample::next(None, 0.5, books(40, 60, 0), 10);
        assert_eq!((first.sold_per_s, first.rejected_per_s), (80.0, 20.0));
        let second = Sample::next(Some(&first), 1.5, books(110, 0, 10), 310);
        assert_eq!((second.sold_per_s, second.rejected_per_s), (70.0, 300.0));
        assert_eq!((second.stock_left, second.oversold), (0, 10));
        let same_time = Sample::next(Some(&second), 1.5, books(110, 0, 10), 310);
        assert_eq!(same_time.sold_per_s, 0.0);
    }
}
