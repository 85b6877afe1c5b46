//! Faults injected during a run (`loadtest compare --faults`): one fault per
//! run, once, when the run's sales have sold a set share of their stock
//! (`--fault-at`, default 30 %); the sale phase goes on, then a bounded
//! settle period, then the audit. What the fault did is the run's
//! [`FaultRecord`] (`runs[].fault` in report.json).
//!
//! Each kind is one module with one `inject` function: it breaks something,
//! waits as long as the fault lasts, repairs it (restarts, continues) and
//! says which instance it hit. Everything measured around it (the moment it
//! hit, what clients were answered meanwhile, how long until the next sale,
//! the accepted purchases that were lost) is a pure function of the
//! readings, tested here.
//!
//! What a fault does not do: hit the shared servers. It kills, stops or
//! restarts only processes this invocation started (its instances, and the
//! Redis and RabbitMQ node it starts for `redis-restart` and
//! `broker-restart`: [`OwnedServers`]), terminates only the Postgres
//! connections of its instances (`application_name = 'seckill'` in the
//! comparison's database), and cuts or slows only the instances' own links
//! to a server (`partition-redis`, `slow-postgres`: [`link`]).

mod broker_restart;
mod kill_instance;
pub mod link;
mod partition_redis;
mod pause_instance;
mod pg_terminate;
mod redis_restart;
mod servers;
mod slow_postgres;

pub use servers::{OwnedServers, Wanted};

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use seckill::strategy::StrategyName;
use serde::{Deserialize, Serialize};

use crate::admin::Admin;
use crate::instances::Instances;
use crate::scenario::{Answer, Receipt};

/// A kind of fault, as `--faults` and report.json name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL one app instance (for `queue`, the one whose consumer is
    /// active), started again after `--fault-restart-ms`.
    KillInstance,
    /// SIGSTOP one app instance for `--fault-duration-ms` (default 3 × the
    /// sale's lock lease), then SIGCONT.
    PauseInstance,
    /// `pg_terminate_backend` on every Postgres connection of the instances.
    PgTerminate,
    /// Kill the invocation's own Redis and start it again empty.
    RedisRestart,
    /// Stop the invocation's own RabbitMQ node and start it again.
    BrokerRestart,
    /// Cut one app instance's link to Redis for `--fault-duration-ms`
    /// (default 3 × the sale's lock lease), then heal it.
    PartitionRedis,
    /// Add `--fault-latency-ms` (default: the sale's lock lease) to every
    /// round trip of the instances' links to Postgres for
    /// `--fault-duration-ms`.
    SlowPostgres,
}

impl FaultKind {
    /// Every kind, in the order reports list them (`--faults all`).
    pub const ALL: &'static [FaultKind] = &[
        FaultKind::KillInstance,
        FaultKind::PauseInstance,
        FaultKind::PgTerminate,
        FaultKind::RedisRestart,
        FaultKind::BrokerRestart,
        FaultKind::PartitionRedis,
        FaultKind::SlowPostgres,
    ];

    /// The wire name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillInstance => "kill-instance",
            FaultKind::PauseInstance => "pause-instance",
            FaultKind::PgTerminate => "pg-terminate",
            FaultKind::RedisRestart => "redis-restart",
            FaultKind::BrokerRestart => "broker-restart",
            FaultKind::PartitionRedis => "partition-redis",
            FaultKind::SlowPostgres => "slow-postgres",
        }
    }

    /// Breaks, waits, repairs; answers when it landed and the instance it
    /// hit.
    async fn inject(self, on: &Target<'_>) -> anyhow::Result<Landed> {
        match self {
            FaultKind::KillInstance => kill_instance::inject(on).await,
            FaultKind::PauseInstance => pause_instance::inject(on).await,
            FaultKind::PgTerminate => pg_terminate::inject(on).await,
            FaultKind::RedisRestart => redis_restart::inject(on).await,
            FaultKind::BrokerRestart => broker_restart::inject(on).await,
            FaultKind::PartitionRedis => partition_redis::inject(on).await,
            FaultKind::SlowPostgres => slow_postgres::inject(on).await,
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One item of `--faults`: a kind, `all` of them, or `none` (a run without
/// a fault, to compare with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultChoice {
    None,
    All,
    Kind(FaultKind),
}

impl std::str::FromStr for FaultChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(FaultChoice::None),
            "all" => Ok(FaultChoice::All),
            _ => FaultKind::ALL
                .iter()
                .find(|kind| kind.name() == s)
                .map(|&kind| FaultChoice::Kind(kind))
                .ok_or_else(|| {
                    let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                    format!("unknown fault `{s}`: one of none, all, {}", names.join(", "))
                }),
        }
    }
}

