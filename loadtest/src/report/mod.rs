//! `report.json`: a stable interface that other tools read (documented in
//! docs/report-format.md). Fields are only ever added; a field that does not
//! apply is `null`, never a made-up 0. `schema_version` changes when a
//! field's meaning does.

pub mod arrivals;
mod columns;
pub mod html;
pub mod markdown;
pub mod matrix;
pub mod summary;
pub mod svg;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use seckill::strategy::{REFERENCE, StrategyName};
use serde::{Deserialize, Serialize};

use crate::balancer::BalancerReport;
use crate::ceilings::Ceilings;
use crate::cpu::Cpu;
pub use crate::expectation::{Expectation, Verdict};
use crate::fault::FaultRecord;
use crate::scenario::{Flood, Latency, Outcomes};
use crate::sizing::Pilot;
pub use seckill::strategy::descriptor::BatchSizes;

/// 4: the unpaired interval of `× sql` in the summary and the generator's
/// CPU weight of `arrival` runs (3: sized sales and their pilots, reference
/// runs, the CPU of the steady window, the `sql_tps` scan; 2: steady-state
/// rates, ceilings per round, intervals, CPU accounting;
/// docs/report-format.md lists the changes). `loadtest render` still reads
/// versions 1 to 3: every field added since defaults to `null`, empty or
/// `false`, and the summary is computed again from the runs.
pub const SCHEMA_VERSION: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub generated_at: DateTime<Utc>,
    pub machine: Machine,
    /// Every flag of the invocation.
    pub config: serde_json::Value,
    /// The load balancer the buyers went through (`--haproxy`); `null`
    /// when they were sent to the instances directly.
    #[serde(default)]
    pub balancer: Option<BalancerReport>,
    /// The local Redis Cluster the instances used (`--redis-cluster`);
    /// `null` when they used --redis-url.
    #[serde(default)]
    pub redis_cluster: Option<RedisClusterReport>,
    pub ceilings: Ceilings,
    /// The pilot sales that sized the runs' stocks (`crate::sizing`), in
    /// the order run; empty with `--stock` and in reports before them.
    #[serde(default)]
    pub pilots: Vec<Pilot>,
    pub runs: Vec<Run>,
    /// One aggregate per (strategy, profile) over its repeats, in the order
    /// of `runs` (see [`summary::summarize`]).
    #[serde(default)]
    pub summary: Vec<summary::Summary>,
    /// Set when the comparison was cut short (`SIGINT`, `SIGTERM`, a panic:
    /// [`crate::interrupt`]): `runs` holds only the runs that finished.
    /// `null` for a comparison that ran to its end, and in reports written
    /// before it was added.
    #[serde(default)]
    pub partial: Option<Partial>,
}

/// What a report of a comparison cut short says of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partial {
    /// Why it ended early: `interrupted by SIGINT`, `interrupted by SIGTERM`
    /// or `the comparison panicked: <message>`.
    pub reason: String,
    /// Runs the invocation set out to make (strategies × profiles × faults
    /// × repeats); `runs` holds the ones that finished.
    pub runs_planned: u64,
}

impl Report {
    /// A complete report of `runs` (their summary computed here), with no
    /// balancer or cluster figures: the caller adds what it has.
    pub fn new(config: serde_json::Value, ceilings: Ceilings, runs: Vec<Run>) -> Report {
        Report {
            schema_version: SCHEMA_VERSION,
            generated_at: Utc::now(),
            machine: Machine::this(),
            config,
            balancer: None,
            redis_cluster: None,
            ceilings,
            pilots: Vec::new(),
            summary: summary::summarize(&runs),
            runs,
            partial: None,
        }
    }

    /// The shortest steady window that ranked in this comparison
    /// (`config.steady_window_s`; 0.5 s in reports before the flag).
    pub fn min_window_s(&self) -> f64 {
        self.config.get("steady_window_s").and_then(serde_json::Value::as_f64).unwrap_or(0.5)
    }

