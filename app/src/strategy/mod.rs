//! Stock-deduction strategies behind one trait, and the one registry of them.
//!
//! A sale names its strategy when it is created (`sales.strategy`), and every
//! purchase of that sale goes through [`Strategy::purchase`]. Each strategy
//! lives in its own module and answers with the same [`Outcome`] /
//! [`StrategyError`] vocabulary (`crate::outcome`), so the HTTP layer, the
//! metrics and the load test read all of them the same way.
//!
//! A strategy is one module plus one line in [`REGISTRY`]. The module
//! declares its [`Registration`] — wire name, the backing servers it needs,
//! how it is built from the process's [`Deps`], one line of description — and
//! implements [`Strategy`], whose optional hooks cover what differs (warming
//! a counter, background work, reconciliation, HTTP routes of its own). The
//! rest of the service names no strategy: the purchase path, the HTTP layer,
//! `--help` and the load test all read the registry (docs/adding-a-strategy.md).
//!
//! Every strategy sits on the same Postgres schema and its unique constraint
//! `orders_sale_user_key` (one order per user per sale). What differs is how
//! the stock is guarded; the audit (`crate::audit`) judges the result from
//! Postgres alone.

use std::sync::Arc;

use async_trait::async_trait;
use utoipa_axum::router::OpenApiRouter;

pub(crate) use crate::outcome::already_purchased_or;
pub use crate::outcome::{Backend, ORDERS_SALE_USER_KEY, Outcome, Reconciliation, StrategyError};
use crate::sale::{InvalidInput, Quantity, Sale, UserId};
pub use crate::strategy_name::StrategyName;
pub use crate::unit_return::{Claim, Returned};

pub mod batch;
pub mod descriptor;
pub mod lock;
pub mod naive;
pub mod queue;
pub mod redis_decr;
mod registry;
pub mod serial;
mod settings;
pub mod sql;
pub mod sql_batched;
pub mod sql_buckets;
pub mod sql_for_update;

pub use descriptor::{
    Ceiling, Conditions, DrainBench, Expectation, Fault, KillTarget, Queues, Settles,
    UnitTransaction,
};
pub use registry::{Deps, Strategies, UnknownStrategy, registration};
pub use settings::StrategySettings;

/// Every strategy of the service, in the order the comparison reports them.
/// Registering a strategy is its one line here. Two registrations with one
/// name do not compile (`registry::NAMES_ARE_UNIQUE`).
pub const REGISTRY: &[Registration] = &[
    naive::REGISTRATION,
    sql::REGISTRATION,
    sql_for_update::REGISTRATION,
    sql_batched::REGISTRATION,
    sql_buckets::REGISTRATION,
    redis_decr::REGISTRATION,
    lock::process_mutex::REGISTRATION,
    lock::setnx::REGISTRATION,
    lock::ttl::REGISTRATION,
    lock::token::REGISTRATION,
    lock::library_lock::WATCHDOG,
    lock::library_lock::FENCED,
    lock::library_fair::REGISTRATION,
    lock::library_redlock::REGISTRATION,
    queue::REGISTRATION,
];

/// The reference strategy: the `sql_tps` ceiling issues its
/// [`Registration::transaction`], and the comparison relates every other
/// strategy's sell-through to its runs (`vs_sql`). It must be registered and
/// have a transaction (checked at compile time).
pub const REFERENCE: StrategyName = sql::NAME;

/// The strategies of a first, short comparison (`loadtest compare
/// --quick`): the reference and one of each other kind of limit — many
/// purchases per transaction, a Redis gate, a queue, and the lock
/// generation that keeps exact books under every fault of the matrix.
pub const QUICK: &[StrategyName] =
    &[REFERENCE, sql_batched::NAME, redis_decr::NAME, queue::NAME, lock::library_lock::FENCED_NAME];

