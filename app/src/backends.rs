//! Shared handles to the backing servers other than Postgres.
//!
//! A handle connects lazily: the service starts (and answers `503` for the
//! strategies that need the server) while a server is down, and connects once
//! it is back.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};
use redis::aio::ConnectionManagerConfig;
use redis_lock::{RedisClient, RedisConnection};
use tokio::sync::OnceCell;

use crate::backend_probe::NoAnswerWithin;
use crate::bounds::MAX_MS;
use crate::outcome::{Backend, StrategyError};

/// `DATABASE_URL`: the service's Postgres database.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";
/// `REDIS_URL`: the Redis of the strategies that use one.
pub const REDIS_URL_ENV: &str = "REDIS_URL";
/// `AMQP_URL`: the RabbitMQ of the `queue` strategy.
pub const AMQP_URL_ENV: &str = "AMQP_URL";
/// `SECKILL_DB_POOL_SIZE`: Postgres connections per instance.
pub const DB_POOL_SIZE_ENV: &str = "SECKILL_DB_POOL_SIZE";
/// `SECKILL_REDIS_PREFIX`: the namespace of the Redis keys.
pub const REDIS_PREFIX_ENV: &str = "SECKILL_REDIS_PREFIX";
/// `SECKILL_AMQP_PREFIX`: the namespace of the queues and exchanges.
pub const AMQP_PREFIX_ENV: &str = "SECKILL_AMQP_PREFIX";

/// Settings of the backing servers: where Postgres, Redis and RabbitMQ are,
/// the Postgres pool, and the namespaces this service writes under. The
/// three URLs keep the unprefixed names the tools around them read
/// (`sqlx`'s `DATABASE_URL`, …).
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "Backing servers")]
pub struct BackendSettings {
    /// Postgres connection URL; the database is created if it does not exist.
    #[arg(
        long,
        env = DATABASE_URL_ENV,
        default_value = "postgres://postgres@127.0.0.1:5432/seckill",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub database_url: String,

    /// Postgres connections in this instance's pool.
    #[arg(
        long,
        env = DB_POOL_SIZE_ENV,
        default_value_t = 10,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub db_pool_size: u32,

    /// How long a request waits for a pool connection, in milliseconds; then
    /// it is answered 503 `busy` if Postgres answers a probe connection (the
    /// pool is exhausted by slow work), 503 `unavailable` if it does not.
    #[arg(
        long,
        env = "SECKILL_DB_ACQUIRE_TIMEOUT_MS",
        default_value_t = 5000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub db_acquire_timeout_ms: u64,

    /// Redis connection URL (lock and redis-decr strategies): one node,
    /// `redis://[user:pass@]host:port[/db]`, or a Redis Cluster by its seed
    /// nodes, `redis+cluster://[user:pass@]h1:p1,h2:p2,...` (every key of a
    /// sale shares one hash slot; docs/scaling.md).
    #[arg(
        long,
        env = REDIS_URL_ENV,
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// Namespace in front of every Redis key this service writes.
    /// Letters, digits, `_`, `.` and `-`, 1 to 64 of them (no `{` or `}`:
    /// the hash tags of a sale's keys must stay the sale's own).
    #[arg(long, env = REDIS_PREFIX_ENV, default_value = "seckill", value_parser = prefix)]
    pub redis_prefix: String,

    /// RabbitMQ connection URL (queue strategy).
    #[arg(
        long,
        env = AMQP_URL_ENV,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub amqp_url: String,

    /// Namespace in front of every queue and exchange this service declares
    /// (`PREFIX.orders.N`, …); instances that share a sale share a prefix.
    /// Letters, digits, `_`, `.` and `-`, 1 to 64 of them (AMQP names are at
    /// most 255 bytes).
    #[arg(long, env = AMQP_PREFIX_ENV, default_value = "seckill", value_parser = prefix)]
    pub amqp_prefix: String,
}

impl BackendSettings {
    /// `SECKILL_DB_ACQUIRE_TIMEOUT_MS`.
    pub fn db_acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.db_acquire_timeout_ms)
    }
}