    /// The line a reader of a partial report must not miss (`None` for a
    /// complete one): why it ended and how many runs it holds.
    pub fn partial_line(&self) -> Option<String> {
        let partial = self.partial.as_ref()?;
        Some(format!(
            "Partial report: {}. {} of {} planned runs finished; the others never ran, and \
             every figure here covers only the finished ones.",
            partial.reason,
            self.runs.len(),
            partial.runs_planned
        ))
    }
}

/// The Redis Cluster of `--redis-cluster`, read once the runs are done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisClusterReport {
    pub masters: Vec<ClusterMaster>,
}

/// One master of the cluster.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterMaster {
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Its hash slots, as `CLUSTER NODES` lists them (e.g. `0-5460`).
    pub slots: String,
    /// Keys it held at the end of the comparison (`DBSIZE`): every key of
    /// one sale is on one master, different sales spread over them.
    pub keys: u64,
}

impl RedisClusterReport {
    /// Asks every master for its slots and its key count.
    pub async fn read(cluster: &owned_servers::RedisCluster) -> anyhow::Result<Self> {
        let mut masters = Vec::new();
        for node in &cluster.nodes {
            let mut conn = node.client().get_multiplexed_async_connection().await?;
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
            let myself = nodes.lines().find(|line| line.contains("myself")).unwrap_or_default();
            let slots = myself.split_whitespace().skip(8).collect::<Vec<_>>().join(",");
            let keys: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await?;
            masters.push(ClusterMaster { addr: format!("127.0.0.1:{}", node.port), slots, keys });
        }
        Ok(Self { masters })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub os: String,
    pub memory_gb: f64,
    /// The cores the service side was capped at (`--service-cpu-budget`,
    /// as the kernel took it); `null` without a budget.
    #[serde(default)]
    pub service_cpu_budget_cores: Option<f64>,
}

impl Machine {
    pub fn this() -> Machine {
        let mut system = sysinfo::System::new();
        system.refresh_memory();
        let os = [sysinfo::System::long_os_version(), sysinfo::System::kernel_version()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", kernel ");
        Machine {
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            os: if os.is_empty() { std::env::consts::OS.to_owned() } else { os },
            memory_gb: (system.total_memory() as f64 / (1u64 << 30) as f64 * 10.0).round() / 10.0,
            service_cpu_budget_cores: None,
        }
    }
}

/// One strategy × profile × repeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub strategy: String,
    pub profile: String,
    /// 1-based.
    pub repeat: u64,
    /// 1-based: which of its round's runs of this strategy (`sql` runs
    /// `--reference-runs` times a round, every other strategy once).
    #[serde(default = "first_take")]
    pub take: u64,
    pub expected: Expectation,
    pub verdict: Verdict,
    pub instances: usize,
    /// Sales the run sold at once (the `multi-sale` profile has several);
    /// every figure below adds up over them.
    #[serde(default = "one")]
    pub sales: u32,
    pub total_stock: i64,
    /// Distinct buyers in the sale phase.
    pub buyers: u64,
    /// Units the buyers wanted (one each).
    pub demanded_units: u64,
    /// Purchase answers in the sale phase (retries and resubmissions included).
    pub requests: u64,
    /// Sale phase, first request sent → last answer, seconds.
    pub duration_s: f64,
    pub throughput_rps: f64,
    /// Units sold per second in the steady window: between the orders that
    /// brought the units sold to 10 % and to 90 % ([`crate::steady`]). In a
    /// version-1 report: the whole-phase rate.
    pub sell_through_per_s: Option<f64>,
    /// Units sold ÷ (commit of the last unit − send of the first purchase).
    #[serde(default)]
    pub sell_through_whole_per_s: Option<f64>,
    /// Length of the steady window, seconds.
    #[serde(default)]
    pub steady_window_s: Option<f64>,
    /// The steady window is shorter than the comparison's
    /// `--steady-window-s` (default [`crate::steady::MIN_WINDOW_S`]; 0.5 s
    /// in reports before it) or missing: the run's rates are reported, not
    /// ranked.
    #[serde(default)]
    pub too_short_to_rank: bool,
    /// Answers per second between 10 % and 90 % of the rejection phase.
    pub rejection_rps: Option<f64>,
    /// The run's own `http_rps` ceiling sample: answers per second of the
    /// trivial endpoint, measured right before its rejection phase with the
    /// same goose users and instances; `null` in reports written before it
    /// (their rejections divide by the round's sample).
    #[serde(default)]
    pub http_rps: Option<f64>,
    /// A rate of the run exceeds its own round's ceiling (for rejections,
    /// its own `http_rps`) by more than 5 %
    /// (`crate::ceilings::Round::exceeded_by`): that ceiling was measured
    /// too low.
    #[serde(default)]
    pub ceiling_undershot: bool,
    /// The service side's CPU seconds per second over the steady window
    /// (`cpu.steady_service_cores`) exceed the machine's CPUs: a
    /// measurement that does not add up, flagged rather than printed as if
    /// consistent.
    #[serde(default)]
    pub cpu_over_cores: bool,
    pub units_sold: i64,
    pub orders: i64,
    pub remaining_stock: i64,
    pub oversold: i64,
    /// `min(total_stock, demanded_units) − units_sold` when positive.
    pub undersold: i64,
    pub ledger_drift: i64,
    pub duplicate_orders: i64,
    /// 5xx answers other than the designed `busy` 503.
    pub errors_5xx: u64,
    pub outcomes: Outcomes,
    pub status_counts: BTreeMap<String, u64>,
    /// Sale-phase purchase latency; in a `flood` run, of every buyer but
    /// the flooding one.
    pub latency_ms: Latency,
    /// The flooding buyer's purchases (`flood` profile); `null` otherwise.
    #[serde(default)]
    pub flood: Option<Flood>,
    pub ratio: Ratio,
    /// Redis counter + open reservations − Postgres remaining stock, measured
    /// before any reconciliation; `null` for strategies without a counter.
    pub redis_drift: Option<i64>,
    /// Units the reconciler had to return or correct during the run; `null`
    /// for strategies without a reconciler.
    pub reconcile_fixes: Option<i64>,
    /// Lock figures; `null` for strategies that take no lock.
    pub lock_stats: Option<LockStats>,
    /// Requests answered `202` that had no final result when the run ended
    /// (the load test waits for the queue to drain first); any value above 0
    /// makes the verdict `broke`. `null` for strategies that answer at once.
    #[serde(default)]
    pub accepted_unresolved: Option<i64>,
    /// Accept → resolved times of the accepted requests, milliseconds
    /// (`latency_ms` stays the HTTP answer time); `null` for strategies that
    /// answer at once.
    #[serde(default)]
    pub e2e_latency_ms: Option<Latency>,
    /// Messages per consumer transaction; `null` for strategies without a
    /// consumer.
    #[serde(default)]
    pub batch_sizes: Option<BatchSizes>,
    /// CPU seconds by process group over the sale phase; `null` with
    /// `--target` and in version-1 reports.
    #[serde(default)]
    pub cpu: Option<Cpu>,
    pub cost: Cost,
    /// Units sold in each second of the sale phase, from its first send
    /// (`crate::series::sold_per_second`, from the orders' commit times);
    /// `null` in reports written before it was added.
    #[serde(default)]
    pub sold_per_second: Option<Vec<i64>>,
    /// The fault injected during the run and what it did (see
    /// docs/report-format.md, "Faults"); `null` for a run without one. With
    /// a fault, `undersold` is counted after the settle period.
    #[serde(default)]
    pub fault: Option<FaultRecord>,
    /// Units of orders that ended unpaid (`cancelled`, `expired`) and came
    /// back to the sale, from the audit; 0 for a sale without a payment
    /// window.
    #[serde(default)]
    pub units_returned: i64,
    /// Of `units_returned`, the units sold again, from the audit.
    #[serde(default)]
    pub units_resold: i64,
    /// The payment window's figures (`payment` profile); `null` otherwise.
    #[serde(default)]
    pub payment: Option<PaymentRecord>,
    /// The open-arrival generator's schedule, how well it kept it, and the
    /// latency from each buyer's intended arrival (`arrival` profile; see
    /// docs/report-format.md, "Open arrivals"); `null` otherwise.
    #[serde(default)]
    pub arrival: Option<crate::scenario::arrival::ArrivalRecord>,
    /// Who got the units: the share of the first `stock` buyers served and
    /// the rank correlation of arrival and order order (docs/report-format.md,
    /// "Fairness"); `null` in reports written before it was added.
    #[serde(default)]
    pub fairness: Option<crate::fairness::Fairness>,
}

