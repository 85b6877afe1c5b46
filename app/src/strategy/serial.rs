//! The time a purchase holds its sale's serial resource: the part of its
//! work during which nothing else can sell the same sale, whatever the
//! hardware. Its sum over a run ÷ the units sold is the strategy's serial
//! time per unit, and its inverse the most one sale can sell per second on
//! any number of cores (Amdahl's law: the serial part bounds the speed-up;
//! docs/scaling.md).
//!
//! Every strategy records each hold in the histogram
//! [`SERIAL_HOLD_DURATION_SECONDS`] (label `strategy`), from the clocks of
//! the component that holds the resource:
//!
//! - **a Postgres row lock taken and released in one statement** (`sql`,
//!   `redis-decr`'s transaction, `sql/buckets`, `naive`): from the order's
//!   `created_at` — `clock_timestamp()` when the `INSERT` that follows the
//!   guarded `UPDATE` wrote the row, so taken under the row lock by
//!   Postgres' clock — to the moment the commit's answer reaches the
//!   service ([`held_since`]). Both clocks are the same host's wall clock
//!   when the service and Postgres share a machine, as in the load test; on
//!   separate hosts their offset adds to every hold.
//! - **a row lock taken by one statement and released by a later commit**
//!   (`sql/for-update`, a `sql/batched` batch, a `queue` consumer's batch):
//!   from the answer of the statement that took it to the commit's answer,
//!   by the service's monotonic clock ([`Hold`]).
//! - **the Redis lock** (`lock/*`): from the acquisition's answer to the
//!   release's, by the service's monotonic clock.
//!
//! Each measured hold misses the one-way trip of the answer that proves the
//! lock held and counts that of the answer that proves it released: on one
//! machine tens of microseconds, against holds of a fraction of a
//! millisecond and more.
//!
//! The Redis lock's holds count whatever the purchase's outcome (a buyer
//! refused inside the lock held it too); a row lock's, those of the
//! purchases and batches that committed (a statement that placed nothing
//! returns no row to time it by, and a transaction that rolls back is not
//! waited for). A sale whose stock is spread over `N` rows
//! (`sql/buckets`) has `N` locks that sell at once: each hold is recorded as
//! `1/N` of itself ([`Hold::end_of`] `lanes`), so that the sum is still the
//! sale's serial time.

use std::time::Instant;

use chrono::{DateTime, Utc};

use super::StrategyName;
use crate::metric_names::SERIAL_HOLD_DURATION_SECONDS;

/// Records one hold of `seconds` of `strategy`'s serial resource, out of
/// `lanes` (at least 1) that sell the same sale at once.
pub fn record(strategy: StrategyName, seconds: f64, lanes: i32) {
    let share = seconds.max(0.0) / f64::from(lanes.max(1));
    metrics::histogram!(SERIAL_HOLD_DURATION_SECONDS, "strategy" => strategy.as_str())
        .record(share);
}

/// Records a hold that began at `locked_at` by Postgres' clock (an order's
/// `created_at`) and ends now, as the commit's answer arrived.
pub fn held_since(strategy: StrategyName, locked_at: DateTime<Utc>, lanes: i32) {
    let seconds = (Utc::now() - locked_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
    record(strategy, seconds, lanes);
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

    /// Ends the hold now and records it.
    pub fn end(self) {
        self.end_of(1);
    }

    /// Ends the hold now and records it as one of `lanes` that sell the
    /// same sale at once.
    pub fn end_of(self, lanes: i32) {
        record(self.strategy, self.since.elapsed().as_secs_f64(), lanes);
    }
}

#[cfg(test)]
mod tests {
    use crate::metric_names::{SERIAL_HOLD_DURATION_SECONDS, SERIAL_HOLD_DURATION_SECONDS_SUM};

    #[test]
    fn the_sum_series_is_the_histograms_own() {
        assert_eq!(SERIAL_HOLD_DURATION_SECONDS_SUM, format!("{SERIAL_HOLD_DURATION_SECONDS}_sum"));
    }
}
