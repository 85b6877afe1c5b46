//! Liveness, readiness and Prometheus metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::Admin;
use super::{AppState, READY_TIMEOUT};
use crate::backends::{AmqpHandle, RedisHandle};
use crate::outcome::{Backend, StrategyError};
use crate::web::AppError;

/// `{"status": "ok"}`.
#[derive(Serialize, ToSchema)]
pub struct Alive {
    #[schema(pattern = "^ok$")]
    status: &'static str,
}

/// `GET /healthz`: the process answers. Also the load test's trivial endpoint
/// for the `http_rps` ceiling.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "The process runs", body = Alive)),
)]
pub async fn healthz() -> Json<Alive> {
    Json(Alive { status: "ok" })
}

/// `{"status": "ready", "postgres": "ok", "redis": "ok", "rabbitmq": "ok"}`.
#[derive(Serialize, ToSchema)]
pub struct Ready {
    #[schema(pattern = "^ready$")]
    status: &'static str,
    #[schema(pattern = "^ok$")]
    postgres: &'static str,
    #[schema(pattern = "^ok$")]
    redis: &'static str,
    #[schema(pattern = "^ok$")]
    rabbitmq: &'static str,
}

/// `GET /readyz`: `200` when every backing server (Postgres, then Redis,
/// then RabbitMQ) answers within 2 s, else `503` problem `unavailable` naming
/// the first one that did not.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses((status = 200, description = "Every backing server answers", body = Ready)),
)]
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Ready>, AppError> {
    let ping = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.db);
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(_)) => {
            redis_ready(&state.redis).await?;
            amqp_ready(&state.amqp).await?;
            Ok(Json(Ready { status: "ready", postgres: "ok", redis: "ok", rabbitmq: "ok" }))
        }
        Ok(Err(err)) => Err(not_ready(Backend::Postgres, err.into()).into()),
        Err(_) => Err(StrategyError::Unavailable {
            backend: Backend::Postgres,
            source: anyhow::anyhow!("no answer within {READY_TIMEOUT:?}"),
        }
        .into()),
    }
}

/// What a failed readiness check of `backend` answers: a refusal stays
/// `misconfigured`, anything else is `unavailable`.
fn not_ready(backend: Backend, err: StrategyError) -> StrategyError {
    match err {
        err @ (StrategyError::Misconfigured { .. } | StrategyError::Unavailable { .. }) => err,
        other => StrategyError::Unavailable { backend, source: other.into() },
    }
}

/// Redis answers `PING` within [`READY_TIMEOUT`]; else `503` problem
/// `unavailable` with backend `redis`.
async fn redis_ready(redis: &RedisHandle) -> Result<(), AppError> {
    let ping = async {
        let mut conn = redis.conn().await?;
        // Any error, not only I/O, means "not ready" here.
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(|err| not_ready(Backend::Redis, crate::backends::redis_error(err)))
    };
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(err.into()),
        Err(_) => Err(StrategyError::Unavailable {
            backend: Backend::Redis,
            source: anyhow::anyhow!("no answer within {READY_TIMEOUT:?}"),
        }
        .into()),
    }
}

/// RabbitMQ holds a connected connection (opening one if needed) within
/// [`READY_TIMEOUT`]; else `503` problem `unavailable` with backend
/// `rabbitmq`.
async fn amqp_ready(amqp: &AmqpHandle) -> Result<(), AppError> {
    match tokio::time::timeout(READY_TIMEOUT, amqp.connection()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(err.into()),
        Err(_) => Err(StrategyError::Unavailable {
            backend: Backend::Rabbitmq,
            source: anyhow::anyhow!("no answer within {READY_TIMEOUT:?}"),
        }
        .into()),
    }
}

/// `GET /metrics`: Prometheus text format, on the main address; asks for the
/// admin token (as `/admin/*`: `401`, `403`, `429`). Not routed when
/// `SECKILL_METRICS_ADDR` gives the metrics a listener of their own
/// ([`metrics_router`]).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    security(("bearer" = [])),
    responses((status = 200, description = "Prometheus text format, version 0.0.4 (docs/api.md \
        lists the series)", body = String, content_type = "text/plain")),
)]
pub async fn metrics(_admin: Admin, State(state): State<AppState>) -> Response {
    exposition(&state.metrics)
}

/// The router of the metrics listener (`SECKILL_METRICS_ADDR`): `GET
/// /metrics` without a token, nothing else (`404`, `405`, as problems).
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new()
        .route("/metrics", get(move || std::future::ready(exposition(&handle))))
        .fallback(|| async { AppError::NotFound("this listener serves GET /metrics only".into()) })
        .method_not_allowed_fallback(|| async { AppError::MethodNotAllowed })
}

/// The exposition page of `handle`.
fn exposition(handle: &PrometheusHandle) -> Response {
    let content_type = [(header::CONTENT_TYPE, "text/plain; version=0.0.4")];
    (StatusCode::OK, content_type, handle.render()).into_response()
}
