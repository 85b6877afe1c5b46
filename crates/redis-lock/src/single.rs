//! The reentrant, fenced lease lock on one Redis node: [`LockClient`] and its
//! [`LockGuard`].
//!
//! Acquisition (`try_lock`): join the lock's local queue (one contender per
//! process), then loop on `acquire.lua` with one owner token. When another
//! owner holds the lock, subscribe once to its release channel and wait for a
//! message, each round bounded by the PTTL the script returned and by the
//! remaining wait, with jitter after a round that timed out. An attempt whose
//! reply is lost is retried with the same owner token, which the script
//! treats as the same acquisition (hold count stays 1, timeline T9); when the
//! wait ends with the outcome unknown, the token is released again. A reply
//! that comes back with no validity left (`lease − elapsed − drift ≤ 0`,
//! timeline T3) is not a lock: it is released and never returned.
//!
//! Timelines (T3, T9, …) are defined in the crate README's "Failure
//! timelines".

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::local::{LocalQueues, Wakeups};
use super::scripts::{self, AcquireMode, AcquireReply, ExtendReply, ReleaseReply};
use super::watchdog::{self, LeaseState, Renewal};
use super::{
    ExtendOutcome, FencingToken, LockConfig, LockError, LockName, LockOptions, LockStats,
    LossReason, ReleaseOutcome, Telemetry, duration_ms_ceil, jitter, new_owner_token, validity,
};

/// Jitter added after a wait round that ended without a release message, so
/// that contenders of several processes do not retry in lockstep.
const RETRY_JITTER: Duration = Duration::from_millis(10);

/// The wait round used when the holder's key has no lease (PTTL −1: not
/// written by this library).
const NO_LEASE_ROUND: Duration = Duration::from_millis(250);

/// A lock client for one Redis node. Create one per process and Redis node
/// and share it (cheap to clone): it owns the process's command connection,
/// its one pub/sub connection for wake-ups, and the local queues.
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("redis", &self.inner.client.get_connection_info().addr())
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct ClientInner {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    config: LockConfig,
    telemetry: Arc<Telemetry>,
    queues: LocalQueues,
    wakeups: Arc<Wakeups>,
}

impl LockClient {
    /// A client with [`LockConfig::default`]. Connects lazily: nothing is
    /// sent before the first lock.
    pub fn new(client: redis::Client) -> Self {
        Self::build(client, LockConfig::default())
    }

    /// A client with `config`. Errors: [`LockError::InvalidConfig`] when a
    /// timeout is zero or longer than 60 s.
    pub fn with_config(client: redis::Client, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        Ok(Self::build(client, config))
    }

    fn build(client: redis::Client, config: LockConfig) -> Self {
        let telemetry = Telemetry::new(config.on_round_trip.clone());
        let wakeups = Wakeups::new(client.clone(), config.connect_timeout, telemetry.clone());
        Self {
            inner: Arc::new(ClientInner {
                client,
                conn: OnceCell::new(),
                config,
                telemetry,
                queues: LocalQueues::default(),
                wakeups,
            }),
        }
    }

    /// Counters since the client was created.
    pub fn stats(&self) -> LockStats {
        self.inner.telemetry.snapshot()
    }

    /// Takes `name` for `lease` without renewal, waiting at most `wait`.
    /// Same as [`try_lock_with`](Self::try_lock_with) with
    /// [`LockOptions::new`].
    pub async fn try_lock(
        &self,
        name: &LockName,
        wait: Duration,
        lease: Duration,
    ) -> Result<LockGuard, LockError> {
        self.try_lock_with(name, LockOptions::new(wait, lease)).await
    }

