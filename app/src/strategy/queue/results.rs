//! Request rows: registering a request, reading its result (with a long
//! poll), and the queue statistics of a sale — all from Postgres.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::sale::{SaleId, UserId};
use crate::strategy::StrategyError;

/// A request as registered (`registrar::Registrar::register`).
#[derive(Debug, Clone, Copy)]
pub struct Registered {
    pub id: Uuid,
    /// Inserted by this call (not a resubmission).
    pub fresh: bool,
    /// Not settled yet.
    pub pending: bool,
}

/// Removes a request registered by this instance whose publish was refused,
/// so that it does not count as accepted. Best effort; a request the
/// consumer settled meanwhile (its publish did land) is kept.
pub async fn forget(db: &PgPool, id: Uuid) {
    // A request the republish job has published meanwhile stays: its copy
    // may be queued, and the consumer would recreate the row anyway.
    let removed = sqlx::query(
        "DELETE FROM purchase_requests
         WHERE id = $1 AND status = 'pending' AND republished_at IS NULL",
    )
    .bind(id)
    .execute(db)
    .await;
    if let Err(err) = removed {
        tracing::warn!(error = %err, request_id = %id, "could not remove a refused request");
    }
}

/// The answer of `GET /sales/{id}/requests/{request_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct RequestResult {
    pub request_id: Uuid,
    pub sale_id: SaleId,
    pub user_id: i64,
    pub quantity: i32,
    /// `pending`, `placed`, `sold_out`, `already_purchased` or `rejected`.
    #[schema(pattern = "^(pending|placed|sold_out|already_purchased|rejected)$")]
    pub status: String,
    /// The order, when `placed`.
    pub order_id: Option<i64>,
    /// Why, when `rejected`: the settlement failed `SECKILL_QUEUE_DELIVERY_LIMIT`
    /// times (with the last error), or the message was dead-lettered (with
    /// the broker's reason).
    pub rejection_reason: Option<String>,
    pub accepted_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// How often a long poll re-reads the request.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Request `id` of `sale`, re-read every 20 ms until it is no longer
/// `pending` or `wait` has passed. `Ok(None)` when there is no such request,
/// or — with `owner` — when it is another buyer's: answered at once either
/// way, so that not even the time of the answer tells the two apart.
pub async fn wait_for(
    db: &PgPool,
    sale: SaleId,
    id: Uuid,
    owner: Option<UserId>,
    wait: Duration,
) -> Result<Option<RequestResult>, StrategyError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let result: Option<RequestResult> = sqlx::query_as(
            "SELECT id AS request_id, sale_id, user_id, quantity, status, order_id,
                    rejection_reason, accepted_at, resolved_at
             FROM purchase_requests
             WHERE id = $1 AND sale_id = $2 AND ($3::bigint IS NULL OR user_id = $3)",
        )
        .bind(id)
        .bind(sale.0)
        .bind(owner.map(UserId::get))
        .fetch_optional(db)
        .await?;
        match result {
            Some(r) if r.status == "pending" && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(POLL_EVERY).await;
            }
            other => return Ok(other),
        }
    }
}

/// Percentiles of accept → resolved, milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct E2eLatency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

/// Sizes of the consumer batches that settled the sale's requests (messages
/// per batch, all sales of the batch counted).
pub use crate::strategy::batch::BatchSizes;

/// `GET /admin/sales/{id}/queue`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QueueStats {
    pub sale_id: SaleId,
    /// Requests registered (each answered `202` unless its publish failed,
    /// in which case it was removed).
    pub accepted: i64,
    /// Requests not resolved yet.
    pub accepted_unresolved: i64,
    pub placed: i64,
    pub sold_out: i64,
    pub already_purchased: i64,
    /// Rejected requests: failed `SECKILL_QUEUE_DELIVERY_LIMIT` times, or
    /// dead-lettered.
    pub rejected: i64,
    /// `null` until a request is resolved.
    pub e2e_latency_ms: Option<E2eLatency>,
    pub batches: i64,
    /// `null` until a batch settled a request of the sale.
    pub batch_sizes: Option<BatchSizes>,
}

#[derive(sqlx::FromRow)]
struct StatsRow {
    accepted: i64,
    pending: i64,
    placed: i64,
    sold_out: i64,
    already_purchased: i64,
    rejected: i64,
    p50: Option<f64>,
    p95: Option<f64>,
    p99: Option<f64>,
    max: Option<f64>,
}

#[derive(sqlx::FromRow)]
struct BatchRow {
    batches: i64,
    p50: Option<f64>,
    max: Option<f64>,
    mean: Option<f64>,
}

/// The queue statistics of `sale` (zeros for a sale with no requests).
pub async fn stats(db: &PgPool, sale: SaleId) -> Result<QueueStats, StrategyError> {
    let row: StatsRow = sqlx::query_as(
        "WITH r AS (
             SELECT status,
                    (extract(epoch FROM resolved_at - accepted_at) * 1000)::float8 AS ms
             FROM purchase_requests WHERE sale_id = $1
         )
         SELECT count(*) AS accepted,
                count(*) FILTER (WHERE status = 'pending') AS pending,
                count(*) FILTER (WHERE status = 'placed') AS placed,
                count(*) FILTER (WHERE status = 'sold_out') AS sold_out,
                count(*) FILTER (WHERE status = 'already_purchased') AS already_purchased,
                count(*) FILTER (WHERE status = 'rejected') AS rejected,
                percentile_cont(0.50) WITHIN GROUP (ORDER BY ms)::float8 AS p50,
                percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)::float8 AS p95,
                percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::float8 AS p99,
                max(ms)::float8 AS max
         FROM r",
    )
    .bind(sale.0)
    .fetch_one(db)
    .await?;
    let batch: BatchRow = sqlx::query_as(
        "WITH b AS (
             SELECT DISTINCT batch_id, batch_size FROM purchase_requests
             WHERE sale_id = $1 AND batch_id IS NOT NULL
         )
         SELECT count(*) AS batches,
                percentile_cont(0.5) WITHIN GROUP (ORDER BY batch_size)::float8 AS p50,
                max(batch_size)::float8 AS max,
                avg(batch_size)::float8 AS mean
         FROM b",
    )
    .bind(sale.0)
    .fetch_one(db)
    .await?;
    let round = |v: f64| (v * 100.0).round() / 100.0;
    Ok(QueueStats {
        sale_id: sale,
        accepted: row.accepted,
        accepted_unresolved: row.pending,
        placed: row.placed,
        sold_out: row.sold_out,
        already_purchased: row.already_purchased,
        rejected: row.rejected,
        e2e_latency_ms: row.max.map(|max| E2eLatency {
            p50: round(row.p50.unwrap_or(0.0)),
            p95: round(row.p95.unwrap_or(0.0)),
            p99: round(row.p99.unwrap_or(0.0)),
            max: round(max),
        }),
        batches: batch.batches,
        batch_sizes: batch.max.map(|max| BatchSizes {
            p50: round(batch.p50.unwrap_or(0.0)),
            max,
            mean: round(batch.mean.unwrap_or(0.0)),
        }),
    })
}
