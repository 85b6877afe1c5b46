//! `loadtest agree`: whether two invocations of the same comparison tell
//! the same story.
//!
//! For each (strategy, profile, fault) summarised in both reports, and each
//! of the figures a reader carries away ([`FIGURES`]), three rules:
//!
//! - **overlap**: the two 95 % intervals share at least a point;
//! - **no contradiction**: the strategy is not `faster` than `sql` in one
//!   and `slower` in the other (`indistinguishable` contradicts neither);
//! - **medians close**: the larger median is at most [`MEDIAN_FACTOR`]
//!   times the smaller.
//!
//! Requiring one invocation's interval to hold the other's median would be
//! unsound: even for identical machines, an interval from 3 values holds
//! an independent median of 3 in about 81 % of cases (docs/report-format.md,
//! "Agreement"). Two 95 % intervals of the same quantity overlap far more
//! often, and when they do not, the invocations disagree.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::report::Report;
use crate::report::summary::{Spread, Summary, VS_SQL};
use crate::stats::VsSql;

/// The figures compared: the ratio to `sql` and the rejections over the
/// run's own `http_rps`.
pub const FIGURES: &[&str] = &[VS_SQL, "ratio.rejection_vs_http_rps"];

/// The largest ratio of the larger median to the smaller that agrees.
pub const MEDIAN_FACTOR: f64 = 1.25;

/// One figure of one strategy in both reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// `strategy (profile[, fault])`.
    pub who: String,
    pub figure: &'static str,
    pub first: Option<Spread>,
    pub second: Option<Spread>,
    /// The two verdicts against `sql` ([`VS_SQL`] only).
    pub verdicts: Option<(Option<VsSql>, Option<VsSql>)>,
    /// `None` when an interval is missing in either report.
    pub overlap: Option<bool>,
    pub medians_close: Option<bool>,
    pub contradiction: bool,
}

impl Check {
    /// Every rule that could be checked holds, and each could be.
    pub fn agrees(&self) -> bool {
        self.overlap == Some(true) && self.medians_close == Some(true) && !self.contradiction
    }

    /// "lock/fenced (burst) × sql: 0.61 [0.52–0.70] | 0.66 [0.60–0.73]:
    /// agree".
    pub fn line(&self) -> String {
        let spread = |s: &Option<Spread>| match s {
            Some(Spread { median, ci95: Some([lo, hi]), .. }) => {
                format!("{median:.2} [{lo:.2}–{hi:.2}]")
            }
            Some(s) => format!("{:.2} [no interval]", s.median),
            None => "–".to_owned(),
        };
        let mut failed = Vec::new();
        match self.overlap {
            Some(false) => failed.push("intervals do not overlap".to_owned()),
            None => failed.push("an interval is missing".to_owned()),
            Some(true) => {}
        }
        if self.medians_close == Some(false) {
            failed.push(format!("medians differ by more than {MEDIAN_FACTOR} ×"));
        }
        if self.contradiction {
            failed.push("faster than sql in one, slower in the other".to_owned());
        }
        let verdicts = match self.verdicts {
            Some((a, b)) => format!(" ({} | {})", verdict(a), verdict(b)),
            None => String::new(),
        };
        let outcome = if failed.is_empty() { "agree".to_owned() } else { failed.join("; ") };
        let name = figure_name(self.figure);
        let (a, b) = (spread(&self.first), spread(&self.second));
        format!("{} {name}: {a} | {b}{verdicts}: {outcome}", self.who)
    }
}

fn verdict(v: Option<VsSql>) -> &'static str {
    v.map_or("not ranked", VsSql::as_str)
}

fn figure_name(figure: &str) -> &str {
    match figure {
        VS_SQL => "× sql",
        "ratio.rejection_vs_http_rps" => "rejections × http_rps",
        other => other,
    }
}

/// The checks of every summary present in both reports, in the first
/// report's order.
pub fn compare(first: &Report, second: &Report) -> Vec<Check> {
    let mut checks = Vec::new();
    for a in &first.summary {
        let Some(b) = second.summary.iter().find(|b| same_group(a, b)) else { continue };
        for &figure in FIGURES {
            checks.push(check(a, b, figure));
        }
    }
    checks
}

fn same_group(a: &Summary, b: &Summary) -> bool {
    a.strategy == b.strategy && a.profile == b.profile && a.fault == b.fault
}

fn check(a: &Summary, b: &Summary, figure: &'static str) -> Check {
    let spread = |s: &Summary| s.figures.get(figure).copied().flatten();
    let (first, second) = (spread(a), spread(b));
    let intervals = first.and_then(|s| s.ci95).zip(second.and_then(|s| s.ci95));
    let overlap = intervals.map(|([lo1, hi1], [lo2, hi2])| lo1 <= hi2 && lo2 <= hi1);
    let medians_close = first.zip(second).map(|(x, y)| medians_close(x.median, y.median));
    let verdicts = (figure == VS_SQL).then_some((a.vs_sql, b.vs_sql));
    let contradiction = matches!(
        verdicts,
        Some((Some(VsSql::Faster), Some(VsSql::Slower)))
            | Some((Some(VsSql::Slower), Some(VsSql::Faster)))
    );
    let who = match &a.fault {
        Some(fault) => format!("{} ({}, {fault})", a.strategy, a.profile),
        None => format!("{} ({})", a.strategy, a.profile),
    };
    Check { who, figure, first, second, verdicts, overlap, medians_close, contradiction }
}

