//! `loadtest compare --serve-progress ADDR`: a page that shows the
//! comparison as it runs — for the run in progress, units sold and purchases
//! rejected per second and the stock left, sampled about once a second
//! during its sale phase, with oversell marked as soon as the books show it;
//! and the runs finished so far with their verdicts and their units sold per
//! second (the series report.json keeps).
//!
//! Two routes on `ADDR`: `GET /` the page (one embedded file, no external
//! resource), which polls `GET /progress.json` every second: the
//! [`Board`] with its charts already drawn as SVG by the report's own chart
//! code (`crate::report`), so the page and report.html draw alike. The
//! samples read Postgres (one query over the run's sales per sample) and
//! the load generator's answer counters; nothing is asked of the instances.
//! The server stops with the comparison; the page then keeps its last state
//! and says so.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde::Serialize;

use crate::report::{Run, html};
use crate::scenario::OutcomeCounters;
use crate::series::{Books, Sample};

/// The page (HTML with its script and style inline).
const PAGE: &str = include_str!("live/page.html");

/// How often the run in progress is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the page shows, as `GET /progress.json` answers it.
#[derive(Debug, Default, Serialize)]
pub struct Board {
    /// What the comparison is doing now (a stage, or the phase of the run).
    pub stage: String,
    pub runs_total: u64,
    pub runs_done: u64,
    /// The run in progress, if any.
    pub current: Option<Current>,
    /// Finished runs, in the order they ran.
    pub finished: Vec<Finished>,
    /// The comparison has ended (its reports are written).
    pub done: bool,
}

/// The run in progress.
#[derive(Debug, Default, Serialize)]
pub struct Current {
    /// `strategy · profile · repeat r/n`.
    pub label: String,
    pub phase: String,
    /// Units of stock of the run's sales (0 before its sale phase).
    pub total_stock: i64,
    /// Samples of its sale phase so far.
    pub samples: Vec<Sample>,
}

/// A finished run, as its record says.
#[derive(Debug, Serialize)]
pub struct Finished {
    pub label: String,
    pub strategy: String,
    pub expected: &'static str,
    /// `ok`, `BROKE` or `unexpected`.
    pub verdict: &'static str,
    pub units_sold: i64,
    pub total_stock: i64,
    pub oversold: i64,
    pub undersold: i64,
    pub ledger_drift: i64,
}

/// The shared board and the runs' records (for the charts); cheap to clone.
#[derive(Clone, Default)]
pub struct Live {
    board: Arc<Mutex<(Board, Vec<Run>)>>,
}

impl Live {
    /// Serves the page on `addr` from now until the process ends. Errors:
    /// the address cannot be bound.
    pub async fn serve(addr: SocketAddr, runs_total: u64) -> anyhow::Result<Live> {
        let live = Live::default();
        live.update(|board| board.runs_total = runs_total);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--serve-progress: cannot listen on {addr}"))?;
        let app = Router::new()
            .route("/", get(page))
            .route("/progress.json", get(progress))
            .with_state(live.clone());
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::warn!(error = %err, "the progress page stopped");
            }
        });
        Ok(live)
    }

    fn update(&self, change: impl FnOnce(&mut Board)) {
        change(&mut self.board.lock().expect("board lock").0);
    }

    /// A stage outside the runs (the current run, if any, is over).
    pub fn stage(&self, what: &str) {
        self.update(|board| {
            board.stage = what.to_owned();
            board.current = None;
        });
    }

    /// A run starts.
    pub fn run(&self, label: &str) {
        self.update(|board| {
            board.stage = format!("{label} · starting");
            board.current = Some(Current { label: label.to_owned(), ..Current::default() });
        });
    }

    /// The current run enters `phase`.
    pub fn phase(&self, phase: &str) {
        self.update(|board| {
            if let Some(current) = &mut board.current {
                current.phase = phase.to_owned();
                board.stage = format!("{} · {phase}", current.label);
            }
        });
    }

    /// The current run is done: its record joins the finished runs.
    pub fn run_done(&self, run: &Run) {
        let mut guard = self.board.lock().expect("board lock");
        let (board, runs) = &mut *guard;
        let label = board.current.take().map(|c| c.label).unwrap_or_default();
        board.runs_done += 1;
        board.finished.push(Finished {
            label,
            strategy: run.strategy.clone(),
            expected: run.expected.as_str(),
            verdict: run.verdict.label(),
            units_sold: run.units_sold,
            total_stock: run.total_stock,
            oversold: run.oversold,
            undersold: run.undersold,
            ledger_drift: run.ledger_drift,
        });
        runs.push(run.clone());
    }

    /// The comparison has ended.
    pub fn done(&self, what: &str) {
        self.update(|board| {
            board.stage = what.to_owned();
            board.current = None;
            board.done = true;
        });
    }

    /// Samples the sale phase of the current run — the books of `sales`
    /// (`total_stock` units) and the refusals in `answers` — every
    /// [`SAMPLE_EVERY`] until [`Sampler::stop`].
    pub fn sample_sale(
        &self,
        db: sqlx::PgPool,
        sales: Vec<i64>,
        total_stock: i64,
        answers: Arc<OutcomeCounters>,
    ) -> Sampler {
        self.update(|board| {
            if let Some(current) = &mut board.current {
                current.total_stock = total_stock;
                current.samples.clear();
            }
        });
        let probe =
            Arc::new(Probe { live: self.clone(), db, sales, answers, started: Instant::now() });
        let sampling = probe.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SAMPLE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                sampling.sample().await;
            }
        });
        Sampler { task, probe }
    }

    /// The board as JSON, with its charts drawn.
    fn snapshot(&self) -> serde_json::Value {
        let guard = self.board.lock().expect("board lock");
        let (board, runs) = &*guard;
        let mut json = serde_json::to_value(board).unwrap_or_default();
        json["charts"] = serde_json::json!({
            "current": board.current.as_ref().map(|c| html::live_chart(&c.samples, c.total_stock)),
            "finished": (!runs.is_empty()).then(|| html::finished_chart(runs)),
        });
        json
    }
}

