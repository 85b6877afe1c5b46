//! Extractors whose rejections are problem documents: malformed JSON is a
//! `400`, a well-formed body with a wrong or missing field a `422`, a path id
//! that is not a number a `404`, and admin routes check the bearer token.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::AppError;
use crate::sale::{InvalidInput, SaleId};

/// `axum::Json` with problem+json rejections.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(JsonRejection::JsonDataError(err)) => {
                Err(AppError::Invalid(InvalidInput::new("body", err.body_text())))
            }
            Err(JsonRejection::MissingJsonContentType(err)) => {
                Err(AppError::UnsupportedMediaType(err.body_text()))
            }
            Err(JsonRejection::BytesRejection(err))
                if err.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(AppError::PayloadTooLarge(err.body_text()))
            }
            Err(err) => Err(AppError::BadRequest(err.body_text())),
        }
    }
}

/// The `{id}` of `/sales/{id}/…` routes.
pub struct SalePath(pub SaleId);

impl<S: Send + Sync> FromRequestParts<S> for SalePath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<i64>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(id)) => Ok(SalePath(SaleId(id))),
            Err(PathRejection::FailedToDeserializePathParams(err)) => {
                Err(AppError::NotFound(format!("no sale with id {}", err.body_text())))
            }
            Err(err) => Err(AppError::BadRequest(err.body_text())),
        }
    }
}

/// Proof that the request carried the admin bearer token: `401` without an
/// `Authorization: Bearer …` header, `403` with a wrong token. The comparison
/// takes constant time, and the token is never logged.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .ok_or(AppError::Unauthorized)?;
        let (expected, _) = state.config.admin_token();
        if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
            Ok(Admin)
        } else {
            Err(AppError::Forbidden)
        }
    }
}
