//! What a strategy answers, in words every layer of the service shares: the
//! [`Outcome`] of a purchase, the [`StrategyError`] that replaces it (with the
//! [`Backend`] that failed), a [`Reconciliation`] report, and the mapping of
//! the one-order-per-buyer constraint to `AlreadyPurchased`.
//!
//! The HTTP layer turns these into statuses, the purchase path into metric
//! labels, the load test into its figures; the strategies produce them. This
//! module sits at the bottom of the service: it imports only the sale
//! identifiers, so the handles to the backing servers (`crate::backends`) and
//! the sale record can use it without knowing any strategy.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sale::SaleId;

/// The answer to one purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An order was written: `orders.id`, with the units it took.
    Placed { order_id: i64, quantity: i32 },
    /// No stock left for this quantity.
    SoldOut,
    /// This user already has an order for this sale.
    AlreadyPurchased,
    /// Before the sale's `starts_at`.
    NotStarted,
    /// At or after the sale's `ends_at`.
    Ended,
    /// Accepted for later settlement (`queue`): the result will be at
    /// `GET /sales/{id}/requests/{request_id}`.
    Accepted { request_id: uuid::Uuid },
}

impl Outcome {
    /// Label used in metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Placed { .. } => "placed",
            Outcome::SoldOut => "sold_out",
            Outcome::AlreadyPurchased => "already_purchased",
            Outcome::NotStarted => "not_started",
            Outcome::Ended => "ended",
            Outcome::Accepted { .. } => "accepted",
        }
    }
}

/// A backing server: one a strategy needs, or the one that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The source of truth: sales, orders, requests (`DATABASE_URL`).
    Postgres,
    /// Counters and locks of the Redis strategies (`REDIS_URL`, `SECKILL_LOCK_REDLOCK_URLS`).
    Redis,
    /// The `queue` strategy's broker (`AMQP_URL`).
    Rabbitmq,
}

/// Why a purchase produced no [`Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    /// Designed back-pressure (a lock wait ran out, a queue is full): the client
    /// should retry after `retry_after`. Becomes `503` + `Retry-After`, problem
    /// type `busy`.
    #[error("busy: {reason}")]
    Busy { reason: &'static str, retry_after: Duration },
    /// A backing server is down or unreachable. Becomes `503`, problem type
    /// `unavailable`.
    #[error("{backend:?} unavailable: {source}")]
    Unavailable {
        backend: Backend,
        #[source]
        source: anyhow::Error,
    },
    /// A backing server refused the service's account or its rights: a
    /// wrong password, a Redis ACL that does not cover the service's keys
    /// (`NOPERM`), a RabbitMQ login or virtual host refused
    /// (`ACCESS_REFUSED`, `NOT_ALLOWED`), a Postgres role without a
    /// privilege it needs. A retry does not help until an operator corrects
    /// the configuration. `cause` names the refusal (the server's own error
    /// code where it has one). Becomes `503`, problem type `misconfigured`,
    /// and is logged once per `(backend, cause)` ([`log_misconfiguration`]).
    #[error("{backend:?} refused this service ({cause}): {source}")]
    Misconfigured {
        backend: Backend,
        cause: &'static str,
        #[source]
        source: anyhow::Error,
    },
    /// Anything else: a bug or an unexpected server answer. Becomes `500`.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl StrategyError {
    /// The same error again — kind, backend, cause and message — for one
    /// more waiter of a batch that failed as a whole (an error is not
    /// `Clone`; the source chain becomes its message).
    pub fn duplicate(&self) -> StrategyError {
        match self {
            StrategyError::Busy { reason, retry_after } => {
                StrategyError::Busy { reason, retry_after: *retry_after }
            }
            StrategyError::Unavailable { backend, source } => StrategyError::Unavailable {
                backend: *backend,
                source: anyhow::anyhow!("{source:#}"),
            },
            StrategyError::Misconfigured { backend, cause, source } => {
                StrategyError::Misconfigured {
                    backend: *backend,
                    cause,
                    source: anyhow::anyhow!("{source:#}"),
                }
            }
            StrategyError::Internal(source) => {
                StrategyError::Internal(anyhow::anyhow!("{source:#}"))
            }
        }
    }
}

/// The `(backend, cause)` pairs of [`StrategyError::Misconfigured`] this
/// process has logged.
static MISCONFIGURATIONS_LOGGED: std::sync::Mutex<std::collections::BTreeSet<(Backend, &str)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Logs a misconfiguration: at ERROR the first time this process meets its
/// `(backend, cause)`, at DEBUG afterwards — one refusal fails every
/// request that needs the server, and one line says why. Returns whether it
/// was the first time.
pub fn log_misconfiguration(backend: Backend, cause: &'static str, source: &anyhow::Error) -> bool {
    let first = MISCONFIGURATIONS_LOGGED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert((backend, cause));
    if first {
        tracing::error!(
            ?backend, cause, error = %source,
            "a backing server refuses this service's configuration; requests that need it are \
             answered 503 misconfigured until it is corrected (logged once per cause)"
        );
    } else {
        tracing::debug!(?backend, cause, error = %source, "backing server refuses this service");
    }
    first
}

