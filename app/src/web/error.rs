//! `AppError`: the one place where failures become HTTP answers.
//!
//! Every error body is an RFC 9457 problem (`application/problem+json`) with a
//! stable `type` per kind; the types are listed in `docs/api.md`. Internal
//! errors are logged here and answered without their details.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::backend_probe::{Server, timed_out};
use crate::outcome::{Backend, Outcome, StrategyError};
use crate::sale::{InvalidInput, SaleId};

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `/problems/<slug>`, stable per kind of failure (docs/api.md).
    #[serde(rename = "type")]
    #[schema(example = "/problems/sold-out")]
    pub kind: String,
    /// A short, fixed summary of the kind.
    pub title: &'static str,
    /// The HTTP status, repeated in the body.
    pub status: u16,
    /// What went wrong with this request (never an internal error's details).
    pub detail: String,
    /// The backing server that is down, for `unavailable` problems only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
}

/// Every way a request can fail; each variant is one problem `type` and one
/// status (its `IntoResponse` answers the problem document).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// `400 malformed-request`: the body is not JSON, or the request is
    /// otherwise unreadable.
    #[error("{0}")]
    BadRequest(String),
    /// `401 unauthorized`: an admin route without a bearer token.
    #[error("missing admin token")]
    Unauthorized,
    /// `403 forbidden`: an admin route with the wrong token.
    #[error("wrong admin token")]
    Forbidden,
    /// `401 unauthorized` on a buyer route while buyer authentication is on:
    /// no buyer token (`None`), or one that is invalid or expired (why).
    /// Answered with `WWW-Authenticate: Bearer` (RFC 6750, section 3; with
    /// `error="invalid_token"` for a token that was refused).
    #[error("{}", .0.as_deref().unwrap_or("a buyer token is required: `Authorization: Bearer <token>`"))]
    BuyerUnauthorized(Option<String>),
    /// `403 buyer-mismatch`: a purchase whose body names a `user_id` other
    /// than its buyer token's `sub`.
    #[error("the body's user_id is not the buyer of the token; leave it out or send the same")]
    BuyerMismatch,
    /// `429 too-many-attempts`: an admin route from a client address that
    /// sent too many wrong tokens lately; `Retry-After` says when it may try
    /// again.
    #[error("too many wrong admin tokens from this address; retry later")]
    TooManyAttempts { retry_after: Duration },
    /// `404 not-found`: no such route, sale or request.
    #[error("{0}")]
    NotFound(String),
    /// `415 unsupported-media-type`: a body that is not `application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// `415 unsupported-encoding`: a body with a `Content-Encoding` the
    /// service does not decode (answered with `Accept-Encoding: identity`).
    #[error("{0}")]
    UnsupportedEncoding(String),
    /// `413 payload-too-large`: a body over the service's limit.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// `405 method-not-allowed`.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// `422 invalid-field`: a well-formed request with a field out of range.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// `409 sold-out`.
    #[error("sold out")]
    SoldOut,
    /// `409 already-purchased`: the buyer has an order for this sale.
    #[error("already purchased")]
    AlreadyPurchased,
    /// `409 not-started`: before the sale's `starts_at`.
    #[error("sale not started")]
    NotStarted,
    /// `409 ended`: at or after the sale's `ends_at`.
    #[error("sale ended")]
    Ended,
    /// `409` with the order's state as `type` (`order-paid`,
    /// `order-cancelled`, `order-expired`, `paid-under-another-key`): a
    /// payment or cancel the order's state refuses; `detail` says why.
    #[error("{detail}")]
    OrderConflict { slug: &'static str, title: &'static str, detail: String },
    /// `404 not-in-line`: the buyer has no place in the sale's waiting room
    /// (never joined, left, dropped after not looking, or the line was lost
    /// with Redis); joining again gives a new place.
    #[error("{0}")]
    NotInLine(String),
    /// `403 admission-required`: a purchase of a sale with a waiting room
    /// without an admission.
    #[error("{0}")]
    AdmissionRequired(String),
    /// `403 admission-refused`: an admission that does not admit this
    /// purchase (forged, another buyer's or sale's, lapsed, used, or lost
    /// with Redis); `detail` says which.
    #[error("{0}")]
    AdmissionRefused(String),
    /// `504 timeout`: the request ran longer than `SECKILL_REQUEST_TIMEOUT_MS`
    /// (the duration); what it set in motion may still complete.
    #[error(
        "no answer within {} ms; what the request started may still complete, and a retry is \
         safe (a buyer never gets two orders of a sale)",
        .0.as_millis()
    )]
    Timeout(Duration),
    /// `503 busy` (with `Retry-After`), `503 unavailable` or `500 internal`,
    /// as the strategy's error says.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
}

impl From<sqlx::Error> for AppError {
    fn from(err: sqlx::Error) -> Self {
        AppError::Strategy(err.into())
    }
}

impl AppError {
    /// `404 not-found` for a sale id that names no sale.
    pub fn no_such_sale(id: SaleId) -> AppError {
        AppError::NotFound(format!("no sale with id {}", id.0))
    }

    /// The error for a purchase outcome that is not a success, if any.
    pub fn from_outcome(outcome: &Outcome) -> Option<AppError> {
        match outcome {
            Outcome::Placed { .. } | Outcome::Accepted { .. } => None,
            Outcome::SoldOut => Some(AppError::SoldOut),
            Outcome::AlreadyPurchased => Some(AppError::AlreadyPurchased),
            Outcome::NotStarted => Some(AppError::NotStarted),
            Outcome::Ended => Some(AppError::Ended),
        }
    }

