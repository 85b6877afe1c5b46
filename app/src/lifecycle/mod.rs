//! The order lifecycle of a sale with a payment window: an order starts
//! `pending_payment`; paying makes it `paid`; the buyer's cancel makes it
//! `cancelled`; unpaid at `expires_at`, the expiry sweep ([`sweep`]) makes it
//! `expired`. Cancelled and expired orders return their units through the
//! sale's strategy ([`crate::strategy::Strategy::return_units`]), exactly once
//! (`crate::unit_return` says how). Orders of a sale without a window are
//! `paid` when placed and stay so.
//!
//! Every change is a conditional update on `status = 'pending_payment'` (a
//! payment) or a claim that locks the pending row (a cancel, an expiry), so
//! a cancel racing a payment, or two sweeps, end each order in exactly one
//! state. A payment is refused once `expires_at` has passed, even if no
//! sweep has expired the order yet: the window is the database's clock, not
//! the sweep's period.
//!
//! Who may pay or cancel: buyers are not authenticated yet, so the caller may
//! name the buyer (`user_id`) and is refused when it is not the order's; with
//! no name, anyone holding the order id may. That check is [`Owner`], the one
//! place to put an authenticated buyer instead.

use metrics::counter;
use sqlx::PgPool;

use crate::bounds::MAX_MS;
use crate::metric_names::ORDERS_ENDED_TOTAL;
use crate::outcome::StrategyError;
use crate::sale::{ORDER_COLUMNS, Order, OrderStatus, SaleCatalog, SaleId, UserId};
use crate::strategy::Strategies;
use crate::unit_return::{Claim, Ending, PendingOrder, Returned};

pub mod sweep;

/// Settings of the order lifecycle: the expiry sweep.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Order lifecycle")]
#[group(id = "lifecycle")]
pub struct Settings {
    /// The period of the expiry sweep, in milliseconds: every instance looks
    /// this often for orders still unpaid at the end of their payment window
    /// and expires them, returning their units (`FOR UPDATE SKIP LOCKED`, so
    /// instances sweeping at once share the work); 0 turns this instance's
    /// sweep off.
    #[arg(
        long,
        env = "SECKILL_EXPIRY_SWEEP_INTERVAL_MS",
        default_value_t = 500,
        value_parser = clap::value_parser!(u64).range(0..=MAX_MS)
    )]
    pub expiry_sweep_interval_ms: u64,
}

impl Settings {
    /// The sweep's period; `None` when this instance's sweep is off.
    pub fn sweep_period(&self) -> Option<std::time::Duration> {
        (self.expiry_sweep_interval_ms > 0)
            .then(|| std::time::Duration::from_millis(self.expiry_sweep_interval_ms))
    }
}

/// What the lifecycle reads besides its request.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub db: &'a PgPool,
    pub catalog: &'a SaleCatalog,
    pub strategies: &'a Strategies,
}

/// The caller's claim to be the order's buyer. Until buyers are
/// authenticated, the caller's word: `Some(user)` must be the order's buyer,
/// `None` asks nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner(pub Option<UserId>);

impl Owner {
    fn admits(self, order_user: i64) -> bool {
        self.0.is_none_or(|user| user.get() == order_user)
    }
}

/// An `Idempotency-Key` of a payment: 1 to 255 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Errors: empty, longer than 255 bytes, or a byte outside `!`..=`~`.
    pub fn parse(raw: &str) -> Result<Self, crate::sale::InvalidInput> {
        if raw.is_empty() || raw.len() > 255 || !raw.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(crate::sale::InvalidInput::new(
                "Idempotency-Key",
                "must be 1 to 255 visible ASCII characters",
            ));
        }
        Ok(Self(raw.to_owned()))
    }
}

/// Why an order could not be paid or cancelled.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// No such order (or not the named buyer's).
    #[error("no order with id {0}")]
    NotFound(i64),
    /// The order's state does not allow it.
    #[error(transparent)]
    Conflict(#[from] OrderConflict),
    /// The return failed (a backing server, a lock not taken): the order is
    /// still pending.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
}

