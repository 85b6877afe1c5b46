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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
    /// Anything else: a bug or an unexpected server answer. Becomes `500`.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// The reason given with `busy` when Postgres rolled a transaction back to
/// break a deadlock or a serialization conflict.
pub const TRANSACTION_CONFLICT: &str =
    "the transaction conflicted with a concurrent one and was rolled back; retry";

/// `Retry-After` of that `busy` answer.
pub const CONFLICT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl From<sqlx::Error> for StrategyError {
    /// Connection-level failures (refused, reset, pool exhausted while
    /// connecting, server shutting down) are `Unavailable`; everything else is
    /// `Internal`. SQLSTATE classes from the PostgreSQL manual, appendix A:
    /// `08` connection exception, `57P0x` operator intervention, `53300` too
    /// many connections. A transaction rolled back by a deadlock (`40P01`)
    /// or a serialization conflict (`40001`) is `Busy`: nothing was written.
    fn from(err: sqlx::Error) -> Self {
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