/// What one sample reads, and where it goes.
struct Probe {
    live: Live,
    db: sqlx::PgPool,
    sales: Vec<i64>,
    answers: Arc<OutcomeCounters>,
    /// The sale phase's start.
    started: Instant,
}

impl Probe {
    /// Reads the books and the answers, and appends a sample to the current
    /// run. A failed read leaves a gap, not a wrong point.
    async fn sample(&self) {
        let Ok(books) = Books::read(&self.db, &self.sales).await else { return };
        let t_s = self.started.elapsed().as_secs_f64();
        let refused = self.answers.snapshot().refused();
        self.live.update(|board| {
            if let Some(current) = &mut board.current {
                let next = Sample::next(current.samples.last(), t_s, books, refused);
                current.samples.push(next);
            }
        });
    }
}

/// The sampling of a sale phase; [`Sampler::stop`] ends it.
pub struct Sampler {
    task: tokio::task::JoinHandle<()>,
    probe: Arc<Probe>,
}

impl Sampler {
    /// Stops sampling after one last sample, taken now.
    pub async fn stop(self) {
        self.task.abort();
        self.probe.sample().await;
    }
}

async fn page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE)
}

async fn progress(State(live): State<Live>) -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(live.snapshot()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    #[test]
    fn the_board_follows_the_runs_and_draws_their_charts() {
        let live = Live::default();
        live.update(|board| board.runs_total = 2);
        live.stage("measuring the ceilings");
        let json = live.snapshot();
        assert_eq!(
            (json["stage"].as_str(), json["current"].is_null()),
            (Some("measuring the ceilings"), true)
        );
        assert!(json["charts"]["current"].is_null() && json["charts"]["finished"].is_null());

        live.run("naive · burst · repeat 1/1");
        live.phase("sale phase");
        live.update(|board| {
            let current = board.current.as_mut().unwrap();
            current.total_stock = 100;
            let books = Books { total_stock: 100, remaining_stock: 0, sold: 120, oversold: 20 };
            current.samples.push(Sample::next(None, 1.0, books, 50));
        });
        let json = live.snapshot();
        assert_eq!(json["stage"], "naive · burst · repeat 1/1 · sale phase");
        assert_eq!(json["current"]["samples"][0]["oversold"], 20);
        let chart = json["charts"]["current"].as_str().unwrap();
        assert_eq!(chart.matches(r#"class="mark""#).count(), 3, "sold, rejected, stock left");
        assert!(chart.contains(r#"class="marker""#), "oversell is marked");

        let run = fixture::report().runs.remove(0);
        live.run_done(&run);
        let json = live.snapshot();
        assert_eq!((json["runs_done"].as_u64(), json["current"].is_null()), (Some(1), true));
        assert_eq!(json["finished"][0]["label"], "naive · burst · repeat 1/1");
        assert_eq!(json["finished"][0]["verdict"], "ok");
        let finished = json["charts"]["finished"].as_str().unwrap();
        assert_eq!(finished.matches(r#"class="mark""#).count(), 1);
        live.done("finished");
        assert_eq!(live.snapshot()["done"], true);
    }
}
