//! Aggregates over repeats: for each (strategy, profile), the median and
//! min–max of every numeric figure of its runs, and the oversell and drift of
//! each repeat, so that one lucky or unlucky run cannot carry a conclusion.
//!
//! The figures are found generically: every number in a run's JSON form,
//! named by its dotted path (`latency_ms.p99`, `cost.pg_xacts_per_unit`,
//! `outcomes.placed`), so a figure added to [`Run`] is summarised without
//! touching this file. `null`s are left out; a figure that is `null` in every
//! repeat is `null` here too.
//!
//! Every ratio (`ratio.*`) also gets a 95 % confidence interval over its
//! per-round values ([`crate::stats::ratio_ci95`]) — except the
//! sell-through against `sql`, whose interval compares the strategy's rates
//! with its rounds' `sql` references, unpaired
//! ([`crate::stats::welch_ratio_ci95`]) — and each strategy a verdict against `sql` from that interval, unless a
//! steady window of its runs or of the `sql` runs of its rounds was too
//! short to rank.

use std::collections::BTreeMap;

use seckill::strategy::REFERENCE;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Run, Verdict};
use crate::expectation::Expectation;
use crate::stats::{self, VsSql};

/// The figure whose interval decides `vs_sql`.
pub const VS_SQL: &str = "ratio.sell_through_vs_sql_strategy";

/// The aggregate of one (strategy, profile, fault) over its repeats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub strategy: String,
    pub profile: String,
    /// The fault of the runs (`runs[].fault.kind`); `null` without one.
    #[serde(default)]
    pub fault: Option<String>,
    pub expected: Expectation,
    /// Runs aggregated (one per repeat).
    pub runs: u64,
    pub verdicts: VerdictCounts,
    /// Runs whose books were broken in any way (oversold, drift, undersold,
    /// duplicate orders, counted 5xx, Redis drift, reconciliation fixes).
    /// For a baseline expected to break, this is the demonstration working.
    pub broken_runs: u64,
    /// `oversold` of each repeat, in repeat order.
    pub oversold: Vec<i64>,
    /// `ledger_drift` of each repeat, in repeat order.
    pub ledger_drift: Vec<i64>,
    /// `redis_drift` of each repeat, in repeat order.
    pub redis_drift: Vec<Option<i64>>,
    /// Every numeric figure of the runs by dotted path (`repeat` excepted).
    pub figures: BTreeMap<String, Option<Spread>>,
    /// A run of this strategy, or a `sql` run it is paired with, had a
    /// steady window too short to rank (`runs[].too_short_to_rank`).
    #[serde(default)]
    pub too_short_to_rank: bool,
    /// Faster, slower or indistinguishable from `sql`: whether the `ci95`
    /// of `ratio.sell_through_vs_sql_strategy` excludes 1. `null` with
    /// fewer than 3 repeats, without `sql` runs, or when too short to rank.
    #[serde(default)]
    pub vs_sql: Option<VsSql>,
}

/// How many runs got each verdict.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VerdictCounts {
    pub ok: u64,
    pub broke: u64,
    pub unexpected: u64,
}

/// Median and range of one figure over the repeats where it was not `null`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The middle value; the mean of the two middle values for an even count.
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Repeats that had a value.
    pub n: usize,
    /// `ratio.*` figures and `cost.cpu_ms_per_unit` ([`has_interval`]): the
    /// 95 % confidence interval `[lo, hi]` over the per-round values
    /// ([`stats::ratio_ci95`]); the fairness scores
    /// ([`has_mean_interval`]): that of their mean
    /// ([`stats::mean_ci95`]); `null` for other figures and with fewer
    /// than 3 values.
    #[serde(default)]
    pub ci95: Option<[f64; 2]>,
}

/// The bounds of an interval that decides, as factors of its centre: at
/// most 25 % below and 33 % above it (a factor 16/9 from end to end), the
/// precision a ranking needs to tell a strategy 1.5 times as fast from one
/// as fast.
pub const DECIDING_BOUNDS: (f64, f64) = (0.75, 4.0 / 3.0);

/// Whether the figure at `path` gets a 95 % interval: every ratio, the CPU
/// per unit and its split over the tiers, and the serial time per unit and
/// its ceiling (the figures a reader carries to another machine). Both are
/// positive quantities that vary by a factor between rounds, so the
/// interval is taken on their logarithms ([`stats::ratio_ci95`]).
pub fn has_interval(path: &str) -> bool {
    path.starts_with("ratio.")
        || path == "cost.cpu_ms_per_unit"
        || path.starts_with("cost.cpu_ms_per_unit_by_tier.")
        || path == "cost.serial_ms_per_unit"
        || path == "cost.serial_ceiling_per_s"
}

