#![doc = include_str!("../README.md")]
//!
//! ## Modules
//! - `connection`: [`RedisClient`] and [`RedisConnection`], one node or a
//!   Redis Cluster (`redis+cluster://`);
//! - `single`: [`LockClient`] and [`LockGuard`], the lock on one node, and
//!   the acquire loop every primitive on one node shares;
//! - `multi`: [`MultiLock`], several locks all or nothing;
//! - `fair`: [`FairLock`], served in arrival order across processes;
//! - `rwlock`: [`RwLock`], many readers or one writer;
//! - `semaphore`: [`Semaphore`], N permits with leases;
//! - `shared`: [`SharedGuard`], a read hold or a permit;
//! - `scheduler`: [`Scheduler`], one run of a periodic job per period;
//! - `redlock`: [`Redlock`] over N independent nodes;
//! - `watchdog`: the holder's view of its lease, and the task that renews it;
//! - `local`: the in-process queue of waiters;
//! - `wakeups`: the shared pub/sub connection that wakes them;
//! - `scripts`: the Lua scripts and their typed replies;
//! - `failpoints` (feature `failpoints`, tests only): pause points.
//!
//! This file holds what they share: names, options, bounds, outcomes, errors,
//! statistics, and the validity arithmetic.

mod connection;
#[cfg(feature = "failpoints")]
pub mod failpoints;
mod fair;
mod local;
mod multi;
mod redlock;
mod rwlock;
mod scheduler;
mod scripts;
mod semaphore;
mod shared;
mod single;
mod wakeups;
mod watchdog;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use connection::{CLUSTER_SCHEME, RedisClient, RedisConnection, cluster_seed_urls};
pub use fair::FairLock;
pub use multi::{MAX_MULTI_LOCK_MEMBERS, MultiGuard, MultiLock};
pub use redlock::{Redlock, RedlockConfig, RedlockGuard, RedlockRelease};
pub use rwlock::RwLock;
pub use scheduler::{Clock, JobRun, PeriodicJob, RunOutcome, Scheduler, SystemClock};
pub use semaphore::Semaphore;
pub use shared::SharedGuard;
pub use single::{LockClient, LockGuard};

/// The shortest lease accepted: below it the lease is gone before a reply
/// crosses a loaded network, and the drift allowance (`0.01·lease + 2 ms`)
/// eats most of it.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// The shortest lease accepted with the watchdog: it renews every lease/3, and
/// a renewal period under 10 ms would be dominated by round trips.
pub const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(30);

/// The longest lease accepted (one day). A lease is a bound on a crashed
/// holder's damage, not a storage duration.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest wait accepted (one hour): every wait is bounded.
pub const MAX_WAIT: Duration = Duration::from_secs(60 * 60);

/// The longest the watchdog renews one hold unless told otherwise
/// ([`LockOptions::with_max_hold`]): one hour, the longest wait the library
/// accepts ([`MAX_WAIT`]). A hold that outlasts it is no longer serving
/// callers that wait for the lock — the most patient of them gave up — so
/// it is treated as hung: the watchdog stops renewing, `lost()` fires with
/// [`LossReason::MaxHold`], and the lease runs out (the lock is not taken
/// from the holder: it may still be writing, and only a fencing token can
/// refuse that write).
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(60 * 60);

/// How far past its `wait` a call that takes a lock on one node may return:
/// the reply to its last attempt, sent before the wait ran out, may take
/// this long (one round trip on a loaded network). Nothing else runs past
/// the wait: a subscription is waited for only until the wait ends, and the
/// release that cleans up after a failed call is sent in the background.
/// (Redlock's own allowance is its per-node timeout.) A zero wait therefore
/// gives its single attempt this long.
pub const WAIT_SLACK: Duration = Duration::from_millis(50);

/// The name of one lock, e.g. `seckill:{sale:7}:lock`.
///
/// It must contain a Redis Cluster hash tag: the first `{` followed later by
/// a `}` with at least one character between them. Every key the library
/// derives from it (fencing counter, wake-up channel) keeps that tag, so a
/// script touching them never fails with `CROSSSLOT` on Redis Cluster.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockName {
    key: String,
    fence: String,
    channel: String,
    tag: (usize, usize),
}

