//! Aggregates over repeats: for each (strategy, profile), the median and
//! min–max of every numeric figure of its runs, and the oversell and drift of
//! each repeat, so that one lucky or unlucky run cannot carry a conclusion.
//!
//! The figures are found generically: every number in a run's JSON form,
//! named by its dotted path (`latency_ms.p99`, `cost.pg_xacts_per_unit`,
//! `outcomes.placed`), so a figure added to [`Run`] is summarised without
//! touching this file. `null`s are left out; a figure that is `null` in every
//! repeat is `null` here too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Run, Verdict};
use crate::expectation::Expectation;

/// The aggregate of one (strategy, profile) over its repeats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub strategy: String,
    pub profile: String,
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
}

impl Spread {
    /// `None` for no values.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median =
            if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Spread { median, min: sorted[0], max: sorted[n - 1], n })
    }
}

impl Summary {
    /// "naive: broke in 5 of 5 runs (oversold 12, 8, 30, 4, 9; drift …)".
    pub fn broke_line(&self) -> String {
        let list =
            |values: &[i64]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
        let who = format!("{} ({})", self.strategy, self.profile);
        let books =
            format!("oversold {}; drift {}", list(&self.oversold), list(&self.ledger_drift));
        if self.broken_runs == 0 {
            format!("{who}: kept exact books in {} of {} runs ({books})", self.runs, self.runs)
        } else {
            format!("{who}: broke in {} of {} runs ({books})", self.broken_runs, self.runs)
        }
    }
}

/// One [`Summary`] per (strategy, profile), in order of first appearance in
/// `runs`; each lists its repeats in repeat order.
pub fn summarize(runs: &[Run]) -> Vec<Summary> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for run in runs {
        let key = (run.strategy.as_str(), run.profile.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(strategy, profile)| {
            let mut group: Vec<&Run> =
                runs.iter().filter(|r| r.strategy == strategy && r.profile == profile).collect();
            group.sort_by_key(|r| r.repeat);
            summarize_group(&group)
        })
        .collect()
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
    Summary {
        strategy: group[0].strategy.clone(),
        profile: group[0].profile.clone(),
        expected: group[0].expected,
        runs: group.len() as u64,
        verdicts,
        broken_runs: group.iter().filter(|r| r.is_broken()).count() as u64,
        oversold: group.iter().map(|r| r.oversold).collect(),
        ledger_drift: group.iter().map(|r| r.ledger_drift).collect(),
        redis_drift: group.iter().map(|r| r.redis_drift).collect(),
        figures: values.into_iter().map(|(path, v)| (path, Spread::of(&v))).collect(),
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

    #[test]
    fn spread_takes_the_middle_and_ignores_nothing_finite() {
        assert_eq!(Spread::of(&[]), None);
        let odd = Spread::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((odd.median, odd.min, odd.max, odd.n), (3.0, 1.0, 5.0, 3));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
    }
}