impl std::fmt::Debug for BackendSettings {
    /// Leaves the URLs out: a password may sit anywhere in one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendSettings")
            .field("db_pool_size", &self.db_pool_size)
            .field("db_acquire_timeout_ms", &self.db_acquire_timeout_ms)
            .field("redis_prefix", &self.redis_prefix)
            .field("amqp_prefix", &self.amqp_prefix)
            .finish_non_exhaustive()
    }
}

/// `url` with its password (the user information before `@`) replaced by
/// `***`, for error messages.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Parser of `SECKILL_REDIS_PREFIX` and `SECKILL_AMQP_PREFIX`: 1 to 64
/// letters, digits, `_`, `.` or `-`.
fn prefix(value: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if (1..=64).contains(&value.len()) && value.chars().all(allowed) {
        Ok(value.to_owned())
    } else {
        Err("1 to 64 letters, digits, `_`, `.` or `-` expected".to_owned())
    }
}

/// Lazily connected Redis, shared by every strategy of the process: one
/// node (`redis://…`) or a Redis Cluster (`redis+cluster://h1:p1,h2:p2,…`,
/// see [`redis_lock::RedisClient`]).
#[derive(Clone)]
pub struct RedisHandle {
    client: RedisClient,
    conn: std::sync::Arc<OnceCell<RedisConnection>>,
    /// Namespace in front of every key (`SECKILL_REDIS_PREFIX`).
    pub prefix: String,
}

impl RedisHandle {
    /// Parses `url` (no connection yet). Errors when the URL is malformed.
    pub fn new(url: &str, prefix: impl Into<String>) -> redis::RedisResult<Self> {
        Ok(Self {
            client: RedisClient::open(url)?,
            conn: Default::default(),
            prefix: prefix.into(),
        })
    }

    /// The underlying client, for the lock library and dedicated
    /// connections (pub/sub: [`RedisClient::pubsub_clients`]).
    pub fn client(&self) -> &RedisClient {
        &self.client
    }

    /// A multiplexed, auto-reconnecting connection (cheap to clone); on a
    /// cluster, each command goes to the master of its key's slot. A command
    /// that hits a dropped connection still fails and is not retried, so
    /// callers must treat a connection error as "outcome unknown".
    ///
    /// Errors: `Unavailable { backend: Redis }` when Redis cannot be reached.
    pub async fn conn(&self) -> Result<RedisConnection, StrategyError> {
        self.conn
            .get_or_try_init(|| async {
                let (connect, respond) = (Duration::from_secs(1), Duration::from_secs(2));
                match &self.client {
                    // Connects now: a node that is down answers
                    // `Unavailable` here rather than on the first command.
                    RedisClient::Node(client) => {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(connect))
                            .set_response_timeout(Some(respond))
                            .set_number_of_retries(2);
                        let manager = client.get_connection_manager_with_config(config).await?;
                        Ok(RedisConnection::Node(manager))
                    }
                    cluster => cluster.connection(connect, respond, 2).await,
                }
            })
            .await
            .cloned()
            .map_err(redis_unavailable)
    }

    /// `PREFIX:{sale:ID}:suffix` — all keys of one sale share the hash tag
    /// `{sale:ID}`, so they live in one hash slot and one Lua script may
    /// touch them on Redis Cluster; different sales spread over the slots.
    pub fn sale_key(&self, sale: i64, suffix: &str) -> String {
        format!("{}:{{sale:{sale}}}:{suffix}", self.prefix)
    }
}

