//! The expectation table: for every strategy, under which conditions of a
//! run it is expected to keep exact books and under which it is a
//! demonstration that breaks them. Each run's verdict compares what the
//! Postgres audit found with this table; docs/strategies.md describes it in
//! prose.
//!
//! A cell is keyed by the strategy's wire name and by the run's
//! [`Conditions`]: the load profile (typed, never matched as a string) and
//! the number of app instances, and the fault injected during the run
//! (`crate::fault`), if any; only the rows a fault changes look at it (a
//! strategy that does not use what the fault breaks keeps its cell: that
//! nothing changes is a result). Where
//! the outcome under a fault depends on timing the fault does not control
//! (whether a killed or stopped instance was inside the critical section at
//! that moment), the cell is [`Expectation::MayBreak`]: either outcome is
//! `ok`, and the report counts how often it broke.
//!
//! The `payment` profile (orders that expire unpaid and return their units)
//! keeps every cell of `burst`: a correct strategy returns each unit once
//! through its own path, so its books stay exact; `naive` returns with a
//! relative update that its own absolute write can overwrite, and breaks as
//! in every profile. A correct `payment` run must besides show the lifecycle
//! at work: units returned and resold, and no order left pending once the
//! phase settled (`crate::report::Run::is_broken`).
//!
//! The table is data, not a `match` over an enum of strategies: a strategy
//! without a row is an error of the comparison (and of a unit test), never a
//! silent guess.

use seckill::strategy::StrategyName;
use serde::{Deserialize, Serialize};

use crate::fault::FaultKind;
use crate::profile::Profile;
use crate::report::Verdict;

/// Whether a strategy is expected to keep the books exact in a run; as
/// report.json's `expected` (`"correct"`, `"breaks"` or `"may_break"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expectation {
    /// No oversell, no undersell, no drift, no duplicate order, no counted
    /// 5xx, no Redis drift, no unresolved accepted request.
    Correct,
    /// A demonstration: the run is expected to show oversell or ledger drift
    /// in the audit (under a fault: oversell, drift, undersell after settle
    /// or an accepted purchase lost).
    Breaks,
    /// Under a fault, either outcome: the run breaks when the fault happens
    /// to hit inside a critical section. Both verdicts are `ok`.
    MayBreak,
}

/// What a run was subjected to: the key of a cell besides the strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    pub profile: Profile,
    /// App instances serving the sale (1 or more).
    pub instances: usize,
    /// The fault injected during the run, if any.
    pub fault: Option<FaultKind>,
}

/// One row: a strategy's wire name and its cell as a function of the
/// conditions. The comment above each row says why.
struct Row {
    strategy: &'static str,
    cell: fn(&Conditions) -> Expectation,
}

use Expectation::{Breaks, Correct, MayBreak};
use FaultKind::{KillInstance, PauseInstance, RedisRestart};

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
    // A reservation whose instance died before its order is returned by the
    // reconciler after its grace (15 s), and a counter a restarted Redis
    // lost is warmed again from Postgres: exact once settled.
    Row { strategy: "redis-decr", cell: |_| Correct },
    // One mutex per process: two instances hold "the" lock at once.
    Row { strategy: "lock/local", cell: |on| if on.instances > 1 { Breaks } else { Correct } },
    // No expiry: exclusive while holders live. A killed holder's key stays
    // forever and the sale is stuck (undersold): with one instance the kill
    // waits for a moment it holds the lock (`crate::fault`), with several
    // the killed one holds it only by chance. A stopped holder resumes and
    // releases: a stall, not a break.
    Row {
        strategy: "lock/setnx",
        cell: |on| match on.fault {
            Some(KillInstance) if on.instances > 1 => MayBreak,
            Some(KillInstance) => Breaks,
            Some(RedisRestart) => MayBreak,
            _ => Correct,
        },
    },
    // A lease with a blind `DEL`: `slow` stalls holders past the lease, so a
    // second holder enters while the first still writes (and the first
    // deletes the second's key). A stopped instance is such a stall when it
    // stops inside the critical section; a killed holder's lease expires.
    Row { strategy: "lock/ttl", cell: |on| stalls_outlive_the_lease(on) },
    // An owner token makes the release safe, but the stalled holder still
    // writes after its lease ran out and another holder entered.
    Row { strategy: "lock/token", cell: |on| stalls_outlive_the_lease(on) },
    // The watchdog renews the lease through stalls of the critical section,
    // but a stopped process stops its watchdog too: the lease runs out, and
    // a holder stopped between its read and its write writes on resumption.
    Row {
        strategy: "lock/watchdog",
        cell: |on| match on.fault {
            Some(PauseInstance | RedisRestart) => MayBreak,
            _ => Correct,
        },
    },
    // Renewed, and fenced: Postgres refuses the writes of a holder paused
    // past its lease (a stopped instance included) or whose key a restarted
    // Redis forgot; a killed holder's lease expires.
    Row { strategy: "lock/fenced", cell: |_| Correct },
    // Redlock quorum, renewed and fenced like `lock/fenced`.
    Row { strategy: "lock/redlock", cell: |_| Correct },
    // One active consumer per partition settles each batch in one guarded
    // Postgres transaction; every accepted request is resolved. A killed
    // consumer's unacknowledged messages are redelivered to the next one,
    // and a redelivered request settles once (its row is idempotent); a
    // `202` is answered only after the publisher confirm, so a restarted
    // broker still holds every accepted request in its quorum queue.
    Row { strategy: "queue", cell: |_| Correct },
];

