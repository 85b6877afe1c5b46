//! Admin routes (bearer token required): create a sale, restock it, audit it,
//! reconcile it.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Admin;
use crate::audit::{self, Audit};
use crate::sale::{InvalidInput, Knobs, SALE_COLUMNS, Sale, Stock, WaitingRoomSettings};
use crate::strategy::{Reconciliation, StrategyName, UnknownStrategy};
use crate::web::{ApiJson, AppError, SalePath, integer, optional_integer};

/// Upper bound on stock figures, so that sums stay far from `i64::MAX`.
const MAX_UNITS: i64 = 1_000_000_000_000;

/// Body of `POST /admin/sales`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSale {
    /// No control character, at least one character that is not whitespace;
    /// trimmed before it is stored.
    // The pattern says what `validate` checks with Rust's character classes:
    // `char::is_control` is U+0000–U+001F and U+007F–U+009F, and
    // `char::is_whitespace` adds U+0020, U+00A0, U+1680, U+2000–U+200A,
    // U+2028, U+2029, U+202F, U+205F and U+3000.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F]*[^\u0000-\u0020\u007F-\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000][^\u0000-\u001F\u007F-\u009F]*$"
    )]
    name: String,
    /// Initial stock, units.
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    #[serde(deserialize_with = "integer")]
    stock: i64,
    #[schema(value_type = StrategyName)]
    strategy: String,
    /// Units one user may buy, in one order.
    #[schema(minimum = 1, maximum = 1_000_000, default = 1)]
    #[serde(default, deserialize_with = "optional_integer")]
    per_user_limit: Option<i32>,
    /// Opening time (inclusive), RFC 3339, within the years 1 to 9999 in UTC;
    /// stored to the microsecond. Absent: open from the start.
    starts_at: Option<DateTime<Utc>>,
    /// Closing time (exclusive), as `starts_at`, after it. Absent: never.
    ends_at: Option<DateTime<Utc>>,
    /// Lease of `lock/*` strategies, milliseconds.
    #[schema(minimum = 1, maximum = 600_000, default = 2000)]
    #[serde(default, deserialize_with = "optional_integer")]
    lock_lease_ms: Option<i32>,
    /// Simulated work inside the critical section or transaction,
    /// milliseconds, ±50 % jitter.
    #[schema(minimum = 0, maximum = 600_000, default = 0)]
    #[serde(default, deserialize_with = "optional_integer")]
    work_ms: Option<i32>,
    /// Length of a stall inside the critical section, milliseconds.
    #[schema(minimum = 0, maximum = 600_000, default = 0)]
    #[serde(default, deserialize_with = "optional_integer")]
    pause_ms: Option<i32>,
    /// Fraction of purchases that stall for `pause_ms`.
    #[schema(minimum = 0, maximum = 1, default = 0)]
    pause_ratio: Option<f64>,
    /// Rows the stock is split over, for a strategy that splits it (its
    /// [`crate::strategy::Strategy::buckets`] decides the default and range:
    /// 1–1024, 8 by default, for `sql/buckets`; `422` on any other strategy).
    #[schema(minimum = 1, maximum = 1024)]
    #[serde(default, deserialize_with = "optional_integer")]
    buckets: Option<i32>,
    /// How long a buyer has to pay, milliseconds (1 ms to 7 days): orders
    /// start `pending_payment` and expire, their units returned, unless paid
    /// within it (`POST /orders/{id}/pay`). Absent: orders are final when
    /// placed. `422` on a strategy that does not return units.
    #[schema(minimum = 1, maximum = 604_800_000)]
    #[serde(default, deserialize_with = "optional_integer")]
    payment_window_ms: Option<i32>,
    /// A waiting room in front of the sale (docs/waiting-room.md): buyers
    /// join its line and buy only once admitted. Absent: buyers buy directly.
    #[serde(default, deserialize_with = "object")]
    waiting_room: Option<NewWaitingRoom>,
}

