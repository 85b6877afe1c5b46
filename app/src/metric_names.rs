//! The names of the series the service exports at `GET /metrics`, defined
//! once for the service (every `metrics::counter!` / `histogram!` call site)
//! and for the load test (which scrapes them and divides them by units sold).
//!
//! This module imports nothing of the service, so that any layer may use it.
//! Renaming a series here renames it everywhere; the load test refuses to
//! read a series it expects and does not find, so a rename can never turn a
//! figure of the report into a silent 0. The HTTP request series
//! (`axum_http_requests_*`) are named by the `axum-prometheus` layer, not here.

/// Counter: round trips the service sent to Redis (one per command, pipeline
/// or script invocation actually sent). Labels: `strategy` (wire name, e.g.
/// `redis-decr`, `lock/token`). Emitted by every strategy that talks to Redis
/// (the `lock/*` strategies register it at 0 when they are built), and by a
/// waiting room under the strategy of the sale it is in front of; the load
/// test's `cost.redis_round_trips_per_unit` divides it by units sold.
pub const REDIS_ROUND_TRIPS_TOTAL: &str = "seckill_redis_round_trips_total";

/// Counter: AMQP messages published or consumed. Labels: `direction`
/// (`published` or `consumed`). Emitted by the `queue` strategy's publisher
/// and consumers; the load test's `cost.amqp_messages_per_unit` divides the
/// sum over both directions by units sold.
pub const AMQP_MESSAGES_TOTAL: &str = "seckill_amqp_messages_total";

/// Counter: purchases answered, one per purchase request that reached a
/// sale. Labels: `strategy` (wire name), `outcome` (`placed`, `accepted`,
/// `sold_out`, `already_purchased`, `not_started`, `ended`, `busy`,
/// `unavailable`, `internal`). Emitted by the purchase path common to every
/// strategy.
pub const PURCHASE_OUTCOMES_TOTAL: &str = "seckill_purchase_outcomes_total";

/// Counter: lock waits of a `lock/*` strategy that ran out (answered `503
/// busy`). Labels: `strategy`. Registered at 0 for every `lock/*` strategy.
pub const LOCK_TIMEOUTS_TOTAL: &str = "seckill_lock_timeouts_total";

/// Counter: claims and writes of a fenced `lock/*` strategy refused by the
/// fence because a newer holder claimed the sale (answered `503 busy`).
/// Labels: `strategy`. Registered at 0 for every `lock/*` strategy.
pub const FENCE_REJECTIONS_TOTAL: &str = "seckill_fence_rejections_total";

/// Counter: writes a `lock/*` strategy abandoned because its watchdog
/// reported the lock lost (answered `503 busy`). Labels: `strategy`.
/// Registered at 0 for every `lock/*` strategy.
pub const LOCK_LOSSES_TOTAL: &str = "seckill_lock_losses_total";

/// Counter: purchases answered `already_purchased` from the instance's
/// cache of buyers known to hold an order (`crate::known_buyers`), before
/// the strategy ran. Labels: `strategy`.
pub const KNOWN_BUYER_ANSWERS_TOTAL: &str = "seckill_known_buyer_answers_total";

/// Counter: critical sections of a `lock/*` strategy cut off because they
/// held the sale's lock for `SECKILL_LOCK_HOLD_MS` (answered `503 busy`).
/// Labels: `strategy`. Registered at 0 for every `lock/*` strategy.
pub const LOCK_HOLD_TIMEOUTS_TOTAL: &str = "seckill_lock_hold_timeouts_total";

/// Counter: successful watchdog lease renewals of a `lock/*` strategy,
/// counted when the lock is released. Labels: `strategy`. Registered at 0
/// for every `lock/*` strategy.
pub const LOCK_RENEWALS_TOTAL: &str = "seckill_lock_renewals_total";

/// Counter: units of stock the `redis-decr` reconciler fixed. Labels:
/// `strategy` (`redis-decr`), `kind` (`returned`: abandoned reservations
/// given back; `corrected`: counter moved towards Postgres). Emitted only
/// when a pass fixed something.
pub const RECONCILE_FIXES_TOTAL: &str = "seckill_reconcile_fixes_total";

/// Counter: completed runs of a periodic job, each the one run of its period
/// across every instance (the lock library's scheduler). Labels: `job`
/// (`redis-decr-reconcile`), `instance` (`SECKILL_INSTANCE`, by default the
/// address the instance listens on). Registered at 0 by every instance that
/// runs the job, so the sum over instances is the number of periods run.
pub const SCHEDULED_JOB_RUNS_TOTAL: &str = "seckill_scheduled_job_runs_total";

/// Counter: `queue` messages drained from the dead-letter queue, each
/// recorded as a final result (`rejected`) when its request was still
/// pending. Labels: `reason` (the broker's `x-death` reason: `rejected` — the
/// consumer gave up on it, after `SECKILL_QUEUE_DELIVERY_LIMIT` failures or
/// because it is unreadable —, `delivery_limit` — the broker's backstop —,
/// or `unknown`). Emitted by the `queue` dead-letter consumer.
pub const QUEUE_DEAD_LETTERED_TOTAL: &str = "seckill_queue_dead_lettered_total";