    /// Takes `name`, waiting at most `options.wait` (zero: one attempt), with
    /// a fresh owner token and fencing token.
    ///
    /// Errors:
    /// - [`LockError::InvalidConfig`]: lease or wait out of bounds (nothing sent);
    /// - [`LockError::Timeout`]: another owner held it for the whole wait;
    /// - [`LockError::AcquiredTooLate`]: the last grant came back with no
    ///   validity left (it was released again);
    /// - [`LockError::Redis`] / [`LockError::CommandTimeout`]: Redis failed or
    ///   did not answer; any grant this call may have obtained is released.
    pub async fn try_lock_with(
        &self,
        name: &LockName,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        let lease_ms = options.validate()?;
        let lease = Duration::from_millis(lease_ms);
        let started = Instant::now();
        let deadline = started + options.wait;
        let inner = &self.inner;
        let entry = inner.queues.entry(name.key());
        let timeout = |retry_after| {
            inner.telemetry.timed_out();
            LockError::Timeout { name: name.to_string(), waited: started.elapsed(), retry_after }
        };
        // Only the head of the local queue competes for the Redis key.
        let _contender =
            match tokio::time::timeout_at(deadline.into(), entry.contender.acquire()).await {
                Ok(Ok(permit)) => permit,
                _ => return Err(timeout(None)),
            };
        let owner = new_owner_token();
        let mut conn = self.conn().await?;
        // An attempt is useless once its reply could carry no validity.
        let attempt_timeout =
            validity(lease, Duration::ZERO).unwrap_or(lease).min(inner.config.command_timeout);
        loop {
            let attempt_started = Instant::now();
            let reply = self
                .call(
                    attempt_timeout,
                    scripts::acquire(&mut conn, name, &owner, lease_ms, AcquireMode::Acquire, true),
                )
                .await;
            let now = Instant::now();
            match reply {
                Ok(AcquireReply::Acquired { fence, .. }) => {
                    let elapsed = now - attempt_started;
                    if let Some(valid) = validity(lease, elapsed) {
                        inner.telemetry.acquired();
                        return Ok(self.guard(
                            name,
                            owner,
                            lease,
                            FencingToken(fence),
                            attempt_started + valid,
                            options.watchdog,
                        ));
                    }
                    // Granted, but too late to be trusted (T3).
                    self.release_unknown(&mut conn, name, &owner).await;
                    if now >= deadline {
                        return Err(LockError::AcquiredTooLate {
                            name: name.to_string(),
                            elapsed,
                            lease,
                        });
                    }
                }
                Ok(AcquireReply::Held { pttl_ms }) => {
                    let pttl = u64::try_from(pttl_ms).map(Duration::from_millis).ok();
                    if now >= deadline {
                        return Err(timeout(pttl));
                    }
                    if !entry.subscriptions.initialized() {
                        // First contention: subscribe, then try again at once,
                        // since the release may have happened in between.
                        entry
                            .subscriptions
                            .get_or_init(|| async {
                                vec![
                                    inner
                                        .wakeups
                                        .register(name.channel(), entry.wake.clone())
                                        .await,
                                ]
                            })
                            .await;
                        continue;
                    }
                    let round = pttl.unwrap_or(NO_LEASE_ROUND).min(deadline - now);
                    if tokio::time::timeout(round, entry.wake.notified()).await.is_err() {
                        // No message (lost, or the lease just ran out).
                        let left = deadline.saturating_duration_since(Instant::now());
                        tokio::time::sleep(jitter(RETRY_JITTER.min(left))).await;
                    }
                }
                Ok(AcquireReply::NotOwner | AcquireReply::Expired) => {
                    // Only a re-entry gets these replies.
                    return Err(LockError::Redis(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "acquire.lua answered a new acquisition with a re-entry reply",
                    ))));
                }
                Err(err @ LockError::CommandTimeout(_)) => {
                    // Outcome unknown: retrying with the same owner token is
                    // safe (the script sees a retry, not a re-entry).
                    if now >= deadline {
                        self.release_unknown(&mut conn, name, &owner).await;
                        return Err(err);
                    }
                    let left = deadline - now;
                    tokio::time::sleep(jitter(RETRY_JITTER.min(left))).await;
                }
                Err(err) => {
                    // The connection failed: fail fast, and free whatever
                    // this call may have obtained in the background.
                    let this = self.clone();
                    let name = name.clone();
                    tokio::spawn(
                        async move { this.release_unknown(&mut conn, &name, &owner).await },
                    );
                    return Err(err);
                }
            }
        }
    }

    fn guard(
        &self,
        name: &LockName,
        owner: String,
        lease: Duration,
        fence: FencingToken,
        valid_until: Instant,
        renew: bool,
    ) -> LockGuard {
        let state = LeaseState::new(valid_until, self.inner.telemetry.clone());
        let held = Arc::new(Held {
            client: self.clone(),
            name: name.clone(),
            owner,
            lease,
            fence,
            state: state.clone(),
        });
        let period = lease / 3;
        let attempt_timeout = (period / 2).min(self.inner.config.command_timeout);
        let renewal = renew.then(|| {
            let client = self.clone();
            let name = name.clone();
            let owner = held.owner.clone();
            let lease_ms = duration_ms_ceil(lease);
            move || {
                let client = client.clone();
                let name = name.clone();
                let owner = owner.clone();
                async move { client.renew(&name, &owner, lease_ms).await }
            }
        });
        watchdog::spawn(state, lease, attempt_timeout, renewal);
        LockGuard { held, released: false }
    }

    async fn renew(&self, name: &LockName, owner: &str, lease_ms: u64) -> Renewal {
        let Ok(mut conn) = self.conn().await else { return Renewal::Failed };
        self.inner.telemetry.round_trips(1);
        match scripts::extend(&mut conn, name, owner, lease_ms).await {
            Ok(ExtendReply::Extended) => Renewal::Renewed,
            Ok(ExtendReply::NotOwner) => Renewal::Lost(LossReason::NotOwner),
            Ok(ExtendReply::Expired) => Renewal::Lost(LossReason::Expired),
            Err(err) => {
                tracing::debug!(%err, lock = %name, "lock renewal failed");
                Renewal::Failed
            }
        }
    }

    /// Best-effort release of every hold of `owner` after an acquisition
    /// whose outcome is unknown or unusable; the outcome is ignored (at
    /// worst the lease runs out).
    async fn release_unknown(&self, conn: &mut ConnectionManager, name: &LockName, owner: &str) {
        let timeout = self.inner.config.command_timeout;
        let released = self.call(timeout, scripts::release(conn, name, owner, 1, true)).await;
        if let Err(err) = released {
            tracing::debug!(%err, lock = %name, "release after a failed acquisition failed");
        }
    }

    /// The command connection, created (lazily connecting) on first use.
    async fn conn(&self) -> Result<ConnectionManager, LockError> {
        let config = &self.inner.config;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout))
            .set_number_of_retries(1);
        self.inner
            .conn
            .get_or_try_init(|| async {
                ConnectionManager::new_lazy_with_config(self.inner.client.clone(), manager_config)
            })
            .await
            .cloned()
            .map_err(LockError::Redis)
    }

    /// Runs one command (one round trip), cut off after `timeout`.
    async fn call<T>(
        &self,
        timeout: Duration,
        command: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        self.inner.telemetry.round_trips(1);
        match tokio::time::timeout(timeout, command).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) if err.is_timeout() => Err(LockError::CommandTimeout(timeout)),
            Ok(Err(err)) => Err(LockError::Redis(err)),
            Err(_) => Err(LockError::CommandTimeout(timeout)),
        }
    }
}