/// `slow` holds the lock past a 200 ms lease (a 600 ms stall); the other
/// profiles finish well inside the lease. A stopped instance outlives the
/// lease of whatever it holds, and a Redis restarted empty forgets every
/// lock: either lets a second holder in while the first may still write.
fn stalls_outlive_the_lease(on: &Conditions) -> Expectation {
    if matches!(on.fault, Some(PauseInstance | RedisRestart)) && on.profile != Profile::Slow {
        return MayBreak;
    }
    match on.profile {
        Profile::Slow => Breaks,
        Profile::Burst
        | Profile::RetryStorm
        | Profile::MultiSale
        | Profile::Flood
        | Profile::Payment => Correct,
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
            MayBreak => "may_break",
        }
    }

    /// As the verdict lines of report.html say it.
    pub fn phrase(self) -> &'static str {
        match self {
            Correct => "expected correct",
            Breaks => "expected to break",
            MayBreak => "may break",
        }
    }

    /// Whether broken books are what the run was meant to show (a
    /// demonstration), rather than a defect.
    pub fn tolerates_broken_books(self) -> bool {
        match self {
            Correct => false,
            Breaks | MayBreak => true,
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
            MayBreak => Verdict::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(profile: Profile, instances: usize) -> Conditions {
        Conditions { profile, instances, fault: None }
    }

    fn under(fault: FaultKind, instances: usize) -> Conditions {
        Conditions { profile: Profile::Burst, instances, fault: Some(fault) }
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
                for profile in [
                    Profile::Burst,
                    Profile::RetryStorm,
                    Profile::MultiSale,
                    Profile::Flood,
                    Profile::Payment,
                ] {
                    assert_eq!(cell(strategy, on(profile, instances)), Correct, "{profile}");
                }
            }
        }
    }

    #[test]
    fn under_faults_fenced_and_transactional_strategies_stay_correct() {
        for &fault in FaultKind::ALL {
            assert_eq!(cell("naive", under(fault, 2)), Breaks, "{fault}");
            for correct in
                ["sql", "sql/for-update", "sql/batched", "sql/buckets", "redis-decr", "queue"]
            {
                assert_eq!(cell(correct, under(fault, 2)), Correct, "{correct} {fault}");
            }
            assert_eq!(cell("lock/fenced", under(fault, 2)), Correct, "{fault}");
            assert_eq!(cell("lock/redlock", under(fault, 2)), Correct, "{fault}");
        }
    }

    #[test]
    fn a_dead_setnx_holder_sticks_and_a_stopped_lease_holder_may_write_late() {
        assert_eq!(cell("lock/setnx", under(KillInstance, 1)), Breaks);
        assert_eq!(cell("lock/setnx", under(KillInstance, 2)), MayBreak);
        assert_eq!(cell("lock/setnx", under(PauseInstance, 2)), Correct);
        assert_eq!(cell("lock/setnx", under(FaultKind::PgTerminate, 2)), Correct);
        for strategy in ["lock/setnx", "lock/ttl", "lock/token", "lock/watchdog"] {
            assert_eq!(cell(strategy, under(RedisRestart, 2)), MayBreak, "{strategy}");
            assert_eq!(cell(strategy, under(FaultKind::BrokerRestart, 2)), Correct);
        }
        for strategy in ["lock/ttl", "lock/token", "lock/watchdog"] {
            assert_eq!(cell(strategy, under(PauseInstance, 2)), MayBreak, "{strategy}");
            assert_eq!(cell(strategy, under(KillInstance, 2)), Correct, "{strategy}");
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
        assert_eq!(MayBreak.verdict(true, true), Verdict::Ok);
        assert_eq!(MayBreak.verdict(false, false), Verdict::Ok);
    }

    #[test]
    fn the_wire_form_is_serdes() {
        for expectation in [Correct, Breaks, MayBreak] {
            assert_eq!(serde_json::to_value(expectation).unwrap(), expectation.as_str());
        }
    }
}