/// What a `payment` run's buyers did and how fast returned units sold again
/// (docs/report-format.md, "Payment").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PaymentRecord {
    /// The sale's payment window, milliseconds.
    pub payment_window_ms: i32,
    /// Fraction of buyers who never pay.
    pub unpaid_share: f64,
    /// The sale closed this long after it was created, seconds.
    pub sale_window_s: u64,
    /// Units of orders still `pending_payment` at the final audit, after
    /// the run waited the payment window (and the sweep's margin) out:
    /// counted in `units_sold` as live; any above 0 makes a `correct` run
    /// `broke` (an unpaid order that never expired).
    pub units_pending: i64,
    /// From the expiry of each resold unit to its resale (see
    /// [`ResaleDelays`]); `null` when no unit was resold, or when the books
    /// oversold or drifted (placements beyond the stock are then not
    /// resales, and the pairing means nothing).
    pub expiry_to_resale_ms: Option<ResaleDelays>,
    /// Of each resale, the time beyond the sale's line: from the later of
    /// the unit's expiry and the sale of the unit ahead of it to its resale
    /// (`seckill::audit::resale_waits_ms`) — how long a returned unit stood
    /// for sale with nothing ahead of it, whatever the strategy's pace. Its
    /// p99 is held to `return_bound_ms` as well; `null` as
    /// `expiry_to_resale_ms`, and in reports written before it existed.
    #[serde(default)]
    pub resale_beyond_line_ms: Option<ResaleDelays>,
    /// From the end of each expired order's payment window to its units'
    /// return (`seckill::audit::return_delays_ms`): the sweep's lag alone,
    /// before any buyer could take the units again; `null` when no order
    /// expired (and in reports written before it existed).
    #[serde(default)]
    pub expiry_to_return_ms: Option<ResaleDelays>,
    /// The bound on `expiry_to_return_ms.p99` a `correct` run must keep
    /// ([`RETURN_BOUND_MS`]); 0 in reports written before it existed.
    #[serde(default)]
    pub return_bound_ms: u64,
    /// Buyers who came after the first `demand × stock` ones.
    pub later_buyers: u64,
    /// Buyers, first and later, who would pay: the run's `demanded_units`.
    pub paying_buyers: u64,
    /// What the payments were answered (the load generator's count).
    pub payments: crate::scenario::payment::Payments,
    /// Seconds from the sale phase's start until the books showed every
    /// unit paid; `null` when that did not happen before the phase ended.
    pub settled_s: Option<f64>,
}

