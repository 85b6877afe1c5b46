//! The flash-sale domain: validated identifiers and quantities, the `Sale`
//! record, and the catalogue that caches sales for the purchase path.
//!
//! Raw integers stop at the HTTP edge: a handler turns them into [`SaleId`],
//! [`UserId`] and [`Quantity`], and everything behind it can rely on their
//! ranges. A sale's settings never change after creation (only its stock does,
//! and stock is read by the strategies, never from here), so the purchase path
//! reads them from the in-process [`SaleCatalog`] instead of paying a Postgres
//! round trip per request.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use crate::strategy_name::StrategyName;

/// Primary key of a sale (`sales.id`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    sqlx::Type,
    utoipa::ToSchema,
)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct SaleId(pub i64);

/// A buyer. Any non-negative 64-bit integer chosen by the caller; the service
/// has no user table, the unique constraint `orders_sale_user_key` is what makes
/// "one order per user per sale" hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
#[schema(minimum = 0)]
pub struct UserId(i64);

impl UserId {
    /// Accepts `0..=i64::MAX`.
    pub fn parse(raw: i64) -> Result<Self, InvalidInput> {
        if raw < 0 {
            return Err(InvalidInput::new("user_id", "must be a non-negative integer"));
        }
        Ok(Self(raw))
    }
    pub fn get(self) -> i64 {
        self.0
    }
}

/// Units of stock in one purchase: `1..=sale.per_user_limit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Quantity(i32);

impl Quantity {
    pub const ONE: Quantity = Quantity(1);

    /// Accepts `1..=limit` (the sale's per-user limit).
    pub fn parse(raw: i64, limit: i32) -> Result<Self, InvalidInput> {
        if raw < 1 || raw > i64::from(limit) {
            return Err(InvalidInput::new(
                "quantity",
                format!("must be between 1 and the per-user limit {limit}"),
            ));
        }
        Ok(Self(raw as i32))
    }
    pub fn get(self) -> i32 {
        self.0
    }
}

/// A field that failed validation; becomes a `422` problem.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidInput {
    pub field: &'static str,
    pub reason: String,
}

impl InvalidInput {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self { field, reason: reason.into() }
    }
}

/// A sale's settings, as stored in `sales` (stock excluded: it changes).
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Sale {
    pub id: SaleId,
    /// 1 to 200 characters, trimmed.
    pub name: String,
    /// Units one buyer may take, in one order.
    pub per_user_limit: i32,
    #[sqlx(try_from = "String")]
    pub strategy: StrategyName,
    /// The sale opens at this time (inclusive); `null`: open from the start.
    pub starts_at: Option<DateTime<Utc>>,
    /// The sale ends at this time (exclusive); `null`: never.
    pub ends_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub knobs: Knobs,
    /// Rows the stock is split over (`sale_buckets`), for a strategy that
    /// splits it (`sql/buckets`); `None`: the stock is on the sale row.
    pub buckets: Option<i32>,
    /// How long a buyer has to pay an order, milliseconds: its orders start
    /// `pending_payment` and expire, their units returned, when unpaid this
    /// long after they were placed (`crate::lifecycle`). `None`: orders are
    /// `paid` when placed, final.
    pub payment_window_ms: Option<i32>,
    /// The sale's waiting room (`crate::waiting_room`); `null`: buyers buy
    /// directly.
    #[sqlx(flatten)]
    #[schema(value_type = Option<WaitingRoomSettings>)]
    pub waiting_room: RoomColumns,
    pub created_at: DateTime<Utc>,
}

/// A sale's waiting room: how fast and how many of the buyers in its line
/// are let in to buy, and how long an admission lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WaitingRoomSettings {
    /// Admissions per second, at most; `null`: no pace (only `concurrency`
    /// and the stock bound the admissions).
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub admissions_per_s: Option<i32>,
    /// Buyers admitted and not yet served, at most, across every instance
    /// (the permits of the lock library's semaphore); `null`: only the
    /// stock bounds them.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub concurrency: Option<i32>,
    /// How long an admission may be used, milliseconds; its permit is free
    /// again when it lapses.
    #[schema(minimum = 100, maximum = 600_000)]
    pub admission_ttl_ms: i32,
}

/// The `room_*` columns of `sales`: a [`WaitingRoomSettings`] or none (the
/// table's check keeps them all set or all `NULL` but one bound). Serialized
/// as the settings, or `null`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct RoomColumns {
    room_admissions_per_s: Option<i32>,
    room_concurrency: Option<i32>,
    room_admission_ttl_ms: Option<i32>,
}