/// What the service and the load test need to know of one strategy,
/// declared by the strategy's module next to its implementation.
///
/// The first four fields are required; the others describe the strategy to
/// a comparison (`descriptor`) and default to a plain correct Postgres
/// strategy. State only what differs, with
/// `..Registration::DEFAULTS`.
#[derive(Clone, Copy)]
pub struct Registration {
    /// The wire name: `sales.strategy`, the `strategy` label of the metrics,
    /// the reports.
    pub name: StrategyName,
    /// One line on what the strategy does (`seckill serve --help`).
    pub about: &'static str,
    /// The backing servers it needs, Postgres always. The load test checks
    /// them before it starts and reports Redis round trips or AMQP messages
    /// per unit only for strategies that need that server.
    pub needs: &'static [Backend],
    /// Builds the strategy of one process. A strategy with settings reads
    /// its own section of `Deps::settings` here and nothing else of the
    /// configuration. Errors: settings it cannot work with (e.g. a malformed
    /// `SECKILL_LOCK_REDLOCK_URLS`).
    pub build: fn(&Deps) -> anyhow::Result<Arc<dyn Strategy>>,
    /// What a comparison expects of it under the conditions of a run.
    /// Default: correct under every condition.
    pub expect: fn(&Conditions) -> Expectation,
    /// When it settles a purchase relative to the answer. Default: before
    /// the answer.
    pub settles: Settles,
    /// The ceiling that bounds its sell-through. Default: one transaction
    /// per unit (`sql_tps`).
    pub ceiling: Ceiling,
    /// Which instance a killed-instance fault kills. Default: the first.
    pub kill: KillTarget,
    /// Whether it guards a critical section with a lock per sale: it then
    /// exports the lock counters (`seckill_lock_*`, `seckill_fence_*`) and
    /// its sales answer `GET /admin/sales/{id}/lock-stats`. Default: no.
    pub takes_a_lock: bool,
    /// Whether it needs independent Redis nodes (`REDLOCK_URLS`), which the
    /// load test starts when none are given. Default: no.
    pub redlock_nodes: bool,
    /// One purchase as its own transaction without HTTP: the `sql_tps`
    /// ceiling's transaction when this is [`REFERENCE`]. Default: none.
    pub transaction: Option<UnitTransaction>,
    /// Broker queues every process declares for it. Default: none.
    pub queues: Option<Queues>,
}

impl Registration {
    /// The optional fields at their defaults; the required ones are
    /// placeholders that every registration replaces (a registration with an
    /// empty name does not compile into [`REGISTRY`]).
    pub const DEFAULTS: Registration = Registration {
        name: StrategyName::declare(""),
        about: "",
        needs: &[Backend::Postgres],
        build: |_| anyhow::bail!("a registration must name its own build"),
        expect: descriptor::always_correct,
        settles: Settles::BeforeTheAnswer,
        ceiling: Ceiling::PerUnitTransaction,
        kill: KillTarget::First,
        takes_a_lock: false,
        redlock_nodes: false,
        transaction: None,
        queues: None,
    };
}

/// HTTP routes a strategy serves besides the purchase (e.g. the `queue`
/// strategy's request results), with their state applied. The service mounts
/// them next to its own routes, behind the same middleware, and answers their
/// errors through the same `AppError` (`crate::web`). Each route is added with
/// `utoipa_axum::routes!` from a handler annotated `#[utoipa::path]`, so it is
/// in the OpenAPI document (`GET /openapi.json`) as soon as it is mounted.
#[derive(Clone)]
pub struct StrategyRoutes {
    /// Names the routes. Strategies that share routes (the `lock/*` variants
    /// share `lock-stats`) give the same key, and the service mounts the
    /// routes of a key once.
    pub key: &'static str,
    /// Routes anyone may call.
    pub public: OpenApiRouter,
    /// Routes under `/admin/`: the service checks the admin token before they
    /// run, exactly as for its own admin routes.
    pub admin: OpenApiRouter,
}

