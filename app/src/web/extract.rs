//! Extractors whose rejections are problem documents: a body that is not
//! JSON is a `400`, a well-formed body that is not an object, or has a wrong
//! or missing field, a `422`, a path id that is not a number a `404`. (The
//! admin token is checked by the service's router, `crate::http`, for its own
//! admin routes and a strategy's alike.)

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use super::error::AppError;
use crate::sale::{InvalidInput, SaleId, UserId};

/// A JSON object body, as `T`, with problem+json rejections:
/// - `415 unsupported-encoding`: a `Content-Encoding` other than `identity`
///   (the service decodes none, and must not read compressed bytes as JSON);
/// - `415 unsupported-media-type`: no `application/json` (or `…+json`)
///   `Content-Type`;
/// - `413 payload-too-large`: over the router's body limit;
/// - `400 malformed-request`: not JSON;
/// - `422 invalid-field`: JSON that is not an object (serde would read an
///   array as the fields of a struct in order), or a field of the wrong type,
///   missing or unknown.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        refuse_content_coding(req.headers())?;
        if !is_json(req.headers()) {
            return Err(AppError::UnsupportedMediaType(
                "expected a body with `Content-Type: application/json`".to_owned(),
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|err| {
            if err.status() == StatusCode::PAYLOAD_TOO_LARGE {
                AppError::PayloadTooLarge(err.body_text())
            } else {
                AppError::BadRequest(err.body_text())
            }
        })?;
        let value = match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(value)) => value,
            Err(JsonRejection::JsonDataError(err)) => {
                return Err(InvalidInput::new("body", err.body_text()).into());
            }
            Err(err) => return Err(AppError::BadRequest(err.body_text())),
        };
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(InvalidInput::new("body", "must be a JSON object").into());
        }
        Ok(ApiJson(value))
    }
}

/// `Err(UnsupportedEncoding)` when the body carries a content coding other
/// than `identity` (RFC 9110, section 8.4).
fn refuse_content_coding(headers: &HeaderMap) -> Result<(), AppError> {
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let codings = value.to_str().unwrap_or("?");
        let decoded = codings.split(',').map(str::trim).filter(|c| !c.is_empty());
        if decoded.clone().any(|coding| !coding.eq_ignore_ascii_case("identity")) {
            return Err(AppError::UnsupportedEncoding(
                "the service decodes no Content-Encoding: send the body uncompressed".to_owned(),
            ));
        }
    }
    Ok(())
}

/// Whether the `Content-Type` is `application/json` or `application/…+json`
/// (parameters such as `charset` ignored), as `axum::Json` accepts.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The `{id}` of `/sales/{id}/…` routes (and, as `params(SalePath)`, its
/// description in the OpenAPI document).
#[derive(utoipa::IntoParams)]
#[into_params(names("id"), parameter_in = Path)]
pub struct SalePath(
    /// The sale's id.
    pub SaleId,
);

impl<S: Send + Sync> FromRequestParts<S> for SalePath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        path_id(parts, state, "sale").await.map(|id| SalePath(SaleId(id)))
    }
}

/// The one `{id}` of a route's path, as a 64-bit integer. An id that is not
/// one is `404 no such <thing>` (the id is not echoed back: it may be
/// anything, of any length); a route without one is a `400`.
pub async fn path_id<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    thing: &str,
) -> Result<i64, AppError> {
    match axum::extract::Path::<i64>::from_request_parts(parts, state).await {
        Ok(axum::extract::Path(id)) => Ok(id),
        Err(PathRejection::FailedToDeserializePathParams(_)) => {
            Err(AppError::NotFound(format!("no such {thing}: its id is a 64-bit integer")))
        }
        Err(err) => Err(AppError::BadRequest(err.body_text())),
    }
}

/// The `{id}` and `{user_id}` of `/sales/{id}/buyers/{user_id}/…` routes: a
/// sale and one of its buyers. An id that is not a 64-bit integer, or a
/// negative buyer, is a `404` (no such buyer can have anything there).
#[derive(utoipa::IntoParams)]
#[into_params(names("id", "user_id"), parameter_in = Path)]
pub struct BuyerPath(
    /// The sale's id.
    pub SaleId,
    /// The buyer: the `user_id` of their purchase.
    #[param(minimum = 0)]
    pub UserId,
);

impl<S: Send + Sync> FromRequestParts<S> for BuyerPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let not_found = || AppError::NotFound("no such sale or buyer".to_owned());
        match axum::extract::Path::<(i64, i64)>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path((id, user))) => {
                Ok(BuyerPath(SaleId(id), UserId::parse(user).map_err(|_| not_found())?))
            }
            Err(PathRejection::FailedToDeserializePathParams(_)) => Err(not_found()),
            Err(err) => Err(AppError::BadRequest(err.body_text())),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(name, value)| (name.clone(), HeaderValue::from_static(value))).collect()
    }

    #[test]
    fn json_and_structured_json_media_types_are_json() {
        for value in ["application/json", "Application/JSON; charset=utf-8", "application/x+json"] {
            assert!(is_json(&headers(&[(header::CONTENT_TYPE, value)])), "{value}");
        }
        for value in ["text/json", "application/jsonx", "text/plain", ""] {
            assert!(!is_json(&headers(&[(header::CONTENT_TYPE, value)])), "{value}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    #[test]
    fn only_the_identity_coding_is_read() {
        assert!(refuse_content_coding(&HeaderMap::new()).is_ok());
        assert!(refuse_content_coding(&headers(&[(header::CONTENT_ENCODING, "identity")])).is_ok());
        for value in ["gzip", "br", "identity, gzip", "x-custom"] {
            let refused = refuse_content_coding(&headers(&[(header::CONTENT_ENCODING, value)]));
            assert!(matches!(refused, Err(AppError::UnsupportedEncoding(_))), "{value}");
        }
    }
}
