//! `queue`: purchases are serialized through RabbitMQ and settled in batches
//! by one consumer per partition.
//!
//! One purchase (the request path, [`Queue::purchase`]):
//! 1. If this instance knows the sale is sold out, publish nothing: answer
//!    `409 sold-out`, or the buyer's existing request if they have one (one
//!    indexed read, no broker; [`sold_out_fanout`]). A request handed back
//!    while it is still `pending` is published again first, so that an id
//!    handed back can always resolve.
//! 2. Register the request in `purchase_requests` (one per sale and user: a
//!    resubmission finds the same request id and, once settled, its result),
//!    in groups: one statement for the requests that arrive together
//!    ([`registrar`]).
//! 3. Publish a persistent message carrying the request id to the sale's
//!    partition queue, `mandatory`, and wait for the publisher confirm. Only
//!    a confirmed message is answered `202 Accepted`; a nack (the queue is
//!    full), a returned (unroutable) message, a timeout or a broker that is
//!    down is answered `503 busy` with `Retry-After` ([`publisher`]).
//!
//! Steps 2 and 3 run in a task of their own ([`Accept`]), which the request
//! awaits: a client that hangs up (or a request timeout) drops the request's
//! future, not the task, so its request ends with its message published, or
//! removed when the publish was refused.
//!
//! Settlement ([`consumer`]): every instance consumes every partition queue,
//! and the queues' single-active-consumer flag lets exactly one of them
//! receive deliveries; when it dies the broker hands the queue (and its
//! unacknowledged messages) to another. The active consumer takes up to
//! `SECKILL_QUEUE_BATCH_MAX` messages and settles them in one Postgres
//! transaction ([`settle`]), then acknowledges them. A crash before the
//! acknowledgement redelivers the batch, and settling is idempotent by request
//! id, so a redelivered message never writes a second order.
//!
//! Dead letters ([`dead_letters`]) are drained and resolved `rejected`;
//! resolved requests older than `SECKILL_QUEUE_RETENTION_MS` are deleted by
//! a periodic job ([`retention`]). A request left `pending` without its
//! message (its instance died, or lost Postgres' reply, between steps 2 and
//! 3) is published again by another periodic job once it is older than
//! `SECKILL_QUEUE_REPUBLISH_AFTER_MS` ([`republish`]).
//!
//! Invariants: the ledger of the `sql` strategy (the consumer takes stock with
//! a guarded update by the units it grants); one result per request id; a
//! `202` only for a message the broker confirmed, and every pending request
//! published again until it is settled, so every request ends resolved. The design and its measured numbers are in docs/queue.md.
//!
//! Results are read at `GET /sales/{id}/requests/{request_id}` and a sale's
//! queue statistics at `GET /admin/sales/{id}/queue`, both routes of this
//! strategy ([`routes`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

use futures_util::future::BoxFuture;

use super::descriptor::{Batching, DrainRun, DrainTimes};
use super::{
    Backend, Ceiling, Claim, Deps, DrainBench, KillTarget, Outcome, Queues, Registration, Returned,
    Settles, Strategy, StrategyError, StrategyName, StrategyRoutes,
};
use crate::backends::AmqpHandle;
use crate::bounds::MAX_MS;
use crate::sale::{Quantity, Sale, SaleId, UserId};
use consumer::ConsumerSettings;

pub mod consumer;
pub mod dead_letters;
pub mod publisher;
mod registrar;
pub mod republish;
pub mod results;
pub mod retention;
mod routes;
pub mod settle;
pub mod sold_out_fanout;
pub mod topology;

pub use results::{QueueStats, RequestResult};
pub use topology::Topology;

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("queue");

/// `queue` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "202 Accepted once a RabbitMQ quorum queue confirmed the request; one active \
            consumer per partition settles batches in one transaction each",
    needs: &[Backend::Postgres, Backend::Rabbitmq],
    build: |deps| Ok(Arc::new(Queue::new(deps, &deps.settings.queue)?)),
    // Expected correct everywhere (the default): one active consumer per
    // partition settles each batch in one guarded Postgres transaction;
    // every accepted request is resolved. A killed consumer's
    // unacknowledged messages are redelivered to the next one, and a
    // redelivered request settles once (its row is idempotent); a `202` is
    // answered only after the publisher confirm, so a restarted broker
    // still holds every accepted request in its quorum queue.
    settles: Settles::AfterTheAnswer,
    ceiling: Ceiling::Drain(DRAIN),
    // Its consumer is where a kill hits: the active one's batches are lost
    // and redelivered.
    kill: KillTarget::ActiveConsumer { batches_metric: crate::metric_names::QUEUE_BATCH_SIZE },
    queues: Some(Queues {
        declare: |prefix, amqp_url| {
            Box::pin(async move { environment_topology(prefix).declare_at(amqp_url).await })
        },
        delete: |prefix, amqp_url| {
            Box::pin(async move { environment_topology(prefix).delete_at(amqp_url).await })
        },
    }),
    ..Registration::DEFAULTS
};

