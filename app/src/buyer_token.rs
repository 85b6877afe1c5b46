//! Buyer tokens: the signed bearer credential that says who buys.
//!
//! A buyer token is a JWT (RFC 7519) whose `sub` claim is the buyer's user
//! id (a non-negative 64-bit integer, written as a string: `sub` is a
//! StringOrURI, RFC 7519 section 4.1.2) and
//! whose `exp` claim (seconds since the Unix epoch) is required and checked,
//! with [`LEEWAY_S`] of clock skew allowed. `nbf`, when present, is checked
//! too. The token is verified with one key from configuration:
//! - an HMAC secret of at least [`MIN_SECRET_BYTES`] (`HS256`), shared with
//!   whatever signs the tokens (a login service in front; the load test);
//! - or a public key in PEM form, RSA (`RS256`) or EC P-256 (`ES256`), when
//!   an identity provider signs with its private key and the service only
//!   verifies.
//!
//! Exactly one algorithm is accepted per key: a token whose header names
//! another (`none`, or `HS256` against a public key) is refused, so no token
//! can pick how it is checked. `iss` and `aud` are not checked: the key is
//! the service's own.
//!
//! The module knows nothing of HTTP: the extractor that reads the
//! `Authorization` header is `crate::web::buyer`.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Least length of an HMAC secret, in bytes: 256 bits, the size of the
/// `HS256` output (RFC 7518, section 3.2, requires a key of at least that
/// size).
pub const MIN_SECRET_BYTES: usize = 32;

/// Clock skew allowed on `exp` and `nbf`, in seconds (the library's
/// default).
pub const LEEWAY_S: u64 = 60;

/// A key that verifies buyer tokens (see the module description).
#[derive(Clone)]
pub struct BuyerVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for BuyerVerifier {
    /// Names the algorithm, never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuyerVerifier").field("algorithm", &self.algorithm()).finish()
    }
}

/// Why a token was refused. The messages name the problem, never the token.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the buyer token has expired")]
    Expired,
    #[error("the buyer token is not valid: {0}")]
    Invalid(String),
    #[error("the buyer token's `sub` is not a non-negative 64-bit integer")]
    BadSubject,
}

/// The claims the service reads.
#[derive(Deserialize)]
struct Claims {
    sub: String,
}

/// What [`mint_hs256`] signs.
#[derive(Serialize)]
struct MintedClaims {
    sub: String,
    exp: u64,
}

impl BuyerVerifier {
    /// Verifies `HS256` tokens signed with `secret`.
    ///
    /// Errors: a secret shorter than [`MIN_SECRET_BYTES`].
    pub fn hs256(secret: &[u8]) -> anyhow::Result<Self> {
        if secret.len() < MIN_SECRET_BYTES {
            anyhow::bail!(
                "the buyer token key is {} bytes long, shorter than {MIN_SECRET_BYTES}",
                secret.len()
            );
        }
        Ok(Self::with(DecodingKey::from_secret(secret)?, Algorithm::HS256))
    }

    /// Verifies tokens signed with the private key of `pem`, a public key:
    /// `RS256` for an RSA key, `ES256` for an EC P-256 key.
    ///
    /// Errors: `pem` is neither.
    pub fn public_key_pem(pem: &[u8]) -> anyhow::Result<Self> {
        if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
            return Ok(Self::with(key, Algorithm::RS256));
        }
        if let Ok(key) = DecodingKey::from_ec_pem(pem) {
            return Ok(Self::with(key, Algorithm::ES256));
        }
        anyhow::bail!("the buyer token public key is neither an RSA nor an EC public key in PEM")
    }

    fn with(key: DecodingKey, algorithm: Algorithm) -> Self {
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY_S;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self { key, validation }
    }

    /// The one algorithm this key accepts.
    pub fn algorithm(&self) -> Algorithm {
        self.validation.algorithms[0]
    }

    /// The buyer (`sub`) of `token` when its signature, algorithm and times
    /// hold.
    ///
    /// Errors: [`TokenError::Expired`] past `exp` (+ leeway);
    /// [`TokenError::Invalid`] for anything else wrong with the token
    /// (signature, algorithm, format, a missing claim, `nbf`);
    /// [`TokenError::BadSubject`] when `sub` is not a user id.
    pub fn verify(&self, token: &str) -> Result<i64, TokenError> {
        use jsonwebtoken::errors::ErrorKind;
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|err| {
                match err.kind() {
                    ErrorKind::ExpiredSignature => TokenError::Expired,
                    other => TokenError::Invalid(describe(other)),
                }
            })?;
        let user: i64 = data.claims.sub.parse().map_err(|_| TokenError::BadSubject)?;
        if user < 0 {
            return Err(TokenError::BadSubject);
        }
        Ok(user)
    }
}

