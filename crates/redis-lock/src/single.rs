//! The reentrant, fenced lease lock on one Redis node: [`LockClient`] and its
//! [`LockGuard`].
//!
//! Acquisition (`try_lock`): join the lock's local queue (one contender per
//! process), then loop on `acquire.lua` with one owner token. The loop
//! ([`LockClient::contend`]) is the same for every primitive of the family on
//! one node (fair lock, read-write lock, semaphore), each with its own
//! script. When another
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::connection::{RedisClient, RedisConnection};
use super::local::{LocalEntry, LocalQueues};
use super::scripts::{
    self, AcquireMode, AcquireReply, Claim, ClaimKind, ExtendReply, ReleaseReply, Wake,
};
use super::wakeups::Wakeups;
use super::watchdog::{self, Lease, LeaseState, Renewal, Renewer};
use super::{
    ExtendOutcome, FencingToken, LockConfig, LockError, LockName, LockOptions, LockStats,
    LossReason, ReleaseOutcome, Telemetry, WAIT_SLACK, duration_ms_ceil, jitter, new_owner_token,
    validity,
};

/// Jitter added after a wait round that ended without a release message, so
/// that contenders of several processes do not retry in lockstep.
const RETRY_JITTER: Duration = Duration::from_millis(10);

/// The wait round used when the holder's key has no lease (PTTL −1: not
/// written by this library).
const NO_LEASE_ROUND: Duration = Duration::from_millis(250);

/// A lock client for one Redis node, or one Redis Cluster (every key of a
/// lock shares its name's hash tag, so each script runs on the master of one
/// slot). Create one per process and Redis deployment and share it (cheap to clone): it owns the process's command connection,
/// its one pub/sub connection for wake-ups, and the local queues.
#[derive(Clone)]
pub struct LockClient {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("redis", &self.inner.client)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct ClientInner {
    client: RedisClient,
    conn: OnceCell<RedisConnection>,
    config: LockConfig,
    telemetry: Arc<Telemetry>,
    queues: LocalQueues,
    wakeups: Arc<Wakeups>,
}

impl LockClient {
    /// A client with [`LockConfig::default`]. Connects lazily: nothing is
    /// sent before the first lock.
    /// `client`: a `redis::Client` (one node) or a [`RedisClient`].
    pub fn new(client: impl Into<RedisClient>) -> Self {
        Self::build(client.into(), LockConfig::default())
    }

    /// A client with `config`. Errors: [`LockError::InvalidConfig`] when a
    /// timeout is zero or longer than 60 s.
    pub fn with_config(
        client: impl Into<RedisClient>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        Ok(Self::build(client.into(), config))
    }

    fn build(client: RedisClient, config: LockConfig) -> Self {
        let telemetry = Telemetry::new(config.on_round_trip.clone());
        let pubsub = client.pubsub_clients().to_vec();
        let wakeups = Wakeups::new(pubsub, config.connect_timeout, telemetry.clone());
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
    ///
    /// Cancel-safe: the acquisition runs in a task of its own,
    /// so dropping this future at any point — before an attempt reached
    /// Redis, after, or while waiting — leaves nothing held and nobody
    /// blocked: the task stops waiting at once, and a grant nobody takes is
    /// released (T20).
    pub async fn try_lock_with(
        &self,
        name: &LockName,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.take(name, ClaimKind::Reentrant, options, None, LockClient::guard).await
    }

    /// Takes a `kind` hold of `name` as [`try_lock_with`](Self::try_lock_with)
    /// does, in a [`detached`] task, and makes its guard with `guard`
    /// (renewed with the watchdog for `options.max_hold`).
    pub(crate) async fn take<G: Send + 'static>(
        &self,
        name: &LockName,
        kind: ClaimKind,
        options: LockOptions,
        heartbeat: Option<Duration>,
        guard: fn(&LockClient, Claim, Grant, Option<Duration>) -> G,
    ) -> Result<G, LockError> {
        let (this, name) = (self.clone(), name.clone());
        detached(move |cancel| async move {
            let (claim, grant) =
                this.contend_in_line(&name, kind, options, heartbeat, &cancel).await?;
            Ok(guard(&this, claim, grant, options.renewal()))
        })
        .await
    }