/// The `queue` settings of this process's environment (its
/// `SECKILL_QUEUE_*` variables, else the defaults): what the instances the
/// load test starts from the same environment read. Exits with clap's
/// message on a malformed variable, as the service would.
fn environment_settings() -> Settings {
    #[derive(clap::Parser)]
    struct FromEnv {
        #[command(flatten)]
        queue: Settings,
    }
    <FromEnv as clap::Parser>::parse_from(["queue"]).queue
}

/// The queues of `prefix` as processes started from this environment
/// declare them.
fn environment_topology(prefix: &str) -> Topology {
    let queue = environment_settings();
    Topology::new(prefix, queue.partitions, queue.max_length, queue.delivery_limit)
}

/// The hooks of the drain benchmark (`queue_drain_units_per_s`): the
/// message of one purchase, and the consumer's own batching and transaction
/// on a queue of them.
const DRAIN: DrainBench = DrainBench {
    message: |sale, user, quantity| {
        let message = PurchaseMessage {
            request_id: Uuid::new_v4(),
            sale_id: sale.0,
            user_id: user.get(),
            quantity: quantity.get(),
        };
        serde_json::to_vec(&message).expect("a purchase message serializes")
    },
    drain: drain_queue,
    batching: || {
        let settings = ConsumerSettings::from_settings(&environment_settings());
        Batching { batch_size: settings.batch_size, window: settings.window }
    },
};

/// [`DrainBench::drain`]: the consumer's drain with `run.batching`, ending
/// once the queue stayed empty for 5 s.
fn drain_queue(run: DrainRun<'_>) -> BoxFuture<'_, anyhow::Result<DrainTimes>> {
    let settings = ConsumerSettings {
        batch_size: run.batching.batch_size,
        window: run.batching.window,
        // A drain settles once and never rejects: the limit does not apply.
        delivery_limit: u32::MAX,
        #[cfg(feature = "failpoints")]
        failpoints: Default::default(),
    };
    let idle = Duration::from_secs(5);
    Box::pin(consumer::drain(run.db, run.channel, run.queue, settings, idle, run.expected))
}

/// The body of one message: a request to settle. JSON, persistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurchaseMessage {
    pub request_id: Uuid,
    pub sale_id: i64,
    pub user_id: i64,
    pub quantity: i32,
}

/// Settings of the `queue` strategy (`SECKILL_QUEUE_*`), its part of
/// `crate::strategy::StrategySettings`.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Strategy queue")]
#[group(id = "queue")]
pub struct Settings {
    /// Partition queues; sale `id` goes to partition `id mod N`.
    /// Every instance must use the same number.
    #[arg(
        id = "QUEUE_PARTITIONS",
        long = "queue-partitions",
        env = "SECKILL_QUEUE_PARTITIONS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub partitions: u16,

