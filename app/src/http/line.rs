//! The waiting room's routes (`crate::waiting_room`): `POST
//! /sales/{id}/line` (join), `GET /sales/{id}/line/{user_id}` (look at the
//! place; counts as still being there) and `DELETE
//! /sales/{id}/line/{user_id}` (leave).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::AppState;
use crate::sale::{Sale, SaleId};
use crate::waiting_room::{Place, RoomError};
use crate::web::{ApiJson, AppError, Buyer, BuyerPath, SalePath, optional_integer};

impl From<RoomError> for AppError {
    fn from(err: RoomError) -> Self {
        match err {
            RoomError::NoRoom => AppError::NotFound(err.to_string()),
            RoomError::NotInLine => AppError::NotInLine(err.to_string()),
            RoomError::AdmissionRequired => AppError::AdmissionRequired(err.to_string()),
            RoomError::AdmissionRefused(why) => AppError::AdmissionRefused(why.to_owned()),
            RoomError::AdmissionUsed => AppError::AdmissionRefused(err.to_string()),
            RoomError::Ended => AppError::Ended,
            RoomError::Backend(err) => AppError::Strategy(err),
        }
    }
}

/// Body of `POST /sales/{id}/line`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinLine {
    /// The buyer, as in a purchase: required while buyer authentication is
    /// off; with it on, the token's `sub` (another is `403 buyer-mismatch`).
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "optional_integer")]
    user_id: Option<i64>,
}

async fn sale_of(state: &AppState, id: SaleId) -> Result<std::sync::Arc<Sale>, AppError> {
    state.catalog.get(&state.db, id).await?.ok_or_else(|| AppError::no_such_sale(id))
}

/// A place, never cached: it changes with every admission.
fn answer(place: Place) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Json(place)).into_response()
}

/// `POST /sales/{id}/line` → `200` with the buyer's place: joins the sale's
/// waiting room, once (joining again keeps the place). Look at the place at
/// least every 10 s (`GET`), or it is lost.
#[utoipa::path(
    post,
    path = "/sales/{id}/line",
    tag = "waiting room",
    params(SalePath),
    request_body = JoinLine,
    responses(
        (status = 200, description = "The buyer's place: `waiting`, `admitted` (with the \
            admission to buy with) or `sold_out`", body = Place),
        (status = 404, description = "`not-found`: no such sale, or a sale without a waiting \
            room", body = crate::web::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`ended`: the sale has ended", body = crate::web::Problem,
            content_type = "application/problem+json"),
    ),
)]
pub async fn join(
    State(state): State<AppState>,
    buyer: Buyer,
    SalePath(id): SalePath,
    ApiJson(body): ApiJson<JoinLine>,
) -> Result<Response, AppError> {
    let user = buyer.purchaser(body.user_id)?;
    let sale = sale_of(&state, id).await?;
    Ok(answer(state.room.join(&sale, user).await?))
}

/// `GET /sales/{id}/line/{user_id}` → `200` with the buyer's place; counts
/// as the buyer still being in line. With buyer authentication on, only the
/// token's buyer's own (another's is `404`).
#[utoipa::path(
    get,
    path = "/sales/{id}/line/{user_id}",
    tag = "waiting room",
    params(BuyerPath),
    responses(
        (status = 200, description = "The buyer's place", body = Place),
        (status = 404, description = "`not-in-line`: no place (never joined, left, dropped \
            after not looking for 10 s, or lost with Redis): join again; or `not-found`",
            body = crate::web::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`ended`: the sale has ended", body = crate::web::Problem,
            content_type = "application/problem+json"),
    ),
)]
pub async fn look(
    State(state): State<AppState>,
    buyer: Buyer,
    BuyerPath(id, user): BuyerPath,
) -> Result<Response, AppError> {
    if !buyer.may_see(user.get()) {
        return Err(RoomError::NotInLine.into());
    }
    let sale = sale_of(&state, id).await?;
    Ok(answer(state.room.look(&sale, user).await?))
}

/// `DELETE /sales/{id}/line/{user_id}` → `204`: the buyer leaves the line,
/// or gives up their admission (its permit goes to the next buyer).
#[utoipa::path(
    delete,
    path = "/sales/{id}/line/{user_id}",
    tag = "waiting room",
    params(BuyerPath),
    responses((status = 204, description = "The buyer has no place any more")),
)]
pub async fn leave(
    State(state): State<AppState>,
    buyer: Buyer,
    BuyerPath(id, user): BuyerPath,
) -> Result<StatusCode, AppError> {
    if !buyer.may_see(user.get()) {
        return Err(RoomError::NotInLine.into());
    }
    let sale = sale_of(&state, id).await?;
    state.room.leave(&sale, user).await?;
    Ok(StatusCode::NO_CONTENT)
}
