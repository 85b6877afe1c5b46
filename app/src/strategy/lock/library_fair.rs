//! `lock/fair`: `lock/fenced` taken through the lock library's fair lock
//! (`redis_lock::FairLock`, as Redisson's `RFairLock`), so that the buyers
//! waiting for a sale's lock are served in the order they joined its line,
//! across instances and tasks. It exists to measure what that order costs
//! per unit, and who gets the units, next to `lock/watchdog` and
//! `lock/fenced`.
//!
//! **Why another lock.** The reentrant lock behind `lock/fenced` serves
//! waiters by a race: a release wakes one contender per process (pub/sub),
//! and whichever acquire script reaches Redis first takes the lock; a
//! newcomer that arrives just then can take it ahead of buyers that waited
//! for a second. Inside one process its local line is first come, first
//! served; across instances nothing orders them. The fair lock keeps a line
//! beside the lock hash, ordered by each waiter's first attempt on the
//! Redis server's clock: only the first waiter in line may take a free lock
//! (a newcomer never barges in), and a release wakes that waiter alone, on
//! its own channel. Every task is its own waiter, so the order holds
//! between the tasks of one instance as well as between instances.
//!
//! **The invariant** is `lock/fenced`'s, unchanged: the guard is the
//! reentrant lock's (watchdog renewals every lease/3 for at most
//! `SECKILL_LOCK_HOLD_MS`, the `lost()` signal checked right before the
//! write), and the holder claims the sale with a fencing token that the
//! write statement checks in Postgres (`super::fence`). The line decides who
//! goes next; the fence keeps the books exact whatever the lock does. A
//! holder whose lease ran out (a paused process, a Redis restarted empty)
//! is refused by the fence or by its loss signal, and answered `busy`, as
//! under `lock/fenced`. A dead holder's lease frees the lock to the first
//! live waiter in line.
//!
//! **The wait** is `SECKILL_LOCK_WAIT_MS`, as for every lock variant. A
//! waiter whose wait runs out leaves the line (the library's `leave`, which
//! also wakes the next waiter if the lock is free) and is answered `busy`,
//! counted in `seckill_lock_timeouts_total`; its retry joins at the back.
//! A buyer that the line could not serve within half of its wait, at the
//! line's pace, is not let in: it is answered `busy` at once, counted the
//! same way (the library's admission; a line that lets everyone in under a
//! spike is served from a head that is always about to give up, and
//! stalls — docs/locks.md, `lock/fair`).
//!
//! **The cost** over `lock/fenced`, all counted in
//! `seckill_redis_round_trips_total`: besides the lock hash
//! `PREFIX:{sale:ID}:lock` and its counter `…:lock:fence`, the line
//! `…:lock:queue` and the waiters' deadlines `…:lock:waiters` (sorted sets
//! that expire once nobody waits). A waiter sends its first attempt (which
//! joins the line), subscribes to its own channel `…:lock:turn:<owner>`,
//! attempts once per wake-up and once per third of the library's waiter
//! timeout (2 s) to renew its deadline, unsubscribes when done, and sends
//! one more script to leave the line if its wait runs out. Where the
//! reentrant lock lets one task per process contend, here every waiting
//! task subscribes and renews on its own. A waiter that stops renewing (its
//! process died) holds up the line for at most the waiter timeout plus a
//! third: that is the price of not skipping a live waiter.
//!
//! **Deliberately not done.** The order is that of the first attempts'
//! arrival at Redis, not of the requests' arrival at the service; purchases
//! that find the lock free and nobody waiting take it at once, with no
//! line; purchases answered by the sold-out shortcut never join it. The
//! line is not bounded (the lock wait bounds each place in it), a buyer
//! answered `busy` keeps no place for its retry, and nothing orders the
//! outcome beyond the lock: a buyer served first may still find the sale
//! sold out.

use std::time::Duration;

use async_trait::async_trait;
use redis_lock::{FairLock, LockGuard};
use tokio_util::sync::CancellationToken;

use super::library_lock::{WatchdogLock, granted};
use super::{Release, SaleLock, Shared};
use crate::backends::RedisHandle;
use crate::sale::Sale;
use crate::strategy::{Backend, Registration, StrategyError, StrategyName};

/// Wire name, and the `strategy` label of its metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/fair");

/// `lock/fair` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "lock/fenced taken through the lock library's fair lock: waiters served in arrival \
            order",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| {
        let lock = FairSaleLock::new(&deps.redis, NAME, deps.settings.lock.hold())?;
        Ok(Shared::of(deps).fenced(NAME, lock))
    },
    // Expected correct everywhere (the default), as `lock/fenced`: renewed,
    // and fenced — Postgres refuses the writes of a holder paused past its
    // lease or whose key a restarted Redis forgot; a killed holder's lease
    // expires, and a killed waiter leaves the line at its deadline.
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

/// The sale's lock taken through the library's [`FairLock`]: the client,
/// the lock's name, the hold's options, the release and the error mapping
/// are [`WatchdogLock`]'s; only the acquisition differs.
pub struct FairSaleLock {
    lock: WatchdogLock,
}

impl FairSaleLock {
    /// A fair lock on the Redis of `redis`, counting round trips for
    /// `strategy`, renewed for at most `max_hold` (`SECKILL_LOCK_HOLD_MS`)
    /// per hold.
    pub fn new(
        redis: &RedisHandle,
        strategy: StrategyName,
        max_hold: Duration,
    ) -> anyhow::Result<Self> {
        Ok(Self { lock: WatchdogLock::new(redis, strategy, max_hold)? })
    }

    /// The lock of `sale`: `PREFIX:{sale:ID}:lock`, its line
    /// `PREFIX:{sale:ID}:lock:queue`.
    pub fn fair_lock(&self, sale: &Sale) -> Result<FairLock, StrategyError> {
        Ok(FairLock::new(self.lock.client(), self.lock.lock_name(sale)?))
    }
}

#[async_trait]
impl SaleLock for FairSaleLock {
    type Held = LockGuard;

    /// Joins the sale's line and takes the lock at its turn; a wait that
    /// runs out leaves the line (`Ok(None)`).
    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let lock = self.fair_lock(sale)?;
        granted(lock.try_lock(self.lock.options(sale, wait)).await)
    }

    fn lost<'a>(&self, held: &'a Self::Held) -> Option<&'a CancellationToken> {
        self.lock.lost(held)
    }

    /// The reentrant lock's release, which wakes the first waiter in line
    /// alone.
    async fn release(&self, sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        self.lock.release(sale, held).await
    }
}
