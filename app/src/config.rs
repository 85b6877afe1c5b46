//! Service configuration: one struct, read from flags or environment
//! variables, with defaults that match the local services of the README.

use std::net::SocketAddr;
use std::time::Duration;

/// Development default for `SECKILL_ADMIN_TOKEN`. The service warns at start
/// when it is in use.
pub const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

/// Default of `SECKILL_BATCH_MAX`, the largest `sql/batched` batch.
///
/// Chosen by measurement (docs/hot-row.md): the strategy's batch
/// transaction driven directly against Postgres by two concurrent drivers
/// (`sql_batched::ceiling::units_per_s`, debug build, 3 s per size, two
/// passes on the 2-core development machine) settled 11–16 thousand units/s
/// in batches of 64, 23–25 thousand in batches of 128, 36–38 thousand in
/// batches of 256 and 47–49 thousand in batches of 512, one batch taking
/// 8–11, 10–11, 14 and 21–22 ms. 256 is the smallest of these caps whose
/// rate is above what HTTP delivers to two instances on that machine (the
/// release `http_rps` ceiling of the README's sample run, 33 635 answers/s),
/// so the cap does not hold the strategy below its front end, and a full
/// batch still commits in about 14 ms. Under the default comparison (200
/// clients over 2 instances) no batch reaches it.
pub const DEFAULT_BATCH_MAX: u16 = 256;