/// One way of deducting stock.
///
/// Implementations must keep the ledger invariant
/// `total_stock = remaining_stock + sum(orders.quantity)` and must never write
/// two orders for one (sale, user) — or, for a baseline that is expected to
/// break, must break only through the race they demonstrate.
#[async_trait]
pub trait Strategy: Send + Sync + 'static {
    /// Tries to sell `quantity` units of `sale` to `user`. The caller has
    /// already checked the sale's time window and the per-user limit.
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError>;

    /// Called once after `sale` was inserted with `stock` units, before the
    /// creating request is answered (e.g. to pre-warm a counter).
    async fn sale_created(&self, _sale: &Sale, _stock: i64) -> Result<(), StrategyError> {
        Ok(())
    }

    /// Called after `units` were added to `sale` in Postgres.
    async fn restocked(&self, _sale: &Sale, _units: i64) -> Result<(), StrategyError> {
        Ok(())
    }

    /// How many bucket rows (`sale_buckets`) the stock of a new sale is split
    /// over, given the `buckets` field of `POST /admin/sales` (`requested`,
    /// `None` when absent); `Ok(None)` keeps the stock on the sale row. The
    /// default keeps it there and refuses the field.
    ///
    /// Errors: a count this strategy does not take (`422`, naming `buckets`).
    fn buckets(&self, requested: Option<i32>) -> Result<Option<i32>, InvalidInput> {
        match requested {
            None => Ok(None),
            Some(_) => Err(InvalidInput::new(
                "buckets",
                "this strategy keeps the stock on the sale row and takes no buckets",
            )),
        }
    }

    /// Whether this strategy returns the units of orders that end unpaid
    /// ([`Strategy::return_units`]), i.e. whether its sales may have a
    /// payment window (`payment_window_ms`; refused with `422` otherwise).
    fn returns_units(&self) -> bool {
        false
    }

    /// Puts the units of the claim's pending orders (one being cancelled, or
    /// the due orders of one sale that the expiry sweep claimed together)
    /// back on sale, through this strategy's own path, and ends the orders:
    /// the return goes into the claim's transaction (which holds the orders'
    /// row locks), then [`Claim::end`] changes the statuses and commits both
    /// (`crate::unit_return`: why this returns a unit at most once). One
    /// write of the stock for the whole claim, so that the sweep waits for a
    /// hot sale's row once per sale, not once per order.
    /// What the strategy keeps outside Postgres (a Redis counter, a local
    /// sold-out flag) follows after the commit.
    ///
    /// Only called for sales of a strategy whose [`Strategy::returns_units`]
    /// is true. Errors: as a purchase's (`busy` when a lock could not be
    /// taken; the order then stays pending and is claimed again later).
    async fn return_units(&self, _sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        Err(StrategyError::Internal(anyhow::anyhow!(
            "this strategy returns no units (order {})",
            claim.orders()[0].id
        )))
    }

    /// How far the strategy's own stock counter strays from Postgres, in
    /// units (see [`crate::audit::Audit::redis_drift`]), measured without
    /// changing anything. `None` (the default) for strategies that keep no
    /// stock outside Postgres.
    async fn redis_drift(&self, _sale: &Sale) -> Result<Option<i64>, StrategyError> {
        Ok(None)
    }

    /// One reconciliation pass over `sale` now: compare the strategy's own
    /// state with Postgres and heal drift. The default has nothing to
    /// reconcile and reports so (`redis_drift: None`, no fixes).
    async fn reconcile(&self, sale: &Sale) -> Result<Reconciliation, StrategyError> {
        Ok(Reconciliation::nothing_to_reconcile(sale.id))
    }

    /// Starts the strategy's background work (a consumer, a reconciler, a
    /// listener). Called once per process, after every strategy is built,
    /// from inside the Tokio runtime; the tasks end with the runtime or when
    /// the strategy is dropped. The default has none.
    fn start_background(self: Arc<Self>) {}

    /// The strategy's own HTTP routes, if it has some (built once per
    /// process, from the same `deps` as the strategy). The default has none.
    fn routes(self: Arc<Self>, _deps: &Deps) -> Option<StrategyRoutes> {
        None
    }
}
