//! Overload told apart from outage, for every backing server. A command
//! that timed out met one of two different things: a server that answers,
//! later than the command's timeout (overloaded — `503 busy`, retry later),
//! or a server that does not answer at all (`503 unavailable`). The error
//! says the same in both cases, so [`BackendProbe`] asks the server itself,
//! outside the connections that timed out, with a timeout longer than the
//! command's:
//!
//! | server | when | probe | within |
//! |---|---|---|---|
//! | Postgres | no pool connection within `SECKILL_DB_ACQUIRE_TIMEOUT_MS` (sqlx retries refused connections until then, so a pool timeout is also what an outage looks like) | one connection outside the pool, `SELECT 1`; `53300 too_many_connections` counts as an answer | [`POSTGRES_PROBE_TIMEOUT`] |
//! | Redis (`REDIS_URL`) | a command of the shared connection or of the lock library got no reply within its timeout | a fresh connection, `PING` | [`REDIS_PROBE_TIMEOUT`] |
//! | Redlock nodes (`SECKILL_LOCK_REDLOCK_URLS`) | fewer than a quorum of nodes answered a lock command within the per-node timeout | a fresh connection and `PING` to every node; busy when a quorum answers | [`REDIS_PROBE_TIMEOUT`] |
//! | RabbitMQ | no publisher confirm, or no connection, within its timeout | a fresh connection and a channel | [`RABBITMQ_PROBE_TIMEOUT`] |
//!
//! Only timeouts are probed ([`timed_out`]): a refused or dropped connection,
//! or an error the server answered, is sorted as it is. One probe of a server
//! runs at a time and its answer serves every request for [`PROBE_TTL`], so
//! an overload costs at most one extra connection per server and second, and
//! an outage one failed attempt per second. A `DEBUG SLEEP` on Redis is the
//! overload in its purest form: every command in flight times out, and the
//! probe, waiting longer, is answered when the sleep ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_lock::{LockError, RedisClient};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::outcome::{Backend, StrategyError};

/// How long a Postgres probe waits for a connection and `SELECT 1`.
pub const POSTGRES_PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a Redis probe waits for a connection and `PING`: longer than
/// the command timeouts of the service's Redis clients (the shared
/// connection's 2 s response timeout, the lock library's 1 s).
pub const REDIS_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a RabbitMQ probe waits for a connection and a channel: longer
/// than the connection timeout (2 s). Shorter than the publisher confirm's
/// (5 s), which waits for a quorum queue's write, not for an answer: a
/// broker that opens a connection and a channel answers; and a purchase
/// that waited for its confirm must still be answered within the request
/// timeout (`SECKILL_REQUEST_TIMEOUT_MS`, 10 s by default).
pub const RABBITMQ_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a probe's answer is reused.
pub const PROBE_TTL: Duration = Duration::from_secs(1);

/// `Retry-After` of the `busy` answer to a timeout the server outlived.
pub const OVERLOAD_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A command that got no answer within its timeout. Put it in an
/// `Unavailable` error's source for [`timed_out`] to find (the Postgres and
/// Redis clients' own timeout errors are found as they are).
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub struct NoAnswerWithin(pub Duration);

/// A server the probe can ask: the backends, with Redis split into the
/// service's Redis and the Redlock nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Redis,
    Redlock,
    Rabbitmq,
}

impl Server {
    /// The backend a failure of this server is reported as.
    pub fn backend(self) -> Backend {
        match self {
            Server::Postgres => Backend::Postgres,
            Server::Redis | Server::Redlock => Backend::Redis,
            Server::Rabbitmq => Backend::Rabbitmq,
        }
    }

    /// The `detail` of a `busy` answer when this server outlived a timeout.
    fn busy_reason(self) -> &'static str {
        match self {
            Server::Postgres => "every Postgres connection of this instance is in use; retry later",
            Server::Redis => "Redis answered later than the command's timeout; retry later",
            Server::Redlock => {
                "the Redlock nodes answered later than the lock's timeout; retry later"
            }
            Server::Rabbitmq => "RabbitMQ answered later than the publish's timeout; retry later",
        }
    }
}

