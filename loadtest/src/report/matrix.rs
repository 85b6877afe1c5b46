//! The fault matrix of a report: strategies × faults, one table per profile
//! that had fault runs. Each cell gathers the runs of one (strategy, fault)
//! over the repeats: the verdict, and for each repeat oversold, undersold
//! after settle, accepted purchases lost and the seconds until the next
//! sale. report.md and report.html render the same cells.

use super::{Report, Run, Verdict};
use crate::expectation::Expectation;

/// The column of the runs without a fault.
pub const NO_FAULT: &str = "none";

/// One profile's matrix.
#[derive(Debug, PartialEq)]
pub struct Matrix {
    pub profile: String,
    /// Column headers: `none` first when there were runs without a fault,
    /// then the faults in the order they ran.
    pub faults: Vec<String>,
    pub rows: Vec<MatrixRow>,
}

#[derive(Debug, PartialEq)]
pub struct MatrixRow {
    pub strategy: String,
    /// One per column; `None` where that combination did not run.
    pub cells: Vec<Option<Cell>>,
}

/// The runs of one (strategy, fault) of a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub expected: Expectation,
    /// The worst verdict of the runs (`broke`, then `unexpected`, then `ok`).
    pub verdict: Verdict,
    pub runs: u64,
    /// Runs that broke the sale in any way ([`Run::is_broken`]): "broke in
    /// k of n" of a `may_break` cell.
    pub broken: u64,
    /// Per repeat, in repeat order.
    pub oversold: Vec<i64>,
    pub undersold_after_settle: Vec<i64>,
    /// `None` for runs without a fault.
    pub accepted_lost: Vec<Option<i64>>,
    pub recovery_s: Vec<Option<f64>>,
}

impl Cell {
    fn of(runs: &[&Run]) -> Cell {
        let verdict = runs
            .iter()
            .map(|r| r.verdict)
            .max_by_key(|v| match v {
                Verdict::Ok => 0,
                Verdict::Unexpected => 1,
                Verdict::Broke => 2,
            })
            .unwrap_or(Verdict::Ok);
        let fault = |r: &&Run| r.fault.clone();
        Cell {
            expected: runs[0].expected,
            verdict,
            runs: runs.len() as u64,
            broken: runs.iter().filter(|r| r.is_broken()).count() as u64,
            oversold: runs.iter().map(|r| r.oversold).collect(),
            undersold_after_settle: runs.iter().map(|r| r.undersold).collect(),
            accepted_lost: runs.iter().map(|r| fault(r).map(|f| f.accepted_lost)).collect(),
            recovery_s: runs.iter().map(|r| fault(r).and_then(|f| f.recovery_s)).collect(),
        }
    }

    /// `ok · broke in 1 of 2 · oversold 0 · undersold 0 · lost 0 · recovery
    /// 0.04 s`; the `broke in` part for `may_break` cells only.
    pub fn text(&self) -> String {
        let ints = |values: &[i64]| values.iter().map(i64::to_string).collect::<Vec<_>>();
        let opt = |values: &[Option<String>]| {
            values.iter().map(|v| v.clone().unwrap_or_else(|| "–".to_owned())).collect::<Vec<_>>()
        };
        let lost: Vec<Option<String>> =
            self.accepted_lost.iter().map(|v| v.map(|v| v.to_string())).collect();
        let recovery: Vec<Option<String>> =
            self.recovery_s.iter().map(|v| v.map(|s| format!("{s:.2}"))).collect();
        let mut parts = vec![self.verdict.label().to_owned()];
        if self.expected == Expectation::MayBreak {
            parts.push(format!("broke in {} of {}", self.broken, self.runs));
        }
        parts.push(format!("oversold {}", ints(&self.oversold).join(", ")));
        parts.push(format!("undersold {}", ints(&self.undersold_after_settle).join(", ")));
        if lost.iter().any(Option::is_some) {
            parts.push(format!("lost {}", opt(&lost).join(", ")));
            parts.push(format!("recovery {} s", opt(&recovery).join(", ")));
        }
        parts.join(" · ")
    }
}

/// The matrices of `report`; none when no run had a fault.
pub fn matrices(report: &Report) -> Vec<Matrix> {
    if report.runs.iter().all(|r| r.fault.is_none()) {
        return Vec::new();
    }
    let profiles = ordered(report.runs.iter().map(|r| r.profile.as_str()));
    profiles.iter().map(|profile| matrix(&report.runs, profile)).collect()
}