    /// Messages a partition queue holds at most (`x-max-length`);
    /// beyond it the broker refuses publishes (`x-overflow = reject-publish`)
    /// and purchases are answered `503 busy`.
    #[arg(
        id = "QUEUE_MAX_LENGTH",
        long = "queue-max-length",
        env = "SECKILL_QUEUE_MAX_LENGTH",
        default_value_t = 100_000,
        value_parser = clap::value_parser!(u32).range(1..=100_000_000)
    )]
    pub max_length: u32,

    /// Most messages the consumer settles in one Postgres
    /// transaction. The prefetch is twice this.
    #[arg(
        id = "QUEUE_BATCH_MAX",
        long = "queue-batch-max",
        env = "SECKILL_QUEUE_BATCH_MAX",
        default_value_t = 200,
        value_parser = clap::value_parser!(u16).range(1..=10_000)
    )]
    pub batch_max: u16,

    /// After a batch's first message, how long the consumer waits
    /// for more before settling what it has, in milliseconds.
    #[arg(
        id = "QUEUE_BATCH_WINDOW_MS",
        long = "queue-batch-window-ms",
        env = "SECKILL_QUEUE_BATCH_WINDOW_MS",
        default_value_t = 2,
        value_parser = clap::value_parser!(u64).range(0..=10_000)
    )]
    pub batch_window_ms: u64,

    /// Failed settlements of one request before it is rejected and
    /// its message dead-lettered. The consumer counts them itself; the
    /// broker's `x-delivery-limit` is a separate backstop (1000), since
    /// RabbitMQ before 4.3 also counts the returns of a fail-over.
    #[arg(
        id = "QUEUE_DELIVERY_LIMIT",
        long = "queue-delivery-limit",
        env = "SECKILL_QUEUE_DELIVERY_LIMIT",
        default_value_t = 5,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub delivery_limit: u32,

    /// Milliseconds a resolved request row is kept after it was
    /// accepted; a periodic job deletes older ones (pending requests are
    /// never deleted). 0 keeps them forever. Default: 7 days.
    #[arg(
        id = "QUEUE_RETENTION_MS",
        long = "queue-retention-ms",
        env = "SECKILL_QUEUE_RETENTION_MS",
        default_value_t = 604_800_000
    )]
    pub retention_ms: u64,

    /// Milliseconds a request may stay `pending` before a periodic
    /// job publishes its message again — for a request whose instance died,
    /// or lost Postgres' reply, between registering it and publishing it. The
    /// consumer settles a request id once, so a request still queued costs a
    /// second delivery, never a second order. 0 turns the job off. Default:
    /// 10 s, twice the publisher's 5 s confirm timeout, so that a publish
    /// waiting for its confirm is rarely doubled.
    #[arg(
        id = "QUEUE_REPUBLISH_AFTER_MS",
        long = "queue-republish-after-ms",
        env = "SECKILL_QUEUE_REPUBLISH_AFTER_MS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(0..=MAX_MS)
    )]
    pub republish_after_ms: u64,

    /// Whether this instance runs a consumer per partition (every
    /// instance does by default; single active consumer picks one).
    #[arg(
        id = "QUEUE_CONSUME",
        long = "queue-consume",
        env = "SECKILL_QUEUE_CONSUME",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub consume: bool,
}

/// The `queue` strategy; one per process.
pub struct Queue {
    db: PgPool,
    /// Pool for registering requests, with `synchronous_commit = off`: a
    /// request row is an index over a message the broker has confirmed, and
    /// the consumer recreates a row that a Postgres crash lost.
    requests_db: PgPool,
    /// Registers requests (and looks buyers up) in groups, over `requests_db`.
    registrar: Arc<registrar::Registrar>,
    /// The connection of the consumers and the event listener.
    background: AmqpHandle,
    topology: Topology,
    publisher: Arc<publisher::Publisher>,
    gate: Arc<sold_out_fanout::SoldOutGate>,
    consumer: consumer::ConsumerSettings,
    consume: bool,
    /// Resolved requests older than this are deleted; zero: kept forever.
    retention: Duration,
    /// Requests pending for longer than this are published again; zero: never.
    republish_after: Duration,
}

impl Queue {
    /// The strategy of one process, with `settings` (its part of the
    /// strategies' settings) over the connections of `deps`.
    ///
    /// Errors: an unparsable `DATABASE_URL`.
    pub fn new(deps: &Deps, settings: &Settings) -> anyhow::Result<Self> {
        let backends = &deps.backends;
        let topology = Topology::of(&backends.amqp_prefix, settings);
        let options: PgConnectOptions = backends.database_url.parse()?;
        let options = options.application_name("seckill").options([("synchronous_commit", "off")]);
        let requests_db = PgPoolOptions::new()
            .max_connections(backends.db_pool_size)
            .acquire_timeout(backends.db_acquire_timeout())
            .idle_timeout(Duration::from_secs(60))
            .connect_lazy_with(options);
        // Consumers and the event listener get a connection of their own:
        // RabbitMQ 3.10 may crash a channel that subscribes to a quorum queue
        // declared a moment earlier (`noproc`), and a crashed channel closes
        // its whole connection — it must not take the publishers with it.
        let background = deps.amqp.separate();
        let gate = Arc::new(sold_out_fanout::SoldOutGate::new(
            deps.settings.sold_out_flag_ttl(),
            background.clone(),
            topology.clone(),
        ));
        Ok(Self {
            db: deps.db.clone(),
            registrar: Arc::new(registrar::Registrar::new(requests_db.clone())),
            requests_db,
            background,
            publisher: Arc::new(publisher::Publisher::new(deps.amqp.clone(), topology.clone())),
            consumer: consumer::ConsumerSettings::from_deps(deps, settings),
            consume: settings.consume,
            retention: Duration::from_millis(settings.retention_ms),
            republish_after: Duration::from_millis(settings.republish_after_ms),
            topology,
            gate,
        })
    }

