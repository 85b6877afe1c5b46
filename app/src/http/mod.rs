//! The HTTP API: routing, shared state and middleware. Handlers are thin:
//! they parse, call the domain, and shape the answer. The storefront page
//! (`storefront`) is served beside it, from files embedded in the binary.
//!
//! The routes a strategy serves besides the purchase (the `queue` strategy's
//! request results, the lock strategies' statistics) come from the strategy
//! itself ([`Strategies::routes`]) and are mounted here next to the service's
//! own, behind the same middleware; their admin routes behind the same token
//! check ([`auth::require_admin`]). The error type and the extractors every
//! route shares are in `crate::web`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use axum_prometheus::{EndpointLabel, PrometheusMetricLayerBuilder};
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::{DefaultOnFailure, TraceLayer};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::backend_probe::BackendProbe;
use crate::backends::{AmqpHandle, RedisHandle};
use crate::outcome::StrategyError;
use crate::sale::SaleCatalog;
use crate::strategy::Strategies;
use crate::web::{AppError, BuyerAuth, UnsortedTimeout};

mod admin;
mod auth;
mod health;
mod line;
pub mod openapi;
mod orders;
mod sales;
pub mod settings;
mod storefront;

pub use auth::settings as auth_settings;
pub use health::metrics_router;

/// Everything a handler may need; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The HTTP server's settings (the request timeout, whether `/metrics`
    /// has a listener of its own).
    pub http: Arc<settings::HttpSettings>,
    /// The admin token, buyer authentication, the trusted load balancers.
    pub auth: Arc<auth::settings::AuthSettings>,
    pub db: PgPool,
    pub catalog: SaleCatalog,
    pub strategies: Strategies,
    pub metrics: PrometheusHandle,
    /// Shared Redis handle (also inside the strategies), for `/readyz`.
    pub redis: RedisHandle,
    /// Shared RabbitMQ handle (also inside the `queue` strategy), for `/readyz`.
    pub amqp: AmqpHandle,
    /// Tells a backing server's overload (`busy`) from its outage.
    pub probe: BackendProbe,
    /// Wrong admin tokens per client address (see [`auth`]).
    pub admin_failures: Arc<auth::AdminFailures>,
    /// Buyers known to hold an order, answered before the strategy runs.
    pub known_buyers: crate::known_buyers::KnownBuyers,
    /// Buyer authentication: the token verifier when it is on (added to
    /// every request's extensions for the [`crate::web::Buyer`] extractor).
    pub buyer_auth: BuyerAuth,
    /// The waiting rooms of the sales that have one.
    pub room: crate::waiting_room::WaitingRoom,
}

/// Request bodies are tiny JSON documents; anything larger is refused (413).
const BODY_LIMIT_BYTES: usize = 16 * 1024;

/// The `endpoint` label of `/metrics` request series for a request that
/// matched no route.
pub const UNMATCHED_ENDPOINT: &str = "unmatched";

