//! Public routes: `GET /sales/{id}` (JSON, or the storefront page for a
//! browser), `POST /sales/{id}/orders` and `GET
//! /sales/{id}/buyers/{user_id}/order`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{AppState, storefront};
use crate::outcome::Outcome;
use crate::purchase::{self, PurchaseError, purchase};
use crate::sale::{self, Order, Phase, SaleId, UserId, WaitingRoomSettings};
use crate::strategy_name::StrategyName;
use crate::web::{
    ApiJson, AppError, Buyer, BuyerPath, Problem, SalePath, optional_integer, prefers_html,
};

/// A sale as a buyer sees it.
#[derive(Serialize, ToSchema)]
pub struct SaleStatus {
    id: SaleId,
    name: String,
    strategy: StrategyName,
    /// Units one buyer may take, in one order.
    per_user_limit: i32,
    total_stock: i64,
    remaining_stock: i64,
    status: Availability,
    /// The sale opens at this time (inclusive); `null`: open from the start.
    starts_at: Option<DateTime<Utc>>,
    /// The sale ends at this time (exclusive); `null`: never.
    ends_at: Option<DateTime<Utc>>,
    /// The sale's waiting room: buyers join its line (`POST
    /// /sales/{id}/line`) and buy with the admission it gives; `null`:
    /// buyers buy directly.
    waiting_room: Option<WaitingRoomSettings>,
    /// The service's clock when it read the sale (`status` is as of this
    /// time): a client counts down to `starts_at` or `ends_at` from it, not
    /// from its own clock.
    now: DateTime<Utc>,
}

/// Where a sale stands: before its window, open with stock, open without
/// stock, after its window.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    NotStarted,
    Open,
    SoldOut,
    Ended,
}

/// `GET /sales/{id}`: remaining stock (read from Postgres), status, window
/// and the service's clock; or, for a browser that prefers `text/html`
/// ([`prefers_html`]), the storefront page of the sale, which reads the same
/// JSON.
#[utoipa::path(
    get,
    path = "/sales/{id}",
    tag = "sales",
    params(SalePath),
    responses((status = 200, description = "The sale's stock and status; the storefront page \
        instead when `Accept` prefers `text/html` to `application/json` (JSON is the default)",
        content((SaleStatus = "application/json"), (String = "text/html")))),
)]
pub async fn get_sale(
    State(state): State<AppState>,
    SalePath(id): SalePath,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    if prefers_html(&headers) {
        return Ok(storefront::page(&headers));
    }
    let not_found = || AppError::no_such_sale(id);
    let sale = state.catalog.get(&state.db, id).await?.ok_or_else(not_found)?;
    let stock = sale::stock(&state.db, id).await?.ok_or_else(not_found)?;
    let now = Utc::now();
    let status = match sale.phase(now) {
        Phase::NotStarted => Availability::NotStarted,
        Phase::Ended => Availability::Ended,
        Phase::Open if stock.remaining_stock == 0 => Availability::SoldOut,
        Phase::Open => Availability::Open,
    };
    let body = SaleStatus {
        id,
        name: sale.name.clone(),
        strategy: sale.strategy,
        per_user_limit: sale.per_user_limit,
        total_stock: stock.total_stock,
        remaining_stock: stock.remaining_stock,
        status,
        starts_at: sale.starts_at,
        ends_at: sale.ends_at,
        waiting_room: sale.waiting_room.settings(),
        now,
    };
    // The answer is as of `now`: a cache must not serve it later.
    Ok(([(header::CACHE_CONTROL, "no-store")], Json(body)).into_response())
}

/// `GET /sales/{id}/buyers/{user_id}/order`: the order the buyer holds in the
/// sale, e.g. after a retried purchase was answered `409 already-purchased`
/// (the first attempt had placed it). With buyer authentication on, only
/// the token's buyer's own: `{user_id}` of another buyer is answered `404`,
/// as a buyer without an order is (existence is not revealed).
#[utoipa::path(
    get,
    path = "/sales/{id}/buyers/{user_id}/order",
    tag = "sales",
    params(BuyerPath),
    responses((status = 200, description = "The buyer's order", body = Order)),
)]
pub async fn buyer_order(
    State(state): State<AppState>,
    buyer: Buyer,
    BuyerPath(id, user): BuyerPath,
) -> Result<Json<Order>, AppError> {
    let none = || AppError::NotFound("this buyer has no order of this sale".into());
    if !buyer.may_see(user.get()) {
        return Err(none());
    }
    let order = sale::order_of(&state.db, id, user).await?;
    order.map(Json).ok_or_else(none)
}

