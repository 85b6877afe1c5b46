//! Ceilings of this machine, measured in the same invocation as the runs so
//! that each strategy is judged as a ratio to what the hardware allowed right
//! then (figures on a shared 2-core machine move by ±20 % between runs).
//!
//! With `--repeat N` every ceiling is measured again before each round (one
//! round = every strategy × profile once), and a run's ratios use the
//! ceilings of its own round: a ceiling measured minutes earlier, while the
//! machine was busier or idler, would bound nothing. Each ceiling object of
//! report.json keeps every round's sample and their median as `value`.
//!
//! The ceilings a comparison measures are a list of [`Kind`]s; a new
//! ceiling is a new kind, its measurement in `compare.rs`, and a field of
//! [`Ceilings`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use seckill::sale::{Quantity, SaleId, UserId};
use seckill::strategy::descriptor::SettleBatch;
use seckill::strategy::{Ceiling, DrainBench, Outcome, REFERENCE, StrategyName, registration};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

use crate::stats::median;

/// One ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    HttpRps,
    SqlTps,
    RedisOps,
    AmqpRps,
    QueueDrain,
}

impl Kind {
    /// Every kind, in measuring order (`queue_drain_units_per_s` after
    /// `sql_tps`, which its ratio divides by).
    pub const ALL: &[Kind] =
        &[Kind::HttpRps, Kind::SqlTps, Kind::RedisOps, Kind::AmqpRps, Kind::QueueDrain];

    /// Its name in report.json.
    pub fn name(self) -> &'static str {
        match self {
            Kind::HttpRps => "http_rps",
            Kind::SqlTps => "sql_tps",
            Kind::RedisOps => "redis_ops",
            Kind::AmqpRps => "amqp_rps",
            Kind::QueueDrain => "queue_drain_units_per_s",
        }
    }

    /// The per-round ceiling that bounds the sell-through of the strategy
    /// named `strategy`, from its registration's `ceiling`: the consumer's
    /// drain for a strategy that settles from a queue, one reference
    /// transaction per unit (`sql_tps`) for the strategies that take at
    /// least that per unit, and none for one that settles many units per
    /// transaction (its own ceiling, `sql_batched_units_per_s`, is measured
    /// after the runs at the batch size they reached) or spreads its units
    /// over several rows. A name no strategy is registered under (a report
    /// of another version) is bounded by `sql_tps`.
    pub fn bounding_sell_through(strategy: &str) -> Option<Kind> {
        let Ok(name) = strategy.parse::<StrategyName>() else {
            return Some(Kind::SqlTps);
        };
        match registration(name).ceiling {
            Ceiling::PerUnitTransaction => Some(Kind::SqlTps),
            Ceiling::Drain(_) => Some(Kind::QueueDrain),
            Ceiling::Batches(_) | Ceiling::Unbounded => None,
        }
    }
}

/// How far above its ceiling a run's rate may be before the ceiling counts
/// as undershot (measured too low): 5 %.
pub const UNDERSHOT_MARGIN: f64 = 1.05;

/// The ceilings measured before one round, by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Round {
    values: BTreeMap<Kind, f64>,
}

impl Round {
    pub fn set(&mut self, kind: Kind, value: f64) {
        self.values.insert(kind, value);
    }

    /// This round with a run's own `http_rps` sample in place of the
    /// round's, when the run measured one.
    pub fn with_own_http_rps(mut self, http_rps: Option<f64>) -> Round {
        if let Some(http_rps) = http_rps {
            self.set(Kind::HttpRps, http_rps);
        }
        self
    }

    /// The round's value of `kind`, `None` when it was not measured.
    pub fn get(&self, kind: Kind) -> Option<f64> {
        self.values.get(&kind).copied()
    }

    /// The ceilings a run of `strategy` exceeded by more than
    /// [`UNDERSHOT_MARGIN`], with the run's rate ÷ the ceiling: its
    /// sell-through against the ceiling that bounds it, its rejection rate
    /// against `http_rps`.
    pub fn exceeded_by(
        &self,
        strategy: &str,
        sell_through: Option<f64>,
        rejection_rps: Option<f64>,
    ) -> Vec<(Kind, f64)> {
        [
            (Kind::bounding_sell_through(strategy), sell_through),
            (Some(Kind::HttpRps), rejection_rps),
        ]
        .into_iter()
        .filter_map(|(kind, rate)| {
            let kind = kind?;
            let ratio = rate? / self.get(kind).filter(|c| *c > 0.0)?;
            (ratio > UNDERSHOT_MARGIN).then_some((kind, ratio))
        })
        .collect()
    }
}