/// The waiting room of a new sale: at least one of its two bounds.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewWaitingRoom {
    /// Admissions per second, at most.
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(default, deserialize_with = "optional_integer")]
    admissions_per_s: Option<i32>,
    /// Buyers admitted and not yet served at once, at most.
    #[schema(minimum = 1, maximum = 1_000_000)]
    #[serde(default, deserialize_with = "optional_integer")]
    concurrency: Option<i32>,
    /// How long an admission may be used, milliseconds.
    #[schema(minimum = 100, maximum = 600_000, default = 30_000)]
    #[serde(default, deserialize_with = "optional_integer")]
    admission_ttl_ms: Option<i32>,
}

/// An optional JSON object, and only an object: serde would also read a
/// struct from an array, field by field in order.
fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value @ serde_json::Value::Object(_)) => {
            serde_json::from_value(value).map(Some).map_err(D::Error::custom)
        }
        Some(_) => Err(D::Error::custom("waiting_room: must be an object")),
    }
}

/// How long an admission lasts when the sale does not say: long enough to
/// press "buy" after being let in, short enough that an unused admission
/// soon lets the next buyer in.
pub const DEFAULT_ADMISSION_TTL_MS: i32 = 30_000;

impl NewWaitingRoom {
    fn validate(self) -> Result<WaitingRoomSettings, InvalidInput> {
        let bound = |field: &'static str, value: Option<i32>| match value {
            Some(v) if !(1..=1_000_000).contains(&v) => {
                Err(InvalidInput::new(field, "must be between 1 and 1000000"))
            }
            _ => Ok(value),
        };
        let admissions_per_s = bound("waiting_room.admissions_per_s", self.admissions_per_s)?;
        let concurrency = bound("waiting_room.concurrency", self.concurrency)?;
        if admissions_per_s.is_none() && concurrency.is_none() {
            return Err(InvalidInput::new(
                "waiting_room",
                "needs admissions_per_s, concurrency or both",
            ));
        }
        let admission_ttl_ms = self.admission_ttl_ms.unwrap_or(DEFAULT_ADMISSION_TTL_MS);
        if !(100..=600_000).contains(&admission_ttl_ms) {
            return Err(InvalidInput::new(
                "waiting_room.admission_ttl_ms",
                "must be between 100 and 600000 ms",
            ));
        }
        Ok(WaitingRoomSettings { admissions_per_s, concurrency, admission_ttl_ms })
    }
}

/// The longest payment window, milliseconds: 7 days (the column's check).
pub const MAX_PAYMENT_WINDOW_MS: i32 = 604_800_000;

impl NewSale {
    fn validate(self) -> Result<(String, i64, StrategyName, i32, Knobs, Window), InvalidInput> {
        if !(1..=200).contains(&self.name.chars().count()) {
            return Err(InvalidInput::new("name", "must be 1 to 200 characters"));
        }
        if self.name.chars().any(char::is_control) {
            return Err(InvalidInput::new("name", "must not contain control characters"));
        }
        let name = self.name.trim().to_owned();
        if name.is_empty() {
            return Err(InvalidInput::new("name", "must not be only whitespace"));
        }
        if !(0..=MAX_UNITS).contains(&self.stock) {
            return Err(InvalidInput::new("stock", format!("must be between 0 and {MAX_UNITS}")));
        }
        let strategy: StrategyName = self
            .strategy
            .parse()
            .map_err(|err: UnknownStrategy| InvalidInput::new("strategy", err.to_string()))?;
        let per_user_limit = self.per_user_limit.unwrap_or(1);
        if !(1..=1_000_000).contains(&per_user_limit) {
            return Err(InvalidInput::new("per_user_limit", "must be between 1 and 1000000"));
        }
        let starts_at = self.starts_at.map(|t| storable("starts_at", t)).transpose()?;
        let ends_at = self.ends_at.map(|t| storable("ends_at", t)).transpose()?;
        if let (Some(start), Some(end)) = (starts_at, ends_at)
            && start >= end
        {
            return Err(InvalidInput::new("ends_at", "must be after starts_at"));
        }
        let ms = |field: &'static str, value: Option<i32>, default: i32, min: i32| {
            let value = value.unwrap_or(default);
            if (min..=600_000).contains(&value) {
                Ok(value)
            } else {
                Err(InvalidInput::new(field, format!("must be between {min} and 600000 ms")))
            }
        };
        let pause_ratio = self.pause_ratio.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&pause_ratio) {
            return Err(InvalidInput::new("pause_ratio", "must be between 0 and 1"));
        }
        let knobs = Knobs {
            lock_lease_ms: ms("lock_lease_ms", self.lock_lease_ms, 2000, 1)?,
            work_ms: ms("work_ms", self.work_ms, 0, 0)?,
            pause_ms: ms("pause_ms", self.pause_ms, 0, 0)?,
            pause_ratio,
        };
        if let Some(ms) = self.payment_window_ms
            && !(1..=MAX_PAYMENT_WINDOW_MS).contains(&ms)
        {
            return Err(InvalidInput::new(
                "payment_window_ms",
                format!("must be between 1 and {MAX_PAYMENT_WINDOW_MS} ms"),
            ));
        }
        let waiting_room = self.waiting_room.map(NewWaitingRoom::validate).transpose()?;
        let window =
            Window { starts_at, ends_at, payment_window_ms: self.payment_window_ms, waiting_room };
        Ok((name, self.stock, strategy, per_user_limit, knobs, window))
    }
}