fn matrix(all: &[Run], profile: &str) -> Matrix {
    let runs: Vec<&Run> = all.iter().filter(|r| r.profile == profile).collect();
    let mut faults = ordered(runs.iter().map(|r| r.fault_name()));
    if let Some(i) = faults.iter().position(|f| f == NO_FAULT) {
        let none = faults.remove(i);
        faults.insert(0, none);
    }
    let rows = ordered(runs.iter().map(|r| r.strategy.as_str()))
        .into_iter()
        .map(|strategy| {
            let cells = faults
                .iter()
                .map(|fault| {
                    let mut group: Vec<&Run> = runs
                        .iter()
                        .copied()
                        .filter(|r| r.strategy == strategy && r.fault_name() == fault)
                        .collect();
                    group.sort_by_key(|r| r.repeat);
                    (!group.is_empty()).then(|| Cell::of(&group))
                })
                .collect();
            MatrixRow { strategy, cells }
        })
        .collect();
    Matrix { profile: profile.to_owned(), faults, rows }
}

/// Distinct items in order of first appearance.
fn ordered<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for item in items {
        if !seen.iter().any(|s| s == item) {
            seen.push(item.to_owned());
        }
    }
    seen
}

/// What a cell says, for the note under each matrix.
pub const LEGEND: &str = "Each cell: the verdict of the runs of that strategy under that fault \
(the worst over the repeats; a may_break cell also says how often its books broke), then per \
repeat: units oversold; units undersold after the settle period and the rejection phase's fresh \
buyers; accepted_lost — purchases answered 201 or 202 that Postgres does not honour after \
settle; recovery — seconds from the fault to the next order committed (– when nothing sold \
after it).";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultRecord;
    use crate::report::fixture;

    fn faulted(mut run: Run, kind: &str, lost: i64, recovery: Option<f64>) -> Run {
        run.fault = Some(FaultRecord {
            kind: kind.to_owned(),
            hit: true,
            accepted_lost: lost,
            recovery_s: recovery,
            ..FaultRecord::default()
        });
        run
    }

    #[test]
    fn a_matrix_has_a_row_per_strategy_and_a_column_per_fault_none_first() {
        let mut report = fixture::report();
        assert!(matrices(&report).is_empty(), "no fault, no matrix");
        let sql = report.runs.iter().find(|r| r.strategy == "sql").unwrap().clone();
        let mut lost = faulted(sql.clone(), "kill-instance", 3, None);
        lost.verdict = Verdict::Broke;
        report.runs.insert(0, faulted(sql, "pg-terminate", 0, Some(0.25)));
        report.runs.push(lost);
        let matrices = matrices(&report);
        assert_eq!(matrices.len(), 1);
        let m = &matrices[0];
        assert_eq!(m.faults, ["none", "pg-terminate", "kill-instance"]);
        let strategies: Vec<&str> = m.rows.iter().map(|r| r.strategy.as_str()).collect();
        assert_eq!(strategies, ["sql", "naive", "queue"]);
        let sql = &m.rows[0];
        assert_eq!(sql.cells[0].as_ref().unwrap().runs, 2, "two repeats without a fault");
        let terminated = sql.cells[1].as_ref().unwrap();
        assert_eq!(terminated.text(), "ok · oversold 0 · undersold 0 · lost 0 · recovery 0.25 s");
        let killed = sql.cells[2].as_ref().unwrap();
        assert_eq!(killed.verdict, Verdict::Broke);
        assert_eq!(killed.text(), "BROKE · oversold 0 · undersold 0 · lost 3 · recovery – s");
        assert!(m.rows[1].cells[1].is_none(), "naive did not run under pg-terminate");
    }

    #[test]
    fn a_may_break_cell_counts_how_often_it_broke() {
        let report = fixture::report();
        let runs: Vec<Run> = report
            .runs
            .iter()
            .filter(|r| r.strategy == "sql")
            .map(|r| {
                let mut run = faulted(r.clone(), "pause-instance", 0, Some(0.5));
                run.expected = Expectation::MayBreak;
                run
            })
            .collect();
        let mut broken = runs[1].clone();
        broken.oversold = 2;
        let cell = Cell::of(&[&runs[0], &broken]);
        assert_eq!((cell.broken, cell.runs), (1, 2));
        assert!(cell.text().starts_with("ok · broke in 1 of 2 · oversold 0, 2"), "{}", cell.text());
    }
}
