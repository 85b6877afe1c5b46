//! One purchase, whatever the strategy: look the sale up, check its time
//! window and the per-user limit, use up the buyer's admission of a sale
//! with a waiting room ([`WaitingRoom`]), answer a buyer known to hold an
//! order ([`KnownBuyers`]), hand the request to the sale's strategy, and
//! count the outcome.

use chrono::Utc;
use metrics::counter;
use sqlx::PgPool;

use crate::backend_probe::BackendProbe;
use crate::known_buyers::{KNOWN_BUYER_ANSWERS, KnownBuyers};
use crate::outcome::{Outcome, StrategyError};
use crate::sale::{InvalidInput, Phase, Quantity, SaleCatalog, SaleId, UserId};
use crate::strategy::Strategies;
use crate::waiting_room::{RoomError, WaitingRoom};

/// Why a purchase could not be attempted.
#[derive(Debug, thiserror::Error)]
pub enum PurchaseError {
    #[error("no sale with id {0:?}")]
    UnknownSale(SaleId),
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// The sale's waiting room refused the purchase (no admission, or one
    /// that is not valid for it).
    #[error(transparent)]
    Room(RoomError),
}

/// What a purchase reads besides its request.
pub struct Context<'a> {
    pub db: &'a PgPool,
    pub catalog: &'a SaleCatalog,
    pub strategies: &'a Strategies,
    pub probe: &'a BackendProbe,
    pub known_buyers: &'a KnownBuyers,
    pub room: &'a WaitingRoom,
}

/// Sells `quantity` units (`None`: 1) of sale `id` to `user`, admitted by
/// `admission` when the sale has a waiting room.
///
/// Errors: [`PurchaseError::UnknownSale`]; [`PurchaseError::Invalid`] when the
/// quantity is outside `1..=per_user_limit`; [`PurchaseError::Room`] when the
/// sale's waiting room refuses the admission; [`PurchaseError::Strategy`] when
/// the strategy applied back-pressure or a backing server failed (a timeout
/// of a backing server — a Postgres pool timeout, a Redis command, a
/// Redlock quorum, a RabbitMQ confirm — sorted out by `probe` into `busy`
/// or `unavailable`).
pub async fn purchase(
    context: Context<'_>,
    id: SaleId,
    user: UserId,
    quantity: Option<i64>,
    admission: Option<&str>,
) -> Result<Outcome, PurchaseError> {
    let Context { db, catalog, strategies, probe, known_buyers, room } = context;
    let sale = match catalog.get(db, id).await {
        Ok(sale) => sale.ok_or(PurchaseError::UnknownSale(id))?,
        Err(err) => return Err(probe.triage(err.into()).await.into()),
    };
    let quantity = match quantity {
        Some(raw) => Quantity::parse(raw, sale.per_user_limit)?,
        None => Quantity::ONE,
    };
    let strategy = sale.strategy.as_str();
    let phase = sale.phase(Utc::now());
    let pass = match phase {
        Phase::Open => match room.admit(&sale, user, admission).await {
            Ok(pass) => pass,
            Err(RoomError::Backend(err)) => return Err(probe.triage(err).await.into()),
            // A retry of a purchase whose answer was lost (a timeout, a
            // dropped connection) finds its admission used: its order
            // answers it, as without a room.
            Err(RoomError::AdmissionUsed) => {
                return match crate::sale::order_of(db, id, user).await {
                    Ok(Some(order)) if order.status.is_live() => Ok(Outcome::AlreadyPurchased),
                    Ok(_) => Err(PurchaseError::Room(RoomError::AdmissionUsed)),
                    Err(err) => Err(probe.triage(err.into()).await.into()),
                };
            }
            Err(refused) => return Err(PurchaseError::Room(refused)),
        },
        Phase::NotStarted | Phase::Ended => None,
    };
    let result = match phase {
        Phase::NotStarted => Ok(Outcome::NotStarted),
        Phase::Ended => Ok(Outcome::Ended),
        // A buyer of a sale with a payment window may lose their order (a
        // cancel, an expiry on any instance) and buy again: not cached.
        Phase::Open
            if sale.payment_window_ms.is_none() && known_buyers.holds_order(sale.id, user) =>
        {
            counter!(KNOWN_BUYER_ANSWERS, "strategy" => strategy).increment(1);
            Ok(Outcome::AlreadyPurchased)
        }
        Phase::Open => match strategies.get(sale.strategy).purchase(&sale, user, quantity).await {
            Err(err) => Err(probe.triage(err).await),
            answer => answer,
        },
    };
    if let Some(pass) = pass {
        room.served(pass, quantity, &result).await;
    }
    if let Ok(Outcome::Placed { .. } | Outcome::AlreadyPurchased) = result
        && sale.payment_window_ms.is_none()
    {
        known_buyers.remember(sale.id, user);
    }
    let label = match &result {
        Ok(outcome) => outcome.label(),
        Err(StrategyError::Busy { .. }) => "busy",
        Err(StrategyError::Unavailable { .. }) => "unavailable",
        Err(StrategyError::Misconfigured { .. }) => "misconfigured",
        Err(StrategyError::Internal(_)) => "internal",
    };
    counter!(crate::metric_names::PURCHASE_OUTCOMES_TOTAL, "strategy" => strategy, "outcome" => label)
        .increment(1);
    Ok(result?)
}