impl RoomColumns {
    /// The room's settings; `None` for a sale without one.
    pub fn settings(self) -> Option<WaitingRoomSettings> {
        Some(WaitingRoomSettings {
            admissions_per_s: self.room_admissions_per_s,
            concurrency: self.room_concurrency,
            admission_ttl_ms: self.room_admission_ttl_ms?,
        })
    }
}

impl From<Option<WaitingRoomSettings>> for RoomColumns {
    fn from(settings: Option<WaitingRoomSettings>) -> Self {
        settings.map_or_else(Self::default, |room| Self {
            room_admissions_per_s: room.admissions_per_s,
            room_concurrency: room.concurrency,
            room_admission_ttl_ms: Some(room.admission_ttl_ms),
        })
    }
}

impl Serialize for RoomColumns {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.settings().serialize(serializer)
    }
}

/// Demonstration knobs: simulated work and stalls inside a strategy's critical
/// section (or transaction), and the lease of lock strategies.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Knobs {
    /// Lease of `lock/*` strategies, milliseconds (default 2000).
    pub lock_lease_ms: i32,
    /// Simulated work inside the critical section, milliseconds, ±50 % jitter.
    pub work_ms: i32,
    /// Length of a stall, milliseconds.
    pub pause_ms: i32,
    /// Fraction (0..=1) of purchases that stall for `pause_ms`.
    pub pause_ratio: f64,
}

impl Knobs {
    /// True when [`Knobs::simulate_work`] may sleep.
    pub fn simulates_work(&self) -> bool {
        self.work_ms > 0 || (self.pause_ms > 0 && self.pause_ratio > 0.0)
    }

    /// Sleeps for the simulated work of one critical section: `work_ms` ±50 %,
    /// plus `pause_ms` for a `pause_ratio` fraction of calls. Returns at once
    /// when both are 0 (the default), without touching the RNG.
    pub async fn simulate_work(&self) {
        let delay = {
            if !self.simulates_work() {
                return;
            }
            let mut rng = rand::rng();
            let mut ms = 0.0;
            if self.work_ms > 0 {
                ms += f64::from(self.work_ms) * rng.random_range(0.5..=1.5);
            }
            if self.pause_ms > 0 && rng.random_bool(self.pause_ratio.clamp(0.0, 1.0)) {
                ms += f64::from(self.pause_ms);
            }
            Duration::from_secs_f64(ms / 1000.0)
        };
        tokio::time::sleep(delay).await;
    }
}

/// Where a sale stands in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    NotStarted,
    Open,
    Ended,
}

impl Sale {
    /// The sale's phase at `now`: `starts_at` is inclusive, `ends_at` exclusive.
    pub fn phase(&self, now: DateTime<Utc>) -> Phase {
        match (self.starts_at, self.ends_at) {
            (Some(start), _) if now < start => Phase::NotStarted,
            (_, Some(end)) if now >= end => Phase::Ended,
            _ => Phase::Open,
        }
    }
}

/// Columns of `sales` that [`Sale`] reads, in one place for every query.
pub(crate) const SALE_COLUMNS: &str = "id, name, per_user_limit, strategy, starts_at, ends_at, \
     lock_lease_ms, work_ms, pause_ms, pause_ratio, buckets, payment_window_ms, room_admissions_per_s, room_concurrency, \
     room_admission_ttl_ms, created_at";

/// Stock figures of a sale, read fresh from Postgres.
#[derive(Debug, Clone, Copy, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Stock {
    /// Units ever put on sale (initial stock + restocks).
    pub total_stock: i64,
    /// Units still for sale: the sale row's, plus its buckets', plus the
    /// returns a lock holder has not folded in yet (the view `sale_stock`).
    pub remaining_stock: i64,
}

/// Process-wide cache of sale settings, filled on first use. Settings are
/// immutable once a sale exists, so entries never go stale; a sale not read
/// for [`IDLE_SALE_STATE`] is dropped, and read from Postgres again if it is
/// asked for. Ids with no sale are remembered for [`MISS_TTL`] too (at most
/// [`MAX_MISSES`] of them), so that a client walking ids costs one query per
/// id and second, not one per request; a sale created on another instance
/// in that second is unknown here for the rest of it.
#[derive(Clone)]
pub struct SaleCatalog {
    sales: moka::sync::Cache<SaleId, Arc<Sale>>,
    misses: moka::sync::Cache<SaleId, ()>,
}