    /// Queue names and partitioning of this process.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The result of request `id` of `sale`, waiting up to `wait` for it to
    /// leave `pending`. `Ok(None)` when the sale has no such request, or —
    /// with `owner` — none of that buyer's.
    pub async fn request(
        &self,
        sale: SaleId,
        id: Uuid,
        owner: Option<UserId>,
        wait: Duration,
    ) -> Result<Option<RequestResult>, StrategyError> {
        results::wait_for(&self.db, sale, id, owner, wait).await
    }

    /// Queue statistics of a sale, from Postgres.
    pub async fn stats(&self, sale: SaleId) -> Result<QueueStats, StrategyError> {
        results::stats(&self.db, sale).await
    }
}

#[async_trait]
impl Strategy for Queue {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let accept = Accept {
            registrar: self.registrar.clone(),
            publisher: self.publisher.clone(),
            requests_db: self.requests_db.clone(),
            sale: sale.id,
            user,
            quantity,
        };
        if self.gate.is_sold_out(&self.db, sale.id).await? {
            // No new request for a sold-out sale; a buyer who already has
            // one gets it back (with its result behind it).
            return match self.registrar.find(sale.id, user).await? {
                None => Ok(Outcome::SoldOut),
                Some(found) if !found.pending => Ok(Outcome::Accepted { request_id: found.id }),
                Some(found) => spawned(accept.publish_pending(found)).await,
            };
        }
        spawned(accept.register_and_publish()).await
    }

    /// Reopens the sale on this instance at once and tells the others.
    async fn restocked(&self, sale: &Sale, _units: i64) -> Result<(), StrategyError> {
        self.gate.reopen(sale.id).await;
        Ok(())
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go back on the sale row, in the claim's transaction: the
    /// consumer's settlement locks that row (`FOR UPDATE`) before it reads
    /// the stock it allocates from, so the return lands before that read or
    /// after the batch's write. The buyers' requests become `returned` in
    /// the same transaction, which frees their places for new requests.
    /// Then, as for a restock, the sale's gate reopens on every instance.
    async fn return_units(&self, sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        let mut claim = claim;
        let (users, orders): (Vec<i64>, Vec<i64>) =
            claim.orders().iter().map(|order| (order.user.get(), order.id)).unzip();
        sqlx::query(
            "UPDATE purchase_requests r SET status = 'returned' \
             FROM unnest($2::bigint[], $3::bigint[]) AS ended(user_id, order_id) \
             WHERE r.sale_id = $1 AND r.user_id = ended.user_id \
               AND r.order_id = ended.order_id AND r.status = 'placed'",
        )
        .bind(claim.sale().0)
        .bind(&users)
        .bind(&orders)
        .execute(claim.conn())
        .await?;
        let returned = super::sql::return_to_sale_row(claim).await?;
        self.gate.reopen(sale.id).await;
        Ok(returned)
    }

    /// Spawns one consumer per partition and the dead-letter consumer (unless
    /// `SECKILL_QUEUE_CONSUME` is off), the sold-out listener, the republish
    /// job (unless `SECKILL_QUEUE_REPUBLISH_AFTER_MS` is 0) and the retention
    /// job (unless `SECKILL_QUEUE_RETENTION_MS` is 0).
    /// They reconnect on their own and end with the runtime.
    ///
    /// The queues are declared once, before any consumer subscribes: RabbitMQ
    /// 3.10 crashes a channel that subscribes to a quorum queue another
    /// channel is still creating, and closes the whole connection with
    /// `541 INTERNAL_ERROR` — which concurrent consumers declaring the same
    /// fresh queues would provoke at every first start.
    fn start_background(self: Arc<Self>) {
        if self.consume {
            let (db, amqp, topology) =
                (self.db.clone(), self.background.clone(), self.topology.clone());
            let (settings, gate) = (self.consumer.clone(), self.gate.clone());
            tokio::spawn(async move {
                consumer::declare_queues(&amqp, &topology).await;
                tokio::spawn(dead_letters::run(db.clone(), amqp.clone(), topology.clone()));
                for partition in 0..topology.partitions() {
                    tokio::spawn(consumer::run(
                        db.clone(),
                        amqp.clone(),
                        topology.clone(),
                        partition,
                        settings.clone(),
                        gate.clone(),
                    ));
                }
            });
        }
        tokio::spawn(sold_out_fanout::listen(
            self.background.clone(),
            self.topology.clone(),
            self.gate.clone(),
        ));
        if !self.republish_after.is_zero() {
            tokio::spawn(republish::run(Arc::downgrade(&self), self.republish_after));
        }
        if !self.retention.is_zero() {
            tokio::spawn(retention::run(Arc::downgrade(&self), self.retention));
        }
    }

    /// Request results and queue statistics.
    fn routes(self: Arc<Self>, deps: &Deps) -> Option<StrategyRoutes> {
        Some(routes::routes(self, deps.catalog.clone()))
    }
}