impl From<sqlx::Error> for LifecycleError {
    fn from(err: sqlx::Error) -> Self {
        LifecycleError::Strategy(err.into())
    }
}

/// The state that refused a payment or a cancel (`409`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OrderConflict {
    /// A cancel of a paid order.
    #[error("the order is paid; it can no longer be cancelled")]
    Paid,
    /// A payment under another `Idempotency-Key` than the one that paid it.
    #[error("the order was paid under another Idempotency-Key")]
    PaidUnderAnotherKey,
    /// A payment of a cancelled order.
    #[error("the order was cancelled; its units were returned")]
    Cancelled,
    /// A payment or cancel after the payment window.
    #[error("the order's payment window ended; its units were returned")]
    Expired,
}

/// The order `id`. `Ok(None)` when there is none.
pub async fn get(db: &PgPool, id: i64) -> Result<Option<Order>, sqlx::Error> {
    let sql = format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1");
    sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(sql)).bind(id).fetch_optional(db).await
}

/// Pays order `id` (idempotent): `pending_payment` → `paid` within its
/// window, recording `key`. A paid order is answered as it is, unless `key`
/// differs from the key it was paid under. A pending order past its window
/// is expired here (its units returned) and refused.
///
/// Errors: [`LifecycleError::NotFound`], [`LifecycleError::Conflict`]
/// (cancelled, expired, paid under another key), a backing server.
pub async fn pay(
    context: Context<'_>,
    id: i64,
    owner: Owner,
    key: Option<IdempotencyKey>,
) -> Result<Order, LifecycleError> {
    let sql = format!(
        "UPDATE orders SET status = 'paid', paid_at = clock_timestamp(), payment_key = $2 \
         WHERE id = $1 AND status = 'pending_payment' AND expires_at > clock_timestamp() \
           AND ($3::bigint IS NULL OR user_id = $3) \
         RETURNING {ORDER_COLUMNS}"
    );
    let key_text = key.as_ref().map(|key| key.0.clone());
    let paid = sqlx::query_as::<_, Order>(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .bind(&key_text)
        .bind(owner.0.map(UserId::get))
        .fetch_optional(context.db)
        .await?;
    if let Some(order) = paid {
        return Ok(order);
    }
    let (order, paid_under): (Order, Option<String>) = {
        let sql = format!("SELECT {ORDER_COLUMNS}, payment_key FROM orders WHERE id = $1");
        let row = sqlx::query_as::<_, OrderWithKey>(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(context.db)
            .await?;
        match row {
            Some(row) if owner.admits(row.order.user_id.get()) => (row.order, row.payment_key),
            _ => return Err(LifecycleError::NotFound(id)),
        }
    };
    match order.status {
        OrderStatus::Paid => match (key_text, paid_under) {
            (Some(asked), Some(paid)) if asked != paid => {
                Err(OrderConflict::PaidUnderAnotherKey.into())
            }
            _ => Ok(order),
        },
        OrderStatus::Cancelled => Err(OrderConflict::Cancelled.into()),
        OrderStatus::Expired => Err(OrderConflict::Expired.into()),
        // Past its window (the update's clock said so): expire it now.
        OrderStatus::PendingPayment => {
            end(context, id, owner, Ending::Expired).await?;
            Err(OrderConflict::Expired.into())
        }
    }
}

#[derive(sqlx::FromRow)]
struct OrderWithKey {
    #[sqlx(flatten)]
    order: Order,
    payment_key: Option<String>,
}

/// Cancels order `id` for its buyer (idempotent): its units come back and it
/// is `cancelled`. A cancelled order is answered as it is.
///
/// Errors: [`LifecycleError::NotFound`], [`LifecycleError::Conflict`] (paid;
/// expired — a pending order past its window is expired here instead), a
/// backing server or a lock not taken (the order stays pending).
pub async fn cancel(context: Context<'_>, id: i64, owner: Owner) -> Result<Order, LifecycleError> {
    let order = end(context, id, owner, Ending::Cancelled).await?;
    match order.status {
        OrderStatus::Cancelled => Ok(order),
        OrderStatus::Expired => Err(OrderConflict::Expired.into()),
        OrderStatus::Paid | OrderStatus::PendingPayment => Err(OrderConflict::Paid.into()),
    }
}

/// Ends order `id` as `wanted` if it is still pending (as `expired` when its
/// window has passed, whatever was wanted), returning its units through its
/// sale's strategy; returns the order as it then stands, ended or not.
async fn end(
    context: Context<'_>,
    id: i64,
    owner: Owner,
    wanted: Ending,
) -> Result<Order, LifecycleError> {
    let mut tx = context.db.begin().await?;
    let row: Option<ClaimRow> = sqlx::query_as(
        "SELECT id, sale_id, user_id, quantity, status, \
                coalesce(expires_at <= clock_timestamp(), false) AS due \
         FROM orders WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let row = match row {
        Some(row) if owner.admits(row.user_id) => row,
        _ => return Err(LifecycleError::NotFound(id)),
    };
    if row.status == OrderStatus::PendingPayment.as_str() {
        let ending = if row.due { Ending::Expired } else { wanted };
        return_units(context, row.claim(tx, ending)?).await?;
    } else {
        tx.rollback().await?;
    }
    get(context.db, id).await?.ok_or(LifecycleError::NotFound(id))
}

/// An order row locked by a claim.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    id: i64,
    sale_id: i64,
    user_id: i64,
    quantity: i32,
    status: String,
    due: bool,
}

impl ClaimRow {
    /// The order of this row.
    fn order(&self) -> Result<PendingOrder, StrategyError> {
        let user = UserId::parse(self.user_id)
            .map_err(|err| StrategyError::Internal(anyhow::anyhow!("stored order: {err}")))?;
        Ok(PendingOrder { id: self.id, sale: SaleId(self.sale_id), user, quantity: self.quantity })
    }

    /// A claim of this one order, whose row `tx` locked.
    fn claim(
        self,
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        ending: Ending,
    ) -> Result<Claim, LifecycleError> {
        claim_of(tx, &[self], ending).map_err(LifecycleError::Strategy)
    }
}

/// A claim of the orders of `rows` (1 to [`crate::unit_return::MAX_ORDERS`],
/// of one sale), whose rows `tx` locked.
fn claim_of(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    rows: &[ClaimRow],
    ending: Ending,
) -> Result<Claim, StrategyError> {
    let orders = rows.iter().map(ClaimRow::order).collect::<Result<Vec<_>, _>>()?;
    Claim::new(tx, orders, ending).map_err(|err| StrategyError::Internal(err.into()))
}

/// Hands `claim` to its sale's strategy and counts the ended orders.
async fn return_units(context: Context<'_>, mut claim: Claim) -> Result<Returned, StrategyError> {
    let sale_id = claim.sale();
    // Through the claim's own connection: the sweep's pool has one, and it is
    // this claim's (a sale this instance had not read yet waited for a second
    // connection until the pool's timeout, at every pass).
    let sale =
        context.catalog.get(claim.conn(), sale_id).await?.ok_or_else(|| {
            StrategyError::Internal(anyhow::anyhow!("order of no sale {sale_id:?}"))
        })?;
    let returned = context.strategies.get(sale.strategy).return_units(&sale, claim).await?;
    let ending = match returned.ending {
        Ending::Cancelled => "cancelled",
        Ending::Expired => "expired",
    };
    counter!(ORDERS_ENDED_TOTAL, "strategy" => sale.strategy.as_str(), "ending" => ending)
        .increment(returned.orders.len() as u64);
    tracing::debug!(
        first_order_id = returned.orders[0].id,
        orders = returned.orders.len(),
        sale_id = sale_id.0,
        units = returned.units(),
        ending,
        "orders ended, units returned"
    );
    Ok(returned)
}