    /// Takes a `kind` hold of `name`: through the process's local queue of
    /// the name (one contender per process), then [`contend`](Self::contend)
    /// with a fresh owner token, until the wait ends or `cancel` fires.
    async fn contend_in_line(
        &self,
        name: &LockName,
        kind: ClaimKind,
        options: LockOptions,
        heartbeat: Option<Duration>,
        cancel: &CancellationToken,
    ) -> Result<(Claim, Grant), LockError> {
        let lease_ms = options.validate()?;
        let started = Instant::now();
        let deadline = started + options.wait;
        let entry = self.inner.queues.entry(name.key());
        // Only the head of the local queue competes for the Redis key.
        let in_line = tokio::time::timeout_at(deadline.into(), entry.contender.acquire());
        let Some(Ok(Ok(_contender))) = until_cancelled(cancel, in_line).await else {
            return Err(self.inner.telemetry.timeout(name, started, None));
        };
        let (owner, fenced) = (new_owner_token(), options.fenced);
        let claim = Claim { name: name.clone(), owner, lease_ms, kind, fenced };
        let waiting = Waiting { entry: &entry, channel: name.channel(), heartbeat, cancel };
        let grant = self.contend(&claim, &waiting, started, deadline).await?;
        Ok((claim, grant))
    }

    /// The acquire loop of every primitive on one node, once this task may
    /// compete: one attempt of `claim` per round, and what [`decide`] makes
    /// of its reply. Waits for wake-ups on `waiting` between rounds. Returns
    /// at most [`WAIT_SLACK`] after `deadline`: each attempt's reply is
    /// awaited at most that long past it, and the release after a failure
    /// only until then (it goes on in the background). Stops, freeing what
    /// it took, when `waiting.cancel` fires.
    pub(crate) async fn contend(
        &self,
        claim: &Claim,
        waiting: &Waiting<'_>,
        started: Instant,
        deadline: Instant,
    ) -> Result<Grant, LockError> {
        let mut conn = self.conn().await?;
        let lease = Duration::from_millis(claim.lease_ms);
        let attempt_timeout = attempt_timeout(lease, self.inner.config.command_timeout);
        let name = &claim.name;
        // Whether Redis answered a claim of this acquisition: a last claim
        // cut short by the end of the wait is then the wait running out, not
        // Redis failing to answer.
        let mut answered = false;
        loop {
            if waiting.cancel.is_cancelled() {
                return Err(self.caller_gone(claim, started));
            }
            let round_started = Instant::now();
            let budget = attempt_budget(attempt_timeout, deadline + WAIT_SLACK, round_started);
            let reply = self.attempt(&mut conn, claim, budget).await?;
            answered |= reply.is_some();
            #[cfg(feature = "failpoints")]
            crate::failpoints::reached::<()>(crate::failpoints::CLAIM_REPLIED, name.key()).await;
            let subscribed = waiting.entry.subscribed();
            let now = Instant::now();
            let round = Round { started: round_started, now, deadline, lease, subscribed };
            match decide(reply, &round) {
                Decision::Grant { fence, valid_until } => {
                    self.inner.telemetry.acquired();
                    return Ok(Grant { fence, valid_until });
                }
                Decision::TooLate { elapsed, give_up: true } => {
                    self.abandon_by(claim, deadline).await;
                    return Err(LockError::AcquiredTooLate {
                        name: name.to_string(),
                        elapsed,
                        lease,
                    });
                }
                Decision::TooLate { give_up: false, .. } => {
                    // Sent before the next attempt, which carries the same
                    // owner token, on the same connection.
                    let budget = attempt_budget(attempt_timeout, deadline, now);
                    self.release_unknown(&mut conn, claim, budget).await;
                }
                Decision::TimedOut { retry_after } => {
                    if claim.queued() {
                        self.abandon_by(claim, deadline).await;
                    }
                    return Err(self.inner.telemetry.timeout(name, started, retry_after));
                }
                Decision::Subscribe => {
                    let nodes = [&*self.inner.wakeups];
                    let subscribing = waiting.entry.subscribe(&nodes, waiting.channel, deadline);
                    until_cancelled(waiting.cancel, subscribing).await;
                }
                Decision::Wait { round } => {
                    let round = waiting.heartbeat.map_or(round, |beat| round.min(beat));
                    let waking = wait_for_release(waiting.entry, round, deadline);
                    until_cancelled(waiting.cancel, waking).await;
                }
                Decision::Retry { pause } => {
                    until_cancelled(waiting.cancel, tokio::time::sleep(jitter(pause))).await;
                }
                Decision::GiveUp => {
                    self.abandon_by(claim, deadline).await;
                    return Err(given_up(answered, budget)
                        .unwrap_or_else(|| self.inner.telemetry.timeout(name, started, None)));
                }
                Decision::Refused { retry_after } => {
                    let retry_after = Some(retry_after);
                    return Err(self.inner.telemetry.timeout(name, started, retry_after));
                }
                Decision::Unexpected => return Err(reentry_reply_to_an_acquisition()),
            }
        }
    }