impl Serialize for FaultChoice {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            FaultChoice::None => "none",
            FaultChoice::All => "all",
            FaultChoice::Kind(kind) => kind.name(),
        })
    }
}

/// The fault dimension of a comparison: each entry is one run per strategy
/// × profile × repeat (`None`: no fault). No choice at all is one run
/// without a fault; `all` expands to every kind; duplicates are dropped.
pub fn dimension(choices: &[FaultChoice]) -> Vec<Option<FaultKind>> {
    let mut faults = Vec::new();
    for choice in choices {
        let add: Vec<Option<FaultKind>> = match choice {
            FaultChoice::None => vec![None],
            FaultChoice::All => FaultKind::ALL.iter().copied().map(Some).collect(),
            FaultChoice::Kind(kind) => vec![Some(*kind)],
        };
        for fault in add {
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        }
    }
    if faults.is_empty() {
        faults.push(None);
    }
    faults
}

/// The fault settings of an invocation (flags of `compare`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Share of the run's stock sold when the fault hits (0..=1).
    pub at: f64,
    /// `kill-instance`: how long the instance stays dead.
    pub restart_after: Duration,
    /// `pause-instance`, `partition-redis`, `slow-postgres`: how long the
    /// instance stays stopped, cut off or slowed; `None`: 3 × the sale's
    /// lock lease ([`lasting`]).
    pub duration: Option<Duration>,
    /// `slow-postgres`: the latency added to each round trip; `None`: the
    /// sale's lock lease ([`slow_postgres::added_latency`]).
    pub latency: Option<Duration>,
    /// Longest settle period after the sale phase.
    pub settle: Duration,
}

/// How long a fault that lasts (stops, cuts or slows) lasts in a run:
/// `--fault-duration-ms`, else 3 × the lease — long enough that a lease
/// held when it hit has run out and another holder can have come and gone.
pub fn lasting(settings: &Settings, lease_ms: i32) -> Duration {
    settings.duration.unwrap_or_else(|| Duration::from_millis(3 * lease_ms.max(1) as u64))
}

/// What a fault acts on during one run.
pub struct Target<'a> {
    pub instances: &'a Instances,
    pub admin: &'a Admin,
    /// The comparison's database (the instances' connections are found in
    /// it).
    pub db: &'a sqlx::PgPool,
    pub strategy: StrategyName,
    /// The run's sales.
    pub sales: &'a [i64],
    /// The Redis the instances use.
    pub redis_url: &'a str,
    /// The servers the invocation started for its faults, and the
    /// instances' links.
    pub servers: &'a OwnedServers,
    /// Lock lease of the run's sales, milliseconds.
    pub lease_ms: i32,
    pub settings: Settings,
}

/// The moment a fault landed (the signal sent, the server killed, the
/// connections terminated), and the instance it hit (`None`: a server, or
/// every instance).
pub struct Landed {
    pub instance: Option<usize>,
    pub at: Instant,
    pub at_wall: DateTime<Utc>,
}

impl Landed {
    /// Landed now, on `instance`.
    pub fn now(instance: Option<usize>) -> Landed {
        Landed { instance, at: Instant::now(), at_wall: Utc::now() }
    }
}

/// The fault as it happened (wall clock and monotonic).
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    pub instance: Option<usize>,
    /// When it landed (after any wait for the moment it matters, such as
    /// a lock held).
    pub at: Instant,
    pub at_wall: DateTime<Utc>,
    /// Units the run's sales had sold then.
    pub sold: i64,
    /// When it was repaired (instance ready again, continued, the
    /// connections terminated).
    pub cleared: Instant,
}

/// Waits until the run's sales have sold `threshold` units, then injects
/// `kind` and answers once it is repaired; `None` when `phase_done` is set
/// before the threshold is reached (the fault never hit).
pub async fn inject_when_sold(
    kind: FaultKind,
    on: &Target<'_>,
    threshold: i64,
    phase_done: Arc<AtomicBool>,
) -> anyhow::Result<Option<Hit>> {
    loop {
        let sold = units_sold(on.db, on.sales).await?;
        if sold >= threshold {
            let Landed { instance, at, at_wall } = kind.inject(on).await?;
            return Ok(Some(Hit { instance, at, at_wall, sold, cleared: Instant::now() }));
        }
        if phase_done.load(Ordering::Relaxed) {
            return Ok(None);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How often the units sold are read while waiting for the fault point.
const POLL: Duration = Duration::from_millis(20);

/// Units sold so far over `sales`, from the orders.
pub async fn units_sold(db: &sqlx::PgPool, sales: &[i64]) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(quantity), 0)::bigint FROM orders WHERE sale_id = ANY($1)",
    )
    .bind(sales)
    .fetch_one(db)
    .await?)
}