/// Body of `POST /sales/{id}/orders`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlaceOrder {
    /// The buyer: any non-negative 64-bit integer. Required while buyer
    /// authentication is off; with it on the buyer is the bearer token's
    /// `sub`, and a `user_id` other than it is refused (`403
    /// buyer-mismatch`).
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "optional_integer")]
    user_id: Option<i64>,
    /// Units to buy, up to the sale's `per_user_limit`.
    #[schema(minimum = 1, maximum = 1_000_000, default = 1)]
    #[serde(default, deserialize_with = "optional_integer")]
    quantity: Option<i64>,
    /// The admission of a sale with a waiting room (its line's `admitted`
    /// place gives it); required there, refused elsewhere. Used up by the
    /// purchase.
    #[serde(default)]
    admission: Option<String>,
}

/// Body of a `201 Created` purchase.
#[derive(Serialize, ToSchema)]
pub struct OrderPlaced {
    order_id: i64,
    sale_id: SaleId,
    user_id: UserId,
    quantity: i32,
}

/// Body of a `202 Accepted` purchase (`queue` sales).
#[derive(Serialize, ToSchema)]
pub struct PurchaseAccepted {
    request_id: uuid::Uuid,
    sale_id: SaleId,
    user_id: UserId,
    /// Where the result will be: `/sales/{id}/requests/{request_id}`.
    location: String,
}

/// `POST /sales/{id}/orders` → `201` with the order, `202` with a request id
/// and a `Location` to poll (`queue` sales), or a problem (see docs/api.md
/// for every status and problem type).
#[utoipa::path(
    post,
    path = "/sales/{id}/orders",
    tag = "sales",
    params(SalePath),
    request_body = PlaceOrder,
    responses(
        (status = 201, description = "The order was placed", body = OrderPlaced),
        (status = 202, description = "Accepted for settlement (`queue` sales); the result will be \
            at `location`. The same buyer again gets the same request.", body = PurchaseAccepted,
            headers(("Location" = String, description = "`/sales/{id}/requests/{request_id}`"))),
        (status = 403, description = "`admission-required`: the sale has a waiting room and no \
            `admission` was sent; `admission-refused`: the admission is forged, another buyer's \
            or sale's, lapsed, used already, or lost with Redis; `buyer-mismatch`", body = Problem,
            content_type = "application/problem+json"),
        (status = 409, description = "`sold-out`, `already-purchased`, `not-started` or `ended`",
            body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`busy`: back-pressure. Besides the causes every route \
            shares (every Postgres connection in use, too many open connections, a backing \
            server overloaded), a `lock/*` sale's own: its lock wait ran out \
            (`SECKILL_LOCK_WAIT_MS`), its critical section was cut off at \
            `SECKILL_LOCK_HOLD_MS` (its write may still land: a retry then answers \
            `already-purchased`), a newer holder fenced it off, or its lock was lost or granted \
            too late; for `queue`, the broker refused the message. `Retry-After` says when to \
            retry. Or `unavailable`, `misconfigured`: a backing server, named in `backend`, is \
            down or refuses this service", body = Problem,
            content_type = "application/problem+json",
            headers(("Retry-After" = String, description = "Whole seconds to wait before \
                retrying (absent on `misconfigured`)"))),
    ),
)]
pub async fn place_order(
    State(state): State<AppState>,
    buyer: Buyer,
    SalePath(id): SalePath,
    ApiJson(body): ApiJson<PlaceOrder>,
) -> Result<Response, AppError> {
    let user = buyer.purchaser(body.user_id)?;
    let context = purchase::Context {
        db: &state.db,
        catalog: &state.catalog,
        strategies: &state.strategies,
        probe: &state.probe,
        known_buyers: &state.known_buyers,
        room: &state.room,
    };
    let admission = body.admission.as_deref();
    let outcome =
        purchase(context, id, user, body.quantity, admission).await.map_err(|err| match err {
            PurchaseError::UnknownSale(id) => AppError::no_such_sale(id),
            PurchaseError::Invalid(invalid) => AppError::Invalid(invalid),
            PurchaseError::Strategy(err) => AppError::Strategy(err),
            PurchaseError::Room(refused) => refused.into(),
        })?;
    match outcome {
        Outcome::Placed { order_id, quantity } => Ok((
            StatusCode::CREATED,
            Json(OrderPlaced { order_id, sale_id: id, user_id: user, quantity }),
        )
            .into_response()),
        Outcome::Accepted { request_id } => {
            let location = format!("/sales/{}/requests/{request_id}", id.0);
            Ok((
                StatusCode::ACCEPTED,
                [(header::LOCATION, location.clone())],
                Json(PurchaseAccepted { request_id, sale_id: id, user_id: user, location }),
            )
                .into_response())
        }
        other => Err(AppError::from_outcome(&other).expect("not a success")),
    }
}