/// Whether the figure at `path` gets a 95 % interval of its mean on its own
/// scale ([`stats::mean_ci95`]): the fairness scores, a share in 0..=1 and
/// a rank correlation in −1..=1, whose rounds differ by an amount rather
/// than a factor (and which may be 0 or negative, where a logarithm fails).
pub fn has_mean_interval(path: &str) -> bool {
    path == "fairness.first_served" || path == "fairness.kendall_tau"
}

impl Spread {
    /// Whether the interval lies within [`DECIDING_BOUNDS`] of its centre,
    /// the geometric mean `√(lo × hi)` it is built around (the intervals of
    /// ratios are symmetric on the logarithms): a test of its width alone,
    /// not of where the median of the runs fell in it. `None` without an
    /// interval or with a bound that is not positive.
    pub fn decides(&self) -> Option<bool> {
        let [lo, hi] = self.ci95?;
        if lo <= 0.0 || hi <= 0.0 {
            return None;
        }
        let centre = (lo * hi).sqrt();
        let (below, above) = DECIDING_BOUNDS;
        // A relative tolerance for bounds that sit exactly on the limits.
        let slack = 1e-9 * centre;
        Some(lo >= centre * below - slack && hi <= centre * above + slack)
    }

    /// `None` for no values; `ci95` only when `interval` is asked.
    pub fn of(values: &[f64], interval: bool) -> Option<Spread> {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let median = stats::median(&finite)?;
        let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ci95 = if interval { stats::ratio_ci95(&finite) } else { None };
        Some(Spread { median, min, max, n: finite.len(), ci95 })
    }

    /// [`Spread::of`] with the interval of the mean on the values' own
    /// scale ([`stats::mean_ci95`]).
    pub fn of_scores(values: &[f64]) -> Option<Spread> {
        let spread = Spread::of(values, false)?;
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        Some(Spread { ci95: stats::mean_ci95(&finite), ..spread })
    }
}

impl Summary {
    /// "naive: broke in 5 of 5 runs (oversold 12, 8, 30, 4, 9; drift …)".
    pub fn broke_line(&self) -> String {
        let list =
            |values: &[i64]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
        let who = match &self.fault {
            Some(fault) => format!("{} ({}, {fault})", self.strategy, self.profile),
            None => format!("{} ({})", self.strategy, self.profile),
        };
        let books =
            format!("oversold {}; drift {}", list(&self.oversold), list(&self.ledger_drift));
        if self.broken_runs == 0 {
            format!("{who}: kept exact books in {} of {} runs ({books})", self.runs, self.runs)
        } else {
            format!("{who}: broke in {} of {} runs ({books})", self.broken_runs, self.runs)
        }
    }
}

/// One [`Summary`] per (strategy, profile, fault), in order of first
/// appearance in `runs`; each lists its repeats in repeat order.
pub fn summarize(runs: &[Run]) -> Vec<Summary> {
    let mut keys: Vec<(&str, &str, &str)> = Vec::new();
    for run in runs {
        let key = (run.strategy.as_str(), run.profile.as_str(), run.fault_name());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(strategy, profile, fault)| {
            let mut group: Vec<&Run> = runs
                .iter()
                .filter(|r| r.strategy == strategy && r.profile == profile)
                .filter(|r| r.fault_name() == fault)
                .collect();
            group.sort_by_key(|r| r.repeat);
            let mut summary = summarize_group(&group);
            // sql's own stays the paired interval of its takes: how far the
            // takes of a round differed.
            if strategy != REFERENCE.as_str()
                && let Some(Some(figure)) = summary.figures.get_mut(VS_SQL)
            {
                figure.ci95 = vs_sql_ci95(&group);
            }
            summary.too_short_to_rank = group.iter().any(|run| {
                run.too_short_to_rank
                    || runs.iter().any(|sql| {
                        sql.strategy == REFERENCE.as_str()
                            && sql.profile == run.profile
                            && sql.fault_name() == run.fault_name()
                            && sql.repeat == run.repeat
                            && sql.too_short_to_rank
                    })
            });
            summary.vs_sql = summary
                .figures
                .get(VS_SQL)
                .copied()
                .flatten()
                .and_then(|s| s.ci95)
                .filter(|_| !summary.too_short_to_rank)
                .map(VsSql::of);
            summary
        })
        .collect()
}

/// The interval of `group`'s sell-through against `sql`
/// ([`stats::welch_ratio_ci95`]): each run's rate against the `sql`
/// reference of its round — the geometric mean of that round's `sql` runs
/// that its ratio divides by ([`super::relate_to_sql`]), read back as rate ÷
/// ratio —, over the runs that have both. One value per round on each side:
/// the takes of one round share that round's own `sql` state, so they are
/// not independent of each other.
fn vs_sql_ci95(group: &[&Run]) -> Option<[f64; 2]> {
    let (rates, references): (Vec<f64>, Vec<f64>) = group
        .iter()
        .filter_map(|run| {
            let (rate, ratio) = (run.sell_through_per_s?, run.ratio.sell_through_vs_sql_strategy?);
            (ratio > 0.0).then(|| (rate, rate / ratio))
        })
        .unzip();
    stats::welch_ratio_ci95(&rates, &references)
}