/// How long per-sale state kept in memory outlives its last use: a sale's
/// catalog entry, its `sql/batched` queue, its known buyers. A sale that
/// ends is idle from then on, so its state goes this long after its end.
pub const IDLE_SALE_STATE: Duration = Duration::from_secs(600);

/// How long an id with no sale is answered `404` from the cache.
pub const MISS_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Ids with no sale remembered at most.
pub const MAX_MISSES: u64 = 10_000;

impl Default for SaleCatalog {
    fn default() -> Self {
        Self::with_idle(IDLE_SALE_STATE)
    }
}

impl SaleCatalog {
    /// A catalog that drops a sale not read for `idle`.
    pub fn with_idle(idle: Duration) -> Self {
        Self {
            sales: moka::sync::Cache::builder().time_to_idle(idle).build(),
            misses: moka::sync::Cache::builder()
                .max_capacity(MAX_MISSES)
                .time_to_live(MISS_TTL)
                .build(),
        }
    }

    /// Sales held (after the pending evictions are applied).
    pub fn len(&self) -> u64 {
        self.sales.run_pending_tasks();
        self.sales.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sale with `id`, from the cache or from Postgres through `db` (a
    /// pool, or a connection the caller holds: a caller whose pool's only
    /// connection is its own transaction, such as the expiry sweep's, reads
    /// through that transaction rather than wait for a second connection that
    /// never comes). `Ok(None)` when no such sale exists. Errors are Postgres
    /// errors.
    pub async fn get(
        &self,
        db: impl sqlx::PgExecutor<'_>,
        id: SaleId,
    ) -> Result<Option<Arc<Sale>>, sqlx::Error> {
        if let Some(sale) = self.sales.get(&id) {
            return Ok(Some(sale));
        }
        if self.misses.contains_key(&id) {
            return Ok(None);
        }
        let sql = format!("SELECT {SALE_COLUMNS} FROM sales WHERE id = $1");
        let Some(sale) = sqlx::query_as::<_, Sale>(sqlx::AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_optional(db)
            .await?
        else {
            self.misses.insert(id, ());
            return Ok(None);
        };
        let sale = Arc::new(sale);
        self.sales.insert(id, sale.clone());
        Ok(Some(sale))
    }

    /// Puts a sale just created by this instance into the cache.
    pub fn insert(&self, sale: Sale) -> Arc<Sale> {
        let sale = Arc::new(sale);
        self.misses.invalidate(&sale.id);
        self.sales.insert(sale.id, sale.clone());
        sale
    }
}

/// Reads the current stock of a sale, buckets included. `Ok(None)` when it
/// does not exist.
pub async fn stock(db: &PgPool, id: SaleId) -> Result<Option<Stock>, sqlx::Error> {
    sqlx::query_as::<_, Stock>(
        "SELECT total_stock, remaining_stock FROM sale_stock WHERE sale_id = $1",
    )
    .bind(id.0)
    .fetch_optional(db)
    .await
}

/// A buyer's order of a sale, as `orders` holds it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Order {
    pub order_id: i64,
    pub sale_id: SaleId,
    #[sqlx(try_from = "i64")]
    pub user_id: UserId,
    /// Units of stock the order took.
    pub quantity: i32,
    /// `pending_payment`, `paid`, `cancelled` or `expired` (orders of a sale
    /// without a payment window are `paid` when placed).
    #[sqlx(try_from = "String")]
    pub status: OrderStatus,
    /// When the order was written (the database's clock).
    pub created_at: DateTime<Utc>,
    /// When an unpaid order expires; `null` for a sale without a payment
    /// window.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was paid.
    pub paid_at: Option<DateTime<Utc>>,
    /// When it was cancelled or expired: when its units came back.
    pub ended_at: Option<DateTime<Utc>>,
}

/// Columns of `orders` that [`Order`] reads, in one place for every query.
pub(crate) const ORDER_COLUMNS: &str = "id AS order_id, sale_id, user_id, quantity, status, \
     created_at, expires_at, paid_at, ended_at";

/// Where an order stands. An order is *live* while it holds its units
/// (`pending_payment`, `paid`); `cancelled` and `expired` orders have
/// returned them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    PendingPayment,
    Paid,
    Cancelled,
    Expired,
}

impl OrderStatus {
    /// `orders.status`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::PendingPayment => "pending_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::Cancelled => "cancelled",
            OrderStatus::Expired => "expired",
        }
    }

    /// Whether the order holds its units.
    pub fn is_live(self) -> bool {
        matches!(self, OrderStatus::PendingPayment | OrderStatus::Paid)
    }
}

