//! What a comparison of the strategies (the load test) needs to know of one
//! strategy, declared in its [`Registration`](super::Registration) next to
//! its implementation: what the strategy is expected to do under the
//! conditions of a run, when it settles a purchase, which ceiling bounds it,
//! which instance a killed-instance fault should hit, and the hooks that let
//! a benchmark drive its transaction without HTTP.
//!
//! Every field has a default ([`super::Registration::DEFAULTS`]) that fits a
//! plain correct Postgres strategy: always expected correct, settled before
//! it answers, bounded by one transaction per unit (`sql_tps`), the first
//! instance killed, no lock, no queue. A strategy states only what differs.
//!
//! The load test names no strategy: it reads these fields, and the role of
//! the reference strategy (the `sql_tps` ceiling's transaction, the
//! `vs_sql` ratios) is [`super::REFERENCE`].

use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::outcome::{Outcome, StrategyError};
use crate::sale::{Quantity, SaleId, UserId};

pub use super::batch::BatchSizes;
pub use super::queue::QueueStats;
pub use super::queue::results::E2eLatency;
pub use super::sql_batched::BatchStats;

/// A fault injected into a run, as the strategy's expectation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// One app instance is killed (`SIGKILL`) and started again: whatever
    /// it held dies with it (transactions, lock keys until they expire,
    /// unacknowledged messages).
    KillInstance,
    /// One app instance is stopped (`SIGSTOP`) for several lock leases, then
    /// continued: what it held outlives its lease.
    PauseInstance,
    /// Every Postgres connection of the instances is terminated.
    PgTerminate,
    /// Redis is killed and started again empty.
    RedisRestart,
    /// The RabbitMQ node is stopped and started again.
    BrokerRestart,
    /// One app instance cannot reach Redis for several lock leases, then
    /// can again; it keeps running, and keeps Postgres. What it sent
    /// meanwhile reaches Redis late.
    PartitionRedis,
    /// Every round trip to Postgres takes a lock lease longer, for several
    /// leases: a critical section with a round trip outlasts its lease.
    SlowPostgres,
}

/// What a run subjects the strategy to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// Whether the sale's simulated work keeps a purchase inside its
    /// critical section longer than the sale's lock lease (a stall: the
    /// load test's `slow` profile holds 600 ms under a 200 ms lease).
    pub stalls_past_lease: bool,
    /// App instances serving the sale (1 or more).
    pub instances: usize,
    /// The fault injected during the run, if any.
    pub fault: Option<Fault>,
}

/// Whether a strategy is expected to keep the books exact in a run; as
/// report.json's `expected` (`"correct"`, `"breaks"` or `"may_break"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expectation {
    /// No oversell, no undersell, no drift, no duplicate order, no counted
    /// 5xx, no Redis drift, no unresolved accepted request.
    Correct,
    /// A demonstration: the run is expected to show oversell or ledger drift
    /// in the audit (under a fault: oversell, drift, undersell after settle
    /// or an accepted purchase lost).
    Breaks,
    /// Either outcome: the run breaks when a fault happens to hit inside a
    /// critical section, which the fault does not control.
    MayBreak,
}

impl Expectation {
    /// The wire form, as in report.json and the tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Expectation::Correct => "correct",
            Expectation::Breaks => "breaks",
            Expectation::MayBreak => "may_break",
        }
    }

    /// As a verdict line says it.
    pub fn phrase(self) -> &'static str {
        match self {
            Expectation::Correct => "expected correct",
            Expectation::Breaks => "expected to break",
            Expectation::MayBreak => "may break",
        }
    }

    /// Whether broken books are what the run was meant to show (a
    /// demonstration), rather than a defect.
    pub fn tolerates_broken_books(self) -> bool {
        match self {
            Expectation::Correct => false,
            Expectation::Breaks | Expectation::MayBreak => true,
        }
    }
}

/// The default expectation: correct under every condition.
pub fn always_correct(_: &Conditions) -> Expectation {
    Expectation::Correct
}

/// When a purchase is settled relative to its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settles {
    /// The answer (`201`, `409`, …) says how the purchase ended. The default.
    BeforeTheAnswer,
    /// The answer is `202 Accepted`; the request settles later. The sale's
    /// requests are counted at `GET /admin/sales/{id}/queue`
    /// ([`QueueStats`]): a comparison waits until none is unresolved before
    /// it audits, and reports the end-to-end latency and batch sizes.
    AfterTheAnswer,
}

/// One purchase as the strategy's own transaction, issued directly against
/// Postgres: the transaction `sql_tps` counts when this strategy is the
/// reference. Answers as the strategy's purchase would.
pub type UnitTransaction =
    fn(PgPool, SaleId, UserId, Quantity) -> BoxFuture<'static, Result<Outcome, StrategyError>>;