/// The units to have sold before the fault hits: `at` of `stock`, at least 1.
pub fn threshold(stock: u64, at: f64) -> i64 {
    ((stock as f64 * at).round() as i64).max(1)
}

/// How long after the repair the fault window still runs: clients retrying
/// with backoff hear of the fault a little after it is repaired.
pub const WINDOW_TAIL: Duration = Duration::from_secs(1);

/// `runs[].fault`: what the fault did to the run (docs/report-format.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// `kill-instance`, `pause-instance`, `pg-terminate`, `redis-restart`,
    /// `broker-restart`, `partition-redis` or `slow-postgres`.
    pub kind: String,
    /// Whether it hit during the sale phase (`false`: the phase ended
    /// before the fault point; every figure below is then `null` or empty).
    pub hit: bool,
    /// Index of the instance it hit; `null` for faults on a server.
    pub instance: Option<usize>,
    /// Seconds from the sale phase's first purchase to the moment it landed.
    pub hit_s: Option<f64>,
    /// Units sold when it hit.
    pub sold_at_hit: Option<i64>,
    /// Seconds from the moment it landed to the repair.
    pub duration_s: Option<f64>,
    /// Undersold (as `runs[].undersold`) right after the sale phase.
    pub undersold_after_phase: i64,
    /// Undersold after the settle period and the rejection phase's fresh
    /// buyers: whether it healed (`runs[].undersold` is this figure).
    pub undersold_after_settle: i64,
    /// Seconds the settle period took (it ends early once every unit is
    /// sold and no request is pending).
    pub settle_s: f64,
    /// Its bound (`--settle-s`).
    pub settle_bound_s: f64,
    /// Purchases of the sale phase answered `201` or `202` whose order does
    /// not exist and whose request has no other final result after settle.
    pub accepted_lost: i64,
    /// Answers of the sale phase by HTTP status from the landing until 1 s
    /// after the repair (`"0"`: no answer — refused, reset, timed out).
    pub answers_in_window: BTreeMap<String, u64>,
    /// Seconds from the moment it landed to the next order committed; `null` when
    /// nothing sold after it.
    pub recovery_s: Option<f64>,
}

impl FaultRecord {
    /// The record of a fault that never hit.
    pub fn missed(kind: FaultKind, settle_bound: Duration) -> FaultRecord {
        FaultRecord {
            kind: kind.name().to_owned(),
            settle_bound_s: settle_bound.as_secs_f64(),
            ..FaultRecord::default()
        }
    }
}

/// Answers by status between the injection and [`WINDOW_TAIL`] after the
/// repair.
pub fn answers_in_window(answers: &[Answer], hit: &Hit) -> BTreeMap<String, u64> {
    let end = hit.cleared + WINDOW_TAIL;
    let mut counts = BTreeMap::new();
    for answer in answers.iter().filter(|a| a.at >= hit.at && a.at <= end) {
        *counts.entry(answer.status.to_string()).or_default() += 1;
    }
    counts
}

/// Seconds from `hit` to the first of `order_times` after it.
pub fn recovery_s(hit: DateTime<Utc>, order_times: &[DateTime<Utc>]) -> Option<f64> {
    let next = order_times.iter().filter(|t| **t > hit).min()?;
    Some((*next - hit).num_microseconds().unwrap_or(0) as f64 / 1e6)
}

/// What Postgres holds of the receipts after settle: the orders that exist,
/// and the requests with a final result (settled as placed with their order
/// present, or answered sold out, already purchased or rejected).
#[derive(Debug, Default)]
pub struct Found {
    pub orders: HashSet<i64>,
    pub final_requests: HashSet<uuid::Uuid>,
}

/// Receipts (each `201`'s order, each `202`'s request) that Postgres does
/// not honour: the order is missing, or the request has no final result.
pub fn accepted_lost(answers: &[Answer], found: &Found) -> i64 {
    answers
        .iter()
        .filter_map(|a| a.receipt)
        .filter(|receipt| match receipt {
            Receipt::Order(id) => !found.orders.contains(id),
            Receipt::Request(id) => !found.final_requests.contains(id),
        })
        .count() as i64
}