/// Configuration of `seckill serve`.
#[derive(Clone, clap::Args)]
pub struct Config {
    /// Postgres connection URL; the database is created if it does not exist.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/seckill"
    )]
    pub database_url: String,

    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SECKILL_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,

    /// Open HTTP connections at most; a connection beyond the cap is answered
    /// `503 busy` and closed at once. Keep it under the process's file
    /// descriptor limit (`ulimit -n`), with room for the connection pools.
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Milliseconds a client has to send a complete request head, from its
    /// first byte (from the accept, for a connection's first request); then
    /// the connection is closed.
    #[arg(long, env = "SECKILL_HEADER_TIMEOUT_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,

    /// Milliseconds a kept-alive connection may stay open with no request in
    /// progress and no byte read or written; then it is closed.
    #[arg(long, env = "SECKILL_IDLE_TIMEOUT_MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// Milliseconds a request may run, reading its body included, before it
    /// is answered `504 timeout`. What it set in motion may still complete
    /// (a purchase is never placed twice for one buyer, so a retry is safe).
    #[arg(long, env = "SECKILL_REQUEST_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Bearer token for `/admin/*` routes. Unset: the development default
    /// `dev-admin-token`, with a warning at start.
    #[arg(long, env = "SECKILL_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Postgres connections in this instance's pool.
    #[arg(long, env = "SECKILL_DB_POOL_SIZE", default_value_t = 10)]
    pub db_pool_size: u32,

    /// Redis connection URL (lock and redis-decr strategies).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,

    /// Namespace in front of every Redis key this service writes.
    #[arg(long, env = "SECKILL_REDIS_PREFIX", default_value = "seckill")]
    pub redis_key_prefix: String,

    /// RabbitMQ connection URL (queue strategy).
    #[arg(long, env = "AMQP_URL", default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,

    /// Namespace in front of every queue and exchange this service declares
    /// (`PREFIX.orders.N`, …); instances that share a sale share a prefix.
    #[arg(long, env = "SECKILL_AMQP_PREFIX", default_value = "seckill")]
    pub amqp_prefix: String,

    /// `queue`: partition queues; sale `id` goes to partition `id mod N`.
    /// Every instance must use the same number.
    #[arg(long, env = "SECKILL_QUEUE_PARTITIONS", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queue_partitions: u16,

    /// `queue`: messages a partition queue holds at most (`x-max-length`);
    /// beyond it the broker refuses publishes (`x-overflow = reject-publish`)
    /// and purchases are answered `503 busy`.
    #[arg(long, env = "SECKILL_QUEUE_MAX_LENGTH", default_value_t = 100_000)]
    pub queue_max_length: u32,

    /// `queue`: most messages the consumer settles in one Postgres
    /// transaction. The prefetch is twice this.
    #[arg(long, env = "SECKILL_QUEUE_BATCH_SIZE", default_value_t = 200,
          value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub queue_batch_size: u16,

    /// `queue`: after a batch's first message, how long the consumer waits
    /// for more before settling what it has, in milliseconds.
    #[arg(long, env = "SECKILL_QUEUE_BATCH_WINDOW_MS", default_value_t = 2)]
    pub queue_batch_window_ms: u64,

    /// `queue`: deliveries of one message before it goes to the dead-letter
    /// queue (`x-delivery-limit`, plus the consumer's own check).
    #[arg(long, env = "SECKILL_QUEUE_DELIVERY_LIMIT", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub queue_delivery_limit: u32,

    /// `queue`: whether this instance runs a consumer per partition (every
    /// instance does by default; single active consumer picks one).
    #[arg(long, env = "SECKILL_QUEUE_CONSUME", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub queue_consume: bool,

    /// `sql/batched`: most purchases of one sale this instance settles in one
    /// transaction; purchases beyond it wait for the next batch.
    #[arg(long, env = "SECKILL_BATCH_MAX", default_value_t = DEFAULT_BATCH_MAX,
          value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub batch_max: u16,

    /// `sql/batched`: microseconds a batch waits for more purchases before it
    /// settles; 0 settles at once what has gathered (group commit, no timer).
    #[arg(long, env = "SECKILL_BATCH_WINDOW_US", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub batch_window_us: u64,

    /// How long a request waits for a pool connection, in milliseconds; then
    /// it is answered 503 `busy` if Postgres answers a probe connection (the
    /// pool is exhausted by slow work), 503 `unavailable` if it does not.
    #[arg(long, env = "SECKILL_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000)]
    pub db_acquire_timeout_ms: u64,

    /// `redis-decr`: the period of the background reconciliation, in
    /// milliseconds: one pass over the sales this Redis prefix holds per
    /// period, run by one instance of those sharing the prefix; 0 turns the
    /// background job off (`POST /admin/sales/{id}/reconcile` still works).
    #[arg(long, env = "SECKILL_RECONCILE_INTERVAL_MS", default_value_t = 5000)]
    pub reconcile_interval_ms: u64,

    /// Names this instance in the `instance` label of its metrics
    /// (`seckill_scheduled_job_runs_total`). Unset: the address it listens
    /// on, as bound (`127.0.0.1:8080`).
    #[arg(long, env = "SECKILL_INSTANCE")]
    pub instance: Option<String>,

    /// `redis-decr`: age in milliseconds after which a reservation without an
    /// order counts as abandoned and is returned. Must exceed the longest
    /// purchase (pool wait `SECKILL_DB_ACQUIRE_TIMEOUT_MS` plus the
    /// transaction), or a slow purchase's unit is returned while it commits.
    #[arg(long, env = "SECKILL_RECONCILE_GRACE_MS", default_value_t = 15000)]
    pub reconcile_grace_ms: u64,

    /// `redis-decr` and `queue`: milliseconds an instance answers "sold out"
    /// from its local flag without asking Redis (or Postgres). The bound on
    /// how long a lost "stock returned" broadcast can hide returned stock.
    #[arg(long, env = "SECKILL_SOLD_OUT_FLAG_TTL_MS", default_value_t = 1000)]
    pub sold_out_flag_ttl_ms: u64,

    /// Test-only fault injection, e.g. `redis-decr-after-reserve=exit`
    /// (comma-separated `name=action`). Unset in production; see
    /// docs/redis-decr.md for the failpoints and their actions.
    #[arg(long, env = "SECKILL_FAILPOINTS", hide = true)]
    pub failpoints: Option<String>,

    /// Independent Redis nodes of the `lock/redlock` strategy, comma-separated
    /// (quorum = N/2 + 1).
    #[arg(
        long,
        env = "REDLOCK_URLS",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:6380,redis://127.0.0.1:6381,redis://127.0.0.1:6382"
    )]
    pub redlock_urls: Vec<String>,

    /// How long a `lock/*` purchase waits for its sale's lock before it is
    /// answered 503 `busy`, in milliseconds.
    #[arg(long, env = "SECKILL_LOCK_WAIT_MS", default_value_t = 1000)]
    pub lock_wait_ms: u64,

    /// How long a `lock/*` purchase may hold its sale's lock, in
    /// milliseconds: its critical section is cut off after this and answered
    /// 503 `busy`, and the library locks' watchdog stops renewing there
    /// (`max_hold`). The default is the default pool wait: a section that
    /// spent that long is hung or overloaded either way, and with the
    /// default lock wait (1 s) and release (at most 1 s) the purchase is
    /// answered well within the request timeout (10 s), by the lock's `busy`
    /// rather than a `504`. Keep wait + hold + 1 s under the request
    /// timeout.
    #[arg(long, env = "SECKILL_LOCK_HOLD_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub lock_hold_ms: u64,
}