/// `http_rps`: a trivial endpoint under the same goose settings, measured
/// by each run right before its rejection phase (`Run::http_rps`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HttpCeiling {
    /// Median of `samples`.
    pub value: f64,
    /// One value per round, in round order: the median of the round's
    /// runs' own samples (in reports before those: measured at the round's
    /// start; empty in a version-1 report).
    #[serde(default)]
    pub samples: Vec<f64>,
    pub users: u64,
    pub instances: usize,
    pub duration_s: f64,
}

/// `sql_tps`: the reference strategy's transaction
/// (`seckill::strategy::REFERENCE`, `sql`) issued directly through sqlx, at
/// the number of connections where it peaked in the comparison's scan
/// ([`scan_counts`]): one hot row serialises its updates, so more
/// connections than the peak's only queue on its lock and lower the rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SqlCeiling {
    pub value: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
    /// Connections of every sample: the scan's peak (in reports before the
    /// scan: the instances' pools added up).
    pub connections: u32,
    pub duration_s: f64,
    /// The scan before the first round: transactions per second at each
    /// number of connections tried, in the order tried; empty with
    /// `--sql-tps-connections` and in reports before the scan.
    #[serde(default)]
    pub scan: Vec<ScanPoint>,
}

/// One point of a ceiling's concurrency scan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScanPoint {
    pub connections: u32,
    pub per_s: f64,
}

/// The connection counts the `sql_tps` scan tries: powers of two from 1
/// up to `pool` (the instances' Postgres connections added up), and
/// `pool` itself.
pub fn scan_counts(pool: u32) -> Vec<u32> {
    let mut counts: Vec<u32> =
        std::iter::successors(Some(1u32), |c| c.checked_mul(2)).take_while(|c| *c < pool).collect();
    counts.push(pool.max(1));
    counts
}

/// The connections of the scan's highest rate (the fewest among equals);
/// `None` for an empty scan.
pub fn peak(scan: &[ScanPoint]) -> Option<u32> {
    scan.iter()
        .filter(|p| p.per_s.is_finite())
        .fold(None::<ScanPoint>, |best, p| match best {
            Some(b) if b.per_s >= p.per_s => Some(b),
            _ => Some(*p),
        })
        .map(|p| p.connections)
}

/// `redis_ops`: `DECR` on one key, at the same concurrency as the goose users.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisCeiling {
    pub value: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
    pub clients: u64,
    pub duration_s: f64,
}

/// `amqp_rps`: persistent publishes with confirms into a quorum queue, at
/// the goose users' concurrency, consumed and acknowledged meanwhile.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AmqpCeiling {
    /// Messages consumed per second.
    pub value: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
    pub clients: u64,
    pub duration_s: f64,
}

/// `queue_drain_units_per_s`: the consumer of the compared strategy that
/// settles from a queue (`queue`) settling a pre-filled queue of one-unit
/// purchases, with no HTTP in front.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainCeiling {
    /// Units settled per second.
    pub value: f64,
    #[serde(default)]
    pub samples: Vec<f64>,
    /// Purchases in the queue.
    pub units: u64,
    /// The consumer's largest batch (`SECKILL_QUEUE_BATCH_MAX` of the
    /// instances).
    pub batch_size: u16,
    /// `value ÷ sql_tps.value`, the median over rounds of each round's
    /// ratio: how far batching lifts the one-unit-per-transaction ceiling.
    pub ratio_vs_sql_tps: Option<f64>,
}

