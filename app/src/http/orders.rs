//! Order routes: `GET /orders/{id}`, `POST /orders/{id}/pay` and `POST
//! /orders/{id}/cancel`. Thin: the lifecycle is `crate::lifecycle`.
//!
//! Who may see, pay or cancel an order: with buyer authentication on, the
//! buyer of the request's token ([`Buyer`]) and no one else — another
//! buyer's order is answered `404`, as one that does not exist, and a body
//! naming another buyer is `403 buyer-mismatch`. With it off, the body may
//! name the buyer (`{"user_id": …}`), and an order of another buyer is then
//! answered `404`; with no body, the order id is the only credential.

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use serde::Deserialize;
use utoipa::ToSchema;

use super::AppState;
use crate::lifecycle::{self, IdempotencyKey, LifecycleError, OrderConflict, Owner};
use crate::sale::{Order, UserId};
use crate::web::{ApiJson, AppError, Buyer, integer};

/// The `{id}` of `/orders/{id}/…` routes. An id that is not a 64-bit
/// integer is a `404`.
#[derive(utoipa::IntoParams)]
#[into_params(names("id"), parameter_in = Path)]
pub struct OrderPath(
    /// The order's id (`order_id` of a placed purchase).
    pub i64,
);

impl<S: Send + Sync> FromRequestParts<S> for OrderPath {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        crate::web::extract::path_id(parts, state, "order").await.map(OrderPath)
    }
}

/// Optional body of `POST /orders/{id}/pay` and `/cancel`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderOwner {
    /// The buyer the caller acts for; the order must be theirs (else `404`).
    #[schema(minimum = 0)]
    #[serde(deserialize_with = "integer")]
    user_id: i64,
}

/// Who the caller may act for: the token's buyer with authentication on
/// (a body naming another is `403 buyer-mismatch`), else the buyer the body
/// names, if it names one.
async fn owner(buyer: Buyer, request: Request) -> Result<Owner, AppError> {
    let named = named_buyer(request).await?;
    match buyer {
        Buyer::Verified(user) if named.is_some_and(|named| named != user) => {
            Err(AppError::BuyerMismatch)
        }
        Buyer::Verified(user) => Ok(Owner(Some(user))),
        Buyer::Unverified => Ok(Owner(named)),
    }
}

/// The buyer named by the request's body, if it has one.
async fn named_buyer(request: Request) -> Result<Option<UserId>, AppError> {
    let empty = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .is_some_and(|length| length.as_bytes() == b"0")
        || (request.headers().get(header::CONTENT_LENGTH).is_none()
            && request.headers().get(header::TRANSFER_ENCODING).is_none());
    if empty {
        return Ok(None);
    }
    let ApiJson(body) = ApiJson::<OrderOwner>::from_request(request, &()).await?;
    Ok(Some(UserId::parse(body.user_id)?))
}

fn answer(err: LifecycleError) -> AppError {
    match err {
        LifecycleError::NotFound(id) => AppError::NotFound(format!("no order with id {id}")),
        LifecycleError::Strategy(err) => AppError::Strategy(err),
        LifecycleError::Conflict(conflict) => {
            let (slug, title) = match conflict {
                OrderConflict::Paid => ("order-paid", "Order paid"),
                OrderConflict::PaidUnderAnotherKey => {
                    ("paid-under-another-key", "Paid under another Idempotency-Key")
                }
                OrderConflict::Cancelled => ("order-cancelled", "Order cancelled"),
                OrderConflict::Expired => ("order-expired", "Order expired"),
            };
            AppError::OrderConflict { slug, title, detail: conflict.to_string() }
        }
    }
}

fn context(state: &AppState) -> lifecycle::Context<'_> {
    lifecycle::Context { db: &state.db, catalog: &state.catalog, strategies: &state.strategies }
}

/// `GET /orders/{id}`: the order and its status.
#[utoipa::path(
    get,
    path = "/orders/{id}",
    tag = "orders",
    params(OrderPath),
    responses((status = 200, description = "The order", body = Order)),
)]
pub async fn get_order(
    State(state): State<AppState>,
    buyer: Buyer,
    OrderPath(id): OrderPath,
) -> Result<Json<Order>, AppError> {
    let order = lifecycle::get(&state.db, id).await?;
    let visible = order.filter(|order| buyer.may_see(order.user_id.get()));
    visible.map(Json).ok_or_else(|| AppError::NotFound(format!("no order with id {id}")))
}

/// `POST /orders/{id}/pay`: a pending order becomes `paid` (idempotent: a
/// paid order is answered as it is). An `Idempotency-Key` is recorded with
/// the payment; a later payment under another key is refused.
#[utoipa::path(
    post,
    path = "/orders/{id}/pay",
    tag = "orders",
    params(OrderPath, ("Idempotency-Key" = Option<String>, Header,
        description = "1 to 255 visible ASCII characters identifying this payment")),
    request_body(content = Option<OrderOwner>, description = "Optional: the buyer paying"),
    responses(
        (status = 200, description = "The order, paid", body = Order),
        (status = 409, description = "`order-cancelled`, `order-expired` or \
            `paid-under-another-key`", body = crate::web::Problem,
            content_type = "application/problem+json"),
    ),
)]
pub async fn pay(
    State(state): State<AppState>,
    buyer: Buyer,
    OrderPath(id): OrderPath,
    headers: HeaderMap,
    request: Request,
) -> Result<Json<Order>, AppError> {
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(value) => Some(IdempotencyKey::parse(value.to_str().unwrap_or("\u{0}"))?),
    };
    let owner = owner(buyer, request).await?;
    lifecycle::pay(context(&state), id, owner, key).await.map(Json).map_err(answer)
}

/// `POST /orders/{id}/cancel`: a pending order is cancelled and its units
/// come back on sale (idempotent: a cancelled order is answered as it is).
#[utoipa::path(
    post,
    path = "/orders/{id}/cancel",
    tag = "orders",
    params(OrderPath),
    request_body(content = Option<OrderOwner>, description = "Optional: the buyer cancelling"),
    responses(
        (status = 200, description = "The order, cancelled", body = Order),
        (status = 409, description = "`order-paid` or `order-expired`", body = crate::web::Problem,
            content_type = "application/problem+json"),
    ),
)]
pub async fn cancel(
    State(state): State<AppState>,
    buyer: Buyer,
    OrderPath(id): OrderPath,
    request: Request,
) -> Result<Json<Order>, AppError> {
    let owner = owner(buyer, request).await?;
    lifecycle::cancel(context(&state), id, owner).await.map(Json).map_err(answer)
}
