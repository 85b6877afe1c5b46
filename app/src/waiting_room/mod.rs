//! A waiting room in front of a sale (docs/waiting-room.md): buyers take a
//! place in a line, first come, first served across every instance; an
//! admitter lets them in in that order, at most `admissions_per_s` a second
//! and at most `concurrency` at once; each admitted buyer gets a short-lived
//! signed admission ([`admission`]) that the purchase of that sale requires
//! and uses up.
//!
//! - The line is in Redis ([`line`]): a sorted set of tickets from one
//!   counter, who was seen when, who is admitted. A buyer who stops looking
//!   at their place for [`line::LEFT_AFTER`] has left, and is dropped when
//!   the line reaches them.
//! - The concurrency bound is the lock library's
//!   [`Semaphore`](redis_lock::Semaphore): each admitted buyer holds one
//!   permit, handed over from the admitter to whichever instance serves the
//!   purchase, which gives it back; an admission never used frees its
//!   permit when its lease ends. Without a `concurrency` setting the
//!   semaphore is as large as [`UNBOUNDED_PERMITS`] and only counts the
//!   admissions in flight.
//! - Nobody is admitted to buy what is no longer there: the admitter lets
//!   in at most the remaining stock (Postgres) less the admissions in
//!   flight. A sold-out answer, or no stock left, marks the sale sold out
//!   for [`SOLD_OUT_HOLD`], renewed while it lasts; every look at a place
//!   reads the mark, so waiting buyers learn it at their next look.
//! - One admitter per sale ([`admitter`]): every instance that buyers visit
//!   runs one, and the lock library's lock lets one of them lead.
//! - Its Redis round trips (the line's scripts, the semaphore, the
//!   admitter's lead) are counted in `seckill_redis_round_trips_total` under
//!   the sale's strategy: what a unit of that strategy costs with a room.
//! - Redis restarted empty: the line is gone; a look answers
//!   [`RoomError::NotInLine`] and the buyer joins again (at the back), and
//!   an admission in hand is refused as unknown.

mod admission;
mod admitter;
mod line;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis_lock::{LockClient, LockConfig, LockError, LockName, Semaphore};
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::DropGuard;

pub use admission::{Admission, AdmissionKey};
pub use line::{LEFT_AFTER, PACE_WINDOW};

use crate::backends::{RedisHandle, count_redis_round_trips};
use crate::outcome::{Outcome, StrategyError};
use crate::sale::{Phase, Quantity, Sale, SaleId, UserId, WaitingRoomSettings};
use crate::strategy::StrategyName;
use crate::strategy::lock::library_lock::lock_error;

/// The permits of a room without a `concurrency` setting: more than any
/// stock the admitter would let in at once.
pub const UNBOUNDED_PERMITS: u32 = 1_000_000;

/// How long a sale stays marked sold out after the last sign of it (a
/// purchase answered `sold-out`, a stock read of 0).
pub const SOLD_OUT_HOLD: Duration = Duration::from_secs(2);

/// How long a permit outlives its admission, so that a purchase begun at
/// the admission's last moment still holds the permit while it runs.
const PERMIT_SLACK: Duration = Duration::from_millis(250);

/// How long an instance keeps its admitter of a sale after a buyer last
/// joined or looked there.
const ADMITTER_IDLE: Duration = Duration::from_secs(60);

/// A buyer's place, as `POST /sales/{id}/line` and `GET
/// /sales/{id}/line/{user_id}` answer it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Place {
    /// In line.
    Waiting {
        /// 1 for the next buyer to be admitted. Buyers ahead who left are
        /// counted until the line reaches them.
        position: u64,
        /// Buyers ahead.
        ahead: u64,
        /// Admissions per second over the last [`PACE_WINDOW`] (or since
        /// the first, when sooner).
        admissions_per_s: f64,
        /// `ahead` at that pace, milliseconds; `null` before any admission.
        estimated_wait_ms: Option<u64>,
    },
    /// Admitted: buy with `admission` before `expires_at`.
    Admitted {
        /// The signed admission, for the purchase's `admission` field.
        admission: String,
        expires_at: DateTime<Utc>,
    },
    /// No stock is left: nobody will be admitted.
    SoldOut,
}