/// `sql_batched_units_per_s`: the batch transaction of the compared
/// strategy that settles in batches (`sql/batched`) driven directly against
/// Postgres, with no HTTP in front, at the batch size the strategy reached
/// in the runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchedCeiling {
    /// Units settled per second.
    pub value: f64,
    /// Purchases per batch: the mean batch size of the `sql/batched` runs,
    /// rounded.
    pub batch_size: usize,
    /// Concurrent batches: one per instance, as each instance settles one
    /// batch of a sale at a time.
    pub connections: usize,
    pub duration_s: f64,
    /// `value ÷ sql_tps.value`.
    pub ratio_vs_sql_tps: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ceilings {
    pub http_rps: HttpCeiling,
    pub sql_tps: SqlCeiling,
    /// `null` when no compared strategy uses Redis.
    pub redis_ops: Option<RedisCeiling>,
    /// `null` when no compared strategy uses RabbitMQ.
    #[serde(default)]
    pub amqp_rps: Option<AmqpCeiling>,
    /// `null` when `queue` is not compared.
    #[serde(default)]
    pub queue_drain_units_per_s: Option<DrainCeiling>,
    /// `null` when `sql/batched` is not compared (measured after its runs).
    #[serde(default)]
    pub sql_batched_units_per_s: Option<BatchedCeiling>,
}

impl Ceilings {
    /// `(value, samples)` of `kind`, `None` when it is not measured.
    fn figures(&self, kind: Kind) -> Option<(f64, &[f64])> {
        match kind {
            Kind::HttpRps => Some((self.http_rps.value, &self.http_rps.samples)),
            Kind::SqlTps => Some((self.sql_tps.value, &self.sql_tps.samples)),
            Kind::RedisOps => self.redis_ops.as_ref().map(|c| (c.value, &c.samples[..])),
            Kind::AmqpRps => self.amqp_rps.as_ref().map(|c| (c.value, &c.samples[..])),
            Kind::QueueDrain => {
                self.queue_drain_units_per_s.as_ref().map(|c| (c.value, &c.samples[..]))
            }
        }
    }

    fn samples_mut(&mut self, kind: Kind) -> Option<(&mut f64, &mut Vec<f64>)> {
        match kind {
            Kind::HttpRps => Some((&mut self.http_rps.value, &mut self.http_rps.samples)),
            Kind::SqlTps => Some((&mut self.sql_tps.value, &mut self.sql_tps.samples)),
            Kind::RedisOps => self.redis_ops.as_mut().map(|c| (&mut c.value, &mut c.samples)),
            Kind::AmqpRps => self.amqp_rps.as_mut().map(|c| (&mut c.value, &mut c.samples)),
            Kind::QueueDrain => {
                self.queue_drain_units_per_s.as_mut().map(|c| (&mut c.value, &mut c.samples))
            }
        }
    }

    /// The kinds this comparison measures.
    pub fn kinds(&self) -> Vec<Kind> {
        Kind::ALL.iter().copied().filter(|k| self.figures(*k).is_some()).collect()
    }

    /// Adds one round's samples; every `value` becomes the median of its
    /// samples, and the drain's ratio the median of the per-round ratios.
    pub fn record(&mut self, round: &Round) {
        for kind in self.kinds() {
            if let (Some(sample), Some((value, samples))) =
                (round.get(kind), self.samples_mut(kind))
            {
                samples.push(sample);
                *value = median(samples).unwrap_or(0.0);
            }
        }
        let sql = self.sql_tps.samples.clone();
        if let Some(drain) = &mut self.queue_drain_units_per_s {
            let ratios: Vec<f64> = drain
                .samples
                .iter()
                .zip(&sql)
                .map(|(d, s)| d / s)
                .filter(|r| r.is_finite())
                .collect();
            drain.ratio_vs_sql_tps = median(&ratios);
        }
    }

    /// The ceilings of round `round` (1-based): its samples, or each
    /// `value` in a version-1 report, which measured them once.
    pub fn round(&self, round: u64) -> Round {
        let mut out = Round::default();
        for kind in self.kinds() {
            if let Some((value, samples)) = self.figures(kind) {
                let i = usize::try_from(round.saturating_sub(1)).unwrap_or(usize::MAX);
                out.set(kind, samples.get(i).copied().unwrap_or(value));
            }
        }
        out
    }
}

/// Which strategies a comparison runs decides which ceilings it measures:
/// `redis_ops` and `amqp_rps` when a strategy uses that server, the drain
/// when a strategy settles from a queue ([`drained`]).
pub fn wanted(strategies: &[StrategyName], kind: Kind) -> bool {
    use seckill::strategy::Backend;
    let uses = |backend| strategies.iter().any(|s| s.needs().contains(&backend));
    match kind {
        Kind::HttpRps | Kind::SqlTps => true,
        Kind::RedisOps => uses(Backend::Redis),
        Kind::AmqpRps => uses(Backend::Rabbitmq),
        Kind::QueueDrain => drained(strategies).is_some(),
    }
}

