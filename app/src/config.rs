//! Service configuration: one struct, read from flags or environment
//! variables, with defaults that match the local services of the README.

use std::net::SocketAddr;
use std::time::Duration;

/// Development default for `SECKILL_ADMIN_TOKEN`. The service warns at start
/// when it is in use.
pub const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

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

    /// How long a request waits for a pool connection before it is answered
    /// 503, in milliseconds.
    #[arg(long, env = "SECKILL_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000)]
    pub db_acquire_timeout_ms: u64,

    /// `redis-decr`: milliseconds between two background reconciliation
    /// passes over the sales this Redis prefix holds; 0 turns the background
    /// job off (`POST /admin/sales/{id}/reconcile` still works).
    #[arg(long, env = "SECKILL_RECONCILE_INTERVAL_MS", default_value_t = 5000)]
    pub reconcile_interval_ms: u64,

    /// `redis-decr`: age in milliseconds after which a reservation without an
    /// order counts as abandoned and is returned. Must exceed the longest
    /// purchase (pool wait `SECKILL_DB_ACQUIRE_TIMEOUT_MS` plus the
    /// transaction), or a slow purchase's unit is returned while it commits.
    #[arg(long, env = "SECKILL_RECONCILE_GRACE_MS", default_value_t = 15000)]
    pub reconcile_grace_ms: u64,

    /// `redis-decr`: milliseconds an instance answers "sold out" from its
    /// local flag without asking Redis. The bound on how long a lost
    /// "stock returned" broadcast can hide returned stock.
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
}

impl Config {
    /// The configuration from environment variables and defaults alone, as
    /// `seckill serve` with no flags would read it.
    pub fn from_env() -> Config {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: Config,
        }
        <Wrapper as clap::Parser>::parse_from(["seckill"]).config
    }

    /// The admin token in force, and whether it is the development default.
    pub fn admin_token(&self) -> (&str, bool) {
        match self.admin_token.as_deref() {
            Some(token) if !token.is_empty() => (token, false),
            _ => (DEV_ADMIN_TOKEN, true),
        }
    }

    pub fn db_acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.db_acquire_timeout_ms)
    }

    pub fn lock_wait(&self) -> Duration {
        Duration::from_millis(self.lock_wait_ms)
    }
}

impl std::fmt::Debug for Config {
    /// Leaves the admin token and the database password out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("addr", &self.addr)
            .field("db_pool_size", &self.db_pool_size)
            .field("db_acquire_timeout_ms", &self.db_acquire_timeout_ms)
            .field("reconcile_interval_ms", &self.reconcile_interval_ms)
            .field("reconcile_grace_ms", &self.reconcile_grace_ms)
            .field("sold_out_flag_ttl_ms", &self.sold_out_flag_ttl_ms)
            .field("failpoints", &self.failpoints)
            .finish_non_exhaustive()
    }
}