impl LockName {
    /// Validates `name` and derives the lock's keys.
    ///
    /// Errors: [`LockError::InvalidName`] when the name is empty, longer than
    /// 1024 bytes, or has no hash tag.
    pub fn new(name: impl Into<String>) -> Result<Self, LockError> {
        let key = name.into();
        let invalid = |reason: &'static str| LockError::InvalidName { name: key.clone(), reason };
        if key.is_empty() {
            return Err(invalid("empty"));
        }
        if key.len() > 1024 {
            return Err(invalid("longer than 1024 bytes"));
        }
        let tag = hash_tag(&key).ok_or_else(|| {
            invalid("no hash tag: it must contain `{tag}` so that its keys share a cluster slot")
        })?;
        Ok(Self { fence: format!("{key}:fence"), channel: format!("{key}:released"), key, tag })
    }

    /// The lock hash `{owner token → hold count}`: the name itself.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing counter, `<name>:fence`. It never expires: tokens stay
    /// monotonic only while it outlives every holder and every write that
    /// carries one of its tokens. An expired counter would start again at 1,
    /// below tokens the protected resource has seen (which then refuses
    /// every new holder), or, if the resource forgot too, hand out a token a
    /// paused holder still carries. So every fenced name leaves this one
    /// integer behind; delete it only together with the resource's record
    /// of the highest token, or take locks that need no token
    /// [`without_fencing`](LockOptions::without_fencing).
    pub fn fence_key(&self) -> &str {
        &self.fence
    }

    /// The pub/sub channel on which a release announces a free lock,
    /// `<name>:released`.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The hash tag, without its braces (`sale:7` for `seckill:{sale:7}:lock`).
    pub fn hash_tag(&self) -> &str {
        &self.key[self.tag.0..self.tag.1]
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockName({:?})", self.key)
    }
}

/// The byte range of the hash tag's content, by the Redis Cluster rule: the
/// first `{`, then the first `}` after it, with something in between.
fn hash_tag(key: &str) -> Option<(usize, usize)> {
    let open = key.find('{')?;
    let close = open + 1 + key[open + 1..].find('}')?;
    (close > open + 1).then_some((open + 1, close))
}

/// How to take a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockOptions {
    /// How long to wait for the lock in total. Zero means a single attempt.
    /// At most [`MAX_WAIT`].
    pub wait: Duration,
    /// The lease: how long the lock outlives a holder that stops renewing it.
    /// Whole milliseconds (rounded up); between [`MIN_LEASE`] (or
    /// [`MIN_WATCHDOG_LEASE`] with the watchdog) and [`MAX_LEASE`].
    pub lease: Duration,
    /// Renew the lease every lease/3 while the guard lives (the watchdog).
    pub watchdog: bool,
    /// With the watchdog: how long after the grant it stops renewing and
    /// fires `lost()` ([`LossReason::MaxHold`]); the lease then runs out.
    /// Default [`DEFAULT_MAX_HOLD`]; positive, at most [`MAX_LEASE`].
    /// Manual extends are not bounded by it.
    pub max_hold: Duration,
    /// Issue a fencing token from the counter `<name>:fence` (default). That
    /// counter never expires (see [`LockName::fence_key`]); a hold taken
    /// without fencing has token 0 and never creates it. Only the reentrant
    /// lock, the fair lock and the write side of a read-write lock issue
    /// tokens.
    pub fenced: bool,
}

impl LockOptions {
    /// A lease lock without renewal.
    pub fn new(wait: Duration, lease: Duration) -> Self {
        Self { wait, lease, watchdog: false, max_hold: DEFAULT_MAX_HOLD, fenced: true }
    }

    /// The same, renewed by the watchdog while held, for at most
    /// [`max_hold`](Self::max_hold).
    pub fn with_watchdog(self) -> Self {
        Self { watchdog: true, ..self }
    }

    /// The same, with the watchdog renewing for at most `max_hold` after the
    /// grant.
    pub fn with_max_hold(self, max_hold: Duration) -> Self {
        Self { max_hold, ..self }
    }

    /// The same, without a fencing token: for names whose holders write
    /// nothing a token must protect, or that take their tokens from the
    /// protected resource itself. No key outlives such a lock.
    pub fn without_fencing(self) -> Self {
        Self { fenced: false, ..self }
    }

