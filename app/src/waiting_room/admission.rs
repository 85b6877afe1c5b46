//! The signed admission a buyer carries from the waiting room to the
//! purchase: an `HS256` JWT (RFC 7519) whose claims name the buyer (`sub`),
//! the sale, the permit held for it (`jti`, the permit's owner token) and
//! when it lapses (`exp`), for the audience `seckill-admission`.
//!
//! The key is derived from the admin token, which every instance of a
//! deployment shares: SHA-256 of a fixed label and the token, so that an
//! admission is never a valid admin token or buyer token, and no setting is
//! added. The signature lets an instance refuse a forged or foreign
//! admission without a round trip; that it is still unused is Redis's to
//! say (`consume.lua`).

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::sale::{SaleId, UserId};

/// The `aud` claim of every admission.
const AUDIENCE: &str = "seckill-admission";

/// The label hashed with the admin token into the signing key.
const KEY_LABEL: &[u8] = b"seckill waiting-room admission key\0";

/// Signs and checks admissions.
#[derive(Clone)]
pub struct AdmissionKey {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for AdmissionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdmissionKey(..)")
    }
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    sale: i64,
    jti: String,
    /// Seconds since the Unix epoch (rounded up from the admission's end in
    /// ms; Redis holds the exact end).
    exp: u64,
    aud: String,
}

/// What a valid admission says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub sale: SaleId,
    pub buyer: UserId,
    /// The owner token of the permit held for it.
    pub permit: String,
}

impl AdmissionKey {
    /// The key derived from `admin_token`.
    pub fn derive(admin_token: &str) -> Self {
        let secret = Sha256::new().chain_update(KEY_LABEL).chain_update(admin_token).finalize();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "sub", "aud", "jti"]);
        Self {
            encoding: EncodingKey::from_secret(&secret).expect("a 32-byte secret"),
            decoding: DecodingKey::from_secret(&secret).expect("a 32-byte secret"),
            validation,
        }
    }

    /// The admission of `admission` that lapses at `ends_ms` (ms since the
    /// Unix epoch, the Redis server's clock).
    pub fn sign(&self, admission: &Admission, ends_ms: u64) -> String {
        let claims = Claims {
            sub: admission.buyer.get().to_string(),
            sale: admission.sale.0,
            jti: admission.permit.clone(),
            exp: ends_ms.div_ceil(1000),
            aud: AUDIENCE.to_owned(),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .expect("HMAC signing of a small JSON object cannot fail")
    }

    /// What `token` admits, if its signature, audience and time hold.
    ///
    /// Errors: a short reason (`expired`, `not an admission of this
    /// service`), never a part of the token.
    pub fn verify(&self, token: &str) -> Result<Admission, &'static str> {
        use jsonwebtoken::errors::ErrorKind;
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|err| match err.kind() {
                ErrorKind::ExpiredSignature => "the admission has lapsed",
                _ => "not an admission of this service",
            })?;
        let claims = data.claims;
        let buyer = claims
            .sub
            .parse::<i64>()
            .ok()
            .and_then(|raw| UserId::parse(raw).ok())
            .ok_or("not an admission of this service")?;
        Ok(Admission { sale: SaleId(claims.sale), buyer, permit: claims.jti })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission() -> Admission {
        Admission { sale: SaleId(7), buyer: UserId::parse(42).unwrap(), permit: "ab12".into() }
    }

    fn in_ms(ms: u64) -> u64 {
        crate::buyer_token::now_s() * 1000 + ms
    }

    #[test]
    fn an_admission_reads_back_with_the_key_that_signed_it() {
        let key = AdmissionKey::derive("a-deployment-admin-token-of-32-bytes");
        let token = key.sign(&admission(), in_ms(30_000));
        assert_eq!(key.verify(&token), Ok(admission()));
    }

    #[test]
    fn another_deployments_admission_or_a_tampered_one_is_refused() {
        let key = AdmissionKey::derive("a-deployment-admin-token-of-32-bytes");
        let other = AdmissionKey::derive("another-deployment-admin-token-32b");
        let token = other.sign(&admission(), in_ms(30_000));
        assert_eq!(key.verify(&token), Err("not an admission of this service"));
        let mut tampered = key.sign(&admission(), in_ms(30_000)).into_bytes();
        let at = tampered.len() - 3;
        tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(key.verify(&tampered), Err("not an admission of this service"));
    }

    #[test]
    fn a_lapsed_admission_is_refused_without_leeway() {
        let key = AdmissionKey::derive("a-deployment-admin-token-of-32-bytes");
        let token = key.sign(&admission(), in_ms(0).saturating_sub(2_000));
        assert_eq!(key.verify(&token), Err("the admission has lapsed"));
    }

    #[test]
    fn a_buyer_token_signed_with_the_admin_token_is_no_admission() {
        let admin = "a-deployment-admin-token-of-32-bytes";
        let buyer = crate::buyer_token::mint_hs256(admin.as_bytes(), 42, in_ms(30_000) / 1000);
        assert!(AdmissionKey::derive(admin).verify(&buyer).is_err());
    }
}