    /// `(status, problem type slug, title)`.
    pub(super) fn kind(&self) -> (StatusCode, &'static str, &'static str) {
        use AppError::*;
        match self {
            BadRequest(_) => (StatusCode::BAD_REQUEST, "malformed-request", "Malformed request"),
            Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Admin token required"),
            Forbidden => (StatusCode::FORBIDDEN, "forbidden", "Admin token rejected"),
            BuyerUnauthorized(_) => {
                (StatusCode::UNAUTHORIZED, "unauthorized", "Buyer token required")
            }
            BuyerMismatch => {
                (StatusCode::FORBIDDEN, "buyer-mismatch", "user_id is not the token's buyer")
            }
            TooManyAttempts { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "too-many-attempts", "Too many wrong admin tokens")
            }
            NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            UnsupportedEncoding(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-encoding",
                "Unsupported content encoding",
            ),
            PayloadTooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large", "Request body too large")
            }
            MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed")
            }
            Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid-field", "Invalid field"),
            SoldOut => (StatusCode::CONFLICT, "sold-out", "Sold out"),
            AlreadyPurchased => (StatusCode::CONFLICT, "already-purchased", "Already purchased"),
            NotStarted => (StatusCode::CONFLICT, "not-started", "Sale not started"),
            Ended => (StatusCode::CONFLICT, "ended", "Sale ended"),
            OrderConflict { slug, title, .. } => (StatusCode::CONFLICT, *slug, *title),
            NotInLine(_) => (StatusCode::NOT_FOUND, "not-in-line", "Not in the line"),
            AdmissionRequired(_) => {
                (StatusCode::FORBIDDEN, "admission-required", "Admission required")
            }
            AdmissionRefused(_) => {
                (StatusCode::FORBIDDEN, "admission-refused", "Admission refused")
            }
            Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout", "Request timed out"),
            Strategy(StrategyError::Busy { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "busy", "Busy, retry later")
            }
            Strategy(StrategyError::Unavailable { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "A backing service is unavailable")
            }
            Strategy(StrategyError::Misconfigured { .. }) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "misconfigured",
                "A backing service refuses this service's configuration",
            ),
            Strategy(StrategyError::Internal(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error")
            }
        }
    }
}

/// Marks the answer to a timeout of a backing server that nothing has
/// sorted out yet (see `crate::backend_probe`): the router re-answers it
/// `busy` when that server answers a probe, and leaves it `unavailable`
/// otherwise.
#[derive(Debug, Clone, Copy)]
pub struct UnsortedTimeout(pub Server);

/// Prefix of every problem `type`: `/problems/sold-out`, … (relative URIs,
/// resolved against the service's own address; documented in docs/api.md).
pub const PROBLEM_TYPE_PREFIX: &str = "/problems/";

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.kind();
        let unsorted_timeout = match &self {
            AppError::Strategy(err) => timed_out(err),
            _ => None,
        };
        let mut retry_after = None;
        let mut backend = None;
        let detail = match &self {
            AppError::Strategy(StrategyError::Internal(err)) => {
                tracing::error!(error = ?err, "internal error");
                "the request failed unexpectedly; it has been logged".to_owned()
            }
            AppError::Strategy(StrategyError::Unavailable { backend: b, source }) => {
                if unsorted_timeout.is_none() {
                    tracing::warn!(backend = ?b, error = %source, "backing service unavailable");
                }
                backend = Some(*b);
                retry_after = Some(Duration::from_secs(1));
                format!("{b:?} is unavailable; retry later")
            }
            AppError::Strategy(StrategyError::Misconfigured { backend: b, cause, source }) => {
                crate::outcome::log_misconfiguration(*b, cause, source);
                backend = Some(*b);
                format!(
                    "{b:?} refuses this service ({cause}); an operator must correct the service's \
                     account or its rights there (the service's log names the error)"
                )
            }
            AppError::Strategy(StrategyError::Busy { reason, retry_after: after }) => {
                retry_after = Some(*after);
                (*reason).to_owned()
            }
            AppError::TooManyAttempts { retry_after: after } => {
                retry_after = Some(*after);
                self.to_string()
            }
            other => other.to_string(),
        };
        let problem = Problem {
            kind: format!("{PROBLEM_TYPE_PREFIX}{slug}"),
            title,
            status: status.as_u16(),
            detail,
            backend,
        };
        let mut response = (status, Json(problem)).into_response();
        if let Some(server) = unsorted_timeout {
            response.extensions_mut().insert(UnsortedTimeout(server));
        }
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(after) = retry_after {
            // Retry-After takes whole seconds (RFC 9110 §10.2.3); round up.
            let secs = after.as_millis().div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
        }
        match &self {
            AppError::Unauthorized | AppError::BuyerUnauthorized(None) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            AppError::BuyerUnauthorized(Some(_)) => {
                let challenge = HeaderValue::from_static(r#"Bearer error="invalid_token""#);
                headers.insert(header::WWW_AUTHENTICATE, challenge);
            }
            // RFC 9110, section 15.5.16: say which codings would be accepted.
            AppError::UnsupportedEncoding(_) => {
                headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            }
            _ => {}
        }
        response
    }
}