/// [`Config`] as a whole command line.
#[derive(clap::Parser)]
struct Wrapper {
    #[command(flatten)]
    config: Config,
}

impl Config {
    /// The configuration from environment variables and defaults alone, as
    /// `seckill serve` with no flags would read it.
    pub fn from_env() -> Config {
        <Wrapper as clap::Parser>::parse_from(["seckill"]).config
    }

    /// The configuration from its defaults alone, every environment variable
    /// ignored: what a test starts from, so that a stray `SECKILL_*` (or
    /// `REDIS_URL`, …) in its environment changes nothing.
    pub fn defaults() -> Config {
        use clap::{CommandFactory, FromArgMatches};
        let command = Wrapper::command().mut_args(|arg| arg.env(None::<&str>));
        let matches = command.get_matches_from(["seckill"]);
        Wrapper::from_arg_matches(&matches).expect("the defaults parse").config
    }

    /// The admin token in force, and whether it is the development default.
    pub fn admin_token(&self) -> (&str, bool) {
        match self.admin_token.as_deref() {
            Some(token) if !token.is_empty() => (token, false),
            _ => (DEV_ADMIN_TOKEN, true),
        }
    }

    /// The `instance` label of this instance's metrics (`SECKILL_INSTANCE`;
    /// set to the bound address at start when unset).
    pub fn instance(&self) -> &str {
        self.instance.as_deref().unwrap_or("unnamed")
    }

    pub fn db_acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.db_acquire_timeout_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub fn lock_wait(&self) -> Duration {
        Duration::from_millis(self.lock_wait_ms)
    }

    pub fn lock_hold(&self) -> Duration {
        Duration::from_millis(self.lock_hold_ms)
    }

    pub fn queue_batch_window(&self) -> Duration {
        Duration::from_millis(self.queue_batch_window_ms)
    }

    pub fn batch_window(&self) -> Duration {
        Duration::from_micros(self.batch_window_us)
    }
}

impl std::fmt::Debug for Config {
    /// Leaves the admin token and the database password out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("addr", &self.addr)
            .field("max_connections", &self.max_connections)
            .field("header_timeout_ms", &self.header_timeout_ms)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("db_pool_size", &self.db_pool_size)
            .field("db_acquire_timeout_ms", &self.db_acquire_timeout_ms)
            .field("reconcile_interval_ms", &self.reconcile_interval_ms)
            .field("reconcile_grace_ms", &self.reconcile_grace_ms)
            .field("instance", &self.instance)
            .field("sold_out_flag_ttl_ms", &self.sold_out_flag_ttl_ms)
            .field("failpoints", &self.failpoints)
            .field("amqp_prefix", &self.amqp_prefix)
            .field("queue_partitions", &self.queue_partitions)
            .field("queue_max_length", &self.queue_max_length)
            .field("queue_batch_size", &self.queue_batch_size)
            .field("queue_batch_window_ms", &self.queue_batch_window_ms)
            .field("queue_delivery_limit", &self.queue_delivery_limit)
            .field("queue_consume", &self.queue_consume)
            .field("batch_max", &self.batch_max)
            .field("batch_window_us", &self.batch_window_us)
            .finish_non_exhaustive()
    }
}
