//! `lock/watchdog`: the project's lock library (the `redis-lock` crate), renewed while
//! held — generation 6; with fencing, `lock/fenced` — generation 7.
//!
//! The library's lock is a reentrant hash lock with an owner token, woken by
//! pub/sub, whose watchdog renews the lease every lease/3 and tells the holder
//! (the guard's `lost` signal) when a renewal fails or finds another owner.
//! The critical section checks that signal right before its write
//! ([`SaleLock::still_held`]).
//!
//! Fixes what `lock/token` breaks: a holder that stalls inside the critical
//! section keeps its lock, because its process keeps renewing. Still breaks
//! when the whole process pauses (stop-the-world, SIGSTOP, a frozen VM): the
//! watchdog pauses too, the lease runs out, and on resume the write may run
//! before the renewal that would report the loss — a check before a write is
//! always a step behind. `lock/fenced` adds the fence that Postgres checks
//! (`super::fence`), which closes that gap.
//!
//! Leases below the library's minimum for a renewed lock
//! (`redis_lock::MIN_WATCHDOG_LEASE`) are raised to it.
//!
//! `lock/fair` (`super::library_fair`) is `lock/fenced` taken through the
//! library's fair lock; it reuses this lock's client, options, release and
//! error mapping.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis_lock::{
    LockClient, LockConfig, LockError, LockGuard, LockName, LockOptions, MIN_WATCHDOG_LEASE,
    ReleaseOutcome,
};

use tokio_util::sync::CancellationToken;

use super::{Release, SaleLock, Shared, lease};
use crate::backends::{RedisHandle, count_redis_round_trips};
use crate::sale::Sale;
use crate::strategy::{Backend, Expectation, Fault, Registration, StrategyError, StrategyName};

/// Wire name of the unfenced variant, and the `strategy` label of its metrics.
pub const WATCHDOG_NAME: StrategyName = StrategyName::declare("lock/watchdog");

/// Wire name of the fenced variant, and the `strategy` label of its metrics.
pub const FENCED_NAME: StrategyName = StrategyName::declare("lock/fenced");