fn summarize_group(group: &[&Run]) -> Summary {
    let mut verdicts = VerdictCounts::default();
    for run in group {
        match run.verdict {
            Verdict::Ok => verdicts.ok += 1,
            Verdict::Broke => verdicts.broke += 1,
            Verdict::Unexpected => verdicts.unexpected += 1,
        }
    }
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in group {
        let json = serde_json::to_value(run).unwrap_or(Value::Null);
        let mut leaves = Vec::new();
        numeric_leaves(&json, String::new(), &mut leaves);
        for (path, value) in leaves {
            values.entry(path).or_default().extend(value);
        }
    }
    values.remove("repeat");
    values.remove("take");
    Summary {
        strategy: group[0].strategy.clone(),
        profile: group[0].profile.clone(),
        fault: group[0].fault.as_ref().map(|f| f.kind.clone()),
        expected: group[0].expected,
        runs: group.len() as u64,
        verdicts,
        broken_runs: group.iter().filter(|r| r.is_broken()).count() as u64,
        oversold: group.iter().map(|r| r.oversold).collect(),
        ledger_drift: group.iter().map(|r| r.ledger_drift).collect(),
        redis_drift: group.iter().map(|r| r.redis_drift).collect(),
        figures: values
            .into_iter()
            .map(|(path, v)| {
                let spread = if has_mean_interval(&path) {
                    Spread::of_scores(&v)
                } else {
                    Spread::of(&v, has_interval(&path))
                };
                (path, spread)
            })
            .collect(),
        too_short_to_rank: false,
        vs_sql: None,
    }
}

