//! The expectation table: for every strategy, under which conditions of a
//! run it is expected to keep exact books and under which it is a
//! demonstration that breaks them. Each run's verdict compares what the
//! Postgres audit found with this table; docs/strategies.md describes it in
//! prose.
//!
//! A cell is keyed by the strategy's wire name and by the run's
//! [`Conditions`]: the load profile (typed, never matched as a string) and
//! the number of app instances. A further dimension (a fault injected during
//! the run, such as an instance killed or Redis restarted) is one more field
//! of `Conditions`; only the rows it changes need to look at it. An
//! expectation that accepts either outcome (a strategy that *may* break under
//! a fault) is one more [`Expectation`] variant, with its arm in
//! [`Expectation::verdict`] and the few accessors below.
//!
//! The table is data, not a `match` over an enum of strategies: a strategy
//! without a row is an error of the comparison (and of a unit test), never a
//! silent guess.

use seckill::strategy::StrategyName;
use serde::{Deserialize, Serialize};

use crate::profile::Profile;
use crate::report::Verdict;

/// Whether a strategy is expected to keep the books exact in a run; as
/// report.json's `expected` (`"correct"` or `"breaks"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expectation {
    /// No oversell, no undersell, no drift, no duplicate order, no counted
    /// 5xx, no Redis drift, no unresolved accepted request.
    Correct,
    /// A demonstration: the run is expected to show oversell or ledger drift
    /// in the audit.
    Breaks,
}

/// What a run was subjected to: the key of a cell besides the strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    pub profile: Profile,
    /// App instances serving the sale (1 or more).
    pub instances: usize,
}

/// One row: a strategy's wire name and its cell as a function of the
/// conditions. The comment above each row says why.
struct Row {
    strategy: &'static str,
    cell: fn(&Conditions) -> Expectation,
}

use Expectation::{Breaks, Correct};

const TABLE: &[Row] = &[
    // Lost updates: it reads the stock, checks it in the application and
    // writes back the computed value with nothing between read and write.
    Row { strategy: "naive", cell: |_| Breaks },
    // One conditional statement: under READ COMMITTED a waiter re-evaluates
    // `remaining_stock >= q` on the newest row version.
    Row { strategy: "sql", cell: |_| Correct },
    // The row lock is held from the read to the commit.
    Row { strategy: "sql/for-update", cell: |_| Correct },
    // Each batch locks the sale row, applies the `sql` rule to its purchases
    // in arrival order and takes the units with one guarded update, in one
    // transaction: batches of several instances serialise on the row.
    Row { strategy: "sql/batched", cell: |_| Correct },
    // The `sql` statement on one of N bucket rows; a purchase that finds
    // every bucket with stock locked waits for one before it is sold out,
    // so no unit is stranded.
    Row { strategy: "sql/buckets", cell: |_| Correct },
    // The Redis gate only filters; the `sql` statement behind it still
    // guards Postgres, and every failure after the decrement is compensated.
    Row { strategy: "redis-decr", cell: |_| Correct },
    // One mutex per process: two instances hold "the" lock at once.
    Row { strategy: "lock/local", cell: |on| if on.instances > 1 { Breaks } else { Correct } },
    // No expiry: exclusive while holders live (a dead holder blocks the sale
    // instead, which its own test shows; no profile kills a holder).
    Row { strategy: "lock/setnx", cell: |_| Correct },
    // A lease with a blind `DEL`: `slow` stalls holders past the lease, so a
    // second holder enters while the first still writes (and the first
    // deletes the second's key).
    Row { strategy: "lock/ttl", cell: |on| stalls_outlive_the_lease(on) },
    // An owner token makes the release safe, but the stalled holder still
    // writes after its lease ran out and another holder entered.
    Row { strategy: "lock/token", cell: |on| stalls_outlive_the_lease(on) },
    // The watchdog renews the lease through stalls.
    Row { strategy: "lock/watchdog", cell: |_| Correct },
    // Renewed, and fenced: Postgres refuses the writes of a holder paused
    // past its lease.
    Row { strategy: "lock/fenced", cell: |_| Correct },
    // Redlock quorum, renewed and fenced like `lock/fenced`.
    Row { strategy: "lock/redlock", cell: |_| Correct },
    // One active consumer per partition settles each batch in one guarded
    // Postgres transaction; every accepted request is resolved.
    Row { strategy: "queue", cell: |_| Correct },
];

/// `slow` holds the lock past a 200 ms lease (a 600 ms stall); the other
/// profiles finish well inside the lease.
fn stalls_outlive_the_lease(on: &Conditions) -> Expectation {
    match on.profile {
        Profile::Slow => Breaks,
        Profile::Burst | Profile::RetryStorm | Profile::MultiSale | Profile::Flood => Correct,
    }
}

