//! Steady-state rates: the part of a phase after its start-up and before
//! its tail.
//!
//! A phase's whole-phase rate mixes three regimes: the start (goose users
//! launching, pools and caches warming), the steady middle, and the tail
//! (the last buyers, a queue draining). In a short sale the start and the
//! tail weigh as much as the middle, and strategies with different start-up
//! costs swap places. So a rate is measured between the moments 10 % and
//! 90 % of its events had happened:
//!
//! - sell-through: units sold between the orders that brought the units
//!   sold to 10 % and to 90 % of the run's total, over the time between
//!   those orders' `created_at` (`clock_timestamp()` when the row was
//!   inserted, within the committing transaction: the commit follows within
//!   the same statement's round trip);
//! - answers (rejections, the `http_rps` ceiling): answers whose time falls
//!   between 10 % and 90 % of the phase's length, over 80 % of that length.
//!
//! A window shorter than the comparison's `--steady-window-s` (default
//! [`MIN_WINDOW_S`]) is reported, not ranked; sale sizing
//! ([`crate::sizing`]) aims above it.

use chrono::{DateTime, Utc};

/// Share of a phase cut from each end.
pub const TRIM: f64 = 0.1;

/// The default shortest steady window whose rate ranks strategies,
/// seconds. The regular events of the purchase path recur at most once a
/// second (the service's sold-out flag, the lock generations' 1 s wait
/// limit, the payment sweep's 0.5 s pass), so a window of 3 s holds each
/// of them at least three times; a window of half a second (the previous
/// threshold) held none of them for the fastest strategies, and their
/// rank changed with the stock (docs/report-format.md, "Steady windows").
pub const MIN_WINDOW_S: f64 = 3.0;

/// The steady window of a sale: units sold in it, its length and its
/// bounds (the commit times of the orders that open and close it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub units: i64,
    pub seconds: f64,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

impl Window {
    /// Units per second; `None` for an empty window.
    pub fn rate(&self) -> Option<f64> {
        (self.seconds > 0.0 && self.units > 0).then(|| self.units as f64 / self.seconds)
    }

    /// Whether the window is shorter than `min_s` seconds, too short to
    /// rank (see [`MIN_WINDOW_S`]).
    pub fn is_too_short(&self, min_s: f64) -> bool {
        self.seconds < min_s
    }
}

/// The steady window of a sale from its orders, `(created_at, quantity)`
/// in any order: from the order at which the cumulative units reach
/// `TRIM` of the total to the one at which they reach `1 − TRIM`; the
/// units counted are those sold after the first of the two up to the
/// second. `None` with fewer than two orders.
pub fn sale_window(orders: &[(DateTime<Utc>, i64)]) -> Option<Window> {
    if orders.len() < 2 {
        return None;
    }
    let mut sorted = orders.to_vec();
    sorted.sort_by_key(|(at, _)| *at);
    let total: i64 = sorted.iter().map(|(_, q)| q).sum();
    let at_share = |share: f64| {
        let target = (total as f64 * share).ceil().max(1.0) as i64;
        let mut sum = 0;
        sorted.iter().position(|(_, q)| {
            sum += q;
            sum >= target
        })
    };
    let (start, end) = (at_share(TRIM)?, at_share(1.0 - TRIM)?);
    let units: i64 = sorted[start + 1..=end.max(start)].iter().map(|(_, q)| q).sum();
    let seconds = (sorted[end].0 - sorted[start].0).num_microseconds().unwrap_or(0) as f64 / 1e6;
    Some(Window { units, seconds, from: sorted[start].0, to: sorted[end].0 })
}

/// Answers per second between `TRIM` and `1 − TRIM` of a phase that lasted
/// `phase_s`, from each answer's time after the phase's start (any order,
/// seconds); 0 for an empty phase.
pub fn answer_rate(answers_s: &[f64], phase_s: f64) -> f64 {
    let (from, to) = (phase_s * TRIM, phase_s * (1.0 - TRIM));
    if to <= from {
        return 0.0;
    }
    let inside = answers_s.iter().filter(|t| (from..to).contains(*t)).count();
    inside as f64 / (to - from)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn a_sale_window_skips_a_slow_start_and_a_slow_tail() {
        // 100 units: 10 in the first second (start-up), then one every 10 ms
        // for 80 units, then 10 more over 5 s (the tail).
        let mut orders: Vec<_> = (0..10).map(|i| (at(i * 100), 1)).collect();
        orders.extend((1..=80).map(|i| (at(900 + i * 10), 1)));
        orders.extend((1..=10).map(|i| (at(1_700 + i * 500), 1)));
        orders.reverse();
        let window = sale_window(&orders).unwrap();
        // From the 10th unit (900 ms) to the 90th (1 700 ms): 80 units.
        assert_eq!(window.units, 80);
        assert!((window.seconds - 0.8).abs() < 1e-9, "{window:?}");
        assert_eq!(window.rate(), Some(100.0));
        assert!(!window.is_too_short(0.5) && window.is_too_short(MIN_WINDOW_S));
        assert_eq!((window.from, window.to), (at(900), at(1_700)));
        // The whole-phase rate would say 100 units in 6.7 s.
    }

    #[test]
    fn a_sale_window_counts_quantities_and_flags_short_windows() {
        let orders = [(at(0), 5), (at(100), 5), (at(200), 5), (at(300), 5)];
        // 20 units: 10 % is reached by the first order, 90 % by the fourth.
        let window = sale_window(&orders).unwrap();
        assert_eq!((window.units, window.seconds), (15, 0.3));
        assert!(window.is_too_short(0.5));
        assert_eq!(sale_window(&orders[..1]), None);
        let same_time = sale_window(&[(at(5), 1), (at(5), 1)]).unwrap();
        assert_eq!(same_time.rate(), None, "no time elapsed");
    }

    #[test]
    fn the_answer_rate_leaves_out_the_first_and_last_tenth() {
        // A 10 s phase: a burst of 1 000 answers in its first second, then
        // 100 per second.
        let mut answers: Vec<f64> = (0..1_000).map(|i| i as f64 / 1_000.0).collect();
        answers.extend((0..900).map(|i| 1.0 + i as f64 / 100.0));
        let rate = answer_rate(&answers, 10.0);
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        assert_eq!(answer_rate(&answers, 0.0), 0.0);
    }
}
