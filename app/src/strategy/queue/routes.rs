//! The `queue` strategy's routes: the results of its purchases, `GET
//! /sales/{id}/requests/{request_id}` (with a long poll), and the admin queue
//! statistics of a sale, `GET /admin/sales/{id}/queue`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Queue, QueueStats, RequestResult};
use crate::sale::{InvalidInput, SaleCatalog, SaleId};
use crate::strategy::StrategyRoutes;
use crate::web::{AppError, Buyer, SalePath};

/// Longest long poll, milliseconds: a client that wants to wait longer asks
/// again.
pub const MAX_WAIT_MS: u64 = 5_000;

#[derive(Clone)]
struct RouteState {
    queue: Arc<Queue>,
    catalog: SaleCatalog,
}

/// The public route `requests/{request_id}` and the admin route `queue`.
pub(super) fn routes(queue: Arc<Queue>, catalog: SaleCatalog) -> StrategyRoutes {
    let state = RouteState { queue, catalog };
    let public = OpenApiRouter::new().routes(routes!(request)).with_state(state.clone());
    let admin = OpenApiRouter::new().routes(routes!(queue_stats)).with_state(state);
    StrategyRoutes { key: "queue", public, admin }
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct Wait {
    /// Milliseconds to wait for a pending request to be resolved (default 0:
    /// answer at once).
    #[param(minimum = 0, maximum = 5000)]
    wait_ms: Option<u64>,
}

/// `GET /sales/{id}/requests/{request_id}?wait_ms=` → `200` with the
/// request's [`RequestResult`] (`status` is `pending` until the consumer
/// settles it), or `404` when the sale has no such request — or, with buyer
/// authentication on, none of the token's buyer (another buyer's request is
/// not told apart from none). With `wait_ms`, a pending request is re-read
/// until it is resolved or the time is up.
#[utoipa::path(
    get,
    path = "/sales/{id}/requests/{request_id}",
    tag = "sales",
    params(
        SalePath,
        ("request_id" = uuid::Uuid, Path, description = "From the `202` of the purchase"),
        Wait,
    ),
    responses((status = 200, description = "The request and its result", body = RequestResult)),
)]
async fn request(
    State(state): State<RouteState>,
    buyer: Buyer,
    path: Result<Path<(String, String)>, PathRejection>,
    wait: Result<Query<Wait>, QueryRejection>,
) -> Result<Json<RequestResult>, AppError> {
    let Query(wait) = wait.map_err(|err| InvalidInput::new("query", err.body_text()))?;
    // The raw segments are never echoed: they may be anything, of any length.
    let parsed = path.ok().map(|Path((sale, request))| {
        (sale.parse::<i64>().map(SaleId), request.parse::<uuid::Uuid>())
    });
    let Some((Ok(sale), Ok(id))) = parsed else {
        return Err(AppError::NotFound(
            "no such request: a sale id is a 64-bit integer and a request id a UUID".to_owned(),
        ));
    };
    let not_found = || AppError::NotFound(format!("sale {} has no request {id}", sale.0));
    let wait_ms = wait.wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(InvalidInput::new("wait_ms", format!("must be at most {MAX_WAIT_MS}")).into());
    }
    let result = state
        .queue
        .request(sale, id, buyer.owner(), Duration::from_millis(wait_ms))
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(result))
}

/// `GET /admin/sales/{id}/queue`: the sale's [`QueueStats`] from Postgres
/// (requests accepted and still unresolved, results, accept → resolved
/// latency, consumer batch sizes). Zeros for a sale with no requests; `404`
/// for an unknown sale.
#[utoipa::path(
    get,
    path = "/admin/sales/{id}/queue",
    tag = "admin",
    params(SalePath),
    responses((status = 200, description = "The sale's queue statistics", body = QueueStats)),
)]
async fn queue_stats(
    State(state): State<RouteState>,
    SalePath(id): SalePath,
) -> Result<Json<QueueStats>, AppError> {
    state.catalog.get(&state.queue.db, id).await?.ok_or_else(|| AppError::no_such_sale(id))?;
    Ok(Json(state.queue.stats(id).await?))
}