impl TryFrom<String> for OrderStatus {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, Self::Error> {
        [
            OrderStatus::PendingPayment,
            OrderStatus::Paid,
            OrderStatus::Cancelled,
            OrderStatus::Expired,
        ]
        .into_iter()
        .find(|status| status.as_str() == raw)
        .ok_or_else(|| format!("unknown order status {raw:?}"))
    }
}

impl TryFrom<i64> for UserId {
    type Error = InvalidInput;
    fn try_from(raw: i64) -> Result<Self, Self::Error> {
        UserId::parse(raw)
    }
}

/// The order `user` holds in sale `id`: the live one — at most one, by the
/// unique index `orders_sale_user_key` — or else their latest (cancelled or
/// expired). `Ok(None)` when they have none.
pub async fn order_of(db: &PgPool, id: SaleId, user: UserId) -> Result<Option<Order>, sqlx::Error> {
    let sql = format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE sale_id = $1 AND user_id = $2 \
         ORDER BY status IN ('pending_payment', 'paid') DESC, id DESC LIMIT 1"
    );
    sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .bind(user.get())
        .fetch_optional(db)
        .await
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    fn sale(starts_at: Option<DateTime<Utc>>, ends_at: Option<DateTime<Utc>>) -> Sale {
        Sale {
            id: SaleId(1),
            name: "launch".to_owned(),
            per_user_limit: 1,
            strategy: StrategyName::declare("sql"),
            starts_at,
            ends_at,
            knobs: Knobs::default(),
            buckets: None,
            payment_window_ms: None,
            waiting_room: RoomColumns::default(),
            created_at: Utc::now(),
        }
    }

    #[test]
    fn the_catalog_drops_the_sales_not_read_for_its_idle_time() {
        let catalog = SaleCatalog::with_idle(Duration::from_millis(300));
        for id in 0..200 {
            catalog.insert(Sale { id: SaleId(id), ..sale(None, None) });
        }
        assert_eq!(catalog.len(), 200);
        std::thread::sleep(Duration::from_millis(150));
        catalog.sales.get(&SaleId(7)).expect("still held");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(catalog.len(), 1, "only the sale read meanwhile is left");
    }

    #[test]
    fn a_sale_without_a_window_is_always_open() {
        assert_eq!(sale(None, None).phase(Utc::now()), Phase::Open);
    }

    #[test]
    fn the_window_includes_its_start_and_excludes_its_end() {
        let start = Utc::now();
        let end = start + TimeDelta::seconds(10);
        let sale = sale(Some(start), Some(end));
        let just_before = start - TimeDelta::microseconds(1);
        assert_eq!(sale.phase(just_before), Phase::NotStarted);
        assert_eq!(sale.phase(start), Phase::Open);
        assert_eq!(sale.phase(end - TimeDelta::microseconds(1)), Phase::Open);
        assert_eq!(sale.phase(end), Phase::Ended);
        assert_eq!(sale.phase(end + TimeDelta::days(1)), Phase::Ended);
    }

    #[test]
    fn an_open_ended_window_has_one_bound_only() {
        let now = Utc::now();
        let only_start = sale(Some(now), None);
        assert_eq!(only_start.phase(now - TimeDelta::seconds(1)), Phase::NotStarted);
        assert_eq!(only_start.phase(now + TimeDelta::days(3650)), Phase::Open);
        let only_end = sale(None, Some(now));
        assert_eq!(only_end.phase(now - TimeDelta::days(3650)), Phase::Open);
        assert_eq!(only_end.phase(now), Phase::Ended);
    }

    #[test]
    fn user_ids_are_non_negative() {
        assert_eq!(UserId::parse(0).unwrap().get(), 0);
        assert_eq!(UserId::parse(i64::MAX).unwrap().get(), i64::MAX);
        assert_eq!(UserId::parse(-1).unwrap_err().field, "user_id");
    }

    #[test]
    fn a_quantity_is_between_one_and_the_per_user_limit() {
        assert_eq!(Quantity::parse(1, 1).unwrap(), Quantity::ONE);
        assert_eq!(Quantity::parse(3, 3).unwrap().get(), 3);
        for (raw, limit) in [(0, 3), (4, 3), (-1, 3), (i64::MAX, i32::MAX)] {
            let err = Quantity::parse(raw, limit).unwrap_err();
            assert_eq!(err.field, "quantity", "{raw} of {limit}");
        }
    }
}