/// Asks the backing servers, outside the connections in use, whether they
/// answer. Cheap to clone.
#[derive(Clone)]
pub struct BackendProbe {
    postgres: Arc<Probe>,
    redis: Arc<Probe>,
    redlock: Arc<Probe>,
    rabbitmq: Arc<Probe>,
}

/// One server's probe and its last answer.
struct Probe {
    target: Target,
    /// When the last probe ran and whether the server answered it. The lock
    /// is held across the probe, so concurrent callers wait for one probe.
    last: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

/// What a probe connects to.
enum Target {
    Postgres(PgConnectOptions),
    Redis(RedisClient),
    /// Every node; a quorum (`n / 2 + 1`) must answer.
    Redlock(Vec<redis::Client>),
    Rabbitmq(String),
}

impl BackendProbe {
    /// Probes of the servers the service uses: Postgres as `postgres`
    /// connects (the pool's own options), the Redis of `redis`, the nodes
    /// of `redlock_urls` (`SECKILL_LOCK_REDLOCK_URLS`; one that does not parse is left
    /// out — the strategy refuses it at start), the broker at `amqp_url`.
    pub fn new(
        postgres: PgConnectOptions,
        redis: RedisClient,
        redlock_urls: &[String],
        amqp_url: String,
    ) -> Self {
        let nodes = redlock_urls.iter().filter_map(|url| redis::Client::open(url.trim()).ok());
        let probe = |target| Arc::new(Probe { target, last: Default::default() });
        Self {
            postgres: probe(Target::Postgres(postgres)),
            redis: probe(Target::Redis(redis)),
            redlock: probe(Target::Redlock(nodes.collect())),
            rabbitmq: probe(Target::Rabbitmq(amqp_url)),
        }
    }

    /// Whether `server` answered a probe, as of at most [`PROBE_TTL`] ago.
    pub async fn answers(&self, server: Server) -> bool {
        let probe = match server {
            Server::Postgres => &self.postgres,
            Server::Redis => &self.redis,
            Server::Redlock => &self.redlock,
            Server::Rabbitmq => &self.rabbitmq,
        };
        probe.answers().await
    }

    /// `err` with a timeout sorted out: `Busy` when its server answers the
    /// probe, `Unavailable` (no longer a timeout, so never probed again)
    /// when it does not. Any other error is returned as it is.
    pub async fn triage(&self, err: StrategyError) -> StrategyError {
        match timed_out(&err) {
            Some(server) => self.sort(server, err.to_string()).await,
            None => err,
        }
    }

    /// The answer to a timeout of `server` (`what` timed out): `Busy` with
    /// [`OVERLOAD_RETRY_AFTER`] when the server answers the probe,
    /// `Unavailable` when it does not.
    pub async fn sort(&self, server: Server, what: String) -> StrategyError {
        if self.answers(server).await {
            StrategyError::Busy { reason: server.busy_reason(), retry_after: OVERLOAD_RETRY_AFTER }
        } else {
            StrategyError::Unavailable {
                backend: server.backend(),
                source: anyhow::anyhow!("{what}, and {server:?} did not answer a probe either"),
            }
        }
    }
}

impl Probe {
    async fn answers(&self) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, answered)) = *last
            && at.elapsed() < PROBE_TTL
        {
            return answered;
        }
        let answered = match &self.target {
            Target::Postgres(options) => postgres_answers(options).await,
            Target::Redis(client) => redis_answers(client).await,
            Target::Redlock(nodes) => redlock_answers(nodes).await,
            Target::Rabbitmq(url) => rabbitmq_answers(url).await,
        };
        *last = Some((Instant::now(), answered));
        answered
    }
}

/// The server whose timeout `err` is, when it is one not yet sorted out by
/// [`BackendProbe::triage`]: a Postgres pool timeout, a Redis command
/// timeout (of the shared connection or of the lock library), a Redlock
/// that found no quorum answering, a RabbitMQ [`NoAnswerWithin`].
pub fn timed_out(err: &StrategyError) -> Option<Server> {
    let StrategyError::Unavailable { backend, source } = err else { return None };
    match backend {
        Backend::Postgres => {
            let pool = matches!(source.downcast_ref(), Some(sqlx::Error::PoolTimedOut));
            pool.then_some(Server::Postgres)
        }
        Backend::Redis => source.chain().find_map(redis_timeout),
        Backend::Rabbitmq => {
            source.chain().any(|cause| cause.is::<NoAnswerWithin>()).then_some(Server::Rabbitmq)
        }
    }
}

