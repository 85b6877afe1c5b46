//! `GET /admin/sales/{id}/lock-stats`: the lock figures of a sale that only
//! the app can measure — `max_concurrency` inside the critical section, over
//! every instance (see `crate::strategy::lock::intervals`).

use axum::Json;
use axum::extract::State;

use super::AppState;
use super::error::AppError;
use super::extract::{Admin, SalePath};
use crate::strategy::lock::intervals::{self, LockStats};

/// Flushes this instance's pending critical-section intervals, then answers
/// the sale's [`LockStats`] from every instance's flushed intervals. Call it on
/// every instance after a run (each call flushes its own instance; intervals
/// are also flushed every 100 ms) and keep the last answer. A sale that no
/// lock strategy served answers zeros; an unknown sale is `404`.
pub async fn lock_stats(
    _: Admin,
    State(state): State<AppState>,
    SalePath(id): SalePath,
) -> Result<Json<LockStats>, AppError> {
    state
        .catalog
        .get(&state.db, id)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no sale with id {}", id.0)))?;
    state.strategies.locks().intervals().flush().await?;
    Ok(Json(intervals::lock_stats(&state.db, id).await?))
}