/// Maps a Redis error to `StrategyError`: a refused account or right
/// ([`redis_misconfiguration`]) is `Misconfigured`; I/O, timeouts and
/// refused connections are `Unavailable`, anything else `Internal`. A
/// timeout keeps its `RedisError` as the source, for the purchase path's
/// probe to sort into `busy` or `unavailable` (`crate::backend_probe`).
pub fn redis_error(err: redis::RedisError) -> StrategyError {
    let err = match redis_misconfigured(err) {
        Ok(misconfigured) => return misconfigured,
        Err(err) => err,
    };
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

/// A connection that could not be made: `Misconfigured` when Redis refused
/// the account, `Unavailable` otherwise.
fn redis_unavailable(err: redis::RedisError) -> StrategyError {
    redis_misconfigured(err).unwrap_or_else(|err| StrategyError::Unavailable {
        backend: Backend::Redis,
        source: err.into(),
    })
}

/// The refusal a Redis error reports, if any: a command or key its ACL
/// does not grant (`NOPERM`), a password it refused (`WRONGPASS`, or
/// authentication failing as the client saw it), one it requires
/// (`NOAUTH`).
pub fn redis_misconfiguration(err: &redis::RedisError) -> Option<&'static str> {
    if err.kind() == redis::ErrorKind::AuthenticationFailed {
        return Some("authentication failed");
    }
    match err.code()? {
        "NOPERM" => Some("NOPERM"),
        "WRONGPASS" => Some("WRONGPASS"),
        "NOAUTH" => Some("NOAUTH"),
        _ => None,
    }
}

/// `Ok(Misconfigured { backend: Redis })` when `err` is a refusal, else
/// `err` back.
fn redis_misconfigured(err: redis::RedisError) -> Result<StrategyError, redis::RedisError> {
    match redis_misconfiguration(&err) {
        Some(cause) => {
            Ok(StrategyError::Misconfigured { backend: Backend::Redis, cause, source: err.into() })
        }
        None => Err(err),
    }
}

/// Counts `n` round trips sent to Redis (`seckill_redis_round_trips_total`);
/// the load test divides it by units sold. Call it once per command, pipeline
/// or script invocation actually sent.
pub fn count_redis_round_trips(strategy: &'static str, n: u64) {
    metrics::counter!(crate::metric_names::REDIS_ROUND_TRIPS_TOTAL, "strategy" => strategy)
        .increment(n);
}

/// Lazily connected RabbitMQ: one AMQP connection per process, shared by the
/// `queue` strategy's publisher, its consumers and `/readyz`.
///
/// A lost connection is not recovered in place: lapin's auto-recovery is
/// off, the connection ends errored or closed, every channel and consumer on
/// it ends with an error, and the next caller opens a new connection (at
/// most one attempt per [`AMQP_RECONNECT_PAUSE`]; the others get
/// `Unavailable` at once). Their owners redeclare what they use and
/// subscribe again on the new one. Auto-recovery is off: with it, the
/// partition consumers sometimes never resumed after a broker restart (the
/// sale stopped settling and the broker-restart test hung), while a fresh
/// connection, redeclared and subscribed by its owner, is one path that the
/// test exercises every time. A loss and a reconnection are logged once
/// each (WARN, INFO): a broker that restarts is expected to cause both, and
/// nothing is lost meanwhile.
///
/// [`AmqpHandle::close`] closes the connection of this handle and of every
/// handle made from it by [`AmqpHandle::separate`], for a clean shutdown.
#[derive(Clone)]
pub struct AmqpHandle {
    inner: Arc<AmqpInner>,
    family: Arc<AmqpFamily>,
}

/// The handles made from one [`AmqpHandle::new`], closed together.
#[derive(Default)]
struct AmqpFamily {
    members: std::sync::Mutex<Vec<Arc<AmqpInner>>>,
    closed: std::sync::atomic::AtomicBool,
}

