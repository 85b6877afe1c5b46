//! `GET /admin/sales/{id}/lock-stats`: the lock figures of a sale that only
//! the app can measure — `max_concurrency` inside the critical section, over
//! every instance (see [`super::intervals`]). One route for every `lock/*`
//! variant, since they share one recorder ([`Shared`]).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Shared;
use super::intervals::{self, LockStats};
use crate::sale::SaleCatalog;
use crate::strategy::StrategyRoutes;
use crate::web::{AppError, SalePath};

#[derive(Clone)]
struct RouteState {
    shared: Arc<Shared>,
    catalog: SaleCatalog,
}

/// The admin route `lock-stats`, over `shared`'s recorder.
pub(super) fn routes(shared: Arc<Shared>, catalog: SaleCatalog) -> StrategyRoutes {
    let admin =
        OpenApiRouter::new().routes(routes!(lock_stats)).with_state(RouteState { shared, catalog });
    StrategyRoutes { key: "lock-stats", public: OpenApiRouter::new(), admin }
}

/// Flushes this instance's pending critical-section intervals, then answers
/// the sale's [`LockStats`] from every instance's flushed intervals. Call it on
/// every instance after a run (each call flushes its own instance; intervals
/// are also flushed every 100 ms) and keep the last answer. A sale that no
/// lock strategy served answers zeros; an unknown sale is `404`.
#[utoipa::path(
    get,
    path = "/admin/sales/{id}/lock-stats",
    tag = "admin",
    params(SalePath),
    responses((status = 200, description = "The sale's lock figures", body = LockStats)),
)]
async fn lock_stats(
    State(state): State<RouteState>,
    SalePath(id): SalePath,
) -> Result<Json<LockStats>, AppError> {
    let db = &state.shared.db;
    state.catalog.get(db, id).await?.ok_or_else(|| AppError::no_such_sale(id))?;
    state.shared.intervals().flush().await?;
    Ok(Json(intervals::lock_stats(db, id).await?))
}