/// A short description of a refusal, without any part of the token.
fn describe(kind: &jsonwebtoken::errors::ErrorKind) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::InvalidSignature => "wrong signature".to_owned(),
        ErrorKind::InvalidAlgorithm => "algorithm not accepted".to_owned(),
        ErrorKind::ImmatureSignature => "not valid yet (`nbf`)".to_owned(),
        ErrorKind::MissingRequiredClaim(claim) => format!("no `{claim}` claim"),
        ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Utf8(_) => {
            "not a JWT".to_owned()
        }
        // A header naming no known algorithm (`none`), or claims that do not
        // read.
        ErrorKind::Json(_) => "unreadable header or claims".to_owned(),
        _ => "refused".to_owned(),
    }
}

/// An `HS256` buyer token for `user`, valid until `exp` (seconds since the
/// Unix epoch), signed with `secret`: what a login service in front of the
/// service issues, and what the load test and the tests sign.
///
/// Panics when `secret` is empty.
pub fn mint_hs256(secret: &[u8], user: i64, exp: u64) -> String {
    let claims = MintedClaims { sub: user.to_string(), exp };
    let key = EncodingKey::from_secret(secret).expect("a non-empty secret");
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key)
        .expect("HMAC signing of a small JSON object cannot fail")
}

/// Seconds since the Unix epoch, now.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a-buyer-token-secret-of-32-bytes!";

    fn verifier() -> BuyerVerifier {
        BuyerVerifier::hs256(SECRET).unwrap()
    }

    #[test]
    fn a_token_signed_with_the_key_yields_its_subject() {
        let token = mint_hs256(SECRET, 1001, now_s() + 60);
        assert_eq!(verifier().verify(&token), Ok(1001));
    }

    #[test]
    fn an_expired_token_is_refused_beyond_the_leeway() {
        let token = mint_hs256(SECRET, 1, now_s() - LEEWAY_S - 5);
        assert_eq!(verifier().verify(&token), Err(TokenError::Expired));
        let within = mint_hs256(SECRET, 1, now_s() - 5);
        assert_eq!(verifier().verify(&within), Ok(1), "within the leeway");
    }

    #[test]
    fn a_token_signed_with_another_key_or_tampered_is_refused() {
        let other = mint_hs256(b"another-secret-another-secret-xx", 7, now_s() + 60);
        assert!(matches!(verifier().verify(&other), Err(TokenError::Invalid(_))));
        let token = mint_hs256(SECRET, 7, now_s() + 60);
        let mut parts: Vec<&str> = token.split('.').collect();
        // The payload of buyer 8, with buyer 7's signature.
        let forged = mint_hs256(SECRET, 8, now_s() + 60);
        parts[1] = forged.split('.').nth(1).unwrap();
        assert!(matches!(verifier().verify(&parts.join(".")), Err(TokenError::Invalid(_))));
        assert!(matches!(verifier().verify("not-a-jwt"), Err(TokenError::Invalid(_))));
    }

    #[test]
    fn an_unsigned_token_is_refused() {
        // `{"alg":"none","typ":"JWT"}` . `{"sub":"1","exp":4102444800}` . no
        // signature (base64url, RFC 7515).
        let token = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxIiwiZXhwIjo0MTAyNDQ0ODAwfQ.";
        assert!(matches!(verifier().verify(token), Err(TokenError::Invalid(_))));
    }

    #[test]
    fn exp_and_sub_are_required_and_sub_is_a_user_id() {
        let key = EncodingKey::from_secret(SECRET).unwrap();
        let sign = |claims: serde_json::Value| {
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
        };
        let exp = now_s() + 60;
        let no_exp = sign(serde_json::json!({ "sub": "1" }));
        assert!(matches!(verifier().verify(&no_exp), Err(TokenError::Invalid(_))));
        let no_sub = sign(serde_json::json!({ "exp": exp }));
        assert!(matches!(verifier().verify(&no_sub), Err(TokenError::Invalid(_))));
        for sub in ["alice", "-1", "1.5", ""] {
            let token = sign(serde_json::json!({ "sub": sub, "exp": exp }));
            assert_eq!(verifier().verify(&token), Err(TokenError::BadSubject), "{sub}");
        }
        // `sub` is a string (RFC 7519): a JSON number is no subject.
        let number = sign(serde_json::json!({ "sub": 42, "exp": exp }));
        assert!(matches!(verifier().verify(&number), Err(TokenError::Invalid(_))));
    }

    #[test]
    fn a_short_secret_is_refused_without_showing_it() {
        let error = BuyerVerifier::hs256(b"short-secret").unwrap_err().to_string();
        assert!(error.contains("12 bytes long"), "{error}");
        assert!(!error.contains("short-secret"), "{error}");
    }
}