/// Why a waiting-room request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    /// The sale has no waiting room (`404`).
    #[error("this sale has no waiting room")]
    NoRoom,
    /// The buyer has no place (`404 not-in-line`): never joined, left,
    /// dropped, or the line was lost with Redis. Join again.
    #[error("this buyer has no place in the line; join it (again)")]
    NotInLine,
    /// A purchase of a sale with a waiting room without an admission
    /// (`403 admission-required`).
    #[error("this sale has a waiting room: join its line and buy with the admission it gives")]
    AdmissionRequired,
    /// An admission that is not valid for this purchase (`403
    /// admission-refused`): why.
    #[error("{0}")]
    AdmissionRefused(&'static str),
    /// A valid admission that was used already: the purchase path answers
    /// `already-purchased` when the buyer holds an order (a retry of a
    /// purchase whose answer was lost), `403 admission-refused` otherwise.
    #[error("the admission was used already, or the line lost it: join the line again")]
    AdmissionUsed,
    /// The sale has ended (`409 ended`).
    #[error("the sale has ended")]
    Ended,
    /// Redis failed (`503`).
    #[error(transparent)]
    Backend(#[from] StrategyError),
}

/// An admission in use by one purchase. [`WaitingRoom::served`] gives its
/// permit back; a purchase cut off before (the request's timeout, a client
/// that hung up) gives it back when the pass is dropped, so that a lost
/// connection does not hold a place of `concurrency` until the admission
/// lapses.
pub struct Pass {
    room: WaitingRoom,
    sale: SaleId,
    strategy: StrategyName,
    settings: WaitingRoomSettings,
    buyer: UserId,
    permit: String,
    entry: String,
    served: bool,
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass").field("sale", &self.sale).field("buyer", &self.buyer).finish()
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if self.served || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (room, sale, strategy) = (self.room.clone(), self.sale, self.strategy);
        let (settings, permit) = (self.settings, std::mem::take(&mut self.permit));
        tokio::spawn(async move {
            if let Err(err) = room.give_back(sale, strategy, settings, &permit).await {
                tracing::warn!(sale_id = sale.0, %err, "a cut-off purchase's permit was not given back");
            }
        });
    }
}

/// The waiting rooms of every sale that has one; cheap to clone.
#[derive(Clone)]
pub struct WaitingRoom {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisHandle,
    /// One lock client per strategy, counting its round trips under the
    /// strategy's name.
    locks: HashMap<StrategyName, LockClient>,
    key: AdmissionKey,
    db: PgPool,
    /// How long a purchase may run: its permit is renewed for this long
    /// when the purchase starts.
    purchase_bound: Duration,
    /// The admitter task of each sale visited lately; dropping the entry
    /// stops it.
    admitters: moka::sync::Cache<SaleId, Arc<DropGuard>>,
}

