//! The HTTP API: routing, shared state and middleware. Handlers are thin:
//! they parse, call the domain, and shape the answer.
//!
//! The routes a strategy serves besides the purchase (the `queue` strategy's
//! request results, the lock strategies' statistics) come from the strategy
//! itself ([`Strategies::routes`]) and are mounted here next to the service's
//! own, behind the same middleware; their admin routes behind the same token
//! check ([`auth::require_admin`]). The error type and the extractors every
//! route shares are in `crate::web`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_prometheus::{EndpointLabel, PrometheusMetricLayerBuilder};
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};

use crate::backends::{AmqpHandle, RedisHandle};
use crate::config::Config;
use crate::postgres_probe::PostgresProbe;
use crate::sale::SaleCatalog;
use crate::strategy::Strategies;
use crate::web::{AppError, UnsortedPoolTimeout};

mod admin;
mod auth;
mod health;
mod sales;

/// Everything a handler may need; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: PgPool,
    pub catalog: SaleCatalog,
    pub strategies: Strategies,
    pub metrics: PrometheusHandle,
    /// Shared Redis handle (also inside the strategies), for `/readyz`.
    pub redis: RedisHandle,
    /// Shared RabbitMQ handle (also inside the `queue` strategy), for `/readyz`.
    pub amqp: AmqpHandle,
    /// Tells a pool timeout's overload (`busy`) from an outage.
    pub probe: PostgresProbe,
}

/// Request bodies are tiny JSON documents; anything larger is refused (413).
const BODY_LIMIT_BYTES: usize = 16 * 1024;

/// The `endpoint` label of `/metrics` request series for a request that
/// matched no route.
pub const UNMATCHED_ENDPOINT: &str = "unmatched";

/// How long `/readyz` waits for each backing server.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The service's routes, then the strategies' own, with every middleware.
pub fn router(state: AppState) -> Router {
    let mut router = Router::new()
        .route("/admin/sales", post(admin::create_sale))
        .route("/admin/sales/{id}/restock", post(admin::restock))
        .route("/admin/sales/{id}/audit", get(admin::audit))
        .route("/admin/sales/{id}/reconcile", post(admin::reconcile))
        .route("/sales/{id}", get(sales::get_sale))
        .route("/sales/{id}/orders", post(sales::place_order))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics));
    for routes in state.strategies.routes() {
        router = router.merge(routes.public.clone().with_state(()));
        if routes.admin.has_routes() {
            let admin = routes
                .admin
                .clone()
                .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_admin));
            router = router.merge(admin.with_state(()));
        }
    }
    router
        .fallback(|| async { AppError::NotFound("no such route".to_owned()) })
        .method_not_allowed_fallback(|| async { AppError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .layer(middleware::from_fn_with_state(state.probe.clone(), sort_pool_timeouts))
        .layer(middleware::from_fn_with_state(state.config.request_timeout(), request_timeout))
        .layer(
            // Requests that match no route are counted under one label, not
            // their raw path: a client must not be able to mint series.
            PrometheusMetricLayerBuilder::new()
                .with_endpoint_label_type(EndpointLabel::MatchedPathWithFallbackFn(|_| {
                    UNMATCHED_ENDPOINT.to_owned()
                }))
                .build(),
        )
        // Failures are logged where they are understood (AppError); a 503
        // `busy` is designed back-pressure, not an error worth a log line.
        .layer(
            TraceLayer::new_for_http()
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        .layer(CatchPanicLayer::new())
        .with_state(state)
}

/// Re-answers a Postgres pool timeout that its handler left unsorted
/// ([`UnsortedPoolTimeout`]): `503 busy` when Postgres answers the probe,
/// `503 unavailable` when it does not. The purchase path sorts its own.
async fn sort_pool_timeouts(
    State(probe): State<PostgresProbe>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    if response.extensions().get::<UnsortedPoolTimeout>().is_none() {
        return response;
    }
    AppError::from(probe.triage(sqlx::Error::PoolTimedOut.into()).await).into_response()
}

/// Answers `504 timeout` for a request that runs longer than `timeout`
/// (`SECKILL_REQUEST_TIMEOUT_MS`), reading its body included. Not
/// `tower_http::timeout::TimeoutLayer`, which answers `408` with no body: a
/// slow server is not a slow client, and every error here is a problem
/// document. `504`, not `503`: the request may have had its effect (a
/// purchase's transaction or lock task runs on), so "not handled, retry
/// later" would not be true.
async fn request_timeout(
    State(timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => AppError::Timeout(timeout).into_response(),
    }
}