/// How late an expired order's units may come back, milliseconds from the
/// end of its payment window, at the 99th percentile of a `payment` run's
/// expired orders: the service's default expiry sweep period
/// (`SECKILL_EXPIRY_SWEEP_INTERVAL_MS`, 500) plus one second for the pass
/// that claims the order to reach it. A `correct` run past it is `broke`:
/// its returned units starved (docs/orders.md states the bound).
pub const RETURN_BOUND_MS: u64 = 1500;

/// Delays of a `payment` run, milliseconds: expiry → resale over the resold
/// units (`seckill::audit::resale_delays_ms`), or expiry → return over the
/// expired orders (`seckill::audit::return_delays_ms`); nearest-rank
/// percentiles.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResaleDelays {
    pub p50: f64,
    pub p90: f64,
    /// `null` in reports written before it existed.
    #[serde(default)]
    pub p99: Option<f64>,
    pub max: f64,
    /// Delays measured: the resold units (`units_resold` of the run), or the
    /// expired orders.
    pub units: u64,
}

impl ResaleDelays {
    /// The percentiles of `delays`; `None` for none.
    pub fn of(delays: &[f64]) -> Option<ResaleDelays> {
        let mut sorted = delays.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            (sorted[i] * 10.0).round() / 10.0
        };
        (!sorted.is_empty()).then(|| ResaleDelays {
            p50: rank(0.5),
            p90: rank(0.9),
            p99: Some(rank(0.99)),
            max: rank(1.0),
            units: sorted.len() as u64,
        })
    }
}