/// Counter: resolved `queue` requests deleted by the retention job (accepted
/// more than `SECKILL_QUEUE_RETENTION_MS` ago). No labels.
pub const QUEUE_REQUESTS_EXPIRED_TOTAL: &str = "seckill_queue_requests_expired_total";

/// Counter: `queue` requests whose message the republish job published again
/// (pending for more than `SECKILL_QUEUE_REPUBLISH_AFTER_MS`). No labels.
pub const QUEUE_REQUESTS_REPUBLISHED_TOTAL: &str = "seckill_queue_requests_republished_total";

/// Gauge: sales the last background `redis-decr` reconciliation pass of this
/// instance visited (the sales in the prefix's index: a sale that ended or
/// sold out, with its books settled, leaves it and its keys expire). Labels:
/// `instance`. Set by every pass this instance runs.
pub const RECONCILE_SALES_VISITED: &str = "seckill_reconcile_sales_visited";

/// Histogram: messages settled per `queue` consumer transaction (a count,
/// not a duration). No labels. Emitted by the `queue` consumer once per
/// settled batch.
pub const QUEUE_BATCH_SIZE: &str = "seckill_queue_batch_size";

/// Counter: accepted `queue` requests resolved by the consumer. Labels:
/// `resolution` (`placed`, `sold_out`, `already_purchased`, `rejected`).
/// Emitted by the `queue` consumer.
pub const QUEUE_RESOLUTIONS_TOTAL: &str = "seckill_queue_resolutions_total";

/// Histogram: purchases settled per `sql/batched` transaction (a count, not
/// a duration). No labels. Emitted once per batch by the batch leader.
pub const GROUP_COMMIT_BATCH_SIZE: &str = "seckill_group_commit_batch_size";

/// Histogram: seconds a `sql/batched` batch took to settle, from taking its
/// purchases off the queue to their answers (a pool connection, the
/// transaction, and its retries). No labels. Emitted once per batch.
pub const GROUP_COMMIT_TRANSACTION_DURATION_SECONDS: &str =
    "seckill_group_commit_transaction_duration_seconds";

/// Histogram: seconds a `sql/batched` purchase waited in its sale's queue
/// before its batch started (0 for a purchase of an idle sale). No labels.
/// Emitted once per purchase.
pub const GROUP_COMMIT_QUEUE_WAIT_DURATION_SECONDS: &str =
    "seckill_group_commit_queue_wait_duration_seconds";

/// Counter: orders that ended unpaid and returned their units. Labels:
/// `strategy` (wire name), `ending` (`cancelled` or `expired`). Emitted by
/// the order lifecycle (`crate::lifecycle`) after each return committed.
pub const ORDERS_ENDED_TOTAL: &str = "seckill_orders_ended_total";

/// Counter: subscriptions of this instance's `queue` consumers, by queue:
/// one per partition at start, then one per resubscription after a lost
/// channel or connection. Labels: `queue` (the partition queue's name).
/// Emitted by `strategy::queue::consumer`; a count that grows while nothing
/// fails is a consumer churning its subscription.
pub const QUEUE_CONSUMER_SUBSCRIPTIONS_TOTAL: &str = "seckill_queue_consumer_subscriptions_total";

/// Counter: failpoints set by `SECKILL_FAILPOINTS` that fired (tests and
/// fault drills only; absent otherwise). Labels: `failpoint` (its name, e.g.
/// `queue-before-ack`). Lets a test tell that the fault it armed happened.
pub const FAILPOINTS_FIRED_TOTAL: &str = "seckill_failpoints_fired_total";

/// Histogram: seconds a purchase or batch held its sale's serial resource —
/// a stock row's lock (a bucket's counted as 1/N of it), a batch's
/// transaction, or the sale's Redis lock (`crate::strategy::serial` says
/// how each is timed, and which holds are recorded). Labels: `strategy`.
/// Registered by every strategy when it is built; the load test's
/// `cost.serial_ms_per_unit` divides its `_sum` by
/// [`SERIAL_HOLD_UNITS_TOTAL`].
pub const SERIAL_HOLD_DURATION_SECONDS: &str = "seckill_serial_hold_duration_seconds";

/// Counter: units sold by the holds recorded in
/// [`SERIAL_HOLD_DURATION_SECONDS`]. Labels: `strategy`.
pub const SERIAL_HOLD_UNITS_TOTAL: &str = "seckill_serial_hold_units_total";

/// The `_sum` series of [`SERIAL_HOLD_DURATION_SECONDS`] in the Prometheus
/// exposition: the seconds of every hold added up.
pub const SERIAL_HOLD_DURATION_SECONDS_SUM: &str = "seckill_serial_hold_duration_seconds_sum";

/// Counter: buyers let in from a waiting room's line (`crate::waiting_room`),
/// by the instance whose admitter led at the time. No labels.
pub const ROOM_ADMISSIONS_TOTAL: &str = "seckill_room_admissions_total";