/// The misconfiguration a Postgres SQLSTATE reports, if any (PostgreSQL
/// manual, appendix A): `42501` insufficient privilege, class `28` invalid
/// authorization (a wrong password, an unknown role), `3D000` no such
/// database.
fn postgres_misconfiguration(code: &str) -> Option<&'static str> {
    match code {
        "42501" => Some("insufficient_privilege"),
        "3D000" => Some("invalid_catalog_name"),
        code if code.starts_with("28") => Some("invalid_authorization_specification"),
        _ => None,
    }
}

/// The reason given with `busy` when Postgres rolled a transaction back to
/// break a deadlock or a serialization conflict.
pub const TRANSACTION_CONFLICT: &str =
    "the transaction conflicted with a concurrent one and was rolled back; retry";

/// `Retry-After` of that `busy` answer.
pub const CONFLICT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl From<sqlx::Error> for StrategyError {
    /// A refused role or privilege is `Misconfigured`
    /// (`postgres_misconfiguration`); connection-level failures (refused,
    /// reset, pool exhausted while connecting, server shutting down) are
    /// `Unavailable`; everything else is `Internal`. SQLSTATE classes from
    /// the PostgreSQL manual, appendix A:
    /// `08` connection exception, `57P0x` operator intervention, `53300` too
    /// many connections. A transaction rolled back by a deadlock (`40P01`)
    /// or a serialization conflict (`40001`) is `Busy`: nothing was written.
    fn from(err: sqlx::Error) -> Self {
        let misconfigured = match &err {
            sqlx::Error::Database(db) => {
                db.code().and_then(|code| postgres_misconfiguration(&code))
            }
            _ => None,
        };
        if let Some(cause) = misconfigured {
            return StrategyError::Misconfigured {
                backend: Backend::Postgres,
                cause,
                source: err.into(),
            };
        }
        let unavailable = match &err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                code.starts_with("08") || code.starts_with("57P") || code == "53300"
            }),
            _ => false,
        };
        // Class 40, transaction rollback: Postgres broke a deadlock
        // (`40P01`) or a serialization conflict (`40001`) by rolling this
        // transaction back; nothing was written and a retry may pass.
        let conflict = matches!(&err, sqlx::Error::Database(db)
            if db.code().is_some_and(|code| code == "40P01" || code == "40001"));
        if unavailable {
            StrategyError::Unavailable { backend: Backend::Postgres, source: err.into() }
        } else if conflict {
            tracing::warn!(error = %err, "a transaction was rolled back by a conflict; answered busy");
            StrategyError::Busy { reason: TRANSACTION_CONFLICT, retry_after: CONFLICT_RETRY_AFTER }
        } else {
            StrategyError::Internal(err.into())
        }
    }
}

/// What one reconciliation pass over a sale found and fixed. Units are units
/// of stock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Reconciliation {
    pub sale_id: SaleId,
    /// As the audit's `redis_drift`, measured before this pass fixed
    /// anything. `None` when the strategy keeps no counter (or Redis holds
    /// none for this sale yet).
    pub redis_drift: Option<i64>,
    /// Units of abandoned reservations (no order after the grace period)
    /// returned to the counter.
    pub returned_units: i64,
    /// Units by which the counter was corrected towards Postgres (absolute).
    pub corrected_units: i64,
    /// Open reservations younger than the grace period, left alone.
    pub in_flight_reservations: i64,
    /// A correction was due but postponed to a later pass, because new
    /// reservations landed while this pass was measuring.
    pub correction_deferred: bool,
}

impl Reconciliation {
    /// The report of a strategy with nothing to reconcile.
    pub fn nothing_to_reconcile(sale_id: SaleId) -> Self {
        Self {
            sale_id,
            redis_drift: None,
            returned_units: 0,
            corrected_units: 0,
            in_flight_reservations: 0,
            correction_deferred: false,
        }
    }

    /// Units fixed by this pass: returned plus corrected.
    pub fn fixes(&self) -> i64 {
        self.returned_units + self.corrected_units
    }
}

/// Maps the unique violation on `orders_sale_user_key` to `AlreadyPurchased`,
/// and any other error through `From<sqlx::Error>`.
pub(crate) fn already_purchased_or(err: sqlx::Error) -> Result<Outcome, StrategyError> {
    match &err {
        sqlx::Error::Database(db) if db.constraint() == Some(ORDERS_SALE_USER_KEY) => {
            Ok(Outcome::AlreadyPurchased)
        }
        _ => Err(err.into()),
    }
}

