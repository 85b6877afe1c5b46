//! Who got the units: how close a run came to first come, first served.
//!
//! Two figures per run, from the buyers' arrival order (the schedule's order
//! for `arrival`, the order buyers were first sent otherwise) and the orders
//! Postgres holds:
//!
//! - `first_served`: of the first `stock` distinct buyers to arrive, the
//!   share that got a unit (an order of the sale, whatever became of it
//!   later). 1.0 is first come, first served; a strategy that serves at
//!   random among `demand × stock` buyers scores about `1 / demand`.
//! - `kendall_tau`: Kendall's τ-b between arrival order and order order
//!   among the buyers who got a unit — 1.0 when the units went in arrival
//!   order, 0 when the two orders are unrelated, −1.0 when reversed. "Order
//!   order" is the orders' `created_at` (the clock of the insert that took
//!   the unit, inside its transaction; the order id breaks a tie): the
//!   moment the strategy decided, which is what a buyer waiting in line
//!   sees. Neither ranking has ties (arrival ranks are positions, order
//!   ranks are distinct), so τ-b equals τ-a here. Computed with the
//!   `kendalls` crate (Knight's O(n log n) algorithm).
//!
//! A run with several sales is measured per sale (each sale's buyers, its
//! stock) and added up: `first_served` over every sale's first buyers,
//! `kendall_tau` weighted by each sale's winners. Buyers who came only after
//! the first answers (the `payment` profile's later buyers) are not in the
//! arrival order and are left out of both.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The fairness of one run (`runs[].fairness`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fairness {
    /// Of the first `stock` distinct buyers to arrive, the share that got a
    /// unit (0..=1); `None` without buyers.
    pub first_served: Option<f64>,
    /// Kendall's τ-b between arrival order and order order among the
    /// buyers who got a unit (−1..=1); `None` with fewer than two.
    pub kendall_tau: Option<f64>,
    /// Buyers of the arrival order who got a unit.
    pub winners: u64,
}

/// One sale's side of a run: its buyers in arrival order (repeats allowed:
/// the first counts), its stock in units, and its orders as
/// `(user_id, created_at, order id)` in any order.
pub struct SaleArrivals<'a> {
    pub arrivals: &'a [i64],
    pub stock: u64,
    pub orders: &'a [(i64, DateTime<Utc>, i64)],
}

/// The counts one sale contributes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Part {
    first: u64,
    served: u64,
    winners: u64,
    tau: Option<f64>,
}