/// Reads what [`accepted_lost`] checks the receipts against.
pub async fn find(db: &sqlx::PgPool, answers: &[Answer]) -> anyhow::Result<Found> {
    let mut orders = Vec::new();
    let mut requests = Vec::new();
    for receipt in answers.iter().filter_map(|a| a.receipt) {
        match receipt {
            Receipt::Order(id) => orders.push(id),
            Receipt::Request(id) => requests.push(id),
        }
    }
    let orders: Vec<i64> = sqlx::query_scalar("SELECT id FROM orders WHERE id = ANY($1)")
        .bind(&orders)
        .fetch_all(db)
        .await?;
    // A request settled as placed counts only with its order present.
    let requests: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT r.id FROM purchase_requests r WHERE r.id = ANY($1) AND r.status <> 'pending' \
         AND (r.status <> 'placed' OR EXISTS (SELECT 1 FROM orders o WHERE o.id = r.order_id))",
    )
    .bind(&requests)
    .fetch_all(db)
    .await?;
    Ok(Found {
        orders: orders.into_iter().collect(),
        final_requests: requests.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn the_dimension_expands_all_keeps_order_and_defaults_to_no_fault() {
        let parse = |s: &str| s.parse::<FaultChoice>().unwrap();
        assert_eq!(dimension(&[]), vec![None]);
        assert_eq!(
            dimension(&[parse("none"), parse("all"), parse("pg-terminate")]),
            vec![
                None,
                Some(FaultKind::KillInstance),
                Some(FaultKind::PauseInstance),
                Some(FaultKind::PgTerminate),
                Some(FaultKind::RedisRestart),
                Some(FaultKind::BrokerRestart),
                Some(FaultKind::PartitionRedis),
                Some(FaultKind::SlowPostgres),
            ]
        );
        assert_eq!(dimension(&[parse("pause-instance")]), vec![Some(FaultKind::PauseInstance)]);
        let err = "kill".parse::<FaultChoice>().unwrap_err();
        assert!(err.contains("kill-instance"), "{err}");
    }

    #[test]
    fn the_wire_names_are_serdes() {
        for &kind in FaultKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
            let choice = FaultChoice::Kind(kind);
            assert_eq!(serde_json::to_value(choice).unwrap(), kind.name());
        }
    }

    #[test]
    fn a_lasting_fault_lasts_three_leases_unless_told() {
        let mut settings = Settings {
            at: 0.3,
            restart_after: Duration::from_secs(1),
            duration: None,
            latency: None,
            settle: Duration::from_secs(20),
        };
        assert_eq!(lasting(&settings, 2000), Duration::from_secs(6));
        settings.duration = Some(Duration::from_millis(1500));
        assert_eq!(lasting(&settings, 2000), Duration::from_millis(1500));
    }

    #[test]
    fn the_fault_point_is_a_share_of_the_stock_and_at_least_one_unit() {
        assert_eq!(threshold(2000, 0.3), 600);
        assert_eq!(threshold(10, 0.0), 1);
    }

    fn answer(at: Instant, status: u16, receipt: Option<Receipt>) -> Answer {
        Answer { at, status, receipt }
    }

    #[test]
    fn the_window_counts_answers_from_the_hit_to_a_second_after_the_repair() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let hit = Hit {
            instance: Some(0),
            at: t0 + s(2),
            at_wall: Utc::now(),
            sold: 10,
            cleared: t0 + s(4),
        };
        let answers = [
            answer(t0 + s(1), 201, None),
            answer(t0 + s(2), 0, None),
            answer(t0 + s(3), 0, None),
            answer(t0 + s(5), 503, None),
            answer(t0 + s(6), 201, None),
        ];
        let counts = answers_in_window(&answers, &hit);
        assert_eq!(counts, BTreeMap::from([("0".to_owned(), 2), ("503".to_owned(), 1)]));
    }

    #[test]
    fn recovery_is_the_first_order_after_the_hit() {
        let at = |ms: i64| Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap();
        assert_eq!(recovery_s(at(1_000), &[at(500), at(3_500), at(2_250)]), Some(1.25));
        assert_eq!(recovery_s(at(1_000), &[at(500)]), None);
    }

    #[test]
    fn a_receipt_is_lost_when_postgres_does_not_honour_it() {
        let t = Instant::now();
        let (kept, gone) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let answers = [
            answer(t, 201, Some(Receipt::Order(1))),
            answer(t, 201, Some(Receipt::Order(2))),
            answer(t, 202, Some(Receipt::Request(kept))),
            answer(t, 202, Some(Receipt::Request(gone))),
            answer(t, 409, None),
        ];
        let found = Found { orders: HashSet::from([1]), final_requests: HashSet::from([kept]) };
        assert_eq!(accepted_lost(&answers, &found), 2);
        let all =
            Found { orders: HashSet::from([1, 2]), final_requests: HashSet::from([kept, gone]) };
        assert_eq!(accepted_lost(&answers, &all), 0);
    }
}
