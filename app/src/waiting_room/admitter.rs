//! The admitter of one sale's room: while it leads (the lock library's lock
//! `…:room:admitter`, renewed by its watchdog), every [`TICK`] it lets in
//! the buyers at the head of the line that the pace, the permits and the
//! stock allow. Every instance that buyers visit runs one; the others wait
//! to lead, so a crashed leader is replaced once its lease ends. Each
//! admission carries the leader's fencing token, and the line refuses one
//! older than the newest it has seen (`admit.lua`): a leader paused in the
//! middle of a round wakes with counts that a newer leader has overtaken,
//! and its round stops at its next admission.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use redis_lock::{LockError, LockGuard, LockName, LockOptions};
use tokio_util::sync::CancellationToken;

use super::{PERMIT_SLACK, SOLD_OUT_HOLD, WaitingRoom, line};
use crate::outcome::StrategyError;
use crate::sale::{Phase, Sale, WaitingRoomSettings};
use crate::strategy::lock::library_lock::lock_error;

/// How often the leader admits: admissions of a second come in 20 steps.
pub const TICK: Duration = Duration::from_millis(50);

/// The leader's lease (renewed by the watchdog every third of it): how long
/// a room goes without admissions when its leader dies.
const LEADER_LEASE: Duration = Duration::from_secs(2);

/// How often an instance that does not lead tries to.
const FOLLOWER_RETRY: Duration = Duration::from_millis(500);

/// Admissions per tick at most, whatever the settings.
const MAX_PER_TICK: i64 = 1000;

/// How a round ended.
enum Round {
    Done,
    /// A newer leader admits: stop leading.
    Fenced,
}

pub(super) struct Admitter {
    room: WaitingRoom,
    sale: Arc<Sale>,
    settings: WaitingRoomSettings,
}

impl Admitter {
    pub(super) fn new(room: WaitingRoom, sale: Arc<Sale>, settings: WaitingRoomSettings) -> Self {
        Self { room, sale, settings }
    }

    /// Leads when it can, until `stop` or the sale's end.
    pub(super) async fn run(self, stop: CancellationToken) {
        let Ok(name) =
            LockName::new(self.room.inner.redis.sale_key(self.sale.id.0, "room:admitter"))
        else {
            return;
        };
        let options = LockOptions::new(Duration::ZERO, LEADER_LEASE).with_watchdog();
        while !stop.is_cancelled() && self.sale.phase(Utc::now()) != Phase::Ended {
            let Ok(locks) = self.room.locks(self.sale.strategy) else { return };
            match locks.try_lock_with(&name, options).await {
                Ok(lead) => {
                    self.lead(&lead, &stop).await;
                    drop(lead.release().await);
                }
                Err(LockError::Timeout { .. }) => {}
                Err(err) => tracing::debug!(sale_id = self.sale.id.0, %err, "admitter lock"),
            }
            self.room.drop_idle_admitters();
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(FOLLOWER_RETRY) => {}
            }
        }
    }

    async fn lead(&self, lead: &LockGuard, stop: &CancellationToken) {
        let pace = self.settings.admissions_per_s.and_then(|rate| {
            let rate = NonZeroU32::new(rate as u32)?;
            // A burst of two ticks' admissions: a token that comes due just
            // after a round is still there at the next, and nothing is
            // saved up beyond that while nobody waits.
            let burst = NonZeroU32::new((rate.get() / 10).max(2))?;
            Some(RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)))
        });
        let mut ticks = tokio::time::interval(TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        for round in 0u64.. {
            if round % 20 == 0 {
                self.room.drop_idle_admitters();
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = lead.lost().cancelled() => return,
                _ = ticks.tick() => {}
            }
            if self.sale.phase(Utc::now()) == Phase::Ended {
                return;
            }
            match self.admit(pace.as_ref(), lead.fencing_token().0).await {
                Ok(Round::Done) => {}
                Ok(Round::Fenced) => return,
                Err(err) => {
                    tracing::debug!(sale_id = self.sale.id.0, %err, "admission round failed")
                }
            }
        }
    }

    /// One round, as the leader of fencing token `token`: as many buyers as
    /// the stock not yet spoken for, the free permits and the pace allow.
    async fn admit(
        &self,
        pace: Option<&DefaultDirectRateLimiter>,
        token: u64,
    ) -> Result<Round, StrategyError> {
        if self.sale.phase(Utc::now()) != Phase::Open {
            return Ok(Round::Done);
        }
        let inner = &self.room.inner;
        let keys = line::Keys::new(&inner.redis, &self.sale);
        let mut conn = inner.redis.conn().await?;
        // An empty line costs one round trip a round, not the permits' and
        // the stock's: a buyer who joins now waits at most one more round.
        if line::waiting(&mut conn, &keys).await? == 0 {
            return Ok(Round::Done);
        }
        let semaphore = self.room.semaphore(self.sale.id, self.sale.strategy, self.settings)?;
        // The admissions in flight first, then the stock: a purchase commits
        // before it gives its permit back, so a unit sold between the two
        // reads is counted in one of them, never in neither.
        let in_flight = i64::from(semaphore.in_use().await.map_err(lock_error)?);
        let remaining = crate::sale::stock(&inner.db, self.sale.id)
            .await?
            .map_or(0, |stock| stock.remaining_stock);
        if remaining <= 0 {
            line::mark_sold_out(&mut conn, &keys, SOLD_OUT_HOLD).await?;
            return Ok(Round::Done);
        }
        let ttl = Duration::from_millis(self.settings.admission_ttl_ms as u64);
        for _ in 0..(remaining - in_flight).clamp(0, MAX_PER_TICK) {
            if pace.is_some_and(|pace| pace.check().is_err()) {
                break;
            }
            let options = LockOptions::new(Duration::ZERO, ttl + PERMIT_SLACK);
            let permit = match semaphore.acquire(options).await {
                Ok(permit) => permit.hand_over(),
                Err(LockError::Timeout { .. }) => break,
                Err(err) => return Err(lock_error(err)),
            };
            match line::admit(&mut conn, &keys, &permit, ttl, token).await? {
                line::Admitted::Buyer { .. } => {
                    metrics::counter!(crate::metric_names::ROOM_ADMISSIONS_TOTAL).increment(1);
                }
                line::Admitted::Empty | line::Admitted::Closed => {
                    semaphore.give_back(&permit).await.map_err(lock_error)?;
                    break;
                }
                line::Admitted::Fenced => {
                    semaphore.give_back(&permit).await.map_err(lock_error)?;
                    return Ok(Round::Fenced);
                }
            }
        }
        Ok(Round::Done)
    }
}
