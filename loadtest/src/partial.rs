//! What a comparison has measured so far, kept beside it for the report of
//! one cut short ([`crate::interrupt`]): by then the comparison's own state
//! is gone, dropped where it waited or unwound by a panic.
//!
//! It holds the ceilings of the finished rounds, the round in progress (its
//! ceilings, measured before its runs) and every finished run. The report
//! made from it ([`SoFar::report`]) is the one a complete comparison writes,
//! over the finished runs only — the round in progress counted as a round
//! once one of its runs finished, its `http_rps` sample the median of their
//! own —, without
//! what is measured at the end (`sql_batched_units_per_s`, the balancer's
//! and the Redis Cluster's figures), and marked `partial`.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::ceilings::{Ceilings, Kind, Round};
use crate::report::{self, Partial, Report, Run};

/// A handle on what was measured; clones share it.
#[derive(Clone)]
pub struct SoFar(Arc<Mutex<State>>);

struct State {
    /// report.json's `config`.
    config: serde_json::Value,
    runs_planned: u64,
    /// The ceilings of the finished rounds.
    ceilings: Ceilings,
    /// The round in progress, by number, with its ceilings.
    round: Option<(u64, Round)>,
    runs: Vec<Run>,
    /// The queues of the started instances on a shared broker: their prefix
    /// and the broker's URL (`None` with `--target`, on a broker the
    /// comparison owns, or before the instances started).
    queues: Option<(String, String)>,
}

impl SoFar {
    /// Nothing measured yet, of `runs_planned` runs, with no sample of
    /// `ceilings` yet.
    pub fn new(config: serde_json::Value, runs_planned: u64, ceilings: Ceilings) -> SoFar {
        let state =
            State { config, runs_planned, ceilings, round: None, runs: vec![], queues: None };
        SoFar(Arc::new(Mutex::new(state)))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves the state as it was
        // between two updates: still worth reporting.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The queues of the started instances, `prefix` on `amqp_url`.
    pub fn queues_declared(&self, prefix: &str, amqp_url: &str) {
        self.state().queues = Some((prefix.to_owned(), amqp_url.to_owned()));
    }

    /// `(prefix, amqp_url)` of the started instances' queues, if any.
    pub fn queues(&self) -> Option<(String, String)> {
        self.state().queues.clone()
    }

    /// Round `repeat` starts, with its ceilings measured.
    pub fn round_started(&self, repeat: u64, round: &Round) {
        self.state().round = Some((repeat, round.clone()));
    }

    /// A run finished.
    pub fn run_finished(&self, run: &Run) {
        self.state().runs.push(run.clone());
    }

    /// The round in progress finished: `ceilings` now count it.
    pub fn round_finished(&self, ceilings: &Ceilings) {
        let mut state = self.state();
        state.ceilings = ceilings.clone();
        state.round = None;
    }

    /// The report of what was measured, marked partial with `reason`.
    pub fn report(&self, reason: String) -> Report {
        let state = self.state();
        let mut ceilings = state.ceilings.clone();
        // The round in progress counts once one of its runs finished (its
        // `http_rps` sample comes from them).
        if let Some((repeat, round)) = &state.round {
            let own: Vec<Option<f64>> =
                state.runs.iter().filter(|run| run.repeat == *repeat).map(|r| r.http_rps).collect();
            if !own.is_empty() {
                let mut round = round.clone();
                round.set(Kind::HttpRps, crate::ceilings::http_sample(own));
                ceilings.record(&round);
            }
        }
        let mut runs = state.runs.clone();
        report::relate_to_sql(&mut runs);
        let mut report = Report::new(state.config.clone(), ceilings, runs);
        report.partial = Some(Partial { reason, runs_planned: state.runs_planned });
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{fixture, html, markdown};

    fn round(sql_tps: f64) -> Round {
        let mut round = Round::default();
        round.set(Kind::SqlTps, sql_tps);
        round
    }

    #[test]
    fn the_report_holds_the_finished_runs_and_rounds_and_says_it_is_partial() {
        let fixture = fixture::report();
        let sofar = SoFar::new(fixture.config.clone(), 9, fixture.ceilings.clone());
        let mut ceilings = fixture.ceilings.clone();
        let first = round(1000.0);
        sofar.round_started(1, &first);
        let (first_runs, second_runs): (Vec<Run>, Vec<Run>) =
            fixture.runs.iter().cloned().partition(|run| run.repeat == 1);
        first_runs.iter().for_each(|run| sofar.run_finished(run));
        ceilings.record(&first);
        sofar.round_finished(&ceilings);
        sofar.round_started(2, &round(3000.0));
        sofar.run_finished(&second_runs[0]);

        let report = sofar.report("interrupted by SIGTERM".into());
        assert_eq!(report.runs.len(), 4);
        let partial = Partial { reason: "interrupted by SIGTERM".into(), runs_planned: 9 };
        assert_eq!(report.partial, Some(partial));
        assert_eq!(report.ceilings.sql_tps.samples, [1000.0, 3000.0], "round 2 has a run");
        assert_eq!(report.summary.len(), 3, "one per strategy");
        let line = "Partial report: interrupted by SIGTERM. 4 of 9 planned runs finished";
        let md = markdown::render(&report);
        assert!(md.lines().take(3).any(|l| l.contains(line)), "at the top of report.md: {md}");
        assert!(md.starts_with("# Flash-sale strategy comparison (partial)"));
        let page = html::render(&report);
        let top = &page[..page.find("<h2").unwrap()];
        assert!(top.contains(line) && top.contains("class=\"partial\""), "{top}");
        assert!(!markdown::render(&fixture).contains("Partial report"), "a complete one");
    }

    #[test]
    fn a_round_without_a_finished_run_adds_no_sample() {
        let fixture = fixture::report();
        let sofar = SoFar::new(fixture.config.clone(), 6, fixture.ceilings.clone());
        sofar.round_started(1, &round(1000.0));
        let report = sofar.report("interrupted by SIGINT".into());
        assert!(report.runs.is_empty() && report.ceilings.sql_tps.samples.is_empty());
        assert_eq!(report.partial.unwrap().runs_planned, 6);
    }
}
