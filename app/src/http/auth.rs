//! The admin bearer token: the [`Admin`] extractor of the service's own admin
//! handlers, and [`require_admin`], the same check as a middleware in front of
//! the admin routes a strategy contributes.
//!
//! The token is compared by its SHA-256 digest in constant time, so neither
//! its content nor its length shows in the answer time. A wrong token is
//! logged at WARN with the client's address (never the token), and an address
//! that sent [`MAX_FAILURES_PER_WINDOW`] wrong tokens within [`WINDOW`] is
//! answered `429` on every admin route until that window ends, right token or
//! not, so that guessing runs at a bounded rate. Rate limiting of everything
//! else belongs in front of the service (docs/security.md).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::web::AppError;

/// Wrong admin tokens one client address may send per [`WINDOW`] before it
/// is answered `429`: enough for a person who mistyped, far too few to guess
/// a token of 32 random bytes.
pub const MAX_FAILURES_PER_WINDOW: u32 = 10;

/// The fixed window of [`MAX_FAILURES_PER_WINDOW`], from an address's first
/// wrong token.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Addresses tracked at most; beyond it, windows that ended are dropped
/// first, then the table is cleared (an attacker with more addresses than
/// this is a matter for the edge in front of the service).
const MAX_TRACKED: usize = 100_000;

/// Proof that the request carried the admin bearer token: `401` without an
/// `Authorization: Bearer …` header, `403` with a wrong token, `429` from an
/// address that sent too many wrong ones lately. The token is never logged.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        authorize(state, &parts.headers, &parts.extensions).map(|()| Admin)
    }
}

/// Middleware of the admin routes that a strategy contributes: answers as
/// [`Admin`] does, before the route's own extractors run.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match authorize(&state, request.headers(), request.extensions()) {
        Ok(()) => next.run(request).await,
        Err(err) => err.into_response(),
    }
}

/// The check of [`Admin`] and [`require_admin`]: the client's address (from
/// the connection; absent when a test calls the router directly) is checked
/// against its recent failures first, then the token.
fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    extensions: &Extensions,
) -> Result<(), AppError> {
    let client = extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip());
    if let Some(retry_after) =
        client.and_then(|ip| state.admin_failures.blocked(ip, Instant::now()))
    {
        return Err(AppError::TooManyAttempts { retry_after });
    }
    let (expected, _) = state.config.admin_token();
    let result = check_bearer(headers.get(header::AUTHORIZATION), expected);
    if let Err(AppError::Forbidden) = &result {
        let failures = client.map(|ip| state.admin_failures.record(ip, Instant::now()));
        tracing::warn!(client = ?client, failures, "wrong admin token");
    }
    result
}

/// `Ok` when `authorization` is `Bearer <expected>`. The scheme name is
/// case-insensitive (RFC 9110, section 11.1); the tokens' SHA-256 digests are
/// compared in constant time. Errors: `Unauthorized` without a bearer token,
/// `Forbidden` with a wrong one.
fn check_bearer(authorization: Option<&HeaderValue>, expected: &str) -> Result<(), AppError> {
    let given = authorization
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
        .ok_or(AppError::Unauthorized)?;
    let (given, expected) = (Sha256::digest(given), Sha256::digest(expected));
    if bool::from(given[..].ct_eq(&expected[..])) { Ok(()) } else { Err(AppError::Forbidden) }
}

/// Wrong admin tokens per client address, in fixed windows of [`WINDOW`]
/// from each address's first failure.
#[derive(Default)]
pub struct AdminFailures {
    windows: Mutex<HashMap<IpAddr, Window>>,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl AdminFailures {
    /// How long `ip` must still wait when it used up its failures in the
    /// current window, else `None`.
    pub fn blocked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let windows = self.windows.lock().expect("no panic while held");
        let window = windows.get(&ip)?;
        let left = (window.started + WINDOW).saturating_duration_since(now);
        (window.failures >= MAX_FAILURES_PER_WINDOW && !left.is_zero()).then_some(left)
    }

    /// Counts one wrong token from `ip`; answers its failures in the window.
    pub fn record(&self, ip: IpAddr, now: Instant) -> u32 {
        let mut windows = self.windows.lock().expect("no panic while held");
        if windows.len() >= MAX_TRACKED && !windows.contains_key(&ip) {
            windows.retain(|_, window| now < window.started + WINDOW);
            if windows.len() >= MAX_TRACKED {
                windows.clear();
            }
        }
        let window = windows.entry(ip).or_insert(Window { started: now, failures: 0 });
        if now >= window.started + WINDOW {
            *window = Window { started: now, failures: 0 };
        }
        window.failures += 1;
        window.failures
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

    #[test]
    fn an_address_is_blocked_after_its_failures_until_its_window_ends() {
        let failures = AdminFailures::default();
        let (ip, other): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let start = Instant::now();
        for n in 1..MAX_FAILURES_PER_WINDOW {
            assert_eq!(failures.record(ip, start), n);
            assert_eq!(failures.blocked(ip, start), None, "after {n} failures");
        }
        failures.record(ip, start);
        let later = start + Duration::from_secs(20);
        assert_eq!(failures.blocked(ip, later), Some(WINDOW - Duration::from_secs(20)));
        assert_eq!(failures.blocked(other, later), None, "another address is not blocked");
        assert_eq!(failures.blocked(ip, start + WINDOW), None, "the window ended");
        assert_eq!(failures.record(ip, start + WINDOW), 1, "a new window starts");
    }
}