    /// How long the watchdog renews a hold taken with these options (`None`:
    /// no watchdog).
    pub(crate) fn renewal(&self) -> Option<Duration> {
        self.watchdog.then_some(self.max_hold)
    }

    /// Checks the bounds above; returns the lease in milliseconds.
    pub(crate) fn validate(&self) -> Result<u64, LockError> {
        let min = if self.watchdog { MIN_WATCHDOG_LEASE } else { MIN_LEASE };
        if self.lease < min {
            return Err(LockError::InvalidConfig(format!(
                "lease {:?} is shorter than the minimum {min:?}{}",
                self.lease,
                if self.watchdog { " for a watchdog lock" } else { "" }
            )));
        }
        if self.lease > MAX_LEASE {
            return Err(LockError::InvalidConfig(format!(
                "lease {:?} is longer than the maximum {MAX_LEASE:?}",
                self.lease
            )));
        }
        if self.max_hold.is_zero() || self.max_hold > MAX_LEASE {
            return Err(LockError::InvalidConfig(format!(
                "max_hold {:?} must be positive and at most {MAX_LEASE:?}",
                self.max_hold
            )));
        }
        if self.wait > MAX_WAIT {
            return Err(LockError::InvalidConfig(format!(
                "wait {:?} is longer than the maximum {MAX_WAIT:?}",
                self.wait
            )));
        }
        Ok(duration_ms_ceil(self.lease))
    }
}

/// `d` in whole milliseconds, rounded up (saturating; callers bound `d`).
pub(crate) fn duration_ms_ceil(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The clock-drift allowance of the Redlock convention: `0.01·lease + 2 ms`
/// (node-redlock, rslock, redlock-rs; the redis.io description speaks of "a
/// few milliseconds").
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// How long a lock taken in a round that started `elapsed` ago stays valid:
/// `lease − elapsed − drift(lease)`, or `None` when that is not positive.
pub(crate) fn validity(lease: Duration, elapsed: Duration) -> Option<Duration> {
    lease.checked_sub(elapsed)?.checked_sub(drift(lease)).filter(|v| !v.is_zero())
}

/// The fencing token of one acquisition: strictly greater than the token of
/// every earlier acquisition of the same lock (while Redis keeps the counter).
/// Re-entries through the guard share their acquisition's token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a holder lost (or never had) its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossReason {
    /// Another owner holds the lock now.
    NotOwner,
    /// Nobody holds it: the lease ran out (or the key was lost).
    Expired,
    /// Renewals could not reach Redis (or a quorum of nodes) in time; the
    /// lease is about to run out, if it has not already.
    Unreachable,
    /// The hold reached its `max_hold`: the watchdog stopped renewing, and
    /// the lease runs out at `valid_until()` at the latest.
    MaxHold,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::NotOwner => "another owner holds the lock",
            LossReason::Expired => "the lease ran out",
            LossReason::Unreachable => "renewals could not reach Redis before the lease ran out",
            LossReason::MaxHold => "held for its max_hold: no longer renewed",
        })
    }
}

/// The outcome of [`LockGuard::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lock is free; waiters were notified.
    Released,
    /// The same owner still holds it `holds` more times (other guards of the
    /// same acquisition, from [`LockGuard::reenter`]).
    StillHeld { holds: u64 },
    /// Another owner holds the lock; nothing was changed.
    NotOwner,
    /// Nobody holds the lock: our lease had run out; nothing was changed.
    Expired,
}

/// The outcome of [`LockGuard::extend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// The lease is now the requested one.
    Extended,
    /// Another owner holds the lock; nothing was changed.
    NotOwner,
    /// Nobody holds the lock; it was not re-created.
    Expired,
}