/// `t` as Postgres stores it: truncated to whole microseconds. Errors name
/// `field`: a time outside the years 1 to 9999 (in UTC) — the range the API
/// documents; Postgres's `timestamptz` reaches further, and chrono's parser
/// accepts signed years of more digits.
fn storable(field: &'static str, t: DateTime<Utc>) -> Result<DateTime<Utc>, InvalidInput> {
    use chrono::{Datelike, Timelike};
    if !(1..=9999).contains(&t.year()) {
        return Err(InvalidInput::new(field, "must be between the years 1 and 9999 (UTC)"));
    }
    // Not `DurationRound`, which counts in i64 nanoseconds and so fails
    // outside the years 1677 to 2262.
    t.with_nanosecond(t.nanosecond() / 1000 * 1000)
        .ok_or_else(|| InvalidInput::new(field, "is not a storable time"))
}

/// When a sale sells, who gets in when, and how long its buyers have to pay.
struct Window {
    starts_at: Option<DateTime<Utc>>,
    ends_at: Option<DateTime<Utc>>,
    payment_window_ms: Option<i32>,
    waiting_room: Option<WaitingRoomSettings>,
}

/// A sale with its stock, as answered by the admin routes.
#[derive(Serialize, ToSchema)]
pub struct SaleWithStock {
    #[serde(flatten)]
    sale: Sale,
    #[serde(flatten)]
    stock: Stock,
}

/// `POST /admin/sales` → `201` with the sale.
#[utoipa::path(
    post,
    path = "/admin/sales",
    tag = "admin",
    request_body = NewSale,
    responses((status = 201, description = "The sale was created", body = SaleWithStock)),
)]
pub async fn create_sale(
    _: Admin,
    State(state): State<AppState>,
    ApiJson(body): ApiJson<NewSale>,
) -> Result<(StatusCode, Json<SaleWithStock>), AppError> {
    let requested_buckets = body.buckets;
    let (name, stock, strategy, per_user_limit, knobs, window) = body.validate()?;
    let buckets = state.strategies.get(strategy).buckets(requested_buckets)?;
    if window.payment_window_ms.is_some() && !state.strategies.get(strategy).returns_units() {
        return Err(InvalidInput::new(
            "payment_window_ms",
            format!("the `{strategy}` strategy does not return units yet: no payment window"),
        )
        .into());
    }
    // A sale with buckets keeps its units in them, spread by `bucket_share`;
    // one statement writes the sale row and its buckets.
    let sql = format!(
        "WITH sale AS (
             INSERT INTO sales (name, total_stock, remaining_stock, per_user_limit, strategy,
                                starts_at, ends_at, lock_lease_ms, work_ms, pause_ms,
                                pause_ratio, buckets, payment_window_ms,
                                room_admissions_per_s, room_concurrency, room_admission_ttl_ms)
             VALUES ($1, $2, CASE WHEN $11::integer IS NULL THEN $2 ELSE 0 END, $3, $4, $5, $6,
                     $7, $8, $9, $10, $11, $12, $13, $14, $15)
             RETURNING {SALE_COLUMNS}
         ), spread AS (
             INSERT INTO sale_buckets (sale_id, bucket, remaining_stock)
             SELECT sale.id, b, bucket_share($2, sale.buckets, b)
             FROM sale, generate_series(0, sale.buckets - 1) AS b
         )
         SELECT * FROM sale"
    );
    let sale: Sale = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(name)
        .bind(stock)
        .bind(per_user_limit)
        .bind(strategy.as_str())
        .bind(window.starts_at)
        .bind(window.ends_at)
        .bind(knobs.lock_lease_ms)
        .bind(knobs.work_ms)
        .bind(knobs.pause_ms)
        .bind(knobs.pause_ratio)
        .bind(buckets)
        .bind(window.payment_window_ms)
        .bind(window.waiting_room.and_then(|room| room.admissions_per_s))
        .bind(window.waiting_room.and_then(|room| room.concurrency))
        .bind(window.waiting_room.map(|room| room.admission_ttl_ms))
        .fetch_one(&state.db)
        .await?;
    let sale = state.catalog.insert(sale);
    state.strategies.get(sale.strategy).sale_created(&sale, stock).await?;
    tracing::info!(sale_id = sale.id.0, strategy = %sale.strategy, stock, "sale created");
    let stock = Stock { total_stock: stock, remaining_stock: stock };
    Ok((StatusCode::CREATED, Json(SaleWithStock { sale: (*sale).clone(), stock })))
}

