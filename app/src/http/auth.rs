//! The admin bearer token: the [`Admin`] extractor of the service's own admin
//! handlers, and [`require_admin`], the same check as a middleware in front of
//! the admin routes a strategy contributes.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::web::AppError;

/// Proof that the request carried the admin bearer token: `401` without an
/// `Authorization: Bearer …` header, `403` with a wrong token. The comparison
/// takes constant time, and the token is never logged.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let (expected, _) = state.config.admin_token();
        check_bearer(parts.headers.get(header::AUTHORIZATION), expected).map(|()| Admin)
    }
}

/// Middleware of the admin routes that a strategy contributes: answers `401`
/// or `403` as [`Admin`] does, before the route's own extractors run.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let (expected, _) = state.config.admin_token();
    match check_bearer(request.headers().get(header::AUTHORIZATION), expected) {
        Ok(()) => next.run(request).await,
        Err(err) => err.into_response(),
    }
}

/// `Ok` when `authorization` is `Bearer <expected>`. The scheme name is
/// case-insensitive (RFC 9110, section 11.1); the token is compared in
/// constant time. Errors: `Unauthorized` without a bearer token,
/// `Forbidden` with a wrong one.
fn check_bearer(authorization: Option<&HeaderValue>, expected: &str) -> Result<(), AppError> {
    let given = authorization
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
        .ok_or(AppError::Unauthorized)?;
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(AppError::Forbidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(header: Option<&'static str>) -> Result<(), AppError> {
        check_bearer(header.map(HeaderValue::from_static).as_ref(), "s3cret")
    }

    #[test]
    fn the_right_bearer_token_passes_whatever_the_scheme_case() {
        assert!(check(Some("Bearer s3cret")).is_ok());
        assert!(check(Some("bEARER s3cret")).is_ok());
    }

    #[test]
    fn no_bearer_token_is_unauthorized() {
        for header in [None, Some("s3cret"), Some("Basic s3cret"), Some("Bearer")] {
            assert!(matches!(check(header), Err(AppError::Unauthorized)), "{header:?}");
        }
    }

    #[test]
    fn a_wrong_bearer_token_is_forbidden() {
        for header in ["Bearer s3cre", "Bearer s3cret ", "Bearer S3CRET", "Bearer "] {
            assert!(matches!(check(Some(header)), Err(AppError::Forbidden)), "{header}");
        }
    }
}