    /// One claim of [`contend`](Self::contend), its reply awaited for
    /// `budget`: `None` when none came in time, or when `budget` is zero (the
    /// wait is over before the claim could be sent). Any other failure of
    /// Redis fails the acquisition at once, the release of what the claim may
    /// have taken going on in the background.
    async fn attempt(
        &self,
        conn: &mut RedisConnection,
        claim: &Claim,
        budget: Duration,
    ) -> Result<Option<AcquireReply>, LockError> {
        if budget.is_zero() {
            return Ok(None);
        }
        match self.call(budget, scripts::claim(conn, claim)).await {
            Ok(reply) => Ok(Some(reply)),
            Err(LockError::CommandTimeout(_)) => Ok(None),
            Err(err) => {
                drop(self.abandon(claim));
                Err(err)
            }
        }
    }

    /// The caller of an acquisition dropped it: frees, in the background,
    /// what an earlier round may have left (a place in line, a release cut
    /// short). The error returned is never seen, nor counted.
    fn caller_gone(&self, claim: &Claim, started: Instant) -> LockError {
        drop(self.abandon(claim));
        let (name, waited) = (claim.name.to_string(), started.elapsed());
        LockError::Timeout { name, waited, retry_after: None }
    }

    /// Frees, in a task of its own, whatever `claim` may hold (its grant,
    /// its place in line) after an acquisition that failed or gave up.
    pub(crate) fn abandon(&self, claim: &Claim) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let claim = claim.clone();
        let timeout = self.inner.config.command_timeout;
        tokio::spawn(async move {
            if let Ok(mut conn) = this.conn().await {
                this.release_unknown(&mut conn, &claim, timeout).await;
            }
        })
    }

    /// [`abandon`](Self::abandon), waiting for it at most until
    /// [`WAIT_SLACK`] after `deadline`: with Redis answering, the caller of a
    /// failed acquisition finds nothing left behind; with Redis slow, it
    /// still returns on time, and the release goes on in the background.
    async fn abandon_by(&self, claim: &Claim, deadline: Instant) {
        let _ = tokio::time::timeout_at((deadline + WAIT_SLACK).into(), self.abandon(claim)).await;
    }

    /// The guard of a granted reentrant, fair or write `claim`, renewed by
    /// the watchdog for `max_hold` when there is one.
    pub(crate) fn guard(
        &self,
        claim: Claim,
        grant: Grant,
        max_hold: Option<Duration>,
    ) -> LockGuard {
        let Claim { name, owner, lease_ms, .. } = &claim;
        let lease = Duration::from_millis(*lease_ms);
        let state = LeaseState::new(grant.lease(lease), self.inner.telemetry.clone());
        let held = Arc::new(Held {
            client: self.clone(),
            name: name.clone(),
            owner: owner.clone(),
            fence: grant.fence,
            wake: claim.wake(),
            state: state.clone(),
            guards: AtomicUsize::new(1),
        });
        self.watch(claim, state, max_hold);
        LockGuard { held, released: false }
    }

    /// Starts the task that watches `claim`'s lease through `state`, and,
    /// given a `max_hold`, renews it for that long (every lease/3, each
    /// renewal within half a period and the command timeout).
    pub(crate) fn watch(&self, claim: Claim, state: Arc<LeaseState>, max_hold: Option<Duration>) {
        let renewer = max_hold.map(|max_hold| {
            let client = self.clone();
            let renew = move |lease_ms| {
                let (client, claim) = (client.clone(), claim.clone());
                async move { client.renew(&claim, lease_ms).await }
            };
            Renewer { renew, max_attempt: self.inner.config.command_timeout, max_hold }
        });
        watchdog::spawn(state, renewer);
    }

