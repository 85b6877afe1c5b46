//! The buyer of a request: [`Buyer`], the extractor of every buyer route
//! (a purchase, a queued request's result, a buyer's order).
//!
//! With buyer authentication on (`SECKILL_BUYER_AUTH`, `crate::http::auth_settings`),
//! the buyer is the `sub` of the request's bearer token, verified by
//! `crate::buyer_token`; no token, or one that is invalid or expired, is
//! answered `401` with `WWW-Authenticate: Bearer`. With it off, the buyer is
//! whoever the request says (the purchase body's `user_id`, the order path's
//! `{user_id}`), trusted as sent.
//!
//! The extractor reads the configured verifier from the request's
//! extensions ([`BuyerAuth`], added by the service's router), so that a
//! strategy's own routes use it with any state.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::error::AppError;
use crate::buyer_token::BuyerVerifier;
use crate::outcome::StrategyError;
use crate::sale::{InvalidInput, UserId};

/// Buyer authentication as configured: the verifier when it is on, `None`
/// when the buyer is taken from the request. A request extension of every
/// route.
#[derive(Clone, Debug)]
pub struct BuyerAuth(pub Option<Arc<BuyerVerifier>>);

/// Who the request acts for: the verified buyer of its token, or — buyer
/// authentication off — whoever the request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buyer {
    /// The `sub` of a verified buyer token.
    Verified(UserId),
    /// Buyer authentication is off: the request's own `user_id` counts.
    Unverified,
}

impl<S: Send + Sync> FromRequestParts<S> for Buyer {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        let Some(auth) = parts.extensions.get::<BuyerAuth>() else {
            // Fail closed: a router without the extension is a bug.
            let missing = anyhow::anyhow!("the router did not add BuyerAuth");
            return Err(AppError::Strategy(StrategyError::Internal(missing)));
        };
        match &auth.0 {
            None => Ok(Buyer::Unverified),
            Some(verifier) => verified(verifier, &parts.headers).map(Buyer::Verified),
        }
    }
}

/// The buyer of `headers`' bearer token. The scheme name is
/// case-insensitive (RFC 9110, section 11.1).
fn verified(verifier: &BuyerVerifier, headers: &HeaderMap) -> Result<UserId, AppError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token.trim()))
        .filter(|token| !token.is_empty())
        .ok_or(AppError::BuyerUnauthorized(None))?;
    let user =
        verifier.verify(token).map_err(|err| AppError::BuyerUnauthorized(Some(err.to_string())))?;
    UserId::parse(user).map_err(|_| AppError::BuyerUnauthorized(Some("bad `sub`".to_owned())))
}

impl Buyer {
    /// The buyer of a purchase whose body says `claimed` (its `user_id`).
    ///
    /// Errors: authentication on and `claimed` another buyer than the
    /// token's (`403 buyer-mismatch`: refused rather than ignored, so that a
    /// client never buys for someone it did not mean); authentication off
    /// and no `user_id`, or a negative one (`422`).
    pub fn purchaser(self, claimed: Option<i64>) -> Result<UserId, AppError> {
        match (self, claimed) {
            (Buyer::Verified(user), Some(claimed)) if claimed != user.get() => {
                Err(AppError::BuyerMismatch)
            }
            (Buyer::Verified(user), _) => Ok(user),
            (Buyer::Unverified, Some(claimed)) => Ok(UserId::parse(claimed)?),
            (Buyer::Unverified, None) => Err(InvalidInput::new(
                "user_id",
                "is required while buyer authentication is off (SECKILL_BUYER_AUTH=off)",
            )
            .into()),
        }
    }

    /// Whether this caller may see what belongs to `owner` (a request's or
    /// an order's buyer): its own only, or anything with authentication off.
    /// A route answers `404` for what the caller may not see, as for what
    /// does not exist, so that nothing tells another buyer's request apart
    /// from none.
    pub fn may_see(self, owner: i64) -> bool {
        self.owner().is_none_or(|user| user.get() == owner)
    }

    /// The buyer whose things alone this caller may see; `None`: anyone's.
    pub fn owner(self) -> Option<UserId> {
        match self {
            Buyer::Verified(user) => Some(user),
            Buyer::Unverified => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;
    use crate::buyer_token::{mint_hs256, now_s};

    const SECRET: &[u8] = b"a-buyer-token-secret-of-32-bytes!";

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn the_buyer_is_the_sub_of_a_valid_bearer_token() {
        let verifier = BuyerVerifier::hs256(SECRET).unwrap();
        let token = mint_hs256(SECRET, 77, now_s() + 60);
        let user = verified(&verifier, &headers(Some(&format!("bearer {token}")))).unwrap();
        assert_eq!(user.get(), 77);
    }

    #[test]
    fn no_token_and_a_refused_token_are_told_apart() {
        let verifier = BuyerVerifier::hs256(SECRET).unwrap();
        for missing in [None, Some("Basic abc"), Some("Bearer "), Some("Bearer")] {
            let answer = verified(&verifier, &headers(missing));
            assert!(matches!(answer, Err(AppError::BuyerUnauthorized(None))), "{missing:?}");
        }
        let expired = mint_hs256(SECRET, 77, now_s() - 3600);
        let answer = verified(&verifier, &headers(Some(&format!("Bearer {expired}"))));
        assert!(
            matches!(answer, Err(AppError::BuyerUnauthorized(Some(why))) if why.contains("expired"))
        );
    }

    #[test]
    fn a_purchase_body_may_repeat_the_verified_buyer_but_not_name_another() {
        let user = UserId::parse(5).unwrap();
        let verified = Buyer::Verified(user);
        assert_eq!(verified.purchaser(None).unwrap(), user);
        assert_eq!(verified.purchaser(Some(5)).unwrap(), user);
        assert!(matches!(verified.purchaser(Some(6)), Err(AppError::BuyerMismatch)));
        assert_eq!(Buyer::Unverified.purchaser(Some(6)).unwrap().get(), 6);
        assert!(matches!(Buyer::Unverified.purchaser(None), Err(AppError::Invalid(_))));
        assert!(matches!(Buyer::Unverified.purchaser(Some(-1)), Err(AppError::Invalid(_))));
    }

    #[test]
    fn a_verified_buyer_sees_their_own_only() {
        let verified = Buyer::Verified(UserId::parse(5).unwrap());
        assert!(verified.may_see(5) && !verified.may_see(6));
        assert!(Buyer::Unverified.may_see(6));
    }
}