impl WaitingRoom {
    /// The rooms on `redis`, signing admissions with a key derived from
    /// `admin_token`, reading stock from `db`; a purchase runs for at most
    /// `purchase_bound` (the request timeout).
    ///
    /// Errors: [`LockError::InvalidConfig`] (the lock library's default
    /// timeouts, which are valid).
    pub fn new(
        redis: &RedisHandle,
        db: PgPool,
        admin_token: &str,
        purchase_bound: Duration,
    ) -> Result<Self, LockError> {
        let admitters = moka::sync::Cache::builder().time_to_idle(ADMITTER_IDLE).build();
        let mut locks = HashMap::new();
        for registration in crate::strategy::REGISTRY {
            let strategy = registration.name;
            let config = LockConfig {
                on_round_trip: Some(Arc::new(move |n| {
                    count_redis_round_trips(strategy.as_str(), n)
                })),
                ..LockConfig::default()
            };
            locks.insert(strategy, LockClient::with_config(redis.client().clone(), config)?);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                locks,
                redis: redis.clone(),
                key: AdmissionKey::derive(admin_token),
                db,
                purchase_bound,
                admitters,
            }),
        })
    }

    /// Puts `buyer` in `sale`'s line (once: joining again keeps the place)
    /// and answers their place.
    ///
    /// Errors: [`RoomError::NoRoom`], [`RoomError::Backend`].
    pub async fn join(&self, sale: &Arc<Sale>, buyer: UserId) -> Result<Place, RoomError> {
        self.place(sale, buyer, true).await
    }

    /// `buyer`'s place in `sale`'s line; counts as the buyer still being
    /// there.
    ///
    /// Errors: [`RoomError::NoRoom`], [`RoomError::NotInLine`],
    /// [`RoomError::Backend`].
    pub async fn look(&self, sale: &Arc<Sale>, buyer: UserId) -> Result<Place, RoomError> {
        self.place(sale, buyer, false).await
    }

    async fn place(&self, sale: &Arc<Sale>, buyer: UserId, join: bool) -> Result<Place, RoomError> {
        let settings = sale.waiting_room.settings().ok_or(RoomError::NoRoom)?;
        if sale.phase(Utc::now()) == Phase::Ended {
            return Err(RoomError::Ended);
        }
        self.keep_admitting(sale, settings);
        let mut conn = self.inner.redis.conn().await?;
        let keys = line::Keys::new(&self.inner.redis, sale);
        Ok(match line::place(&mut conn, &keys, buyer, join).await? {
            line::Seen::SoldOut => Place::SoldOut,
            line::Seen::Admitted { permit, ends_ms } => {
                let admission = Admission { sale: sale.id, buyer, permit };
                Place::Admitted {
                    admission: self.inner.key.sign(&admission, ends_ms),
                    expires_at: DateTime::from_timestamp_millis(ends_ms as i64).unwrap_or_default(),
                }
            }
            line::Seen::Waiting { ahead, recent, window_ms } => {
                let admissions_per_s = recent as f64 * 1000.0 / window_ms.max(1) as f64;
                let estimated_wait_ms =
                    (recent > 0).then(|| (ahead as f64 * 1000.0 / admissions_per_s).round() as u64);
                Place::Waiting { position: ahead + 1, ahead, admissions_per_s, estimated_wait_ms }
            }
            line::Seen::Absent => return Err(RoomError::NotInLine),
        })
    }

    /// Takes `buyer` out of `sale`'s line, and gives back the permit of an
    /// admission they held.
    ///
    /// Errors: [`RoomError::NoRoom`], [`RoomError::Backend`].
    pub async fn leave(&self, sale: &Sale, buyer: UserId) -> Result<(), RoomError> {
        let settings = sale.waiting_room.settings().ok_or(RoomError::NoRoom)?;
        let mut conn = self.inner.redis.conn().await?;
        let keys = line::Keys::new(&self.inner.redis, sale);
        if let Some(permit) = line::leave(&mut conn, &keys, buyer).await? {
            self.give_back(sale.id, sale.strategy, settings, &permit).await?;
        }
        Ok(())
    }

    async fn give_back(
        &self,
        sale: SaleId,
        strategy: StrategyName,
        settings: WaitingRoomSettings,
        permit: &str,
    ) -> Result<(), StrategyError> {
        // Expired: the lease ended first, and the permit is free already.
        let semaphore = self.semaphore(sale, strategy, settings)?;
        semaphore.give_back(permit).await.map(drop).map_err(lock_error)
    }

    /// The admission a purchase of `sale` by `buyer` needs, used up: `None`
    /// for a sale without a waiting room (and no admission sent).
    ///
    /// Errors: [`RoomError::AdmissionRequired`]; [`RoomError::AdmissionRefused`]
    /// for an admission that is forged, another buyer's or sale's, lapsed,
    /// used, or unknown to Redis, and for one sent to a sale without a room;
    /// [`RoomError::Backend`].
    pub async fn admit(
        &self,
        sale: &Sale,
        buyer: UserId,
        admission: Option<&str>,
    ) -> Result<Option<Pass>, RoomError> {
        let (settings, token) = match (sale.waiting_room.settings(), admission) {
            (None, None) => return Ok(None),
            (None, Some(_)) => {
                return Err(RoomError::AdmissionRefused("this sale has no waiting room"));
            }
            (Some(_), None) => return Err(RoomError::AdmissionRequired),
            (Some(settings), Some(token)) => (settings, token),
        };
        let admission = self.inner.key.verify(token).map_err(RoomError::AdmissionRefused)?;
        if admission.sale != sale.id || admission.buyer != buyer {
            return Err(RoomError::AdmissionRefused("an admission of another buyer or sale"));
        }
        let mut conn = self.inner.redis.conn().await?;
        let keys = line::Keys::new(&self.inner.redis, sale);
        let entry = match line::consume(&mut conn, &keys, buyer, &admission.permit).await? {
            line::Used::Now(entry) => entry,
            line::Used::Lapsed => {
                return Err(RoomError::AdmissionRefused("the admission has lapsed"));
            }
            line::Used::Unknown => return Err(RoomError::AdmissionUsed),
        };
        let pass = Pass {
            room: self.clone(),
            sale: sale.id,
            strategy: sale.strategy,
            settings,
            buyer,
            permit: admission.permit,
            entry,
            served: false,
        };
        // The permit now lasts as long as the purchase may: a purchase that
        // outlives its admission still counts against the bound and the
        // stock the admitter reads.
        let lease = self.inner.purchase_bound + PERMIT_SLACK;
        let semaphore = self.semaphore(sale.id, sale.strategy, settings)?;
        match semaphore.renew(&pass.permit, lease).await.map_err(lock_error)? {
            true => Ok(Some(pass)),
            false => Err(RoomError::AdmissionRefused("the admission has lapsed")),
        }
    }

    /// Ends `pass`'s purchase of `quantity` units, which answered `result`:
    /// its permit is given back; a one-unit purchase answered `sold-out`
    /// marks the sale sold out (a larger one only says that fewer units are
    /// left than it asked for); a purchase that failed on a backing server
    /// gets its admission back, to retry while it lasts. Failures are
    /// logged, not answered: the permit's lease ends anyway.
    pub async fn served(
        &self,
        mut pass: Pass,
        quantity: Quantity,
        result: &Result<Outcome, StrategyError>,
    ) {
        pass.served = true;
        let keys = line::Keys::of(&self.inner.redis, pass.sale, pass.strategy);
        let done = async {
            let mut conn = self.inner.redis.conn().await?;
            match result {
                Err(_) => {
                    line::restore(&mut conn, &keys, pass.buyer, &pass.entry).await?;
                    return Ok(());
                }
                Ok(Outcome::SoldOut) if quantity == Quantity::ONE => {
                    line::mark_sold_out(&mut conn, &keys, SOLD_OUT_HOLD).await?;
                }
                Ok(_) => {}
            }
            self.give_back(pass.sale, pass.strategy, pass.settings, &pass.permit).await
        };
        if let Err(err) = done.await {
            tracing::warn!(sale_id = pass.sale.0, %err, "a served admission was not given back");
        }
    }

    /// The semaphore of `sale`'s room, through `strategy`'s lock client.
    fn semaphore(
        &self,
        sale: SaleId,
        strategy: StrategyName,
        settings: WaitingRoomSettings,
    ) -> Result<Semaphore, StrategyError> {
        let permits = settings.concurrency.map_or(UNBOUNDED_PERMITS, |n| n as u32);
        let name =
            LockName::new(self.inner.redis.sale_key(sale.0, "room:permits")).map_err(lock_error)?;
        Semaphore::new(self.locks(strategy)?, name, permits).map_err(lock_error)
    }

    /// The lock client that counts its round trips under `strategy`.
    fn locks(&self, strategy: StrategyName) -> Result<&LockClient, StrategyError> {
        self.inner.locks.get(&strategy).ok_or_else(|| {
            StrategyError::Internal(anyhow::anyhow!("no waiting-room lock client for {strategy}"))
        })
    }

    /// Stops the admitters of the sales nobody joined or looked at here for
    /// [`ADMITTER_IDLE`]: the cache evicts only when asked to, so every
    /// admitter asks now and then, and an idle one thereby stops itself.
    fn drop_idle_admitters(&self) {
        self.inner.admitters.run_pending_tasks();
    }

    /// Starts this instance's admitter of `sale` unless it runs, and keeps
    /// it for [`ADMITTER_IDLE`] more.
    fn keep_admitting(&self, sale: &Arc<Sale>, settings: WaitingRoomSettings) {
        if sale.phase(Utc::now()) == Phase::Ended {
            return;
        }
        self.inner.admitters.get_with(sale.id, || {
            let stop = tokio_util::sync::CancellationToken::new();
            let admitter = admitter::Admitter::new(self.clone(), sale.clone(), settings);
            tokio::spawn(admitter.run(stop.clone()));
            Arc::new(stop.drop_guard())
        });
    }
}
