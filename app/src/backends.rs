//! Shared handles to the backing servers other than Postgres.
//!
//! A handle connects lazily: the service starts (and answers `503
//! unavailable` for the strategies that need the server) while a server is
//! down, and connects once it is back.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;
use tokio::sync::OnceCell;

use crate::strategy::{Backend, StrategyError};

/// Lazily connected Redis, shared by every strategy of the process.
#[derive(Clone)]
pub struct RedisHandle {
    client: redis::Client,
    conn: std::sync::Arc<OnceCell<ConnectionManager>>,
    /// Namespace in front of every key (`SECKILL_REDIS_PREFIX`).
    pub prefix: String,
}

impl RedisHandle {
    /// Parses `url` (no connection yet). Errors when the URL is malformed.
    pub fn new(url: &str, prefix: impl Into<String>) -> redis::RedisResult<Self> {
        Ok(Self {
            client: redis::Client::open(url)?,
            conn: Default::default(),
            prefix: prefix.into(),
        })
    }

    /// The underlying client, for dedicated connections (pub/sub).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// A multiplexed, auto-reconnecting connection (cheap to clone). A
    /// command that hits a dropped connection still fails and is not retried,
    /// so callers must treat a connection error as "outcome unknown".
    ///
    /// Errors: `Unavailable { backend: Redis }` when Redis cannot be reached.
    pub async fn conn(&self) -> Result<ConnectionManager, StrategyError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(2);
        self.conn
            .get_or_try_init(|| self.client.get_connection_manager_with_config(config))
            .await
            .cloned()
            .map_err(redis_unavailable)
    }

    /// `PREFIX:{sale:ID}:suffix` — all keys of one sale share the hash tag
    /// `{sale:ID}`, so one Lua script may touch them on Redis Cluster.
    pub fn sale_key(&self, sale: i64, suffix: &str) -> String {
        format!("{}:{{sale:{sale}}}:{suffix}", self.prefix)
    }
}

/// Maps a Redis error to `StrategyError`: I/O, timeouts and refused
/// connections are `Unavailable`, anything else `Internal`.
pub fn redis_error(err: redis::RedisError) -> StrategyError {
    if err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
    {
        redis_unavailable(err)
    } else {
        StrategyError::Internal(err.into())
    }
}

fn redis_unavailable(err: redis::RedisError) -> StrategyError {
    StrategyError::Unavailable { backend: Backend::Redis, source: err.into() }
}

/// Counts `n` round trips sent to Redis (`seckill_redis_round_trips_total`);
/// the load test divides it by units sold. Call it once per command, pipeline
/// or script invocation actually sent.
pub fn count_redis_round_trips(strategy: &'static str, n: u64) {
    metrics::counter!("seckill_redis_round_trips_total", "strategy" => strategy).increment(n);
}