/// A batch of purchases (`(buyer, units)`, in arrival order) of one sale,
/// settled by the strategy's own batch transaction directly against
/// Postgres; one answer per purchase, in the same order. Errors: the batch
/// failed as a whole.
pub type SettleBatch =
    fn(
        PgPool,
        SaleId,
        Vec<(UserId, Quantity)>,
    ) -> BoxFuture<'static, Result<Vec<Result<Outcome, StrategyError>>, StrategyError>>;

/// The ceiling that bounds a strategy's sell-through, and how a benchmark
/// measures it without HTTP.
#[derive(Clone, Copy)]
pub enum Ceiling {
    /// At least one transaction on the sale row per unit: bounded by
    /// `sql_tps`, the reference strategy's transaction. The default.
    PerUnitTransaction,
    /// No measured ceiling bounds it (e.g. the stock spread over several
    /// rows, each as fast as `sql_tps`).
    Unbounded,
    /// Many units per transaction: its own batch transaction
    /// (`sql_batched_units_per_s`), measured after the runs at the mean
    /// batch size they reached. The sale's batches are counted at
    /// `GET /admin/sales/{id}/batches` ([`BatchStats`]).
    Batches(SettleBatch),
    /// A consumer settling requests from a queue: the drain of a pre-filled
    /// queue (`queue_drain_units_per_s`), measured every round.
    Drain(DrainBench),
}

impl Ceiling {
    /// Whether `sql_tps` bounds the sell-through.
    pub fn is_per_unit_transaction(&self) -> bool {
        matches!(self, Ceiling::PerUnitTransaction)
    }

    /// The batch transaction, for [`Ceiling::Batches`].
    pub fn settle_batch(&self) -> Option<SettleBatch> {
        match self {
            Ceiling::Batches(settle) => Some(*settle),
            _ => None,
        }
    }

    /// The drain hooks, for [`Ceiling::Drain`].
    pub fn drain(&self) -> Option<DrainBench> {
        match self {
            Ceiling::Drain(drain) => Some(*drain),
            _ => None,
        }
    }
}

/// How a consumer's batching sizes its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most messages per transaction.
    pub batch_size: u16,
    /// How long a batch waits for more after its first message.
    pub window: Duration,
}

/// Where the time of a drain went: what the consumer waits on when the
/// drain is slower than it should be.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DrainTimes {
    /// Messages settled.
    pub settled: u64,
    /// Transactions (batches).
    pub batches: u64,
    /// Seconds waiting for the first delivery of a batch.
    pub waiting_s: f64,
    /// Seconds collecting the rest of a batch (at most the window each).
    pub collecting_s: f64,
    /// Seconds in the settling transactions.
    pub settling_s: f64,
    /// Seconds acknowledging.
    pub acking_s: f64,
}

/// What one drain is asked to do: settle `expected` messages waiting in
/// `queue` (a durable quorum queue on `channel`'s connection) into `db`.
pub struct DrainRun<'a> {
    pub db: &'a PgPool,
    /// Closed by the drain when it ends.
    pub channel: &'a lapin::Channel,
    pub queue: &'a str,
    pub batching: Batching,
    /// Messages to settle; the drain also ends once the queue stayed empty
    /// for 5 s.
    pub expected: u64,
}

/// The hooks of a queue consumer's drain benchmark.
#[derive(Clone, Copy)]
pub struct DrainBench {
    /// The body of one persistent message: a request to sell `Quantity`
    /// units of `SaleId` to `UserId`.
    pub message: fn(SaleId, UserId, Quantity) -> Vec<u8>,
    /// Settles the messages of a queue with the consumer's batching and
    /// transaction; where the time went. Errors: the broker or Postgres
    /// failed.
    pub drain: for<'a> fn(DrainRun<'a>) -> BoxFuture<'a, anyhow::Result<DrainTimes>>,
    /// The batching of processes started from this environment (its
    /// `SECKILL_QUEUE_*` variables, else the service's defaults).
    pub batching: fn() -> Batching,
}

/// Broker queues every process declares for a strategy, named after a
/// prefix (`SECKILL_AMQP_PREFIX`).
#[derive(Clone, Copy)]
pub struct Queues {
    /// Declares the queues of a prefix on an AMQP URL, with this
    /// environment's settings.
    pub declare: for<'a> fn(&'a str, &'a str) -> BoxFuture<'a, anyhow::Result<()>>,
    /// Deletes the queues of a prefix on an AMQP URL.
    pub delete: for<'a> fn(&'a str, &'a str) -> BoxFuture<'a, anyhow::Result<()>>,
}

/// Which instance a killed-instance fault should kill so that it hits where
/// the strategy can break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillTarget {
    /// The first instance. The default.
    First,
    /// The instance whose consumer is active: the one whose
    /// `<batches_metric>_count` (batches it settled) grows.
    ActiveConsumer { batches_metric: &'static str },
    /// With a single instance, that instance at a moment it holds the
    /// sale's lock: while the Redis key `PREFIX:{sale:ID}:<key>` exists.
    /// With several, the first (which holds the lock only by chance).
    LockHolder { key: &'static str },
}