/// The expectation of `strategy` under `conditions`. Errors when the table
/// has no row for the strategy.
pub fn expected(strategy: StrategyName, conditions: &Conditions) -> anyhow::Result<Expectation> {
    let name = strategy.as_str();
    let row = TABLE.iter().find(|row| row.strategy == name).ok_or_else(|| {
        anyhow::anyhow!("the expectation table has no row for strategy `{name}`; add one")
    })?;
    Ok((row.cell)(conditions))
}

impl Expectation {
    /// The wire form, as in report.json and the tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Correct => "correct",
            Breaks => "breaks",
        }
    }

    /// As the verdict lines of report.html say it.
    pub fn phrase(self) -> &'static str {
        match self {
            Correct => "expected correct",
            Breaks => "expected to break",
        }
    }

    /// Whether broken books are what the run was meant to show (a
    /// demonstration), rather than a defect.
    pub fn tolerates_broken_books(self) -> bool {
        match self {
            Correct => false,
            Breaks => true,
        }
    }

    /// The verdict of a run with this expectation: `broken` is any sign of a
    /// broken sale ([`crate::report::Run::is_broken`]), `books_broken`
    /// whether the audit shows oversell or ledger drift. A demonstration
    /// must break the books themselves, not merely its error count.
    pub fn verdict(self, broken: bool, books_broken: bool) -> Verdict {
        match self {
            Correct if broken => Verdict::Broke,
            Correct => Verdict::Ok,
            Breaks if books_broken => Verdict::Ok,
            Breaks => Verdict::Unexpected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(profile: Profile, instances: usize) -> Conditions {
        Conditions { profile, instances }
    }

    fn cell(strategy: &str, conditions: Conditions) -> Expectation {
        expected(strategy.parse().unwrap(), &conditions).unwrap()
    }

    #[test]
    fn every_strategy_has_exactly_one_row() {
        for strategy in StrategyName::ALL {
            let rows = TABLE.iter().filter(|row| row.strategy == strategy.as_str()).count();
            assert_eq!(rows, 1, "{strategy}");
        }
        for row in TABLE {
            assert!(row.strategy.parse::<StrategyName>().is_ok(), "unknown {}", row.strategy);
        }
    }

    #[test]
    fn baselines_break_everywhere_and_guarded_strategies_never_do() {
        for &profile in Profile::ALL {
            for instances in [1, 2, 4] {
                let conditions = on(profile, instances);
                assert_eq!(cell("naive", conditions), Breaks, "{conditions:?}");
                for correct in [
                    "sql",
                    "sql/for-update",
                    "sql/batched",
                    "sql/buckets",
                    "redis-decr",
                    "lock/setnx",
                    "lock/watchdog",
                    "lock/fenced",
                    "lock/redlock",
                    "queue",
                ] {
                    assert_eq!(cell(correct, conditions), Correct, "{correct} {conditions:?}");
                }
            }
        }
    }

    #[test]
    fn an_in_process_lock_breaks_only_with_more_than_one_instance() {
        for &profile in Profile::ALL {
            assert_eq!(cell("lock/local", on(profile, 1)), Correct);
            assert_eq!(cell("lock/local", on(profile, 2)), Breaks);
        }
    }

    #[test]
    fn lease_locks_without_renewal_break_only_when_holders_stall() {
        for strategy in ["lock/ttl", "lock/token"] {
            for instances in [1, 2] {
                assert_eq!(cell(strategy, on(Profile::Slow, instances)), Breaks);
                for profile in
                    [Profile::Burst, Profile::RetryStorm, Profile::MultiSale, Profile::Flood]
                {
                    assert_eq!(cell(strategy, on(profile, instances)), Correct, "{profile}");
                }
            }
        }
    }

    #[test]
    fn verdicts_compare_the_books_with_the_expectation() {
        assert_eq!(Correct.verdict(false, false), Verdict::Ok);
        assert_eq!(Correct.verdict(true, false), Verdict::Broke);
        assert_eq!(Breaks.verdict(true, true), Verdict::Ok);
        // Broken only in its error count: not the demonstration it claims.
        assert_eq!(Breaks.verdict(true, false), Verdict::Unexpected);
        assert_eq!(Breaks.verdict(false, false), Verdict::Unexpected);
    }

    #[test]
    fn the_wire_form_is_serdes() {
        for expectation in [Correct, Breaks] {
            assert_eq!(serde_json::to_value(expectation).unwrap(), expectation.as_str());
        }
    }
}