/// Steps 2 and 3 of a purchase (or the publish of a pending request handed
/// back by the sold-out gate), owning what they need so that they run in a
/// task of their own: a request whose client is gone still ends with its
/// message published, or with its row removed.
struct Accept {
    registrar: Arc<registrar::Registrar>,
    publisher: Arc<publisher::Publisher>,
    requests_db: PgPool,
    sale: SaleId,
    user: UserId,
    quantity: Quantity,
}

impl Accept {
    /// Registers the request and publishes its message.
    async fn register_and_publish(self) -> Result<Outcome, StrategyError> {
        let registered = self.registrar.register(self.sale, self.user, self.quantity).await?;
        if !registered.pending {
            // Settled already: the same request, answered without a message.
            return Ok(Outcome::Accepted { request_id: registered.id });
        }
        let message = PurchaseMessage {
            request_id: registered.id,
            sale_id: self.sale.0,
            user_id: self.user.get(),
            quantity: self.quantity.get(),
        };
        // A resubmission of a request that is still pending publishes again:
        // this instance cannot know whether the first publish was confirmed
        // (its instance may have died in between), and the consumer settles
        // a request id once, so a second message costs a delivery, never a
        // second order.
        match self.publisher.publish(&message).await {
            Ok(()) => Ok(Outcome::Accepted { request_id: registered.id }),
            Err(err) => {
                if registered.fresh {
                    results::forget(&self.requests_db, registered.id).await;
                }
                Err(err)
            }
        }
    }

    /// Publishes the message of `found`, a pending request of the buyer of a
    /// sale that is sold out (the consumer answers it at once).
    async fn publish_pending(self, found: registrar::Found) -> Result<Outcome, StrategyError> {
        let message = PurchaseMessage {
            request_id: found.id,
            sale_id: self.sale.0,
            user_id: self.user.get(),
            quantity: found.quantity,
        };
        self.publisher.publish(&message).await?;
        Ok(Outcome::Accepted { request_id: found.id })
    }
}

/// Runs `work` in a task of its own and waits for it: dropping the waiting
/// future leaves the task running to its end.
async fn spawned(
    work: impl std::future::Future<Output = Result<Outcome, StrategyError>> + Send + 'static,
) -> Result<Outcome, StrategyError> {
    tokio::spawn(work).await.map_err(|err| StrategyError::Internal(err.into()))?
}

#[cfg(test)]
mod environment_tests {
    use super::*;

    /// The load test's hooks read the queue's section alone from the
    /// environment; with none of its variables set, the defaults.
    #[test]
    fn the_hooks_read_the_queue_settings_of_the_environment() {
        let settings = environment_settings();
        assert!(settings.partitions >= 1 && settings.batch_max >= 1, "{settings:?}");
        let topology = environment_topology("test-hooks");
        assert_eq!(topology.partitions(), settings.partitions, "{topology:?}");
        let batching = (DRAIN.batching)();
        assert_eq!(batching.batch_size, settings.batch_max);
    }
}