/// Name of the constraint that allows one order per (sale, user).
pub const ORDERS_SALE_USER_KEY: &str = "orders_sale_user_key";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_of_postgres_are_unavailable_and_the_rest_internal() {
        for err in [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed, sqlx::Error::WorkerCrashed]
        {
            let mapped = StrategyError::from(err);
            assert!(
                matches!(mapped, StrategyError::Unavailable { backend: Backend::Postgres, .. }),
                "{mapped:?}"
            );
        }
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(StrategyError::from(io), StrategyError::Unavailable { .. }));
        let mapped = StrategyError::from(sqlx::Error::RowNotFound);
        assert!(matches!(mapped, StrategyError::Internal(_)), "{mapped:?}");
    }

    /// Two transactions of a real Postgres that take two advisory locks in
    /// opposite orders: Postgres rolls one back with `40P01`.
    #[tokio::test]
    async fn a_transaction_rolled_back_to_break_a_deadlock_is_busy() {
        use sqlx::Connection;
        let url = std::env::var("TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let key = i64::from(std::process::id()) << 8;
        let take = |first: i64, second: i64| {
            let url = url.clone();
            async move {
                let mut conn = sqlx::PgConnection::connect(&url).await.expect("postgres");
                let mut tx = conn.begin().await.expect("begin");
                let lock = "SELECT pg_advisory_xact_lock($1)";
                sqlx::query(lock).bind(first).execute(&mut *tx).await.expect("first lock");
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                sqlx::query(lock).bind(second).execute(&mut *tx).await.map(drop)
            }
        };
        let (a, b) = tokio::join!(take(key, key + 1), take(key + 1, key));
        let err = a.err().or(b.err()).expect("Postgres broke the deadlock");
        let mapped = StrategyError::from(err);
        assert!(
            matches!(mapped, StrategyError::Busy { reason: TRANSACTION_CONFLICT, .. }),
            "{mapped:?}"
        );
    }

    #[test]
    fn refused_roles_and_privileges_are_misconfigurations_and_nothing_else_is() {
        assert_eq!(postgres_misconfiguration("42501"), Some("insufficient_privilege"));
        assert_eq!(postgres_misconfiguration("28P01"), Some("invalid_authorization_specification"));
        assert_eq!(postgres_misconfiguration("28000"), Some("invalid_authorization_specification"));
        assert_eq!(postgres_misconfiguration("3D000"), Some("invalid_catalog_name"));
        for other in ["23505", "40001", "08006", "53300", "42P01"] {
            assert_eq!(postgres_misconfiguration(other), None, "{other}");
        }
    }

    #[test]
    fn a_duplicate_keeps_the_kind_backend_and_message() {
        let down = StrategyError::Unavailable {
            backend: Backend::Postgres,
            source: anyhow::anyhow!("connection reset"),
        };
        let again = down.duplicate();
        assert!(
            matches!(&again, StrategyError::Unavailable { backend: Backend::Postgres, source }
                if source.to_string() == "connection reset"),
            "{again:?}"
        );
        assert!(matches!(
            StrategyError::Internal(anyhow::anyhow!("x")).duplicate(),
            StrategyError::Internal(_)
        ));
    }

    #[test]
    fn a_misconfiguration_is_logged_once_per_backend_and_cause() {
        let source = anyhow::anyhow!("NOPERM");
        assert!(log_misconfiguration(Backend::Redis, "test cause", &source));
        assert!(!log_misconfiguration(Backend::Redis, "test cause", &source));
        assert!(log_misconfiguration(Backend::Rabbitmq, "test cause", &source));
        assert!(log_misconfiguration(Backend::Redis, "another test cause", &source));
    }

    #[test]
    fn an_error_that_is_not_the_buyer_constraint_is_not_already_purchased() {
        let answer = already_purchased_or(sqlx::Error::RowNotFound);
        assert!(matches!(answer, Err(StrategyError::Internal(_))), "{answer:?}");
    }

    #[test]
    fn every_outcome_has_its_own_label() {
        let outcomes = [
            Outcome::Placed { order_id: 1, quantity: 1 },
            Outcome::SoldOut,
            Outcome::AlreadyPurchased,
            Outcome::NotStarted,
            Outcome::Ended,
            Outcome::Accepted { request_id: uuid::Uuid::nil() },
        ];
        let mut labels: Vec<&str> = outcomes.iter().map(Outcome::label).collect();
        assert_eq!(
            labels,
            ["placed", "sold_out", "already_purchased", "not_started", "ended", "accepted"]
        );
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), outcomes.len());
    }

    #[test]
    fn a_strategy_with_nothing_to_reconcile_reports_no_drift_and_no_fixes() {
        let report = Reconciliation::nothing_to_reconcile(SaleId(7));
        assert_eq!((report.sale_id, report.redis_drift, report.fixes()), (SaleId(7), None, 0));
        let report = Reconciliation { returned_units: 3, corrected_units: 2, ..report };
        assert_eq!(report.fixes(), 5);
    }
}