/// How long `/readyz` waits for each backing server.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The service's routes, then the strategies' own, and `/openapi.json`,
/// with every middleware.
pub fn router(state: AppState) -> Router {
    let (router, document) = routes(&state);
    router
        .layer(Extension(openapi::Served::new(&document)))
        .layer(Extension(state.buyer_auth.clone()))
        .fallback(|| async { AppError::NotFound("no such route".to_owned()) })
        .method_not_allowed_fallback(|| async { AppError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .layer(middleware::from_fn_with_state(state.probe.clone(), sort_timeouts))
        .layer(middleware::from_fn_with_state(state.http.request_timeout(), request_timeout))
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
        .layer(CatchPanicLayer::custom(|_| {
            let panic = anyhow::anyhow!("a handler panicked");
            AppError::Strategy(StrategyError::Internal(panic)).into_response()
        }))
        .with_state(state)
}

/// Every route, each mounted from its annotated handler, and the OpenAPI
/// document the same calls build ([`openapi`]).
fn routes(state: &AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let mut api = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(admin::create_sale))
        .routes(routes!(admin::restock))
        .routes(routes!(admin::audit))
        .routes(routes!(admin::reconcile))
        .routes(routes!(sales::get_sale))
        .routes(routes!(sales::place_order))
        .routes(routes!(sales::buyer_order))
        .routes(routes!(line::join))
        .routes(routes!(line::look, line::leave))
        .routes(routes!(orders::get_order))
        .routes(routes!(orders::pay))
        .routes(routes!(orders::cancel))
        .routes(routes!(storefront::index))
        .routes(routes!(storefront::script))
        .routes(routes!(storefront::style))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(openapi::openapi_json));
    if state.http.metrics_addr.is_none() {
        api = api.routes(routes!(health::metrics));
    }
    for routes in state.strategies.routes() {
        api = api.merge(routes.public.clone().with_state(()));
        if !routes.admin.get_openapi().paths.paths.is_empty() {
            let admin = routes
                .admin
                .clone()
                .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_admin));
            api = api.merge(admin.with_state(()));
        }
    }
    let (router, document) = api.split_for_parts();
    (router, openapi::finish(document, state.buyer_auth.0.is_some()))
}