/// What a lock strategy's lock did during a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockStats {
    /// Most purchases inside the critical section at once, across every
    /// instance (from the intervals the instances record; 1 for a correct lock).
    pub max_concurrency: i64,
    /// Watchdog lease renewals (`seckill_lock_renewals_total` delta).
    pub renewals: u64,
    /// Lock waits that ran out and were answered `busy`.
    pub lock_timeouts: u64,
    /// Writes refused because a higher fencing token had claimed the sale.
    pub fence_rejections: u64,
}

fn one() -> u32 {
    1
}

/// What each sold unit cost, counted over the sale phase and divided by the
/// units sold in it; `null` where a figure does not apply or nothing sold.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cost {
    /// Round trips the instances sent to Redis during the sale phase (their
    /// `seckill_redis_round_trips_total`) ÷ units sold; `null` for
    /// strategies that do not use Redis.
    pub redis_round_trips_per_unit: Option<f64>,
    /// Transactions of the service database during the sale phase
    /// (`pg_stat_database.xact_commit + xact_rollback`, settled as
    /// `crate::cost` describes) ÷ units sold.
    #[serde(default)]
    pub pg_xacts_per_unit: Option<f64>,
    /// Messages the instances published or consumed during the sale phase
    /// (their `seckill_amqp_messages_total`, all labels) ÷ units sold;
    /// `null` for strategies that do not use RabbitMQ.
    #[serde(default)]
    pub amqp_messages_per_unit: Option<f64>,
    /// CPU milliseconds of the service side (instances, Postgres, Redis,
    /// RabbitMQ; `runs[].cpu`) over the sale phase ÷ units sold; `null`
    /// with `--target`.
    #[serde(default)]
    pub cpu_ms_per_unit: Option<f64>,
    /// `cpu_ms_per_unit` split over the service's tiers by each tier's share
    /// of the service-side CPU of the whole sale phase (`runs[].cpu`, which
    /// is read per tier only at the phase's ends): the tiers add up to
    /// `cpu_ms_per_unit`. A tier not measured on this machine is `null`.
    #[serde(default)]
    pub cpu_ms_per_unit_by_tier: Option<Tiers>,
    /// Milliseconds the sale's serial resource was held per unit during the
    /// sale phase: the instances' `seckill_serial_hold_duration_seconds_sum`
    /// ÷ `seckill_serial_hold_units_total` (a stock row's lock by Postgres'
    /// clock, a bucket's as a share of it, a batch's transaction, the Redis
    /// lock: `seckill::strategy::serial`): the part of a unit's work that no
    /// added core or instance shortens.
    #[serde(default)]
    pub serial_ms_per_unit: Option<f64>,
    /// `1000 ÷ serial_ms_per_unit`: the most units one sale can sell per
    /// second on any hardware, as far as its serial part goes.
    #[serde(default)]
    pub serial_ceiling_per_s: Option<f64>,
    /// Peak resident set of the largest app instance during the run's
    /// phases, MiB (sampled every 100 ms); `null` with `--target`.
    #[serde(default)]
    pub peak_rss_mb: Option<f64>,
}

/// A figure of each tier of the service side: milliseconds of CPU per unit
/// in `cost.cpu_ms_per_unit_by_tier`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Tiers {
    /// The app instances, together.
    pub instances: f64,
    /// Postgres; `null` when it does not run on this machine.
    pub postgres: Option<f64>,
    /// Redis; `null` when it does not run on this machine.
    pub redis: Option<f64>,
    /// RabbitMQ; `null` when it does not run on this machine.
    pub rabbitmq: Option<f64>,
}