/// Body of `POST /admin/sales/{id}/restock`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Restock {
    /// Units to add; the total stock may not exceed 10^12.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_i64)]
    #[serde(deserialize_with = "integer")]
    units: i64,
}

/// Adds `$2` units to sale `$1` unless its total would exceed `$3`: to the
/// sale row, or spread over its buckets (`bucket_share`) for a sale whose
/// stock is split. Returns the new stock figures (as the view `sale_stock`
/// counts them: returns a lock holder has not folded in yet included), no
/// row when refused.
const RESTOCK: &str = "\
WITH sale AS (
    UPDATE sales
    SET total_stock = total_stock + $2,
        remaining_stock = remaining_stock + CASE WHEN buckets IS NULL THEN $2 ELSE 0 END
    WHERE id = $1 AND total_stock + $2 <= $3
    RETURNING id, buckets, total_stock,
              remaining_stock + (returned_stock - folded_stock) AS remaining_stock
), spread AS (
    UPDATE sale_buckets b
    SET remaining_stock = b.remaining_stock + bucket_share($2, sale.buckets, b.bucket)
    FROM sale WHERE b.sale_id = sale.id
    RETURNING b.remaining_stock
)
SELECT total_stock,
       remaining_stock + coalesce((SELECT sum(remaining_stock) FROM spread), 0)::bigint
         AS remaining_stock
FROM sale";

/// `$1` sale id: locks its bucket rows (none for a sale whose stock is not
/// split) in bucket order, for [`RESTOCK`] in the same transaction.
const LOCK_BUCKETS: &str =
    "SELECT bucket FROM sale_buckets WHERE sale_id = $1 ORDER BY bucket FOR UPDATE";

/// `POST /admin/sales/{id}/restock`: raises total and remaining stock by the
/// same amount in one statement (the remaining units on the sale row or
/// spread over its buckets), so the ledger invariant holds throughout.
#[utoipa::path(
    post,
    path = "/admin/sales/{id}/restock",
    tag = "admin",
    params(SalePath),
    request_body = Restock,
    responses((status = 200, description = "The sale with its new stock", body = SaleWithStock)),
)]
pub async fn restock(
    _: Admin,
    State(state): State<AppState>,
    SalePath(id): SalePath,
    ApiJson(body): ApiJson<Restock>,
) -> Result<Json<SaleWithStock>, AppError> {
    if !(1..=MAX_UNITS).contains(&body.units) {
        return Err(InvalidInput::new("units", format!("must be between 1 and {MAX_UNITS}")).into());
    }
    let not_found = || AppError::no_such_sale(id);
    let sale = state.catalog.get(&state.db, id).await?.ok_or_else(not_found)?;
    let mut tx = state.db.begin().await?;
    // A split sale's buckets are locked in bucket order first, as
    // `sql/buckets`' several-bucket purchase locks them, so the two never
    // wait for each other in a circle.
    sqlx::query(LOCK_BUCKETS).bind(id.0).execute(&mut *tx).await?;
    let stock: Stock = sqlx::query_as(RESTOCK)
        .bind(id.0)
        .bind(body.units)
        .bind(MAX_UNITS)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| {
            InvalidInput::new("units", format!("total stock would exceed {MAX_UNITS}"))
        })?;
    tx.commit().await?;
    state.strategies.get(sale.strategy).restocked(&sale, body.units).await?;
    tracing::info!(sale_id = id.0, units = body.units, "sale restocked");
    Ok(Json(SaleWithStock { sale: (*sale).clone(), stock }))
}

