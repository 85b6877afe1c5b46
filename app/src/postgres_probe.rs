//! Overload told apart from outage. A request that waited
//! `SECKILL_DB_ACQUIRE_TIMEOUT_MS` for a pool connection and got none
//! (`sqlx::Error::PoolTimedOut`) met one of two different things: a pool
//! exhausted by slow work while Postgres answers — `503 busy`, retry later —
//! or a Postgres that cannot be reached — `503 unavailable`. The pool says the
//! same in both cases (sqlx retries refused connections until the acquire
//! deadline, then reports the timeout), so [`PostgresProbe`] asks Postgres
//! itself: one connection outside the pool and `SELECT 1`, within
//! [`PROBE_TIMEOUT`]. One probe runs at a time and its answer serves every
//! request for [`PROBE_TTL`], so an overload costs at most one extra
//! connection per second, and an outage one failed connect per second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::outcome::{Backend, StrategyError};

/// How long a probe waits for Postgres to accept a connection and answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(1000);

/// How long a probe's answer is reused.
pub const PROBE_TTL: Duration = Duration::from_secs(1);

/// `Retry-After` of the `busy` answer to a pool timeout.
pub const POOL_BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Asks Postgres, outside the pool, whether it answers. Cheap to clone.
#[derive(Clone)]
pub struct PostgresProbe {
    options: Arc<PgConnectOptions>,
    /// When the last probe ran and whether Postgres answered it. The lock is
    /// held across the probe, so concurrent callers wait for one probe.
    last: Arc<tokio::sync::Mutex<Option<(Instant, bool)>>>,
}

impl PostgresProbe {
    /// A probe of the server `options` connect to (the pool's own options).
    pub fn new(options: PgConnectOptions) -> Self {
        Self { options: Arc::new(options), last: Arc::default() }
    }

    /// Whether Postgres answered a fresh connection's `SELECT 1` within
    /// [`PROBE_TIMEOUT`], as of at most [`PROBE_TTL`] ago. A server that
    /// refuses the connection with `53300 too_many_connections` answered: it
    /// is overloaded, not down.
    pub async fn answers(&self) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, answered)) = *last
            && at.elapsed() < PROBE_TTL
        {
            return answered;
        }
        let answered = probe(&self.options).await;
        *last = Some((Instant::now(), answered));
        answered
    }

    /// `err` with a pool timeout sorted out: `Busy` when Postgres answers
    /// the probe, `Unavailable` (no longer a pool timeout) when it does not.
    /// Any other error is returned as it is.
    pub async fn triage(&self, err: StrategyError) -> StrategyError {
        if !is_pool_timeout(&err) {
            return err;
        }
        if self.answers().await {
            StrategyError::Busy {
                reason: "every Postgres connection of this instance is in use; retry later",
                retry_after: POOL_BUSY_RETRY_AFTER,
            }
        } else {
            StrategyError::Unavailable {
                backend: Backend::Postgres,
                source: anyhow::anyhow!(
                    "no pool connection within the acquire timeout, and Postgres did not \
                     answer a probe either"
                ),
            }
        }
    }
}

/// Whether `err` is a pool timeout not yet sorted out by
/// [`PostgresProbe::triage`] (`From<sqlx::Error>` makes it `Unavailable`).
pub fn is_pool_timeout(err: &StrategyError) -> bool {
    matches!(
        err,
        StrategyError::Unavailable { backend: Backend::Postgres, source }
            if matches!(source.downcast_ref::<sqlx::Error>(), Some(sqlx::Error::PoolTimedOut))
    )
}

/// One connection, `SELECT 1`, closed; `true` when Postgres answered.
async fn probe(options: &PgConnectOptions) -> bool {
    let attempt = async {
        let mut conn = options.connect().await?;
        sqlx::query("SELECT 1").execute(&mut conn).await?;
        conn.close().await
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(())) => true,
        Ok(Err(sqlx::Error::Database(db))) => db.code().as_deref() == Some("53300"),
        Ok(Err(_)) | Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unsorted_pool_timeout_is_a_pool_timeout() {
        assert!(is_pool_timeout(&sqlx::Error::PoolTimedOut.into()));
        assert!(!is_pool_timeout(&sqlx::Error::PoolClosed.into()));
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(!is_pool_timeout(&io.into()));
        let busy = StrategyError::Busy { reason: "x", retry_after: Duration::ZERO };
        assert!(!is_pool_timeout(&busy));
    }

    #[tokio::test]
    async fn a_pool_timeout_with_postgres_unreachable_stays_unavailable_but_sorted() {
        // A port nothing listens on: the probe's connect is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let options = PgConnectOptions::new().host("127.0.0.1").port(port).username("postgres");
        let sorted = PostgresProbe::new(options).triage(sqlx::Error::PoolTimedOut.into()).await;
        assert!(matches!(sorted, StrategyError::Unavailable { .. }), "{sorted:?}");
        assert!(!is_pool_timeout(&sorted), "sorted once, not probed again");
    }
}