    /// One watchdog renewal of `claim`'s hold to `lease_ms` (one round trip).
    async fn renew(&self, claim: &Claim, lease_ms: u64) -> Renewal {
        let Ok(mut conn) = self.conn().await else { return Renewal::Failed };
        self.inner.telemetry.round_trips(1);
        let (name, owner) = (&claim.name, claim.owner.as_str());
        let renewed = match claim.kind {
            ClaimKind::Read | ClaimKind::Permit { .. } => {
                scripts::shared_extend(&mut conn, &claim.holders_key(), owner, lease_ms).await
            }
            _ => scripts::extend(&mut conn, name, owner, lease_ms).await,
        };
        match renewed {
            Ok(ExtendReply::Extended) => Renewal::Renewed,
            Ok(ExtendReply::NotOwner) => Renewal::Lost(LossReason::NotOwner),
            Ok(ExtendReply::Expired) => Renewal::Lost(LossReason::Expired),
            Err(err) => {
                tracing::debug!(%err, lock = %name, "lock renewal failed");
                Renewal::Failed
            }
        }
    }

    /// Best-effort release of every hold of `claim`'s owner (and its place in
    /// line) after an acquisition whose outcome is unknown or unusable,
    /// waiting at most `timeout` for the reply; the outcome is ignored (at
    /// worst the lease runs out).
    async fn release_unknown(&self, conn: &mut RedisConnection, claim: &Claim, timeout: Duration) {
        if let Err(err) = self.call(timeout, scripts::abandon(conn, claim)).await {
            tracing::debug!(%err, lock = %claim.name, "release after a failed acquisition failed");
        }
    }

    /// The client's settings.
    pub(crate) fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    /// The counters behind [`stats`](Self::stats).
    pub(crate) fn telemetry(&self) -> &Arc<Telemetry> {
        &self.inner.telemetry
    }

    /// The command connection, created (lazily connecting) on first use.
    pub(crate) async fn conn(&self) -> Result<RedisConnection, LockError> {
        let config = &self.inner.config;
        self.inner
            .conn
            .get_or_try_init(|| {
                self.inner.client.connection(config.connect_timeout, config.command_timeout, 1)
            })
            .await
            .cloned()
            .map_err(LockError::Redis)
    }

    /// Runs one command (one round trip), cut off after `timeout`.
    pub(crate) async fn call<T>(
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
    fence: FencingToken,
    /// Whom the release wakes (a fair lock's release: the next in line).
    wake: Wake,
    state: Arc<LeaseState>,
    /// Live guards of the acquisition: counted explicitly, because the
    /// `Arc`'s own count also counts the background releases of dropped
    /// guards, and two siblings dropped at once could each see the other.
    guards: AtomicUsize,
}

impl Held {
    /// One guard lets go: true for the last of them, which stops the
    /// watchdog (before its release is sent, T10). Exactly one guard sees
    /// true: the count changes only by atomic read-modify-writes, whose
    /// single order ends at zero once.
    fn let_go(&self) -> bool {
        let last = self.guards.fetch_sub(1, Ordering::AcqRel) == 1;
        if last {
            self.state.stop();
        }
        last
    }

    /// Sends the release of one hold, or of every hold of the owner token
    /// when `last` (one round trip).
    async fn release(&self, last: bool) -> Result<ReleaseReply, LockError> {
        let client = &self.client;
        let mut conn = client.conn().await?;
        let lease_ms = duration_ms_ceil(self.state.length());
        let timeout = client.inner.config.command_timeout;
        let (name, owner) = (&self.name, &self.owner);
        let release = scripts::release(&mut conn, name, owner, lease_ms, last, self.wake);
        client.call(timeout, release).await
    }
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