/// `lock/watchdog` in the registry.
pub const WATCHDOG: Registration = Registration {
    name: WATCHDOG_NAME,
    about: "the naive steps inside the lock library's reentrant lock, renewed by its watchdog",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| {
        let lock = WatchdogLock::new(&deps.redis, WATCHDOG_NAME, deps.settings.lock.hold())?;
        Ok(Shared::of(deps).locked(WATCHDOG_NAME, lock))
    },
    // The watchdog renews the lease through stalls of the critical section,
    // but a stopped process stops its watchdog too: the lease runs out, and
    // a holder stopped between its read and its write writes on resumption.
    // A Redis restarted empty forgets the lock as well.
    expect: |on| match on.fault {
        Some(Fault::PauseInstance | Fault::RedisRestart) => Expectation::MayBreak,
        _ => Expectation::Correct,
    },
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

/// `lock/fenced` in the registry.
pub const FENCED: Registration = Registration {
    name: FENCED_NAME,
    about: "lock/watchdog plus a fencing token checked by Postgres",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| {
        let lock = WatchdogLock::new(&deps.redis, FENCED_NAME, deps.settings.lock.hold())?;
        Ok(Shared::of(deps).fenced(FENCED_NAME, lock))
    },
    // Expected correct everywhere (the default): renewed, and fenced —
    // Postgres refuses the writes of a holder paused past its lease (a
    // stopped instance included) or whose key a restarted Redis forgot; a
    // killed holder's lease expires.
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

/// The library lock of one strategy (one [`LockClient`] per strategy, so that
/// its round trips are counted under the strategy's name).
pub struct WatchdogLock {
    client: LockClient,
    prefix: String,
    strategy: StrategyName,
    max_hold: Duration,
}

impl WatchdogLock {
    /// A lock on the Redis of `redis`, counting round trips for `strategy`,
    /// renewed for at most `max_hold` (`SECKILL_LOCK_HOLD_MS`) per hold.
    pub fn new(
        redis: &RedisHandle,
        strategy: StrategyName,
        max_hold: Duration,
    ) -> anyhow::Result<Self> {
        let config = LockConfig {
            on_round_trip: Some(Arc::new(move |n| count_redis_round_trips(strategy.as_str(), n))),
            ..LockConfig::default()
        };
        let client = LockClient::with_config(redis.client().clone(), config)?;
        Ok(Self { client, prefix: redis.prefix.clone(), strategy, max_hold })
    }

    /// The lock's name: `PREFIX:{sale:ID}:lock` (its fencing counter and
    /// wake-up channel share the hash tag).
    pub fn lock_name(&self, sale: &Sale) -> Result<LockName, StrategyError> {
        sale_lock_name(&self.prefix, sale)
    }

    /// The client the lock is taken through (`lock/fair` takes its
    /// `FairLock` through it too, so that its round trips are counted the
    /// same way).
    pub(super) fn client(&self) -> &LockClient {
        &self.client
    }

    /// One hold of `sale`'s lock: wait at most `wait`, the sale's lease
    /// raised to the watchdog's minimum, renewed for at most `max_hold`.
    pub(super) fn options(&self, sale: &Sale, wait: Duration) -> LockOptions {
        let lease = Duration::from_millis(lease(sale)).max(MIN_WATCHDOG_LEASE);
        LockOptions::new(wait, lease).with_watchdog().with_max_hold(self.max_hold)
    }
}

/// What an acquisition of the library's lock (reentrant or fair) means to
/// [`SaleLock::acquire`]: a guard, `None` when the wait ran out, or the
/// error mapped by [`lock_error`].
pub(super) fn granted(
    acquired: Result<LockGuard, LockError>,
) -> Result<Option<LockGuard>, StrategyError> {
    match acquired {
        Ok(guard) => Ok(Some(guard)),
        Err(LockError::Timeout { .. }) => Ok(None),
        Err(err) => Err(lock_error(err)),
    }
}

/// `PREFIX:{sale:ID}:lock`.
pub(super) fn sale_lock_name(prefix: &str, sale: &Sale) -> Result<LockName, StrategyError> {
    LockName::new(format!("{prefix}:{{sale:{}}}:lock", sale.id.0))
        .map_err(|err| StrategyError::Internal(err.into()))
}

/// Maps a library error: Redis refusing the account or a key
/// (`crate::backends::redis_misconfiguration`) is `Misconfigured`,
/// unreachable Redis `Unavailable`, a grant that came back too late `busy`
/// (retry), anything else `Internal`.
pub(crate) fn lock_error(err: LockError) -> StrategyError {
    let refused = match &err {
        LockError::Redis(redis) => crate::backends::redis_misconfiguration(redis),
        _ => None,
    };
    if let Some(cause) = refused {
        return StrategyError::Misconfigured { backend: Backend::Redis, cause, source: err.into() };
    }
    match err {
        err if err.is_unavailable() => {
            StrategyError::Unavailable { backend: Backend::Redis, source: err.into() }
        }
        LockError::AcquiredTooLate { .. } => StrategyError::Busy {
            reason: "the sale's lock was granted too late to be trusted",
            retry_after: super::BUSY_RETRY_AFTER,
        },
        err => StrategyError::Internal(err.into()),
    }
}

#[async_trait]
impl SaleLock for WatchdogLock {
    type Held = LockGuard;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let name = self.lock_name(sale)?;
        granted(self.client.try_lock_with(&name, self.options(sale, wait)).await)
    }

    fn lost<'a>(&self, held: &'a Self::Held) -> Option<&'a CancellationToken> {
        Some(held.lost())
    }

    async fn release(&self, _sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        super::count_renewals(self.strategy, held.renewals());
        match held.release().await.map_err(lock_error)? {
            ReleaseOutcome::Released | ReleaseOutcome::StillHeld { .. } => Ok(Release::Released),
            ReleaseOutcome::NotOwner | ReleaseOutcome::Expired => Ok(Release::NotHeld),
        }
    }
}