/// The first of `strategies` whose ceiling is a queue's drain, with its
/// drain hooks: the strategy `queue_drain_units_per_s` measures.
pub fn drained(strategies: &[StrategyName]) -> Option<(StrategyName, DrainBench)> {
    strategies.iter().find_map(|&name| registration(name).ceiling.drain().map(|d| (name, d)))
}

/// The first of `strategies` whose ceiling is its own batch transaction,
/// with that transaction: the strategy `sql_batched_units_per_s` measures.
pub fn batched(strategies: &[StrategyName]) -> Option<(StrategyName, SettleBatch)> {
    strategies.iter().find_map(|&name| registration(name).ceiling.settle_batch().map(|s| (name, s)))
}

/// A round's `http_rps` sample from its runs' own samples: their median
/// (0 when no run measured one).
pub fn http_sample(own: impl IntoIterator<Item = Option<f64>>) -> f64 {
    let own: Vec<f64> = own.into_iter().flatten().collect();
    crate::stats::median(&own).unwrap_or(0.0)
}

/// `clients` concurrent tasks sending `DECR` on one scratch key over one
/// multiplexed connection (as the service does) for `seconds`; operations
/// per second. The key is deleted afterwards. On a Redis Cluster the key
/// lives on one master, as one sale's keys do: the figure is one shard's.
pub async fn redis_ops(redis_url: &str, clients: u64, seconds: f64) -> anyhow::Result<f64> {
    let client = redis_lock::RedisClient::open(redis_url)?;
    let timeout = Duration::from_secs(5);
    let conn = client.connection(timeout, timeout, 1).await?;
    let key = format!("loadtest-ceiling:{:016x}", rand::random::<u64>());
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (mut conn, key, done) = (conn.clone(), key.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                redis::cmd("DECR").arg(&key).query_async::<i64>(&mut conn).await?;
                done.fetch_add(1, Relaxed);
            }
            Ok::<_, redis::RedisError>(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut conn = conn;
    redis::cmd("DEL").arg(&key).query_async::<i64>(&mut conn).await?;
    Ok(done.load(Relaxed) as f64 / elapsed)
}

/// Sells units of `sale` (which must have far more stock than can sell in
/// `seconds`) one per transaction, exactly as the reference strategy does
/// (its registration's `transaction`), over `connections` connections, and
/// returns committed transactions per second.
pub async fn sql_tps(
    database_url: &str,
    sale: SaleId,
    connections: u32,
    seconds: f64,
) -> anyhow::Result<f64> {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        .connect(database_url)
        .await?;
    // Open every connection before the clock starts.
    let mut warm = Vec::new();
    for _ in 0..connections {
        warm.push(pool.acquire().await?);
    }
    drop(warm);
    let transaction = registration(REFERENCE).transaction.ok_or_else(|| {
        anyhow::anyhow!("the reference strategy `{REFERENCE}` has no transaction")
    })?;
    let next_user = Arc::new(AtomicI64::new(1));
    let committed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (pool, next_user, committed) = (pool.clone(), next_user.clone(), committed.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let user = UserId::parse(next_user.fetch_add(1, Relaxed)).expect("positive");
                match transaction(pool.clone(), sale, user, Quantity::ONE).await {
                    Ok(Outcome::Placed { .. }) => {
                        committed.fetch_add(1, Relaxed);
                    }
                    Ok(other) => anyhow::bail!("the ceiling sale answered {other:?}"),
                    Err(err) => anyhow::bail!("the ceiling transaction failed: {err}"),
                }
            }
            Ok(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    pool.close().await;
    Ok(committed.load(Relaxed) as f64 / elapsed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_scan_tries_powers_of_two_up_to_the_pools_and_keeps_the_peak() {
        use super::{ScanPoint, peak, scan_counts};
        assert_eq!(scan_counts(20), [1, 2, 4, 8, 16, 20]);
        assert_eq!(scan_counts(16), [1, 2, 4, 8, 16]);
        assert_eq!(scan_counts(1), [1]);
        let point = |connections, per_s| ScanPoint { connections, per_s };
        let scan = [point(1, 900.0), point(2, 1600.0), point(4, 1600.0), point(20, 800.0)];
        assert_eq!(peak(&scan), Some(2), "the fewest connections among equal rates");
        assert_eq!(peak(&[point(1, f64::NAN), point(2, 10.0)]), Some(2));
        assert_eq!(peak(&[]), None);
    }

    use super::*;

    fn ceilings() -> Ceilings {
        Ceilings {
            http_rps: HttpCeiling {
                value: 0.0,
                samples: vec![],
                users: 10,
                instances: 2,
                duration_s: 1.0,
            },
            sql_tps: SqlCeiling {
                value: 0.0,
                samples: vec![],
                connections: 20,
                duration_s: 1.0,
                scan: vec![],
            },
            redis_ops: None,
            amqp_rps: None,
            queue_drain_units_per_s: Some(DrainCeiling {
                value: 0.0,
                samples: vec![],
                units: 100,
                batch_size: 200,
                ratio_vs_sql_tps: None,
            }),
            sql_batched_units_per_s: None,
        }
    }

    fn round(http: f64, sql: f64, drain: f64) -> Round {
        let mut round = Round::default();
        round.set(Kind::HttpRps, http);
        round.set(Kind::SqlTps, sql);
        round.set(Kind::QueueDrain, drain);
        round
    }

    #[test]
    fn each_round_adds_a_sample_and_values_are_medians() {
        let mut c = ceilings();
        assert_eq!(c.kinds(), [Kind::HttpRps, Kind::SqlTps, Kind::QueueDrain]);
        for r in [round(900.0, 100.0, 1_000.0), round(1_000.0, 200.0, 1_000.0)] {
            c.record(&r);
        }
        c.record(&round(1_200.0, 50.0, 1_500.0));
        assert_eq!(c.http_rps.samples, [900.0, 1_000.0, 1_200.0]);
        assert_eq!((c.http_rps.value, c.sql_tps.value), (1_000.0, 100.0));
        let drain = c.queue_drain_units_per_s.as_ref().unwrap();
        assert_eq!(drain.ratio_vs_sql_tps, Some(10.0), "median of 10, 5 and 30");
        // A run reads its own round's samples.
        assert_eq!(c.round(2).get(Kind::SqlTps), Some(200.0));
        assert_eq!(c.round(3).get(Kind::QueueDrain), Some(1_500.0));
        assert_eq!(c.round(3).get(Kind::RedisOps), None);
    }

    #[test]
    fn a_rounds_http_sample_is_the_median_of_its_runs_own() {
        assert_eq!(http_sample([Some(900.0), None, Some(1_500.0), Some(1_000.0)]), 1_000.0);
        assert_eq!(http_sample([Some(900.0), Some(1_100.0)]), 1_000.0);
        assert_eq!(http_sample([None, None]), 0.0);
    }

    #[test]
    fn a_version_1_report_has_one_value_for_every_round() {
        let mut c = ceilings();
        c.sql_tps.value = 321.0;
        assert_eq!(c.round(1).get(Kind::SqlTps), Some(321.0));
        assert_eq!(c.round(4).get(Kind::SqlTps), Some(321.0));
    }

    #[test]
    fn a_rate_above_its_own_ceiling_by_more_than_5_percent_is_an_undershot_ceiling() {
        let r = round(1_000.0, 100.0, 1_000.0);
        assert_eq!(r.exceeded_by("sql", Some(105.0), Some(1_050.0)), vec![], "5 % is allowed");
        let exceeded = r.exceeded_by("lock/watchdog", Some(50.0), Some(1_600.0));
        assert_eq!(exceeded, vec![(Kind::HttpRps, 1.6)]);
        // queue's sell-through is bounded by the drain, not by sql_tps.
        assert_eq!(r.exceeded_by("queue", Some(300.0), None), vec![]);
        assert_eq!(r.exceeded_by("queue", Some(1_100.0), None).len(), 1);
        assert_eq!(r.exceeded_by("sql", None, None), vec![]);
        // Many units per transaction, or several rows: sql_tps does not bound them.
        assert_eq!(r.exceeded_by("sql/batched", Some(1_000.0), None), vec![]);
        assert_eq!(r.exceeded_by("sql/buckets", Some(1_000.0), None), vec![]);
        assert_eq!(Round::default().exceeded_by("sql", Some(1.0), Some(1.0)), vec![]);
    }
}
