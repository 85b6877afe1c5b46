//! The time a purchase holds its sale's serial resource: the part of its
//! work during which nothing else can sell the same sale, whatever the
//! hardware. Its sum over a run ÷ the units those holds sold is the
//! strategy's serial time per unit, and its inverse the most one sale can
//! sell per second on any number of cores (Amdahl's law: the serial part
//! bounds the speed-up; docs/scaling.md).
//!
//! Every strategy records holds in the histogram
//! [`SERIAL_HOLD_DURATION_SECONDS`] and the units they sold in the counter
//! [`SERIAL_HOLD_UNITS_TOTAL`] (label `strategy`), from the clocks of the
//! component that holds the resource:
//!
//! - **a stock row's lock** (`sql`, `redis-decr`'s transaction,
//!   `sql/for-update`, a `sql/buckets` bucket, `naive`'s write): by
//!   Postgres' clock, from [`Marks`]. The `UPDATE` that takes the row writes
//!   the moment it holds the lock (`held_at`, `clock_timestamp()`) and moves
//!   the previous holder's to `held_before`. A purchase whose statement (for
//!   `sql/for-update`, its `FOR UPDATE`) began before the previous holder's
//!   mark waited through that holder's whole hold, commit included, and took
//!   the lock when it was released: the gap between the two marks is the
//!   previous holder's hold (and the hand-over), for the units it took (the
//!   row keeps them too). Only such purchases record a hold, so the figure
//!   is the mean over the holds seen under contention, which a burst
//!   provides in plenty. The service's own clock would add its wait for a
//!   core between the commit and reading the answer, which on a busy machine
//!   is longer than the hold itself.
//! - **a `sql/batched` batch**: the same marks, written by the batch's one
//!   `UPDATE` of the sale row, for the batch's units.
//! - **a `queue` consumer's batch**: by the service's monotonic clock
//!   ([`Hold`]), the batch's whole transaction, for the units it sold: the
//!   partition's one active consumer is the serial resource (nothing waits
//!   for its row lock, so no mark measures it), and it is the holder, so
//!   its own waits for a core are part of the hold.
//! - **the Redis lock** (`lock/*`): by the service's monotonic clock, from
//!   the acquisition's answer to the release's, whatever the purchase sold —
//!   the service is the holder there, so its waits for a core are the
//!   lock's hold.
//!
//! A sale whose stock is spread over `N` rows (`sql/buckets`) has `N` locks
//! that sell at once: each hold is recorded as `1/N` of itself (`lanes`),
//! so that the figure is still the sale's serial time per unit.

use std::time::Instant;

use chrono::{DateTime, Utc};

use super::StrategyName;
use crate::metric_names::{SERIAL_HOLD_DURATION_SECONDS, SERIAL_HOLD_UNITS_TOTAL};

/// Records one hold of `seconds` of `strategy`'s serial resource that sold
/// `units`, out of `lanes` (at least 1) that sell the same sale at once.
pub fn record(strategy: StrategyName, seconds: f64, units: u64, lanes: i32) {
    let share = seconds.max(0.0) / f64::from(lanes.max(1));
    metrics::histogram!(SERIAL_HOLD_DURATION_SECONDS, "strategy" => strategy.as_str())
        .record(share);
    metrics::counter!(SERIAL_HOLD_UNITS_TOTAL, "strategy" => strategy.as_str()).increment(units);
}

/// Lists `strategy`'s units counter at `/metrics`, at 0, before its first
/// hold; the hold histogram shows from its first hold (the exporter leaves
/// a histogram without samples out).
pub fn register(strategy: StrategyName) {
    let _registered =
        metrics::histogram!(SERIAL_HOLD_DURATION_SECONDS, "strategy" => strategy.as_str());
    metrics::counter!(SERIAL_HOLD_UNITS_TOTAL, "strategy" => strategy.as_str()).increment(0);
}

/// What the `UPDATE` that took a stock row returned: the previous holder's
/// mark and units, this one's mark, and when this purchase's statement
/// began (Postgres' `statement_timestamp()`), all by Postgres' clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marks {
    pub held_before: Option<DateTime<Utc>>,
    pub units_before: Option<i32>,
    pub held_at: DateTime<Utc>,
    pub began_at: DateTime<Utc>,
}

impl Marks {
    /// The previous holder's hold, when this purchase waited through all of
    /// it (it began before that holder's mark).
    pub fn previous_hold_s(&self) -> Option<f64> {
        let before = self.held_before.filter(|before| self.began_at < *before)?;
        Some((self.held_at - before).num_microseconds()? as f64 / 1e6)
    }

    /// Records the previous holder's hold and units, if this purchase
    /// waited through it.
    pub fn record(&self, strategy: StrategyName, lanes: i32) {
        if let (Some(seconds), Some(units)) = (self.previous_hold_s(), self.units_before) {
            record(strategy, seconds, units.max(0) as u64, lanes);
        }
    }
}

/// A hold measured by the service's monotonic clock: started when the
/// answer that proves the resource held arrives, ended ([`Hold::end`]) when
/// the answer that proves it released does.
#[derive(Debug)]
#[must_use = "a hold records nothing until it ends"]
pub struct Hold {
    strategy: StrategyName,
    since: Instant,
}

impl Hold {
    /// Starts a hold of `strategy`'s serial resource now.
    pub fn start(strategy: StrategyName) -> Hold {
        Hold { strategy, since: Instant::now() }
    }

    /// Ends the hold now and records it with the `units` it sold.
    pub fn end(self, units: u64) {
        record(self.strategy, self.since.elapsed().as_secs_f64(), units, 1);
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::metric_names::SERIAL_HOLD_DURATION_SECONDS_SUM;

    #[test]
    fn the_sum_series_is_the_histograms_own() {
        assert_eq!(SERIAL_HOLD_DURATION_SECONDS_SUM, format!("{SERIAL_HOLD_DURATION_SECONDS}_sum"));
    }

    #[test]
    fn only_a_purchase_that_waited_through_the_previous_hold_measures_it() {
        let t = |ms: i64| DateTime::<Utc>::UNIX_EPOCH + TimeDelta::milliseconds(ms);
        // Began at 10, the previous holder took the row at 20, this one at 23.
        let waited = Marks {
            held_before: Some(t(20)),
            units_before: Some(1),
            held_at: t(23),
            began_at: t(10),
        };
        assert_eq!(waited.previous_hold_s(), Some(0.003));
        // Began after the previous holder's mark: the gap may hold idle time.
        let late = Marks { began_at: t(21), ..waited };
        assert_eq!(late.previous_hold_s(), None);
        // The row's first purchase has no previous holder.
        assert_eq!(Marks { held_before: None, ..waited }.previous_hold_s(), None);
    }
}
