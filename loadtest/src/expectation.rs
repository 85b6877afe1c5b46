//! What each run is expected to show, and the verdict that compares it
//! with what the Postgres audit found; docs/strategies.md describes the
//! expectations in prose.
//!
//! The expectation is the strategy's own: its registration's `expect`
//! (`seckill::strategy::Registration`), a function of the run's conditions
//! that the strategy's module declares and explains next to its
//! implementation. This module only maps the run — its load profile (typed,
//! never matched as a string), the number of app instances and the fault
//! injected (`crate::fault`), if any — into the conditions the registration
//! reads. Nothing here names a strategy: a new registration brings its
//! expectation with it (correct everywhere unless it says otherwise).
//!
//! Where the outcome under a fault depends on timing the fault does not
//! control (whether a killed or stopped instance was inside the critical
//! section at that moment), the expectation is [`Expectation::MayBreak`]:
//! either outcome is `ok`, and the report counts how often it broke.
//!
//! The `payment` profile (orders that expire unpaid and return their units)
//! keeps every expectation of `burst`: a correct strategy returns each unit
//! once through its own path, so its books stay exact. A correct `payment`
//! run must besides show the lifecycle at work: units returned and resold,
//! and no order left pending once the phase settled
//! (`crate::report::Run::is_broken`).

use seckill::strategy::{Fault, Registration};
use serde::{Deserialize, Serialize};

use crate::fault::FaultKind;
use crate::profile::Profile;

pub use seckill::strategy::Expectation;

/// What a run was subjected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    pub profile: Profile,
    /// App instances serving the sale (1 or more).
    pub instances: usize,
    /// The fault injected during the run, if any.
    pub fault: Option<FaultKind>,
}

impl Conditions {
    /// The conditions as a registration's `expect` reads them.
    pub fn as_seen_by_strategies(&self) -> seckill::strategy::Conditions {
        seckill::strategy::Conditions {
            stalls_past_lease: stalls_past_lease(self.profile),
            instances: self.instances,
            fault: self.fault.map(fault),
        }
    }
}

/// `slow` holds the lock for 600 ms under a 200 ms lease; the other profiles
/// finish well inside the lease.
fn stalls_past_lease(profile: Profile) -> bool {
    match profile {
        Profile::Slow => true,
        Profile::Burst
        | Profile::RetryStorm
        | Profile::MultiSale
        | Profile::Flood
        | Profile::Payment
        | Profile::Arrival => false,
    }
}

/// The fault as the strategies name it.
fn fault(kind: FaultKind) -> Fault {
    match kind {
        FaultKind::KillInstance => Fault::KillInstance,
        FaultKind::PauseInstance => Fault::PauseInstance,
        FaultKind::PgTerminate => Fault::PgTerminate,
        FaultKind::RedisRestart => Fault::RedisRestart,
        FaultKind::BrokerRestart => Fault::BrokerRestart,
        FaultKind::PartitionRedis => Fault::PartitionRedis,
        FaultKind::SlowPostgres => Fault::SlowPostgres,
    }
}

/// The expectation of `strategy` under `conditions`: its registration's.
pub fn expected(strategy: &Registration, conditions: &Conditions) -> Expectation {
    (strategy.expect)(&conditions.as_seen_by_strategies())
}

/// Whether a run matched its expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Expected correct and clean, or expected to break and visibly broken.
    Ok,
    /// Expected correct, but oversold, drifted, undersold, duplicated an
    /// order, returned a counted 5xx, left Redis out of step with Postgres,
    /// or left an accepted request unresolved.
    Broke,
    /// Expected to break, but came out clean (reported, not an error).
    Unexpected,
}

