//! What a run cost outside the HTTP figures: Postgres transactions of the
//! service database, and the resident memory of the app instances.
//!
//! Postgres counts transactions per backend and publishes them to
//! `pg_stat_database` only from time to time: a backend flushes its pending
//! counts when it goes idle at least `PGSTAT_MIN_INTERVAL` (1 s) after its
//! previous flush, and otherwise only after `PGSTAT_IDLE_INTERVAL` (10 s) of
//! idleness (PostgreSQL 15+, `src/backend/utils/activity/pgstat.c`). Read
//! straight after a phase, the view misses up to a second of every pool
//! connection's work. [`PgXacts::settle`] therefore waits past the 1 s
//! interval and then sends each instance's pool one trivial transaction per
//! connection (`GET /readyz` runs `SELECT 1`; sqlx hands out idle
//! connections first-in first-out, so consecutive requests visit every
//! one), which makes each backend flush; those nudges are counted and left
//! out of the figure. Transactions of the instances' background work (the
//! `redis-decr` reconciler, queue consumers) in the window are part of the
//! figure: they are what the strategy costs.
//!
//! The RSS sampler reads `/proc` through sysinfo every 100 ms; it knows only
//! the instances this process started, so it has nothing to say with
//! `--target`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// Postgres' minimum interval between two flushes of a backend's statistics
/// (`PGSTAT_MIN_INTERVAL`, 1000 ms), plus a margin for clock granularity.
const PGSTAT_MIN_INTERVAL: Duration = Duration::from_millis(1_150);

/// Reads `xact_commit + xact_rollback` of the service database.
pub struct PgXacts {
    /// A connection to the `postgres` database, so that reading the view
    /// does not count as a transaction of the service database.
    pool: PgPool,
    database: String,
    client: reqwest::Client,
    urls: Vec<String>,
    /// `GET /readyz` requests per instance in one nudge: one per pool
    /// connection, and one more in case background work took a connection
    /// out of turn.
    nudges_per_instance: u32,
}

/// One settled reading.
#[derive(Debug, Clone, Copy)]
pub struct Xacts {
    /// `xact_commit + xact_rollback` of the service database.
    pub total: i64,
    /// Transactions the nudge itself ran (already in `total`).
    pub nudges: i64,
}

impl PgXacts {
    /// Connects to the server of `database_url`; `pool_size` is the pool of
    /// each instance at `urls`.
    pub async fn connect(
        database_url: &str,
        urls: &[String],
        pool_size: u32,
    ) -> anyhow::Result<PgXacts> {
        let options: PgConnectOptions = database_url.parse().context("parsing DATABASE_URL")?;
        let database = options.get_database().unwrap_or("postgres").to_owned();
        let options = options.database("postgres").disable_statement_logging();
        let pool = PgPoolOptions::new().max_connections(1).connect_with(options).await?;
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        Ok(PgXacts {
            pool,
            database,
            client,
            urls: urls.to_vec(),
            nudges_per_instance: pool_size + 1,
        })
    }

    /// Makes every instance's backends publish their counts (see the module
    /// documentation), then reads the total. Call it after a phase's last
    /// answer; it takes a little over a second.
    pub async fn settle(&self) -> anyhow::Result<Xacts> {
        tokio::time::sleep(PGSTAT_MIN_INTERVAL).await;
        let mut nudges = 0;
        for url in &self.urls {
            for _ in 0..self.nudges_per_instance {
                let answer = self.client.get(format!("{url}/readyz")).send().await;
                // Any answer ran the `SELECT 1` unless Postgres itself failed,
                // which the readings would show anyway.
                if answer.is_ok_and(|r| r.status().is_success()) {
                    nudges += 1;
                }
            }
        }
        let total: i64 = sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
        )
        .bind(&self.database)
        .fetch_optional(&self.pool)
        .await?
        .unwrap_or(0);
        Ok(Xacts { total, nudges })
    }

    /// Transactions between two settled readings, without the nudges of the
    /// later one.
    pub fn between(before: Xacts, after: Xacts) -> i64 {
        (after.total - before.total - after.nudges).max(0)
    }
}

/// Samples the resident set of the started instances every 100 ms until
/// stopped, keeping the largest instance's peak.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    peak_bytes: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RssSampler {
    /// Starts sampling `pids`; with no pids (`--target`) it samples nothing
    /// and [`RssSampler::stop`] answers `None`.
    pub fn start(pids: Vec<u32>) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak_bytes = Arc::new(AtomicU64::new(0));
        let task = (!pids.is_empty()).then(|| {
            let (stop, peak_bytes) = (stop.clone(), peak_bytes.clone());
            tokio::spawn(async move {
                let pids: Vec<Pid> = pids.into_iter().map(Pid::from_u32).collect();
                let mut system = System::new();
                let mut ticks = tokio::time::interval(Duration::from_millis(100));
                loop {
                    ticks.tick().await;
                    system.refresh_processes_specifics(
                        ProcessesToUpdate::Some(&pids),
                        true,
                        ProcessRefreshKind::nothing().with_memory(),
                    );
                    let largest =
                        pids.iter().filter_map(|p| system.process(*p)).map(|p| p.memory()).max();
                    peak_bytes.fetch_max(largest.unwrap_or(0), Relaxed);
                    if stop.load(Relaxed) {
                        return;
                    }
                }
            })
        });
        RssSampler { stop, peak_bytes, task }
    }

    /// Stops sampling (after one last sample) and answers the peak RSS of
    /// the largest instance in MiB; `None` when nothing was sampled.
    pub async fn stop(mut self) -> Option<f64> {
        self.stop.store(true, Relaxed);
        let task = self.task.take()?;
        let _ = task.await;
        let bytes = self.peak_bytes.load(Relaxed);
        (bytes > 0).then(|| (bytes as f64 / (1u64 << 20) as f64 * 10.0).round() / 10.0)
    }
}