/// Re-answers a backing server's timeout that its handler left unsorted
/// ([`UnsortedTimeout`]): `503 busy` when that server answers the probe,
/// `503 unavailable` when it does not. The purchase path sorts its own.
async fn sort_timeouts(
    State(probe): State<BackendProbe>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let Some(&UnsortedTimeout(server)) = response.extensions().get::<UnsortedTimeout>() else {
        return response;
    };
    let what = format!("a request timed out waiting for {server:?}");
    AppError::from(probe.sort(server, what).await).into_response()
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

#[cfg(test)]
mod tests {
    //! The router and its OpenAPI document name the same routes. The paths
    //! the router serves are read from the router itself (its `Debug` form,
    //! the one view axum gives of its route table); the methods of each path
    //! are checked against the live service by `app/tests/api/openapi.rs`.

    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;

    /// A state whose servers are never contacted: lazy pools and handles.
    fn offline_state() -> AppState {
        let config = crate::config::Config::from_env();
        let db = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy(&config.backends.database_url)
            .expect("a parsable DATABASE_URL");
        let redis = RedisHandle::new(&config.backends.redis_url, "offline").unwrap();
        let amqp = AmqpHandle::new(config.backends.amqp_url.clone(), "offline");
        let catalog = SaleCatalog::default();
        let deps = config.deps(db.clone(), redis.clone(), amqp.clone(), catalog.clone());
        AppState {
            strategies: Strategies::new(&deps).unwrap(),
            probe: BackendProbe::new(
                crate::startup::connect_options(&config.backends).unwrap(),
                redis.client().clone(),
                &config.strategies.lock.redlock_urls,
                config.backends.amqp_url.clone(),
            ),
            admin_failures: Default::default(),
            known_buyers: Default::default(),
            buyer_auth: BuyerAuth(None),
            room: crate::waiting_room::WaitingRoom::new(
                &redis,
                db.clone(),
                "offline",
                Duration::from_secs(1),
            )
            .unwrap(),
            metrics: crate::telemetry::metrics_handle(),
            http: Arc::new(config.http.clone()),
            auth: Arc::new(config.auth.clone()),
            db,
            catalog,
            redis,
            amqp,
        }
    }

    /// The quoted paths of `router`'s path router in its `Debug` form (the
    /// fallback router that follows holds axum's own catch-all routes).
    fn served_paths(router: &Router<AppState>) -> BTreeSet<String> {
        let debug = format!("{router:?}");
        let (paths, _) = debug.split_once("fallback_router:").expect("axum's Router layout");
        paths
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|quoted| quoted.starts_with('/') && !quoted.contains("__private__"))
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn every_path_the_router_serves_is_in_the_document_and_no_other() {
        let (router, document) = routes(&offline_state());
        let served = served_paths(&router);
        let documented: BTreeSet<String> = document.paths.paths.keys().cloned().collect();
        for path in ["/sales/{id}/orders", "/admin/sales/{id}/lock-stats", "/openapi.json"] {
            assert!(served.contains(path), "{path} is read from the router: {served:?}");
        }
        assert_eq!(served, documented);
    }

    #[tokio::test]
    async fn a_route_mounted_without_its_annotation_is_caught() {
        let (router, document) = routes(&offline_state());
        let router = router.route("/undocumented", axum::routing::get(|| async {}));
        let documented: BTreeSet<String> = document.paths.paths.keys().cloned().collect();
        let missing: Vec<String> = served_paths(&router).difference(&documented).cloned().collect();
        assert_eq!(missing, ["/undocumented"]);
    }

    #[tokio::test]
    async fn the_document_is_openapi_3_1_with_a_problem_answer_for_every_error() {
        let (_, document) = routes(&offline_state());
        let json = serde_json::to_value(&document).unwrap();
        assert_eq!(json["openapi"], "3.1.0");
        let order = &json["paths"]["/sales/{id}/orders"]["post"]["responses"];
        for status in ["201", "202", "400", "404", "409", "413", "415", "422", "500", "503", "504"]
        {
            assert!(order.get(status).is_some(), "POST /sales/{{id}}/orders answers {status}");
        }
        let audit = &json["paths"]["/admin/sales/{id}/audit"]["get"];
        assert!(audit["responses"].get("401").is_some() && audit["security"].is_array());
        let healthz = &json["paths"]["/healthz"]["get"]["responses"];
        assert!(healthz.get("404").is_none() && healthz.get("401").is_none());
        let strategies = &json["components"]["schemas"]["StrategyName"]["enum"];
        assert_eq!(strategies.as_array().unwrap().len(), crate::strategy::REGISTRY.len());
    }

    #[tokio::test]
    async fn a_lock_purchase_cut_off_at_its_hold_bound_is_a_documented_busy() {
        let (_, document) = routes(&offline_state());
        let json = serde_json::to_value(&document).unwrap();
        let busy = &json["paths"]["/sales/{id}/orders"]["post"]["responses"]["503"];
        let about = busy["description"].as_str().expect("the purchase states its own 503");
        for cause in ["SECKILL_LOCK_WAIT_MS", "SECKILL_LOCK_HOLD_MS", "fenced"] {
            assert!(about.contains(cause), "the purchase's 503 names {cause}: {about}");
        }
        assert!(busy["headers"].get("Retry-After").is_some());
        let problem = &busy["content"]["application/problem+json"]["schema"]["$ref"];
        assert_eq!(problem, "#/components/schemas/Problem");
        // Returns take no lock (`crate::strategy::lock`): the order routes
        // keep the shared answer, whose causes do not include the lock's.
        for route in ["/orders/{id}/pay", "/orders/{id}/cancel"] {
            let shared = &json["paths"][route]["post"]["responses"]["503"]["$ref"];
            assert_eq!(shared, "#/components/responses/Unavailable", "{route}");
        }
    }

    /// JSON object keys are strings: a map keyed by integers must not
    /// promise integer property names, or every non-empty `size_counts` is
    /// off the document (schemathesis's stateful phase reached one through
    /// a `sql/batched` sale it had created and bought from).
    #[tokio::test]
    async fn map_keys_are_documented_as_the_strings_json_makes_them() {
        let (_, document) = routes(&offline_state());
        let json = serde_json::to_value(&document).unwrap();
        let size_counts = &json["components"]["schemas"]["BatchStats"]["properties"]["size_counts"];
        assert_eq!(size_counts["propertyNames"]["type"], "string");
        let text = json.to_string();
        for (at, _) in text.match_indices("\"propertyNames\"") {
            let names = &text[at..text[at..].find('}').map_or(text.len(), |end| at + end)];
            assert!(names.contains("\"string\""), "every map's keys are strings: {names}");
        }
    }
}