/// Every number or `null` under `value`, by dotted path (`null` as `None`,
/// so that a figure that is always `null` still appears).
fn numeric_leaves(value: &Value, path: String, out: &mut Vec<(String, Option<f64>)>) {
    match value {
        Value::Number(n) => out.push((path, n.as_f64())),
        Value::Null if !path.is_empty() => out.push((path, None)),
        Value::Object(map) => {
            for (key, child) in map {
                let child_path =
                    if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                numeric_leaves(child, child_path, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::report::fixture;

    #[test]
    fn spread_takes_the_middle_and_ignores_nothing_finite() {
        assert_eq!(Spread::of(&[], true), None);
        let odd = Spread::of(&[5.0, 1.0, 3.0], false).unwrap();
        assert_eq!((odd.median, odd.min, odd.max, odd.n, odd.ci95), (3.0, 1.0, 5.0, 3, None));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0], false).unwrap().median, 2.5);
        assert!(Spread::of(&[5.0, 1.0, 3.0], true).unwrap().ci95.is_some());
    }

    /// The fixture's runs with three repeats, `queue`'s sell-through
    /// `ratios` to sql in round order.
    fn three_rounds(ratios: [f64; 3]) -> Vec<Run> {
        let mut runs = fixture::report().runs;
        let third: Vec<Run> = runs.iter().filter(|r| r.repeat == 1).cloned().collect();
        runs.extend(third.into_iter().map(|mut r| {
            r.repeat = 3;
            r
        }));
        // sql sells 1000, 1100 and 900 units a second in the three rounds.
        let sql_rate = |repeat: u64| [1000.0, 1100.0, 900.0][repeat as usize - 1];
        for run in runs.iter_mut() {
            let ratio = ratios[run.repeat as usize - 1];
            match run.strategy.as_str() {
                "queue" => {
                    run.ratio.sell_through_vs_sql_strategy = Some(ratio);
                    run.sell_through_per_s = Some(ratio * sql_rate(run.repeat));
                }
                "sql" => run.sell_through_per_s = Some(sql_rate(run.repeat)),
                _ => {}
            }
        }
        runs
    }

    fn queue(summaries: &[Summary]) -> &Summary {
        summaries.iter().find(|s| s.strategy == "queue").unwrap()
    }

    #[test]
    fn ratios_get_an_interval_and_a_verdict_against_sql_from_three_repeats() {
        let summaries = summarize(&three_rounds([2.05, 2.3, 2.21]));
        let figure = queue(&summaries).figures[VS_SQL].unwrap();
        let [lo, hi] = figure.ci95.expect("three repeats");
        assert!(lo > 1.0 && lo < 2.05 && hi > 2.3, "[{lo}, {hi}]");
        assert_eq!(queue(&summaries).vs_sql, Some(VsSql::Faster));
        assert!(
            figure.ci95.is_some() && summaries[0].figures["units_sold"].unwrap().ci95.is_none()
        );
        let sql = summaries.iter().find(|s| s.strategy == "sql").unwrap();
        assert_eq!(sql.vs_sql, Some(VsSql::Indistinguishable), "sql against itself");
        let straddling = summarize(&three_rounds([0.8, 1.3, 1.0]));
        assert_eq!(queue(&straddling).vs_sql, Some(VsSql::Indistinguishable));
        // Two repeats give no interval.
        assert_eq!(fixture::report().summary[0].vs_sql, None);
    }

    #[test]
    fn the_cpu_per_unit_gets_an_interval_and_intervals_decide_within_bounds() {
        assert!(has_interval("cost.cpu_ms_per_unit") && has_interval("ratio.x"));
        assert!(!has_interval("cost.pg_xacts_per_unit") && !has_interval("latency_ms.p99"));
        let spread = |median, ci95| Spread { median, min: 0.0, max: 0.0, n: 5, ci95 };
        // Centre √(1.5 × 8/3) = 2: exactly −25 % and +33 %.
        assert_eq!(spread(2.0, Some([1.5, 8.0 / 3.0])).decides(), Some(true), "−25 %, +33 %");
        assert_eq!(spread(2.0, Some([1.49, 2.7])).decides(), Some(false), "too wide");
        // The width decides, not where the median fell: the same interval
        // around a median near its lower bound.
        assert_eq!(spread(1.55, Some([1.5, 8.0 / 3.0])).decides(), Some(true));
        assert_eq!(spread(2.0, None).decides(), None);
        assert_eq!(spread(2.0, Some([0.0, 2.0])).decides(), None);
        let mut runs = three_rounds([2.05, 2.3, 2.21]);
        for (i, run) in runs.iter_mut().enumerate() {
            run.cost.cpu_ms_per_unit = Some(1.0 + i as f64 / 10.0);
        }
        let summaries = summarize(&runs);
        assert!(queue(&summaries).figures["cost.cpu_ms_per_unit"].unwrap().ci95.is_some());
    }

    #[test]
    fn the_sql_interval_takes_one_mean_a_round_and_only_rounds_with_every_rate() {
        let runs = three_rounds([2.0, 2.0, 2.0]);
        // queue is exactly twice sql's mean in every round: the interval is
        // centred on 2, and wide, since unpaired it keeps the rounds' spread
        // (1000, 1100, 900 units/s) on both sides.
        let [lo, hi] = queue(&summarize(&runs)).figures[VS_SQL].unwrap().ci95.unwrap();
        assert!(((lo * hi).sqrt() - 2.0).abs() < 1e-9 && lo < 1.9 && hi > 2.1, "[{lo}, {hi}]");
        // A round whose sql run has no rate gives no ratio, and is left out
        // on both sides: two rounds are too few for an interval.
        let mut runs = runs;
        let sql = runs.iter_mut().find(|r| r.strategy == "sql" && r.repeat == 2).unwrap();
        sql.sell_through_per_s = None;
        crate::report::relate_to_sql(&mut runs);
        assert_eq!(queue(&summarize(&runs)).figures[VS_SQL].unwrap().ci95, None);
    }

    #[test]
    fn a_short_window_of_a_run_or_of_its_sql_pair_withholds_the_verdict() {
        let mut runs = three_rounds([2.05, 2.3, 2.21]);
        let sql = runs.iter_mut().find(|r| r.strategy == "sql" && r.repeat == 2).unwrap();
        sql.too_short_to_rank = true;
        let summaries = summarize(&runs);
        assert!(queue(&summaries).too_short_to_rank);
        assert_eq!(queue(&summaries).vs_sql, None);
        assert!(queue(&summaries).figures[VS_SQL].unwrap().ci95.is_some(), "still reported");
    }

    #[test]
    fn fairness_scores_get_an_interval_of_their_mean_even_when_negative() {
        assert!(has_mean_interval("fairness.first_served") && !has_interval("fairness.winners"));
        let mut runs = three_rounds([2.05, 2.3, 2.21]);
        for run in runs.iter_mut().filter(|r| r.strategy == "queue") {
            let tau = [-0.1, 0.05, 0.2][run.repeat as usize - 1];
            run.fairness = Some(crate::fairness::Fairness {
                first_served: Some(0.3),
                kendall_tau: Some(tau),
                winners: 10,
            });
        }
        let summaries = summarize(&runs);
        let tau = queue(&summaries).figures["fairness.kendall_tau"].unwrap();
        let [lo, hi] = tau.ci95.expect("three rounds");
        assert!(lo < -0.1 && hi > 0.2 && (tau.median - 0.05).abs() < 1e-12, "[{lo}, {hi}]");
        let served = queue(&summaries).figures["fairness.first_served"].unwrap();
        assert_eq!(served.ci95, Some([0.3, 0.3]));
    }
}