/// A broker's refusal of the login or the virtual host: its cause (see
/// [`amqp_misconfiguration`]) and its message.
type Refusal = (&'static str, String);

struct AmqpInner {
    url: String,
    current: RwLock<Option<Arc<Connection>>>,
    /// Serialises (re)connection attempts and remembers the last one — when,
    /// and the refusal it met if the broker refused the login — so a broker
    /// that is down costs one attempt per [`AMQP_RECONNECT_PAUSE`], not one
    /// per request, and the requests in between get the same answer.
    connecting: tokio::sync::Mutex<Option<(Instant, Option<Refusal>)>>,
    /// Namespace in front of every queue and exchange this service declares
    /// (`SECKILL_AMQP_PREFIX`).
    prefix: String,
}

/// How long an AMQP connection attempt may take before the caller is answered
/// `Unavailable`.
const AMQP_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Minimum pause between two fresh connection attempts.
const AMQP_RECONNECT_PAUSE: Duration = Duration::from_millis(250);

impl AmqpHandle {
    /// No connection yet; the URL is parsed on first use.
    pub fn new(url: impl Into<String>, prefix: impl Into<String>) -> Self {
        Self::member_of(Arc::default(), url.into(), prefix.into())
    }

    fn member_of(family: Arc<AmqpFamily>, url: String, prefix: String) -> Self {
        let inner = Arc::new(AmqpInner {
            url,
            current: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(None),
            prefix,
        });
        family.members.lock().expect("amqp family lock").push(inner.clone());
        Self { inner, family }
    }

    /// Another handle to the same broker with a connection of its own, so
    /// that what closes one connection (the broker closes a connection when
    /// one of its channels crashes) leaves the other alone. [`Self::close`]
    /// on either closes both.
    pub fn separate(&self) -> Self {
        let (url, prefix) = (self.inner.url.clone(), self.inner.prefix.clone());
        Self::member_of(self.family.clone(), url, prefix)
    }

    /// Whether [`Self::close`] was called on this handle's family: the
    /// background tasks that use it stop instead of reconnecting.
    pub fn is_closed(&self) -> bool {
        self.family.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Shutdown: closes the connection of this handle and of its separate
    /// handles (`200`, so the broker hands their queues' unacknowledged
    /// messages to another consumer at once), waiting at most 2 s for each;
    /// from then on [`Self::connection`] answers `Unavailable`.
    pub async fn close(&self) {
        self.family.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        crate::telemetry::amqp_closing();
        let members = self.family.members.lock().expect("amqp family lock").clone();
        for member in members {
            let current = member.current.write().expect("amqp handle lock").take();
            if let Some(conn) = current.filter(|conn| conn.status().connected()) {
                let closing = conn.close(200, "shutting down".into());
                let _ = tokio::time::timeout(AMQP_CONNECT_TIMEOUT, closing).await;
            }
        }
    }

    /// Namespace of this service's queues and exchanges.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The broker user this handle connects as: `AMQP_URL`'s, or the AMQP
    /// client's default (`guest`) when the URL names none. `None` when the
    /// URL does not parse (then no connection is made either).
    pub fn user(&self) -> Option<String> {
        let uri = self.inner.url.parse::<lapin::uri::AMQPUri>().ok()?;
        Some(uri.authority.userinfo.username)
    }

    /// The process's connection, opened on first use and opened again after
    /// it was lost.
    ///
    /// Errors: `Unavailable { backend: Rabbitmq }` when the broker cannot be
    /// reached within 2 s (a [`NoAnswerWithin`] source: a timeout, for the
    /// probe to sort), when another attempt failed less than
    /// [`AMQP_RECONNECT_PAUSE`] ago, or once the service is shutting down.
    pub async fn connection(&self) -> Result<Arc<Connection>, StrategyError> {
        if self.is_closed() {
            return Err(amqp_unavailable(anyhow::anyhow!("the service is shutting down")));
        }
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        let mut last_attempt = self.inner.connecting.lock().await;
        // Another caller may have connected while this one waited.
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        match &*last_attempt {
            Some((at, refusal)) if at.elapsed() < AMQP_RECONNECT_PAUSE => {
                return Err(match refusal {
                    // The broker's own words, for the one log line.
                    Some((cause, message)) => StrategyError::Misconfigured {
                        backend: Backend::Rabbitmq,
                        cause,
                        source: anyhow::anyhow!("{message}"),
                    },
                    None => amqp_unavailable(anyhow::anyhow!("RabbitMQ was unreachable just now")),
                });
            }
            _ => {}
        }
        *last_attempt = Some((Instant::now(), None));
        let properties = ConnectionProperties::default().with_connection_name("seckill".into());
        let conn = tokio::time::timeout(
            AMQP_CONNECT_TIMEOUT,
            Connection::connect(&self.inner.url, properties),
        )
        .await
        .map_err(|_| amqp_unavailable(NoAnswerWithin(AMQP_CONNECT_TIMEOUT).into()))?
        .map_err(|err| {
            let err = amqp_unavailable(err.into());
            if let StrategyError::Misconfigured { cause, source, .. } = &err {
                *last_attempt = Some((Instant::now(), Some((*cause, format!("{source:#}")))));
            }
            err
        })?;
        let conn = Arc::new(conn);
        tokio::spawn(watch(Arc::downgrade(&conn), self.family.clone()));
        let previous = self.inner.current.write().expect("amqp handle lock").replace(conn.clone());
        if previous.is_some() {
            tracing::info!("reconnected to RabbitMQ");
        }
        Ok(conn)
    }

    /// The current connection if it is connected; `None` when there is none
    /// worth keeping (none yet, or the last one was lost).
    fn usable(&self) -> Option<Arc<Connection>> {
        let current = self.inner.current.read().expect("amqp handle lock");
        current.as_ref().filter(|conn| conn.status().connected()).cloned()
    }
}

/// How often [`watch`] looks at a connection's state.
const AMQP_WATCH_PERIOD: Duration = Duration::from_millis(250);

/// Logs the loss of a connection (WARN, once) unless the service closed it,
/// then ends; ends quietly when the connection is dropped. lapin's own report
/// of the broker's close is left out of the logs when it is the broker's
/// shutdown notice or a reset socket (see [`crate::telemetry`]), so this
/// line is what explains the loss.
async fn watch(conn: std::sync::Weak<Connection>, family: Arc<AmqpFamily>) {
    loop {
        tokio::time::sleep(AMQP_WATCH_PERIOD).await;
        let Some(conn) = conn.upgrade() else { return };
        let status = conn.status();
        if status.closed() || status.errored() {
            if !family.closed.load(std::sync::atomic::Ordering::SeqCst) {
                tracing::warn!(
                    "the RabbitMQ connection was lost (the broker closed it or went away, as it \
                     does when it restarts); the next use opens a new one, requests answer 503 \
                     meanwhile"
                );
            }
            return;
        }
    }
}

/// Maps an AMQP client error to `Misconfigured { backend: Rabbitmq }` when
/// the broker refused the login or the virtual host
/// ([`amqp_misconfiguration`]), to `Unavailable { backend: Rabbitmq }`
/// otherwise.
pub fn amqp_unavailable(err: anyhow::Error) -> StrategyError {
    match amqp_misconfiguration(&err) {
        Some(cause) => {
            StrategyError::Misconfigured { backend: Backend::Rabbitmq, cause, source: err }
        }
        None => StrategyError::Unavailable { backend: Backend::Rabbitmq, source: err },
    }
}

/// The refusal an AMQP error reports, if any, by its AMQP 0-9-1 reply code:
/// `ACCESS_REFUSED` (403: a login, or a resource the user's permissions do
/// not grant), and `NOT_ALLOWED` (530) when it says the user may not open
/// the virtual host ("access to vhost … refused for user …"). RabbitMQ
/// sends `NOT_ALLOWED` for a virtual host that is down or a connection
/// limit too: those are not the configuration's fault, and stay
/// `unavailable`.
pub fn amqp_misconfiguration(err: &anyhow::Error) -> Option<&'static str> {
    use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
    let lapin = err.chain().find_map(|cause| cause.downcast_ref::<lapin::Error>())?;
    match lapin.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => Some("ACCESS_REFUSED"),
            AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
                if amqp.get_message().as_str().contains("refused for user") =>
            {
                Some("NOT_ALLOWED")
            }
            _ => None,
        },
        _ => None,
    }
}

/// Counts `n` AMQP messages published or consumed
/// (`seckill_amqp_messages_total{direction}`, direction `published` or
/// `consumed`); the load test divides the sum by units sold.
pub fn count_amqp_messages(direction: &'static str, n: u64) {
    metrics::counter!(crate::metric_names::AMQP_MESSAGES_TOTAL, "direction" => direction)
        .increment(n);
}
