//! Progress of a comparison on stderr: which strategy, profile, repeat and
//! phase is running, how many runs are done, the elapsed time and an
//! estimate of the time left.
//!
//! On a terminal it is an indicatif bar; otherwise (CI logs, pipes) one line
//! per stage, so a log shows where a long run was; with `--quiet`, nothing.
//! The estimate is the mean time of the finished runs times the runs left,
//! so it is only as good as the runs are alike. With `--serve-progress`,
//! every step also goes to the live view ([`crate::live`]).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::live::Live;
use crate::report::Run;

pub struct Progress {
    bar: Option<ProgressBar>,
    /// One line per stage on stderr (not a terminal, not quiet).
    lines: bool,
    started: Instant,
    total: u64,
    done: u64,
    /// When the latest run finished.
    last_done: Instant,
    current: String,
    live: Option<Live>,
}

impl Progress {
    /// Progress over `total` runs, also shown by `live` if given.
    pub fn new(total: u64, quiet: bool, live: Option<Live>) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (terminal && !quiet).then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs · ETA {eta} · {msg}",
                )
                .expect("a valid template")
                .progress_chars("█▌ "),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            bar,
            lines: !terminal && !quiet,
            started: Instant::now(),
            total,
            done: 0,
            last_done: Instant::now(),
            current: String::new(),
            live,
        }
    }

    /// The live view, with `--serve-progress`.
    pub fn live(&self) -> Option<&Live> {
        self.live.as_ref()
    }

    /// A stage outside the runs, e.g. measuring the ceilings.
    pub fn stage(&mut self, what: &str) {
        self.current.clear();
        if let Some(live) = &self.live {
            live.stage(what);
        }
        self.show(what);
    }

    /// A run starts: `label` names strategy, profile and repeat.
    pub fn run(&mut self, label: String) {
        if let Some(live) = &self.live {
            live.run(&label);
        }
        self.current = label;
        self.show("starting");
    }

    /// A phase of the current run starts.
    pub fn phase(&mut self, phase: &str) {
        if let Some(live) = &self.live {
            live.phase(phase);
        }
        self.show(phase);
    }

    /// The current run is done: its outcome is shown above the bar.
    pub fn run_done(&mut self, run: &Run) {
        if let Some(live) = &self.live {
            live.run_done(run);
        }
        let outcome = format!(
            "{}: sold {} of {}, oversold {}, drift {}",
            run.verdict.label(),
            run.units_sold,
            run.total_stock,
            run.oversold,
            run.ledger_drift
        );
        self.done += 1;
        self.last_done = Instant::now();
        let line = format!("{} — {outcome}", self.current);
        match &self.bar {
            Some(bar) => {
                bar.inc(1);
                bar.println(line);
            }
            None if self.lines => {
                eprintln!("[{}] {}/{} {line}", clock(self.started.elapsed()), self.done, self.total)
            }
            None => {}
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    fn show(&self, what: &str) {
        let message = if self.current.is_empty() {
            what.to_owned()
        } else {
            format!("{} · {what}", self.current)
        };
        match &self.bar {
            Some(bar) => bar.set_message(message),
            None if self.lines => {
                // Mean run time × runs left, less what the current run has
                // already taken.
                let eta = (self.done > 0).then(|| {
                    let mean = self.last_done.duration_since(self.started) / self.done as u32;
                    (mean * (self.total - self.done) as u32)
                        .saturating_sub(self.last_done.elapsed())
                });
                eprintln!(
                    "[{}] run {}/{}{} · {message}",
                    clock(self.started.elapsed()),
                    (self.done + 1).min(self.total),
                    self.total,
                    eta.map_or_else(String::new, |eta| format!(" · ETA {}", clock(eta))),
                );
            }
            None => {}
        }
    }
}

/// `hh:mm:ss`.
fn clock(elapsed: Duration) -> String {
    let s = elapsed.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}