/// Whether the larger of two positive medians is at most
/// [`MEDIAN_FACTOR`] times the smaller.
fn medians_close(a: f64, b: f64) -> bool {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    lo > 0.0 && hi / lo <= MEDIAN_FACTOR
}

/// `loadtest agree`: reads both reports, prints every check, answers
/// success when every one agrees, 1 when one does not, 2 when a report
/// cannot be read.
pub fn run(first: &Path, second: &Path) -> ExitCode {
    let reports = read(first).and_then(|a| Ok((a, read(second)?)));
    let (a, b) = match reports {
        Ok(reports) => reports,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::from(2);
        }
    };
    let checks = compare(&a, &b);
    for check in &checks {
        println!("{}", check.line());
    }
    let disagree = checks.iter().filter(|c| !c.agrees()).count();
    if checks.is_empty() {
        eprintln!("the two reports have no strategy summarised in both");
        ExitCode::from(1)
    } else if disagree > 0 {
        eprintln!("{disagree} of {} checks disagree", checks.len());
        ExitCode::from(1)
    } else {
        println!("all {} checks agree", checks.len());
        ExitCode::SUCCESS
    }
}

/// The report at `path`, its summaries computed again from its runs (as
/// `loadtest render` does), so that two reports are compared under this
/// version's intervals whichever version wrote them.
fn read(path: &Path) -> anyhow::Result<Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut report: Report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a report.json", path.display()))?;
    report.summary = crate::report::summary::summarize(&report.runs);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::expectation::Expectation;
    use crate::report::summary::VerdictCounts;

    fn summary(strategy: &str, vs_sql: [f64; 3], verdict: Option<VsSql>) -> Summary {
        let [lo, median, hi] = vs_sql;
        let spread = Spread { median, min: lo, max: hi, n: 5, ci95: Some([lo, hi]) };
        let rejections = Spread { median: 0.5, min: 0.4, max: 0.6, n: 5, ci95: Some([0.4, 0.6]) };
        let figures = BTreeMap::from([
            (VS_SQL.to_owned(), Some(spread)),
            ("ratio.rejection_vs_http_rps".to_owned(), Some(rejections)),
        ]);
        Summary {
            strategy: strategy.to_owned(),
            profile: "burst".to_owned(),
            fault: None,
            expected: Expectation::Correct,
            runs: 5,
            verdicts: VerdictCounts::default(),
            broken_runs: 0,
            oversold: vec![],
            ledger_drift: vec![],
            redis_drift: vec![],
            figures,
            too_short_to_rank: false,
            vs_sql: verdict,
        }
    }

    fn checks(a: Summary, b: Summary) -> Vec<Check> {
        FIGURES.iter().map(|figure| check(&a, &b, figure)).collect()
    }

    #[test]
    fn overlapping_intervals_with_close_medians_agree() {
        let a = summary("queue", [3.0, 3.5, 4.0], Some(VsSql::Faster));
        let b = summary("queue", [3.8, 4.2, 4.6], Some(VsSql::Faster));
        let checks = checks(a, b);
        assert!(checks.iter().all(Check::agrees), "{checks:#?}");
        assert!(checks[0].line().ends_with("(faster | faster): agree"), "{}", checks[0].line());
    }

    #[test]
    fn disjoint_intervals_or_far_medians_disagree() {
        let a = summary("queue", [3.0, 3.5, 4.0], Some(VsSql::Faster));
        let b = summary("queue", [4.1, 4.5, 5.0], Some(VsSql::Faster));
        let check = &checks(a, b)[0];
        assert_eq!((check.overlap, check.medians_close), (Some(false), Some(false)));
        assert!(!check.agrees());
        // Overlapping, but 1.3 × apart: the medians rule alone fails.
        let a = summary("sql/buckets", [1.0, 2.0, 3.0], Some(VsSql::Indistinguishable));
        let b = summary("sql/buckets", [1.5, 2.6, 3.5], Some(VsSql::Faster));
        let check = &checks(a, b)[0];
        assert_eq!((check.overlap, check.medians_close), (Some(true), Some(false)));
        assert!(!check.contradiction, "indistinguishable contradicts nothing");
        assert!(check.line().contains("medians differ"), "{}", check.line());
    }

    #[test]
    fn faster_in_one_and_slower_in_the_other_is_a_contradiction() {
        let a = summary("naive", [1.01, 1.1, 1.2], Some(VsSql::Faster));
        let b = summary("naive", [0.9, 0.95, 0.99], Some(VsSql::Slower));
        let check = &checks(a, b)[0];
        assert!(check.contradiction && !check.agrees());
        assert_eq!(check.medians_close, Some(true), "1.16 × apart");
    }

    #[test]
    fn a_missing_interval_cannot_agree() {
        let a = summary("sql/batched", [7.0, 8.0, 9.0], Some(VsSql::Faster));
        let mut b = summary("sql/batched", [7.0, 8.0, 9.0], None);
        b.figures
            .insert(VS_SQL.to_owned(), Some(Spread { ci95: None, ..a.figures[VS_SQL].unwrap() }));
        let check = &checks(a, b)[0];
        assert_eq!(check.overlap, None);
        assert!(!check.agrees());
        assert!(check.line().contains("an interval is missing"), "{}", check.line());
    }

    #[test]
    fn medians_are_close_within_a_factor_of_1_25() {
        assert!(medians_close(1.0, 1.25) && medians_close(1.25, 1.0));
        assert!(!medians_close(1.0, 1.26));
        assert!(!medians_close(0.0, 0.0), "nothing measured agrees with nothing");
    }
}