/// [`timed_out`] for one cause of a Redis failure.
fn redis_timeout(cause: &(dyn std::error::Error + 'static)) -> Option<Server> {
    if let Some(lock) = cause.downcast_ref::<LockError>() {
        return match lock {
            LockError::CommandTimeout(_) => Some(Server::Redis),
            LockError::Redis(err) if err.is_timeout() => Some(Server::Redis),
            LockError::NoQuorum { .. } => Some(Server::Redlock),
            _ => None,
        };
    }
    let redis = cause.downcast_ref::<redis::RedisError>()?;
    redis.is_timeout().then_some(Server::Redis)
}

/// One connection, `SELECT 1`, closed; `true` when Postgres answered.
async fn postgres_answers(options: &PgConnectOptions) -> bool {
    let attempt = async {
        let mut conn = options.connect().await?;
        sqlx::query("SELECT 1").execute(&mut conn).await?;
        conn.close().await
    };
    match tokio::time::timeout(POSTGRES_PROBE_TIMEOUT, attempt).await {
        Ok(Ok(())) => true,
        Ok(Err(sqlx::Error::Database(db))) => db.code().as_deref() == Some("53300"),
        Ok(Err(_)) | Err(_) => false,
    }
}

/// A fresh connection and `PING` (on a cluster, to the node the cluster
/// connection picks); `true` when Redis answered.
async fn redis_answers(client: &RedisClient) -> bool {
    let attempt = async {
        let timeout = REDIS_PROBE_TIMEOUT;
        let mut conn = client.connection(timeout, timeout, 0).await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    matches!(tokio::time::timeout(REDIS_PROBE_TIMEOUT, attempt).await, Ok(Ok(_)))
}

/// [`redis_answers`] on every node at once; `true` when a quorum answered.
async fn redlock_answers(nodes: &[redis::Client]) -> bool {
    let pings = nodes.iter().map(|node| redis_answers_node(node.clone()));
    let answered = futures_util::future::join_all(pings).await.into_iter().filter(|a| *a).count();
    !nodes.is_empty() && answered > nodes.len() / 2
}

async fn redis_answers_node(node: redis::Client) -> bool {
    redis_answers(&RedisClient::from(node)).await
}

/// A fresh connection and a channel; `true` when the broker answered both.
/// The connection is closed after (how that goes says nothing more).
async fn rabbitmq_answers(url: &str) -> bool {
    let attempt = async {
        let properties =
            lapin::ConnectionProperties::default().with_connection_name("seckill-probe".into());
        let conn = lapin::Connection::connect(url, properties).await?;
        let channel = conn.create_channel().await;
        let _ = conn.close(200, "probe".into()).await;
        channel.map(drop)
    };
    matches!(tokio::time::timeout(RABBITMQ_PROBE_TIMEOUT, attempt).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(backend: Backend, source: anyhow::Error) -> StrategyError {
        StrategyError::Unavailable { backend, source }
    }

    fn io(kind: std::io::ErrorKind) -> redis::RedisError {
        redis::RedisError::from(std::io::Error::from(kind))
    }

    #[test]
    fn only_timeouts_are_probed_and_each_names_its_server() {
        assert_eq!(timed_out(&sqlx::Error::PoolTimedOut.into()), Some(Server::Postgres));
        assert_eq!(timed_out(&sqlx::Error::PoolClosed.into()), None);
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(timed_out(&refused.into()), None);

        let lock_timeout = LockError::CommandTimeout(Duration::from_millis(60));
        assert_eq!(
            timed_out(&unavailable(Backend::Redis, lock_timeout.into())),
            Some(Server::Redis)
        );
        let no_quorum =
            LockError::NoQuorum { name: "{sale:1}:lock".into(), reachable: 1, nodes: 3, quorum: 2 };
        assert_eq!(
            timed_out(&unavailable(Backend::Redis, no_quorum.into())),
            Some(Server::Redlock)
        );
        let slow = io(std::io::ErrorKind::TimedOut);
        assert!(slow.is_timeout(), "redis-rs reads a timed-out I/O as a timeout");
        assert_eq!(timed_out(&unavailable(Backend::Redis, slow.into())), Some(Server::Redis));
        let in_lock = LockError::Redis(io(std::io::ErrorKind::TimedOut));
        assert_eq!(timed_out(&unavailable(Backend::Redis, in_lock.into())), Some(Server::Redis));
        let refused = io(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(timed_out(&unavailable(Backend::Redis, refused.into())), None);
        let refused = LockError::Redis(io(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(timed_out(&unavailable(Backend::Redis, refused.into())), None);

        let confirm = anyhow::Error::from(NoAnswerWithin(Duration::from_secs(5)));
        let confirm = confirm.context("publishing a purchase");
        assert_eq!(timed_out(&unavailable(Backend::Rabbitmq, confirm)), Some(Server::Rabbitmq));
        let down = anyhow::anyhow!("connection refused");
        assert_eq!(timed_out(&unavailable(Backend::Rabbitmq, down)), None);

        let busy = StrategyError::Busy { reason: "x", retry_after: Duration::ZERO };
        assert_eq!(timed_out(&busy), None);
    }

    /// A probe of servers nothing listens for: every connection is refused.
    fn probe_of_nothing() -> BackendProbe {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let options = PgConnectOptions::new().host("127.0.0.1").port(port).username("postgres");
        let url = format!("redis://127.0.0.1:{port}");
        let redis = RedisClient::open(&url).unwrap();
        let amqp = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
        BackendProbe::new(options, redis, &[url.clone(), url.clone(), url], amqp)
    }

    #[tokio::test]
    async fn a_timeout_with_its_server_unreachable_stays_unavailable_but_sorted() {
        let probe = probe_of_nothing();
        let timeouts = [
            sqlx::Error::PoolTimedOut.into(),
            unavailable(
                Backend::Redis,
                LockError::CommandTimeout(Duration::from_millis(60)).into(),
            ),
            unavailable(
                Backend::Redis,
                LockError::NoQuorum { name: "n".into(), reachable: 0, nodes: 3, quorum: 2 }.into(),
            ),
            unavailable(Backend::Rabbitmq, NoAnswerWithin(Duration::from_secs(5)).into()),
        ];
        for timeout in timeouts {
            let server = timed_out(&timeout).expect("a timeout");
            let sorted = probe.triage(timeout).await;
            assert!(
                matches!(&sorted, StrategyError::Unavailable { backend, .. } if *backend == server.backend()),
                "{sorted:?}"
            );
            assert_eq!(timed_out(&sorted), None, "sorted once, not probed again");
        }
    }

    #[tokio::test]
    async fn a_timeout_of_a_server_that_answers_is_busy() {
        let options = PgConnectOptions::new().host("127.0.0.1").port(5432).username("postgres");
        let url = std::env::var("TEST_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
        let probe = BackendProbe::new(
            options,
            RedisClient::open(&url).unwrap(),
            &[url.clone(), url.clone(), url],
            std::env::var("TEST_AMQP_URL")
                .unwrap_or("amqp://guest:guest@127.0.0.1:5672/%2f".into()),
        );
        let timeouts = [
            unavailable(
                Backend::Redis,
                LockError::CommandTimeout(Duration::from_millis(60)).into(),
            ),
            unavailable(
                Backend::Redis,
                LockError::NoQuorum { name: "n".into(), reachable: 1, nodes: 3, quorum: 2 }.into(),
            ),
            unavailable(Backend::Rabbitmq, NoAnswerWithin(Duration::from_secs(5)).into()),
        ];
        for timeout in timeouts {
            let sorted = probe.triage(timeout).await;
            assert!(
                matches!(sorted, StrategyError::Busy { retry_after: OVERLOAD_RETRY_AFTER, .. }),
                "{sorted:?}"
            );
        }
    }
}
