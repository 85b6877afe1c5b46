//! What every HTTP route of the service shares, whoever contributes the route
//! — the service's own router (`crate::http`) or a strategy that serves routes
//! of its own (the `queue` strategy's request results, the lock strategies'
//! statistics): [`AppError`], the one mapping of failures to problem+json
//! answers, extractors whose rejections are problems ([`ApiJson`],
//! [`SalePath`], [`Buyer`]), and the reading of integers in request bodies as the
//! OpenAPI document defines them ([`integer`]), and the choice between JSON
//! and the storefront's HTML on a route that serves both ([`prefers_html`]).
//!
//! It sits below the strategies so that their routes answer exactly like the
//! service's own. It knows nothing of routing or state, and of
//! authentication only the buyer's token ([`Buyer`], verified by
//! `crate::buyer_token`).

pub mod buyer;
pub mod error;
pub mod extract;
pub mod integer;
pub mod negotiate;

pub use buyer::{Buyer, BuyerAuth};
pub use error::{AppError, PROBLEM_TYPE_PREFIX, Problem, UnsortedTimeout};
pub use extract::{ApiJson, BuyerPath, SalePath};
pub use integer::{integer, optional_integer};
pub use negotiate::prefers_html;

#[cfg(test)]
mod tests {
    //! The mapping of every error to its status, problem type and headers.

    use std::time::Duration;

    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;

    use super::*;
    use crate::outcome::{Backend, Outcome, StrategyError};
    use crate::sale::InvalidInput;

    fn answer(err: AppError) -> (StatusCode, String, Option<String>) {
        let response = err.into_response();
        let header = |name| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(header(header::CONTENT_TYPE).as_deref(), Some("application/problem+json"));
        let retry_after = header(header::RETRY_AFTER);
        (response.status(), retry_after.unwrap_or_default(), header(header::WWW_AUTHENTICATE))
    }

    #[test]
    fn every_error_has_its_status_and_problem_type() {
        let unavailable = StrategyError::Unavailable {
            backend: Backend::Redis,
            source: anyhow::anyhow!("connection refused"),
        };
        let cases = [
            (AppError::BadRequest("x".into()), 400, "malformed-request"),
            (AppError::Unauthorized, 401, "unauthorized"),
            (AppError::Forbidden, 403, "forbidden"),
            (AppError::BuyerUnauthorized(None), 401, "unauthorized"),
            (AppError::BuyerMismatch, 403, "buyer-mismatch"),
            (
                AppError::TooManyAttempts { retry_after: Duration::from_secs(3) },
                429,
                "too-many-attempts",
            ),
            (AppError::NotFound("x".into()), 404, "not-found"),
            (AppError::MethodNotAllowed, 405, "method-not-allowed"),
            (AppError::PayloadTooLarge("x".into()), 413, "payload-too-large"),
            (AppError::UnsupportedMediaType("x".into()), 415, "unsupported-media-type"),
            (AppError::UnsupportedEncoding("x".into()), 415, "unsupported-encoding"),
            (InvalidInput::new("stock", "must be positive").into(), 422, "invalid-field"),
            (AppError::SoldOut, 409, "sold-out"),
            (AppError::AlreadyPurchased, 409, "already-purchased"),
            (AppError::NotStarted, 409, "not-started"),
            (AppError::Ended, 409, "ended"),
            (AppError::Timeout(Duration::from_secs(10)), 504, "timeout"),
            (unavailable.into(), 503, "unavailable"),
            (StrategyError::Internal(anyhow::anyhow!("bug")).into(), 500, "internal"),
            (sqlx::Error::PoolTimedOut.into(), 503, "unavailable"),
        ];
        let mut slugs = Vec::new();
        for (err, status, slug) in cases {
            let (code, found, _) = err.kind();
            assert_eq!((code.as_u16(), found), (status, slug), "{err:?}");
            slugs.push(slug);
        }
        let busy = StrategyError::Busy { reason: "lock wait ran out", retry_after: Duration::ZERO };
        assert_eq!(AppError::from(busy).kind().1, "busy");
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), 18, "every kind has a type of its own");
    }

    #[test]
    fn busy_and_unavailable_tell_when_to_retry_in_whole_seconds() {
        let busy = |millis| StrategyError::Busy {
            reason: "queue full",
            retry_after: Duration::from_millis(millis),
        };
        assert_eq!(answer(busy(1500).into()).1, "2", "rounded up");
        assert_eq!(answer(busy(0).into()).1, "1", "never 0");
        assert_eq!(answer(busy(3000).into()).1, "3");
        let down = StrategyError::Unavailable {
            backend: Backend::Postgres,
            source: anyhow::anyhow!("refused"),
        };
        assert_eq!(answer(down.into()), (StatusCode::SERVICE_UNAVAILABLE, "1".into(), None));
        assert_eq!(answer(AppError::SoldOut).1, "", "no Retry-After on a 409");
    }

    #[test]
    fn a_missing_token_asks_for_the_bearer_scheme() {
        let (status, _, challenge) = answer(AppError::Unauthorized);
        assert_eq!((status, challenge.as_deref()), (StatusCode::UNAUTHORIZED, Some("Bearer")));
        assert_eq!(answer(AppError::Forbidden).2, None);
        let missing = answer(AppError::BuyerUnauthorized(None));
        assert_eq!((missing.0, missing.2.as_deref()), (StatusCode::UNAUTHORIZED, Some("Bearer")));
        let refused = answer(AppError::BuyerUnauthorized(Some("expired".into())));
        assert_eq!(refused.2.as_deref(), Some(r#"Bearer error="invalid_token""#));
    }

    #[test]
    fn only_unsuccessful_outcomes_are_errors() {
        let placed = Outcome::Placed { order_id: 1, quantity: 1 };
        let accepted = Outcome::Accepted { request_id: uuid::Uuid::nil() };
        assert!(AppError::from_outcome(&placed).is_none());
        assert!(AppError::from_outcome(&accepted).is_none());
        let kind = |outcome| AppError::from_outcome(&outcome).unwrap().kind().1;
        assert_eq!(kind(Outcome::SoldOut), "sold-out");
        assert_eq!(kind(Outcome::AlreadyPurchased), "already-purchased");
        assert_eq!(kind(Outcome::NotStarted), "not-started");
        assert_eq!(kind(Outcome::Ended), "ended");
    }
}