/// Errors of the lock library.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// A lease, wait or configuration value out of bounds.
    #[error("invalid lock configuration: {0}")]
    InvalidConfig(String),
    /// A lock name without a hash tag, empty or too long.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// Another owner still held the lock when the wait ran out. `retry_after`
    /// is the remaining lease last seen, when known.
    #[error("lock {name} still held by another owner after waiting {waited:?}")]
    Timeout { name: String, waited: Duration, retry_after: Option<Duration> },
    /// The acquire succeeded on Redis but its reply came so late that the
    /// lease had no validity left (timeline T3); the lock was released again.
    #[error("lock {name} was granted too late: {elapsed:?} after the request, lease {lease:?}")]
    AcquiredTooLate { name: String, elapsed: Duration, lease: Duration },
    /// The operation needs a lock the guard no longer holds.
    #[error("lock {name} lost: {reason}")]
    Lost { name: String, reason: LossReason },
    /// Redlock: fewer than a quorum of nodes answered at all.
    #[error("lock {name}: only {reachable} of {nodes} Redis nodes reachable, {quorum} needed")]
    NoQuorum { name: String, reachable: usize, nodes: usize, quorum: usize },
    /// Redis could not be reached or answered with an error. The outcome of
    /// the command is unknown; an acquire whose outcome is unknown is
    /// released again before this is returned.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A command got no reply within the configured timeout (outcome unknown).
    #[error("redis did not answer within {0:?}")]
    CommandTimeout(Duration),
}

impl LockError {
    /// True when the cause is Redis being unreachable or too slow (map it to
    /// "unavailable"), as opposed to contention or bad input.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            LockError::Redis(_) | LockError::CommandTimeout(_) | LockError::NoQuorum { .. }
        )
    }
}

/// A callback told about every round trip the library sends to Redis
/// (argument: how many), e.g. to feed a metrics counter.
pub type RoundTripHook = Arc<dyn Fn(u64) + Send + Sync>;

/// Settings of a [`LockClient`].
#[derive(Clone)]
pub struct LockConfig {
    /// The longest a single command may take before its outcome is treated as
    /// unknown (default 1 s). Acquire attempts are further bounded by the
    /// lease's validity, renewals by a renewal period.
    pub command_timeout: Duration,
    /// The longest a connection attempt may take (default 1 s).
    pub connect_timeout: Duration,
    /// How long a waiter that stopped coming back keeps its place (default
    /// 2 s; between 30 ms and 10 min): a [`FairLock`] waiter stays in line,
    /// a waiting [`RwLock`] writer keeps new readers out. A live waiter
    /// renews it every third of it (one round trip), so a dead one delays
    /// the others by at most this plus one third.
    pub waiter_timeout: Duration,
    /// Told about every round trip sent (default: none).
    pub on_round_trip: Option<RoundTripHook>,
}

impl Default for LockConfig {
    fn default() -> Self {
        Self {
            command_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            waiter_timeout: Duration::from_secs(2),
            on_round_trip: None,
        }
    }
}

impl fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockConfig")
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("waiter_timeout", &self.waiter_timeout)
            .field("on_round_trip", &self.on_round_trip.as_ref().map(|_| "…"))
            .finish()
    }
}

impl LockConfig {
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        for (what, d) in
            [("command_timeout", self.command_timeout), ("connect_timeout", self.connect_timeout)]
        {
            if d.is_zero() || d > Duration::from_secs(60) {
                return Err(LockError::InvalidConfig(format!(
                    "{what} {d:?} must be positive and at most 60 s"
                )));
            }
        }
        let waiter = self.waiter_timeout;
        if waiter < MIN_WATCHDOG_LEASE || waiter > Duration::from_secs(600) {
            return Err(LockError::InvalidConfig(format!(
                "waiter_timeout {waiter:?} must be between {MIN_WATCHDOG_LEASE:?} and 10 min"
            )));
        }
        Ok(())
    }
}

/// Counters of one [`LockClient`] or [`Redlock`] since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Commands sent to Redis (scripts, pub/sub (un)subscriptions), each one
    /// round trip; Redlock counts one per node contacted.
    pub round_trips: u64,
    /// Successful acquisitions (re-entries not included).
    pub acquisitions: u64,
    /// `try_lock` calls that ended in [`LockError::Timeout`].
    pub timeouts: u64,
    /// Successful watchdog renewals.
    pub renewals: u64,
    /// Guards told that they lost their lock (watchdog or lease end).
    pub losses: u64,
}