/// `GET /admin/sales/{id}/audit`: the correctness figures of the sale, from
/// Postgres (see `crate::audit`), plus `redis_drift` measured by the sale's
/// strategy (`null` when it keeps no counter outside Postgres).
#[utoipa::path(
    get,
    path = "/admin/sales/{id}/audit",
    tag = "admin",
    params(SalePath),
    responses((status = 200, description = "The sale's correctness figures", body = Audit)),
)]
pub async fn audit(
    _: Admin,
    State(state): State<AppState>,
    SalePath(id): SalePath,
) -> Result<Json<Audit>, AppError> {
    let not_found = || AppError::no_such_sale(id);
    let mut audit = {
        let mut conn = state.db.acquire().await?;
        audit::audit(&mut conn, id).await?.ok_or_else(not_found)?
    };
    let sale = state.catalog.get(&state.db, id).await?.ok_or_else(not_found)?;
    audit.redis_drift = state.strategies.get(sale.strategy).redis_drift(&sale).await?;
    Ok(Json(audit))
}

/// `POST /admin/sales/{id}/reconcile`: one reconciliation pass now (the
/// background job runs the same pass every `SECKILL_REDIS_DECR_RECONCILE_INTERVAL_MS`).
/// For a strategy with nothing to reconcile the report has `redis_drift:
/// null` and no fixes.
#[utoipa::path(
    post,
    path = "/admin/sales/{id}/reconcile",
    tag = "admin",
    params(SalePath),
    responses((status = 200, description = "What the pass found and fixed", body = Reconciliation)),
)]
pub async fn reconcile(
    _: Admin,
    State(state): State<AppState>,
    SalePath(id): SalePath,
) -> Result<Json<Reconciliation>, AppError> {
    let not_found = || AppError::no_such_sale(id);
    let sale = state.catalog.get(&state.db, id).await?.ok_or_else(not_found)?;
    let report = state.strategies.get(sale.strategy).reconcile(&sale).await?;
    Ok(Json(report))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A valid body with `changes` applied (`null` removes a field).
    fn new_sale(changes: Value) -> NewSale {
        let mut body = json!({ "name": "launch", "stock": 10, "strategy": "sql" });
        for (field, value) in changes.as_object().unwrap() {
            match value {
                Value::Null => body.as_object_mut().unwrap().remove(field),
                value => body.as_object_mut().unwrap().insert(field.clone(), value.clone()),
            };
        }
        serde_json::from_value(body).unwrap()
    }

    /// The field a body is refused for, and the reason.
    fn refused(changes: Value) -> (&'static str, String) {
        let err = new_sale(changes).validate().err().expect("refused");
        (err.field, err.reason)
    }

    #[test]
    fn a_minimal_sale_gets_the_defaults() {
        let (name, stock, strategy, per_user_limit, knobs, window) =
            new_sale(json!({ "name": "  launch  " })).validate().unwrap();
        assert_eq!(
            (name.as_str(), stock, strategy.as_str(), per_user_limit),
            ("launch", 10, "sql", 1)
        );
        assert_eq!((knobs.lock_lease_ms, knobs.work_ms, knobs.pause_ms), (2000, 0, 0));
        assert_eq!(knobs.pause_ratio, 0.0);
        assert!(window.starts_at.is_none() && window.ends_at.is_none());
        assert_eq!(window.payment_window_ms, None);
    }

    #[test]
    fn every_registered_strategy_is_accepted_and_an_unknown_one_is_refused() {
        for name in StrategyName::ALL {
            let (_, _, strategy, ..) =
                new_sale(json!({ "strategy": name.as_str() })).validate().unwrap();
            assert_eq!(strategy, *name);
        }
        let (field, reason) = refused(json!({ "strategy": "optimistic" }));
        assert_eq!(field, "strategy");
        assert!(reason.starts_with("unknown strategy `optimistic`; expected one of: naive, sql"));
    }

    #[test]
    fn out_of_range_fields_are_refused_by_name() {
        let cases = [
            (json!({ "name": "" }), "name"),
            (json!({ "name": "   " }), "name"),
            (json!({ "name": "n".repeat(201) }), "name"),
            (json!({ "name": "tab\there" }), "name"),
            (json!({ "stock": -1 }), "stock"),
            (json!({ "stock": MAX_UNITS + 1 }), "stock"),
            (json!({ "per_user_limit": 0 }), "per_user_limit"),
            (json!({ "per_user_limit": 1_000_001 }), "per_user_limit"),
            (json!({ "lock_lease_ms": 0 }), "lock_lease_ms"),
            (json!({ "work_ms": -1 }), "work_ms"),
            (json!({ "pause_ms": 600_001 }), "pause_ms"),
            (json!({ "pause_ratio": 1.5 }), "pause_ratio"),
            (json!({ "payment_window_ms": 0 }), "payment_window_ms"),
            (json!({ "payment_window_ms": -5 }), "payment_window_ms"),
            (json!({ "payment_window_ms": MAX_PAYMENT_WINDOW_MS + 1 }), "payment_window_ms"),
            (json!({ "starts_at": "0000-12-31T00:00:00Z" }), "starts_at"),
            (json!({ "ends_at": "+10000-01-01T00:00:00Z" }), "ends_at"),
            (
                json!({ "starts_at": "2030-01-01T00:00:00Z", "ends_at": "2030-01-01T00:00:00Z" }),
                "ends_at",
            ),
        ];
        for (changes, field) in cases {
            assert_eq!(refused(changes.clone()).0, field, "{changes}");
        }
    }

    #[test]
    fn the_edges_of_each_range_are_accepted() {
        let edges = json!({
            "name": "n".repeat(200), "stock": MAX_UNITS, "per_user_limit": 1_000_000,
            "lock_lease_ms": 600_000, "work_ms": 0, "pause_ms": 600_000, "pause_ratio": 1.0,
            "payment_window_ms": MAX_PAYMENT_WINDOW_MS,
        });
        assert!(new_sale(edges).validate().is_ok());
        assert!(new_sale(json!({ "stock": 0, "pause_ratio": 0.0 })).validate().is_ok());
        assert!(new_sale(json!({ "payment_window_ms": 1 })).validate().is_ok());
    }

    #[test]
    fn every_time_of_the_years_1_to_9999_is_accepted() {
        let edges = json!({
            "starts_at": "0001-01-01T00:00:00Z", "ends_at": "9999-12-31T23:59:59.999999999Z",
        });
        let (.., window) = new_sale(edges).validate().unwrap();
        assert_eq!(window.starts_at.unwrap().to_rfc3339(), "0001-01-01T00:00:00+00:00");
        assert_eq!(window.ends_at.unwrap().to_rfc3339(), "9999-12-31T23:59:59.999999+00:00");
        for outside in ["0000-12-31T23:59:59Z", "0001-01-01T00:30:00+01:00"] {
            assert_eq!(refused(json!({ "starts_at": outside })).0, "starts_at", "{outside}");
        }
    }

    #[test]
    fn times_are_truncated_to_what_postgres_stores() {
        let (.., window) =
            new_sale(json!({ "starts_at": "2030-01-01T00:00:00.123456789Z" })).validate().unwrap();
        let stored = window.starts_at.unwrap();
        assert_eq!(stored.to_rfc3339(), "2030-01-01T00:00:00.123456+00:00");
    }
}