/// The fairness of a run made of `sales`.
pub fn of_run(sales: &[SaleArrivals<'_>]) -> Fairness {
    let parts: Vec<Part> = sales.iter().map(of_sale).collect();
    let first: u64 = parts.iter().map(|p| p.first).sum();
    let served: u64 = parts.iter().map(|p| p.served).sum();
    let winners: u64 = parts.iter().map(|p| p.winners).sum();
    let weighted: Vec<(f64, f64)> =
        parts.iter().filter_map(|p| p.tau.map(|tau| (tau, p.winners as f64))).collect();
    let weight: f64 = weighted.iter().map(|(_, w)| w).sum();
    Fairness {
        first_served: (first > 0).then(|| served as f64 / first as f64),
        kendall_tau: (weight > 0.0)
            .then(|| weighted.iter().map(|(tau, w)| tau * w).sum::<f64>() / weight),
        winners,
    }
}

fn of_sale(sale: &SaleArrivals<'_>) -> Part {
    let mut seen = HashSet::new();
    let order: Vec<i64> = sale.arrivals.iter().copied().filter(|user| seen.insert(*user)).collect();
    let rank: HashMap<i64, usize> = order.iter().enumerate().map(|(i, &u)| (u, i)).collect();
    let mut winners: Vec<&(i64, DateTime<Utc>, i64)> =
        sale.orders.iter().filter(|(user, ..)| rank.contains_key(user)).collect();
    winners.sort_by_key(|&&(_, at, id)| (at, id));
    winners.dedup_by_key(|w| w.0);
    let first = order.len().min(usize::try_from(sale.stock).unwrap_or(usize::MAX));
    let got: HashSet<i64> = winners.iter().map(|w| w.0).collect();
    let served = order[..first].iter().filter(|user| got.contains(user)).count();
    let arrival: Vec<usize> = winners.iter().map(|w| rank[&w.0]).collect();
    let decided: Vec<usize> = (0..arrival.len()).collect();
    let tau = (arrival.len() >= 2)
        .then(|| kendalls::tau_b(&arrival, &decided).ok().map(|(tau, _)| tau))
        .flatten();
    Part { first: first as u64, served: served as u64, winners: winners.len() as u64, tau }
}

/// The orders of `sale` as [`SaleArrivals::orders`] reads them.
pub async fn orders(
    db: &sqlx::PgPool,
    sale: i64,
) -> anyhow::Result<Vec<(i64, DateTime<Utc>, i64)>> {
    Ok(sqlx::query_as("SELECT user_id, created_at, id FROM orders WHERE sale_id = $1")
        .bind(sale)
        .fetch_all(db)
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    /// Orders for `winners`, the first decided first.
    fn orders_in(winners: &[i64]) -> Vec<(i64, DateTime<Utc>, i64)> {
        winners.iter().enumerate().map(|(i, &u)| (u, at(i as i64), 100 + i as i64)).collect()
    }

    fn one(arrivals: &[i64], stock: u64, winners: &[i64]) -> Fairness {
        let orders = orders_in(winners);
        of_run(&[SaleArrivals { arrivals, stock, orders: &orders }])
    }

    #[test]
    fn first_come_first_served_scores_one_on_both() {
        let arrivals: Vec<i64> = (1..=30).collect();
        let fair = one(&arrivals, 10, &(1..=10).collect::<Vec<_>>());
        assert_eq!(fair.first_served, Some(1.0));
        assert!((fair.kendall_tau.unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(fair.winners, 10);
    }

    #[test]
    fn the_first_buyers_served_in_reverse_score_one_and_minus_one() {
        let arrivals: Vec<i64> = (1..=30).collect();
        let fair = one(&arrivals, 10, &(1..=10).rev().collect::<Vec<_>>());
        assert_eq!(fair.first_served, Some(1.0), "all of the first ten got a unit");
        assert!((fair.kendall_tau.unwrap() + 1.0).abs() < 1e-12, "in reverse");
    }

    #[test]
    fn the_last_buyers_served_score_zero_first_served() {
        let arrivals: Vec<i64> = (1..=30).collect();
        let fair = one(&arrivals, 10, &(21..=30).collect::<Vec<_>>());
        assert_eq!(fair.first_served, Some(0.0));
        assert!((fair.kendall_tau.unwrap() - 1.0).abs() < 1e-12, "but in their order");
    }

    /// Four winners, arrival ranks decided in the order 0, 2, 1, 3: five
    /// concordant pairs and one discordant out of six, τ = 4 / 6.
    #[test]
    fn one_swapped_pair_of_four_gives_tau_two_thirds() {
        let fair = one(&[1, 2, 3, 4, 5, 6], 4, &[1, 3, 2, 4]);
        assert!((fair.kendall_tau.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(fair.first_served, Some(1.0));
    }

    #[test]
    fn half_of_the_first_buyers_served_is_one_half() {
        let fair = one(&[1, 2, 3, 4, 5, 6, 7, 8], 4, &[1, 5, 2, 6]);
        assert_eq!(fair.first_served, Some(0.5));
    }

    #[test]
    fn repeats_and_strangers_are_ignored_and_ties_broken_by_order_id() {
        // Buyer 2 resubmits; buyer 99 (a later buyer) is not in the order.
        let arrivals = [1, 2, 2, 3, 4];
        let orders = vec![(99, at(0), 1), (3, at(5), 3), (1, at(5), 2)];
        let fair = of_run(&[SaleArrivals { arrivals: &arrivals, stock: 2, orders: &orders }]);
        assert_eq!(fair.winners, 2);
        assert_eq!(fair.first_served, Some(0.5), "of buyers 1 and 2, buyer 1");
        assert!((fair.kendall_tau.unwrap() - 1.0).abs() < 1e-12, "1 (order 2) before 3 (order 3)");
    }

    #[test]
    fn sales_add_up_their_first_buyers_and_weigh_tau_by_winners() {
        let (a, b) = (orders_in(&[1, 2, 3]), orders_in(&[12, 11]));
        let fair = of_run(&[
            SaleArrivals { arrivals: &[1, 2, 3, 4], stock: 3, orders: &a },
            SaleArrivals { arrivals: &[11, 12, 13, 14], stock: 3, orders: &b },
        ]);
        assert_eq!(fair.first_served, Some(5.0 / 6.0));
        // Sale a: 3 winners in order (τ = 1); sale b: 2 reversed (τ = −1).
        assert!((fair.kendall_tau.unwrap() - (3.0 - 2.0) / 5.0).abs() < 1e-12);
        assert_eq!(fair.winners, 5);
    }

    #[test]
    fn no_buyers_or_one_winner_has_no_figure() {
        let none = one(&[], 5, &[]);
        assert_eq!((none.first_served, none.kendall_tau, none.winners), (None, None, 0));
        let single = one(&[1, 2], 1, &[1]);
        assert_eq!((single.first_served, single.kendall_tau), (Some(1.0), None));
    }
}