impl Verdict {
    /// `ok`, `BROKE` (shouted: the one that fails the comparison) or
    /// `unexpected`.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Broke => "BROKE",
            Verdict::Unexpected => "unexpected",
        }
    }

    /// The verdict of a run `expected` to do something: `broken` is any
    /// sign of a broken sale ([`crate::report::Run::is_broken`]),
    /// `books_broken` whether the audit shows oversell or ledger drift. A
    /// demonstration must break the books themselves, not merely its error
    /// count.
    pub fn of(expected: Expectation, broken: bool, books_broken: bool) -> Verdict {
        match expected {
            Expectation::Correct if broken => Verdict::Broke,
            Expectation::Correct => Verdict::Ok,
            Expectation::Breaks if books_broken => Verdict::Ok,
            Expectation::Breaks => Verdict::Unexpected,
            Expectation::MayBreak => Verdict::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use seckill::strategy::{REGISTRY, StrategyName, registration};

    use super::*;
    use Expectation::{Breaks, Correct, MayBreak};
    use FaultKind::{KillInstance, PauseInstance, RedisRestart};

    fn on(profile: Profile, instances: usize) -> Conditions {
        Conditions { profile, instances, fault: None }
    }

    fn under(fault: FaultKind, instances: usize) -> Conditions {
        Conditions { profile: Profile::Burst, instances, fault: Some(fault) }
    }

    fn cell(strategy: &str, conditions: Conditions) -> Expectation {
        expected(registration(strategy.parse().unwrap()), &conditions)
    }

    /// Every run a comparison can make: each profile, 1 to 4 instances,
    /// without a fault and under each.
    fn every_condition() -> Vec<Conditions> {
        let faults = std::iter::once(None).chain(FaultKind::ALL.iter().copied().map(Some));
        let faults: Vec<Option<FaultKind>> = faults.collect();
        let mut all = Vec::new();
        for &profile in Profile::ALL {
            for instances in 1..=4 {
                for &fault in &faults {
                    all.push(Conditions { profile, instances, fault });
                }
            }
        }
        all
    }

    #[test]
    fn every_registration_has_an_expectation_that_follows_its_descriptor_not_its_name() {
        let conditions = every_condition();
        for strategy in REGISTRY {
            let own: Vec<Expectation> = conditions.iter().map(|c| expected(strategy, c)).collect();
            // The same descriptor under every other registered name: a
            // lookup by name would answer that name's expectation instead.
            for &other in StrategyName::ALL {
                let renamed = Registration { name: other, ..*strategy };
                let theirs: Vec<Expectation> =
                    conditions.iter().map(|c| expected(&renamed, c)).collect();
                assert_eq!(own, theirs, "{} named {other}", strategy.name);
            }
        }
        // The defaults: correct under every condition.
        for c in &conditions {
            assert_eq!(expected(&Registration::DEFAULTS, c), Correct, "{c:?}");
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
                    Profile::Arrival,
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
    fn a_partition_breaks_blind_releases_and_late_setnx_and_a_slow_postgres_unrenewed_leases() {
        use FaultKind::{PartitionRedis, SlowPostgres};
        assert_eq!(cell("lock/ttl", under(PartitionRedis, 2)), MayBreak);
        assert_eq!(cell("lock/setnx", under(PartitionRedis, 2)), MayBreak);
        assert_eq!(cell("lock/token", under(PartitionRedis, 2)), Correct);
        assert_eq!(cell("lock/watchdog", under(PartitionRedis, 2)), Correct);
        for strategy in ["lock/ttl", "lock/token"] {
            assert_eq!(cell(strategy, under(SlowPostgres, 2)), MayBreak, "{strategy}");
        }
        for strategy in ["lock/setnx", "lock/watchdog"] {
            assert_eq!(cell(strategy, under(SlowPostgres, 2)), Correct, "{strategy}");
        }
    }

    #[test]
    fn verdicts_compare_the_books_with_the_expectation() {
        assert_eq!(Verdict::of(Correct, false, false), Verdict::Ok);
        assert_eq!(Verdict::of(Correct, true, false), Verdict::Broke);
        assert_eq!(Verdict::of(Breaks, true, true), Verdict::Ok);
        // Broken only in its error count: not the demonstration it claims.
        assert_eq!(Verdict::of(Breaks, true, false), Verdict::Unexpected);
        assert_eq!(Verdict::of(Breaks, false, false), Verdict::Unexpected);
        assert_eq!(Verdict::of(MayBreak, true, true), Verdict::Ok);
        assert_eq!(Verdict::of(MayBreak, false, false), Verdict::Ok);
    }

    #[test]
    fn the_wire_form_is_serdes() {
        for expectation in [Correct, Breaks, MayBreak] {
            assert_eq!(serde_json::to_value(expectation).unwrap(), expectation.as_str());
        }
    }
}