/// Shared counters behind [`LockStats`].
#[derive(Default)]
pub(crate) struct Telemetry {
    round_trips: AtomicU64,
    acquisitions: AtomicU64,
    timeouts: AtomicU64,
    renewals: AtomicU64,
    losses: AtomicU64,
    hook: Option<RoundTripHook>,
}

impl Telemetry {
    pub(crate) fn new(hook: Option<RoundTripHook>) -> Arc<Self> {
        Arc::new(Self { hook, ..Self::default() })
    }

    pub(crate) fn round_trips(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
        if let Some(hook) = &self.hook {
            hook(n);
        }
    }

    pub(crate) fn acquired(&self) {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a wait for `name` that ran out, and builds its error.
    pub(crate) fn timeout(
        &self,
        name: &LockName,
        started: Instant,
        retry_after: Option<Duration>,
    ) -> LockError {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
        LockError::Timeout { name: name.to_string(), waited: started.elapsed(), retry_after }
    }

    pub(crate) fn renewed(&self) {
        self.renewals.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lost(&self) {
        self.losses.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LockStats {
        LockStats {
            round_trips: self.round_trips.load(Ordering::Relaxed),
            acquisitions: self.acquisitions.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            renewals: self.renewals.load(Ordering::Relaxed),
            losses: self.losses.load(Ordering::Relaxed),
        }
    }
}

/// A fresh owner token: 160 random bits from the thread's CSPRNG, hex-encoded
/// (the Redlock description suggests 20 random bytes).
pub(crate) fn new_owner_token() -> String {
    use rand::Rng;
    let bytes: [u8; 20] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A uniformly random duration in `[0, max]`, to desynchronise retries.
pub(crate) fn jitter(max: Duration) -> Duration {
    use rand::Rng;
    let ms = duration_ms_ceil(max);
    Duration::from_micros(rand::rng().random_range(0..=ms.saturating_mul(1000)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tag_follows_the_cluster_rule() {
        assert_eq!(LockName::new("p:{sale:7}:lock").unwrap().hash_tag(), "sale:7");
        assert_eq!(LockName::new("{a}{b}").unwrap().hash_tag(), "a");
        assert!(LockName::new("p:{}:lock{x}").is_err(), "an empty first tag is no tag");
        assert!(LockName::new("no-tag").is_err());
        assert!(LockName::new("").is_err());
        let name = LockName::new("p:{sale:7}:lock").unwrap();
        assert_eq!(name.fence_key(), "p:{sale:7}:lock:fence");
        assert_eq!(name.channel(), "p:{sale:7}:lock:released");
    }

    #[test]
    fn validity_never_underflows() {
        let lease = Duration::from_millis(10);
        assert_eq!(validity(lease, Duration::from_secs(5)), None);
        assert_eq!(validity(lease, Duration::from_millis(8)), None);
        assert!(validity(Duration::MAX, Duration::ZERO).is_some());
        assert_eq!(
            validity(Duration::from_secs(1), Duration::ZERO),
            Some(Duration::from_millis(988))
        );
    }

    #[test]
    fn lease_and_wait_bounds_are_typed_errors() {
        let ms = Duration::from_millis;
        assert!(LockOptions::new(ms(0), ms(0)).validate().is_err());
        assert!(LockOptions::new(ms(0), ms(9)).validate().is_err());
        assert_eq!(LockOptions::new(ms(0), ms(10)).validate().unwrap(), 10);
        assert!(LockOptions::new(ms(0), ms(20)).with_watchdog().validate().is_err());
        assert!(LockOptions::new(Duration::MAX, ms(20)).validate().is_err());
        assert!(LockOptions::new(ms(0), Duration::MAX).validate().is_err());
        assert_eq!(LockOptions::new(ms(0), Duration::from_micros(10_001)).validate().unwrap(), 11);
        let watchdog = LockOptions::new(ms(0), ms(100)).with_watchdog();
        assert_eq!(watchdog.renewal(), Some(DEFAULT_MAX_HOLD));
        assert_eq!(watchdog.with_max_hold(ms(500)).renewal(), Some(ms(500)));
        assert_eq!(LockOptions::new(ms(0), ms(100)).renewal(), None);
        assert!(watchdog.with_max_hold(Duration::ZERO).validate().is_err());
        assert!(watchdog.with_max_hold(MAX_LEASE * 2).validate().is_err());
    }
}