    /// The lease in force: the one requested, or the last one set by
    /// [`extend`](Self::extend) (each renewal restores it).
    pub fn lease(&self) -> Duration {
        self.held.state.length()
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
        let lease_ms = duration_ms_ceil(held.state.length());
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
            AcquireReply::Acquired { .. } => {
                // While this guard lives the count is at least one, so it
                // never rises again from zero.
                held.guards.fetch_add(1, Ordering::Relaxed);
                Ok(LockGuard { held: held.clone(), released: false })
            }
            AcquireReply::NotOwner | AcquireReply::Held { .. } | AcquireReply::LineFull { .. } => {
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
                let length = Duration::from_millis(lease_ms);
                // A reply with no validity left: the lease may end any
                // moment, so the holder is told at once.
                let valid_until = started + validity(length, started.elapsed()).unwrap_or_default();
                held.state.extended(Lease { length, set_at: started, valid_until });
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
        let reply = held.release(held.let_go()).await?;
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

    /// Hands the hold over to a script that ends it some other way (a
    /// periodic job's "period done"): stops the watchdog, and the guard no
    /// longer releases on drop. Returns the client and the owner token.
    pub(crate) fn hand_over(mut self) -> (LockClient, String) {
        self.released = true;
        self.held.let_go();
        self.held.state.stop();
        (self.held.client.clone(), self.held.owner.clone())
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
        let last = self.held.let_go();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let held = self.held.clone();
        runtime.spawn(async move {
            if let Err(err) = held.release(last).await {
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

/// Runs the acquisition `acquire` in a task of its own, and waits for its
/// outcome. The task owns all it needs, so the caller may drop this future
/// at any point: the token handed to `acquire` is then cancelled, and the
/// task stops waiting at once, lets an attempt already sent come back, and
/// frees whatever it obtained (a guard nobody takes is dropped, which
/// releases it). A panic in the task is the caller's panic.
pub(crate) async fn detached<G, F, Fut>(acquire: F) -> Result<G, LockError>
where
    G: Send + 'static,
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<G, LockError>> + Send + 'static,
{
    let cancel = CancellationToken::new();
    let _cancel_when_dropped = cancel.clone().drop_guard();
    match tokio::spawn(acquire(cancel)).await {
        Ok(outcome) => outcome,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // The runtime is shutting down.
        Err(err) => Err(LockError::Redis(std::io::Error::other(err).into())),
    }
}

/// `future`'s output, unless `cancel` fires first.
pub(crate) async fn until_cancelled<T>(
    cancel: &CancellationToken,
    future: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        output = future => Some(output),
        _ = cancel.cancelled() => None,
    }
}

/// Where a contending task waits between two rounds.
pub(crate) struct Waiting<'a> {
    /// Its wake-up and the subscription that feeds it: the process's local
    /// entry of the lock, or (fair lock) one of the waiter's own.
    pub(crate) entry: &'a LocalEntry,
    /// The channel whose messages wake it.
    pub(crate) channel: &'a str,
    /// The longest wait between two attempts, for a waiter whose attempts
    /// also keep its place (fair lock, waiting writer).
    pub(crate) heartbeat: Option<Duration>,
    /// Fired when the caller is gone: stop waiting and free what was taken.
    pub(crate) cancel: &'a CancellationToken,
}

/// A successful acquisition: its fencing token (0 when the primitive has
/// none) and the end of its validity as measured locally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: FencingToken,
    pub(crate) valid_until: Instant,
}

impl Grant {
    /// The lease of `length` this grant set (the watchdog's first renewal is
    /// due a third of it after the grant).
    pub(crate) fn lease(&self, length: Duration) -> Lease {
        Lease { length, set_at: Instant::now(), valid_until: self.valid_until }
    }
}

/// How far one acquire round got, as [`decide`] needs it.
#[derive(Clone, Copy, Debug)]
struct Round {
    /// When the round's command was sent (validity is measured from here).
    started: Instant,
    /// When its reply (or its timeout) came back.
    now: Instant,
    deadline: Instant,
    lease: Duration,
    /// Whether this process already listens for the lock's release messages.
    subscribed: bool,
}

/// What the acquire loop does after one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    /// The lock is ours, valid until `valid_until`.
    Grant { fence: FencingToken, valid_until: Instant },
    /// Granted with no validity left (T3): release it, then try again at
    /// once, or give up with [`LockError::AcquiredTooLate`].
    TooLate { elapsed: Duration, give_up: bool },
    /// Held by another owner past the deadline: [`LockError::Timeout`].
    TimedOut { retry_after: Option<Duration> },
    /// Not let into a fair lock's line, which would take about
    /// `retry_after` to serve this waiter, more than half of its wait:
    /// [`LockError::Timeout`] at once, nothing left in line.
    Refused { retry_after: Duration },
    /// Held, first contention: subscribe, then try again at once (the
    /// release may have happened in between).
    Subscribe,
    /// Held: wait for a release message at most `round`, then try again
    /// (after a jittered pause when no message came).
    Wait { round: Duration },
    /// No reply in time, outcome unknown: try again with the same owner
    /// token (the script sees a retry, not a re-entry, T9) after a jittered
    /// pause of at most `pause`.
    Retry { pause: Duration },
    /// No reply in time and the deadline passed: release whatever we may
    /// hold and fail with [`LockError::CommandTimeout`].
    GiveUp,
    /// A re-entry reply to a new acquisition: the script is not ours.
    Unexpected,
}

/// The decision after one round whose reply is `reply` (`None`: no reply
/// within the attempt timeout).
fn decide(reply: Option<AcquireReply>, round: &Round) -> Decision {
    let past_deadline = round.now >= round.deadline;
    match reply {
        Some(AcquireReply::Acquired { fence, .. }) => {
            let elapsed = round.now - round.started;
            match validity(round.lease, elapsed) {
                Some(valid) => Decision::Grant {
                    fence: FencingToken(fence),
                    valid_until: round.started + valid,
                },
                None => Decision::TooLate { elapsed, give_up: past_deadline },
            }
        }
        Some(AcquireReply::Held { pttl_ms }) => {
            let remaining = u64::try_from(pttl_ms).map(Duration::from_millis).ok();
            if past_deadline {
                Decision::TimedOut { retry_after: remaining }
            } else if !round.subscribed {
                Decision::Subscribe
            } else {
                let round_max = round.deadline - round.now;
                Decision::Wait { round: remaining.unwrap_or(NO_LEASE_ROUND).min(round_max) }
            }
        }
        Some(AcquireReply::LineFull { wait_ms }) => {
            Decision::Refused { retry_after: Duration::from_millis(wait_ms) }
        }
        Some(AcquireReply::NotOwner | AcquireReply::Expired) => Decision::Unexpected,
        None if past_deadline => Decision::GiveUp,
        None => Decision::Retry { pause: retry_pause(round.deadline, round.now) },
    }
}

/// Waits at most `round` for a release message; when none came (lost, or
/// the lease just ran out), adds a jittered pause.
async fn wait_for_release(entry: &LocalEntry, round: Duration, deadline: Instant) {
    if tokio::time::timeout(round, entry.wake.notified()).await.is_err() {
        tokio::time::sleep(jitter(retry_pause(deadline, Instant::now()))).await;
    }
}

/// How long one acquire attempt may wait for its reply: never past the
/// point where a grant could still carry validity, nor the command timeout.
pub(crate) fn attempt_timeout(lease: Duration, command_timeout: Duration) -> Duration {
    validity(lease, Duration::ZERO).unwrap_or(lease).min(command_timeout)
}

/// The error of an acquisition whose last claim got no reply before the
/// wait (and its [`WAIT_SLACK`]) ended: [`LockError::CommandTimeout`] when
/// Redis answered no claim of it (Redis is slow or gone, as far as the
/// caller can tell), `None` — a plain wait timeout, the lock busy — when
/// Redis did answer an earlier claim, or when the wait ended before the last
/// claim could be sent (`budget` zero). Without this, a loaded machine turned
/// a busy lock into "Redis did not answer within 0 ns".
fn given_up(answered: bool, budget: Duration) -> Option<LockError> {
    (!answered && !budget.is_zero()).then_some(LockError::CommandTimeout(budget))
}

/// How long a command sent at `now` may wait for its reply: `timeout`, and
/// never past `until`.
fn attempt_budget(timeout: Duration, until: Instant, now: Instant) -> Duration {
    timeout.min(until.saturating_duration_since(now))
}

/// The upper bound of the jittered pause before a retry: [`RETRY_JITTER`],
/// never past the deadline.
fn retry_pause(deadline: Instant, now: Instant) -> Duration {
    RETRY_JITTER.min(deadline.saturating_duration_since(now))
}

fn reentry_reply_to_an_acquisition() -> LockError {
    LockError::Redis(redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "acquire.lua answered a new acquisition with a re-entry reply",
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A round of a 1 s lease sent at `t0`, answered `reply_ms` later, with
    /// the deadline `wait_ms` after `t0`.
    fn round(reply_ms: u32, wait_ms: u32, subscribed: bool) -> Round {
        let t0 = Instant::now();
        Round {
            started: t0,
            now: t0 + MS * reply_ms,
            deadline: t0 + MS * wait_ms,
            lease: Duration::from_secs(1),
            subscribed,
        }
    }

    #[test]
    fn a_grant_is_valid_for_the_lease_minus_elapsed_and_drift_from_the_round_start() {
        let r = round(100, 0, false);
        let granted = decide(Some(AcquireReply::Acquired { fence: 7, holds: 1 }), &r);
        // 1000 − 100 − (10 + 2) ms.
        let valid_until = r.started + MS * 888;
        assert_eq!(granted, Decision::Grant { fence: FencingToken(7), valid_until });
    }

    #[test]
    fn a_grant_with_no_validity_left_is_released_and_retried_until_the_deadline() {
        let acquired = Some(AcquireReply::Acquired { fence: 7, holds: 1 });
        let elapsed = MS * 990;
        let before = decide(acquired, &round(990, 2000, false));
        assert_eq!(before, Decision::TooLate { elapsed, give_up: false });
        let after = decide(acquired, &round(990, 500, false));
        assert_eq!(after, Decision::TooLate { elapsed, give_up: true });
    }

    #[test]
    fn a_held_lock_subscribes_first_then_waits_at_most_the_holders_lease() {
        let held = Some(AcquireReply::Held { pttl_ms: 300 });
        assert_eq!(decide(held, &round(1, 2000, false)), Decision::Subscribe);
        assert_eq!(decide(held, &round(1, 2000, true)), Decision::Wait { round: MS * 300 });
        // Never past the deadline.
        assert_eq!(decide(held, &round(1, 101, true)), Decision::Wait { round: MS * 100 });
        // A key without a lease: a fixed round.
        let forever = Some(AcquireReply::Held { pttl_ms: -1 });
        assert_eq!(
            decide(forever, &round(1, 5000, true)),
            Decision::Wait { round: NO_LEASE_ROUND }
        );
    }

    #[test]
    fn a_held_lock_past_the_deadline_times_out_with_the_holders_lease() {
        let held = Some(AcquireReply::Held { pttl_ms: 300 });
        let retry_after = Some(MS * 300);
        assert_eq!(decide(held, &round(5, 5, true)), Decision::TimedOut { retry_after });
        let forever = Some(AcquireReply::Held { pttl_ms: -1 });
        assert_eq!(decide(forever, &round(5, 0, false)), Decision::TimedOut { retry_after: None });
    }

    #[test]
    fn a_last_claim_cut_short_by_the_wait_is_a_timeout_unless_redis_never_answered() {
        let budget = MS * 50;
        assert!(
            matches!(given_up(false, budget), Some(LockError::CommandTimeout(b)) if b == budget)
        );
        assert!(given_up(true, budget).is_none(), "Redis answered earlier: the wait ran out");
        assert!(given_up(false, Duration::ZERO).is_none(), "no claim was sent");
    }

    #[test]
    fn no_reply_is_retried_with_jitter_until_the_deadline_then_given_up() {
        assert_eq!(decide(None, &round(100, 1000, false)), Decision::Retry { pause: RETRY_JITTER });
        assert_eq!(decide(None, &round(100, 104, true)), Decision::Retry { pause: MS * 4 });
        assert_eq!(decide(None, &round(100, 100, true)), Decision::GiveUp);
    }

    #[test]
    fn a_reentry_reply_to_an_acquisition_is_unexpected_even_before_the_deadline() {
        assert_eq!(
            decide(Some(AcquireReply::NotOwner), &round(1, 9000, true)),
            Decision::Unexpected
        );
        assert_eq!(decide(Some(AcquireReply::Expired), &round(1, 0, true)), Decision::Unexpected);
    }

    #[test]
    fn a_command_never_waits_past_its_bound() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(attempt_budget(second, t0 + MS * 300, t0), MS * 300);
        assert_eq!(attempt_budget(MS * 100, t0 + MS * 300, t0), MS * 100);
        assert_eq!(attempt_budget(second, t0, t0 + MS * 5), Duration::ZERO);
    }

    #[test]
    fn an_attempt_waits_at_most_the_leases_validity_or_the_command_timeout() {
        let second = Duration::from_secs(1);
        assert_eq!(attempt_timeout(second, second), MS * 988);
        assert_eq!(attempt_timeout(second, MS * 200), MS * 200);
        // A lease too short for any validity: the lease itself.
        assert_eq!(attempt_timeout(MS * 2, second), MS * 2);
    }
}
