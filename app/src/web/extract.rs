//! Extractors whose rejections are problem documents: malformed JSON is a
//! `400`, a well-formed body with a wrong or missing field a `422`, a path id
//! that is not a number a `404`. (The admin token is checked by the service's
//! router, `crate::http`, for its own admin routes and a strategy's alike.)

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

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
            // The id is not echoed back: it may be anything, of any length.
            Err(PathRejection::FailedToDeserializePathParams(_)) => {
                Err(AppError::NotFound("no such sale: a sale id is a 64-bit integer".to_owned()))
            }
            Err(err) => Err(AppError::BadRequest(err.body_text())),
        }
    }
}