/// One hold of a lock. Guards from [`reenter`](Self::reenter) share the
/// acquisition (owner token, fencing token, watchdog); each releases one hold.
///
/// Dropping a guard without [`release`](Self::release) releases its hold in
/// the background (when a Tokio runtime is running; otherwise the lease runs
/// out). The watchdog stops with the last guard of the acquisition.
pub struct LockGuard {
    held: Arc<Held>,
    released: bool,
}

/// The acquisition shared by re-entrant guards.
struct Held {
    client: LockClient,
    name: LockName,
    owner: String,
    lease: Duration,
    fence: FencingToken,
    state: Arc<LeaseState>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.state.stop();
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.held.name
    }

    /// The owner token (hex, 160 bits) stored as the field of the lock hash.
    pub fn owner(&self) -> &str {
        &self.held.owner
    }

    /// The fencing token of this acquisition; the protected resource must
    /// refuse writes carrying a token lower than the highest it has seen.
    pub fn fencing_token(&self) -> FencingToken {
        self.held.fence
    }

    /// The lease requested (each renewal restores it).
    pub fn lease(&self) -> Duration {
        self.held.lease
    }

    /// Cancelled once the lock is known or presumed lost: the watchdog found
    /// another owner or no lock, renewals failed for too long, or (without
    /// watchdog) the lease's validity ended. A critical section should
    /// `select!` on `lost().cancelled()` and stop writing when it fires.
    pub fn lost(&self) -> &CancellationToken {
        self.held.state.lost()
    }

    /// Why the lock was lost, once [`lost`](Self::lost) fired.
    pub fn loss(&self) -> Option<LossReason> {
        self.held.state.loss()
    }

    /// Successful watchdog renewals of this acquisition so far.
    pub fn renewals(&self) -> u64 {
        self.held.state.renewals()
    }

    /// Until when the lease is valid as measured locally (monotonic clock,
    /// from the start of the last successful acquire or renewal, minus the
    /// drift allowance).
    pub fn valid_until(&self) -> Instant {
        self.held.state.valid_until()
    }

    /// Takes the lock once more under the same owner token (hold count + 1,
    /// lease refreshed, same fencing token) and returns the guard of that
    /// hold.
    ///
    /// Errors: [`LockError::Lost`] when another owner holds the lock or
    /// nobody does (it is never re-created); [`LockError::Redis`] /
    /// [`LockError::CommandTimeout`] when the outcome is unknown (the extra
    /// hold, if any, goes with the last guard's release).
    pub async fn reenter(&self) -> Result<LockGuard, LockError> {
        let held = &self.held;
        let client = &held.client;
        let mut conn = client.conn().await?;
        let lease_ms = duration_ms_ceil(held.lease);
        let timeout = client.inner.config.command_timeout;
        let reply = client
            .call(
                timeout,
                scripts::acquire(
                    &mut conn,
                    &held.name,
                    &held.owner,
                    lease_ms,
                    AcquireMode::Reenter,
                    false,
                ),
            )
            .await?;
        match reply {
            AcquireReply::Acquired { .. } => Ok(LockGuard { held: held.clone(), released: false }),
            AcquireReply::NotOwner | AcquireReply::Held { .. } => {
                Err(self.lost_with(LossReason::NotOwner))
            }
            AcquireReply::Expired => Err(self.lost_with(LossReason::Expired)),
        }
    }

    /// Sets the remaining lease to `lease` if we still own the lock; never
    /// re-creates a lock that expired or that another owner took.
    ///
    /// Errors: [`LockError::InvalidConfig`] for a lease out of bounds;
    /// [`LockError::Redis`] / [`LockError::CommandTimeout`].
    pub async fn extend(&self, lease: Duration) -> Result<ExtendOutcome, LockError> {
        let lease_ms = LockOptions::new(Duration::ZERO, lease).validate()?;
        let held = &self.held;
        let client = &held.client;
        let mut conn = client.conn().await?;
        let started = Instant::now();
        let timeout = client.inner.config.command_timeout;
        let reply = client
            .call(timeout, scripts::extend(&mut conn, &held.name, &held.owner, lease_ms))
            .await?;
        Ok(match reply {
            ExtendReply::Extended => {
                if let Some(valid) = validity(Duration::from_millis(lease_ms), started.elapsed()) {
                    held.state.set_valid_until(started + valid);
                }
                ExtendOutcome::Extended
            }
            ExtendReply::NotOwner => {
                held.state.mark_lost(LossReason::NotOwner);
                ExtendOutcome::NotOwner
            }
            ExtendReply::Expired => {
                held.state.mark_lost(LossReason::Expired);
                ExtendOutcome::Expired
            }
        })
    }

    /// Releases this hold. The last guard of an acquisition stops the
    /// watchdog first, then frees the lock (all holds of its owner token) and
    /// wakes the waiters; an earlier guard only decrements the hold count.
    ///
    /// Errors: [`LockError::Redis`] / [`LockError::CommandTimeout`] (outcome
    /// unknown; the lease runs out at worst).
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.released = true;
        let held = &self.held;
        let last = Arc::strong_count(held) == 1;
        if last {
            held.state.stop();
        }
        let client = &held.client;
        let mut conn = client.conn().await?;
        let lease_ms = duration_ms_ceil(held.lease);
        let timeout = client.inner.config.command_timeout;
        let reply = client
            .call(timeout, scripts::release(&mut conn, &held.name, &held.owner, lease_ms, last))
            .await?;
        Ok(match reply {
            ReleaseReply::Released => {
                // An earlier guard freed the lock (a re-entry whose reply
                // was lost left the count short): its siblings lost it.
                held.state.mark_lost(LossReason::Expired);
                ReleaseOutcome::Released
            }
            ReleaseReply::StillHeld(holds) => ReleaseOutcome::StillHeld { holds },
            ReleaseReply::NotOwner => {
                held.state.mark_lost(LossReason::NotOwner);
                ReleaseOutcome::NotOwner
            }
            ReleaseReply::Expired => {
                held.state.mark_lost(LossReason::Expired);
                ReleaseOutcome::Expired
            }
        })
    }

    fn lost_with(&self, reason: LossReason) -> LockError {
        self.held.state.mark_lost(reason);
        LockError::Lost { name: self.held.name.to_string(), reason }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let last = Arc::strong_count(&self.held) == 1;
        if last {
            self.held.state.stop();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let held = self.held.clone();
        runtime.spawn(async move {
            let client = &held.client;
            let Ok(mut conn) = client.conn().await else { return };
            let lease_ms = duration_ms_ceil(held.lease);
            let timeout = client.inner.config.command_timeout;
            let released = client
                .call(timeout, scripts::release(&mut conn, &held.name, &held.owner, lease_ms, last))
                .await;
            if let Err(err) = released {
                tracing::debug!(%err, lock = %held.name, "release of a dropped lock guard failed");
            }
        });
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.held.name)
            .field("fencing_token", &self.held.fence)
            .field("lost", &self.held.state.loss())
            .finish_non_exhaustive()
    }
}