impl Tiers {
    /// `total` split by each tier's share of `cpu`'s service-side seconds;
    /// all of it on the instances when the service side used no measurable
    /// CPU.
    pub fn split(total: f64, cpu: &crate::cpu::Cpu) -> Tiers {
        let service = cpu.service_s();
        let share = |s: f64| if service > 0.0 { total * s / service } else { 0.0 };
        Tiers {
            instances: if service > 0.0 { share(cpu.instances_s) } else { total },
            postgres: cpu.postgres_s.map(share),
            redis: cpu.redis_s.map(share),
            rabbitmq: cpu.rabbitmq_s.map(share),
        }
    }

    /// The tiers by name, in the order above; a tier not measured is left
    /// out.
    pub fn named(&self) -> Vec<(&'static str, f64)> {
        let tiers = [
            ("instances", Some(self.instances)),
            ("postgres", self.postgres),
            ("redis", self.redis),
            ("rabbitmq", self.rabbitmq),
        ];
        tiers.into_iter().filter_map(|(name, v)| Some((name, v?))).collect()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ratio {
    pub sell_through_vs_sql_tps: Option<f64>,
    pub rejection_vs_http_rps: Option<f64>,
    /// This run's sell-through ÷ the `sql` run's in the same profile and
    /// repeat; `null` when `sql` did not run.
    pub sell_through_vs_sql_strategy: Option<f64>,
    /// This `sql/batched` run's sell-through ÷ `sql_batched_units_per_s`;
    /// `null` for every other strategy.
    #[serde(default)]
    pub sell_through_vs_batched_ceiling: Option<f64>,
}

impl Run {
    /// Any sign of a broken sale. Under a fault the books decide, not what
    /// the clients heard: a 5xx while a backing service is down is the
    /// designed answer (`fault.answers_in_window` shows them), and the
    /// reconciler returning what the fault stranded is its job (its fixes
    /// are reported, not counted as broken); an accepted purchase lost
    /// breaks the sale.
    pub fn is_broken(&self) -> bool {
        let faulted = self.fault.is_some();
        self.oversold > 0
            || self.ledger_drift != 0
            || self.undersold > 0
            || self.duplicate_orders > 0
            || (self.errors_5xx > 0 && !faulted)
            || self.redis_drift.is_some_and(|d| d != 0)
            || (self.reconcile_fixes.is_some_and(|f| f != 0) && !faulted)
            || self.accepted_unresolved.is_some_and(|n| n > 0)
            || self.fault.as_ref().is_some_and(|f| f.accepted_lost > 0)
            || self.payment_missing()
    }

    /// A `payment` run that did not show the lifecycle at work: an order
    /// still pending once the windows passed, expired orders whose units
    /// came back, or resold units that waited beyond the sale's line,
    /// later than `return_bound_ms` at the 99th percentile, or — with
    /// buyers who never pay — no unit returned or none resold.
    pub fn payment_missing(&self) -> bool {
        self.payment.as_ref().is_some_and(|p| {
            let late = |delays: &Option<ResaleDelays>| {
                delays
                    .as_ref()
                    .and_then(|d| d.p99)
                    .is_some_and(|p99| p.return_bound_ms > 0 && p99 > p.return_bound_ms as f64)
            };
            p.units_pending > 0
                || late(&p.expiry_to_return_ms)
                || late(&p.resale_beyond_line_ms)
                || (p.unpaid_share > 0.0 && (self.units_returned == 0 || self.units_resold == 0))
        })
    }

    /// Whether the books themselves show the break: oversold or drift, and
    /// under a fault also units left unsold after settle or an accepted
    /// purchase lost.
    pub fn books_broken(&self) -> bool {
        let fault = self.fault.as_ref();
        self.oversold > 0
            || self.ledger_drift != 0
            || fault.is_some_and(|f| f.undersold_after_settle > 0 || f.accepted_lost > 0)
    }

    /// The verdict against `expected`. A run expected to break must show it
    /// in the books, not merely in its error count.
    pub fn judge(&self) -> Verdict {
        Verdict::of(self.expected, self.is_broken(), self.books_broken())
    }

    /// The run's repeat as the tables show it: `3`, or `3.2` for the
    /// second take of round 3.
    pub fn label(&self) -> String {
        match self.take {
            0 | 1 => self.repeat.to_string(),
            take => format!("{}.{take}", self.repeat),
        }
    }

    /// The fault's wire name, `none` without one.
    pub fn fault_name(&self) -> &str {
        self.fault.as_ref().map_or("none", |f| f.kind.as_str())
    }
}

fn first_take() -> u64 {
    1
}

/// Fills `ratio.sell_through_vs_sql_strategy` from the runs of the
/// reference strategy (`seckill::strategy::REFERENCE`) of the same profile,
/// fault and repeat: the run's sell-through over the geometric mean of
/// theirs (one run, or `--reference-runs` of them spread through the
/// round). None when one of them has no rate: a reference with a missing
/// run is not the reference of the other rounds.
pub fn relate_to_sql(runs: &mut [Run]) {
    let sql: Vec<(String, String, u64, Option<f64>)> = runs
        .iter()
        .filter(|r| r.strategy == REFERENCE.as_str())
        .map(|r| (r.profile.clone(), r.fault_name().to_owned(), r.repeat, r.sell_through_per_s))
        .collect();
    for run in runs.iter_mut() {
        let bases: Vec<Option<f64>> = sql
            .iter()
            .filter(|(profile, fault, repeat, _)| {
                *profile == run.profile && fault == run.fault_name() && *repeat == run.repeat
            })
            .map(|(_, _, _, value)| *value)
            .collect();
        let base = geometric_mean(&bases);
        run.ratio.sell_through_vs_sql_strategy = match (run.sell_through_per_s, base) {
            (Some(value), Some(base)) if base > 0.0 => Some(value / base),
            _ => None,
        };
    }
}

/// The geometric mean of `values`; `None` when there are none or one is
/// missing or not positive.
fn geometric_mean(values: &[Option<f64>]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut logs = 0.0;
    for value in values {
        let value = (*value).filter(|v| v.is_finite() && *v > 0.0)?;
        logs += value.ln();
    }
    Some((logs / values.len() as f64).exp())
}

/// Fills `ratio.sell_through_vs_batched_ceiling` of the runs of `strategy`
/// (the strategy whose batch transaction was measured) from `ceiling`
/// (`sql_batched_units_per_s`).
pub fn relate_to_batched_ceiling(runs: &mut [Run], strategy: StrategyName, ceiling: f64) {
    for run in runs.iter_mut().filter(|run| run.strategy == strategy.as_str()) {
        run.ratio.sell_through_vs_batched_ceiling =
            run.sell_through_per_s.map(|value| value / ceiling).filter(|v| v.is_finite());
    }
}

/// A small report for the unit tests of the views: `naive`, `sql` and
/// `queue` in `burst`, two repeats each.
#[cfg(test)]
pub(crate) mod fixture {
    use serde_json::{Value, json};

    use super::{Report, summary};

    fn run(strategy: &str, repeat: u64) -> Value {
        let breaks = strategy == "naive";
        let queue = strategy == "queue";
        let oversold = if breaks { 30 + repeat as i64 } else { 0 };
        let sold = 1000 + oversold;
        json!({
            "strategy": strategy, "profile": "burst", "repeat": repeat,
            "expected": if breaks { "breaks" } else { "correct" }, "verdict": "ok",
            "instances": 2, "sales": 1, "total_stock": 1000, "buyers": 3000,
            "demanded_units": 3000, "requests": 3300, "duration_s": 2.5, "throughput_rps": 1320.0,
            "sell_through_per_s": 800.0 + repeat as f64, "rejection_rps": 2100.0,
            "units_sold": sold, "orders": sold, "remaining_stock": 0, "oversold": oversold,
            "undersold": 0, "ledger_drift": -oversold, "duplicate_orders": 0, "errors_5xx": 0,
            "outcomes": { "placed": sold, "sold_out": 2000, "already_purchased": 300,
                          "busy": 0, "unavailable": 0, "not_started": 0, "ended": 0,
                          "invalid": 0, "other": 0 },
            "status_counts": { "201": sold, "409": 2300 },
            "latency_ms": { "p50": 2.25, "p95": 20.0, "p99": 80.0, "max": 400.0 },
            "ratio": { "sell_through_vs_sql_tps": 0.4, "rejection_vs_http_rps": 0.3,
                       "sell_through_vs_sql_strategy": if strategy == "sql" { json!(1.0) }
                                                       else { json!(0.9) } },
            "redis_drift": null, "reconcile_fixes": null, "lock_stats": null,
            "accepted_unresolved": if queue { json!(0) } else { Value::Null },
            "e2e_latency_ms": if queue {
                json!({ "p50": 45.3, "p95": 70.0, "p99": 81.7, "max": 90.0 })
            } else { Value::Null },
            "batch_sizes": if queue { json!({ "p50": 100.0, "max": 200.0, "mean": 112.8 }) }
                           else { Value::Null },
            "cost": { "redis_round_trips_per_unit": null, "pg_xacts_per_unit": 2.2,
                      "amqp_messages_per_unit": if queue { json!(2.1) } else { Value::Null },
                      "peak_rss_mb": 38.0 }
        })
    }

    pub fn report() -> Report {
        let runs: Vec<Value> =
            (1..=2).flat_map(|repeat| ["naive", "sql", "queue"].map(|s| run(s, repeat))).collect();
        let mut report: Report = serde_json::from_value(json!({
            "schema_version": 1,
            "generated_at": "2026-11-29T21:00:00Z",
            "machine": { "cpus": 2, "os": "Debian GNU/Linux 12", "memory_gb": 23.4 },
            "config": { "strategies": ["naive", "sql", "queue"], "repeat": 2 },
            "ceilings": {
                "http_rps": { "value": 7000.0, "users": 200, "instances": 2, "duration_s": 5.0 },
                "sql_tps": { "value": 2000.0, "connections": 20, "duration_s": 5.0 }
            },
            "runs": runs
        }))
        .expect("the fixture is a report.json");
        report.summary = summary::summarize(&report.runs);
        report
    }
}

#[cfg(test)]
mod tests {
    use super::{fixture, geometric_mean, relate_to_sql};

    #[test]
    fn each_ratio_to_sql_divides_by_the_geometric_mean_of_its_rounds_sql_takes() {
        let mut runs = fixture::report().runs;
        let mut second =
            runs.iter().find(|r| r.strategy == "sql" && r.repeat == 1).unwrap().clone();
        second.take = 2;
        runs.push(second);
        for run in runs.iter_mut().filter(|r| r.repeat == 1) {
            run.sell_through_per_s = Some(match (run.strategy.as_str(), run.take) {
                ("sql", 1) => 400.0,
                ("sql", _) => 900.0,
                _ => 1200.0,
            });
        }
        relate_to_sql(&mut runs);
        let ratio = |strategy: &str, repeat, take| {
            let run = runs
                .iter()
                .find(|r| r.strategy == strategy && r.repeat == repeat && r.take == take);
            run.unwrap().ratio.sell_through_vs_sql_strategy.unwrap()
        };
        // √(400 × 900) = 600.
        assert!((ratio("queue", 1, 1) - 2.0).abs() < 1e-12);
        assert!((ratio("sql", 1, 1) - 400.0 / 600.0).abs() < 1e-12);
        assert!((ratio("sql", 1, 2) - 1.5).abs() < 1e-12);
        assert!((ratio("sql", 2, 1) - 1.0).abs() < 1e-12, "one take: itself");
        assert_eq!(geometric_mean(&[Some(4.0), None]), None, "a take without a rate");
        assert_eq!(geometric_mean(&[]), None);
        assert_eq!(runs[0].label(), "1");
        assert_eq!(runs.last().unwrap().label(), "1.2");
    }
}
