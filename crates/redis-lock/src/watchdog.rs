//! The lease of a held lock as the holder sees it, and the watchdog that
//! renews it.
//!
//! One task per acquisition (shared by its re-entrant guards). With renewal
//! it extends the lease every lease/3 while the owner token still matches;
//! without, it only waits for the lease's end. Either way it is the one
//! place that tells the holder, through [`LeaseState::lost`], that the lock
//! is gone:
//! - at once when a renewal finds another owner or no lock (timeline T2);
//! - when renewals keep failing, as soon as less than one renewal period
//!   (lease/3) of the lease is left, and in any case no later than lease/6
//!   before the lease's end as measured locally (no renewal attempt may run
//!   into that margin), so a partitioned holder hears it in time (T12);
//! - for a lock without renewal, when its lease's validity ends;
//! - with renewal, at the hold's `max_hold`: renewals stop there, and the
//!   lease runs out by itself (timeline T19).
//!
//! A manual extend changes the lease: the task re-plans at once, renewing
//! every third of the new lease, to the new lease, and measuring its margins
//! and the end of validity from it (T18).
//!
//! The task is stopped (`stop`) on every exit path: the last guard's release
//! (before the release is sent, T10), the last guard dropped, a failed
//! acquisition (no task is started before success). A renewal that still
//! races a release cannot revive the key: `extend.lua` checks the owner.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{LossReason, Telemetry, duration_ms_ceil, validity};

/// What one renewal round found.
pub(crate) enum Renewal {
    /// The lease was extended (on a quorum, for Redlock).
    Renewed,
    /// The owner token is gone: the lock is lost for good.
    Lost(LossReason),
    /// No answer, an error, or no quorum: try again while time is left.
    Failed,
}

/// The holder's view of its lease, shared by the guards of one acquisition
/// and their watchdog.
pub(crate) struct LeaseState {
    lost: CancellationToken,
    reason: OnceLock<LossReason>,
    renewals: AtomicU64,
    /// The lease and its validity; the watchdog re-plans when it changes.
    lease: watch::Sender<Lease>,
    /// Stops the watchdog task.
    stop: CancellationToken,
    telemetry: Arc<Telemetry>,
}

/// A lease as last set on Redis by this holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    /// Its length (each renewal restores it).
    pub(crate) length: Duration,
    /// When the command that set it was sent.
    pub(crate) set_at: Instant,
    /// The end of its validity as measured locally (`set_at` + length −
    /// elapsed − drift).
    pub(crate) valid_until: Instant,
}

impl LeaseState {
    pub(crate) fn new(lease: Lease, telemetry: Arc<Telemetry>) -> Arc<Self> {
        Arc::new(Self {
            lost: CancellationToken::new(),
            reason: OnceLock::new(),
            renewals: AtomicU64::new(0),
            lease: watch::Sender::new(lease),
            stop: CancellationToken::new(),
            telemetry,
        })
    }

    /// Cancelled once the lock is known or presumed lost.
    pub(crate) fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.reason.get().copied()
    }

    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.lease.borrow().valid_until
    }

    /// The lease length in force.
    pub(crate) fn length(&self) -> Duration {
        self.lease.borrow().length
    }

    /// A manual extend set `lease` on Redis: the watchdog re-plans.
    pub(crate) fn extended(&self, lease: Lease) {
        self.lease.send_replace(lease);
    }

    /// Records the loss (the first reason wins) and tells the holder, unless
    /// the holder already let go of the lock.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        if self.stop.is_cancelled() {
            return;
        }
        if self.reason.set(reason).is_ok() {
            self.telemetry.lost();
            self.lost.cancel();
        }
    }

    /// Stops the watchdog; idempotent.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }
}

/// The accessors of a guard's lease — `lost()`, `loss()`, `renewals()`,
/// `valid_until()` — for a guard type whose `state` field is its
/// `Arc<LeaseState>` (a Redlock hold, a read hold, a permit).
macro_rules! lease_accessors {
    () => {
        /// Cancelled once the hold is known or presumed lost (see
        /// [`LockGuard::lost`](crate::LockGuard::lost)): the lease ended
        /// without renewal, a renewal found it gone, or renewals failed for
        /// too long. A critical section should stop writing when it fires.
        pub fn lost(&self) -> &tokio_util::sync::CancellationToken {
            self.state.lost()
        }

        /// Why the hold was lost, once [`lost`](Self::lost) fired.
        pub fn loss(&self) -> Option<crate::LossReason> {
            self.state.loss()
        }

        /// Successful watchdog renewals so far (Redlock: each on a quorum).
        pub fn renewals(&self) -> u64 {
            self.state.renewals()
        }

        /// Until when the lease is valid as measured locally (monotonic
        /// clock, from the start of the last successful acquire or renewal,
        /// minus the drift allowance).
        pub fn valid_until(&self) -> std::time::Instant {
            self.state.valid_until()
        }
    };
}
pub(crate) use lease_accessors;

/// How the watchdog renews a hold.
pub(crate) struct Renewer<F> {
    /// Runs one renewal round to the lease length it is given, in
    /// milliseconds.
    pub(crate) renew: F,
    /// The longest one round may take; it is also cut off after a sixth of
    /// the lease (half a renewal period), whichever is shorter (a timeout
    /// counts as [`Renewal::Failed`]).
    pub(crate) max_attempt: Duration,
    /// How long after the start to stop renewing and fire `lost()`
    /// ([`LossReason::MaxHold`]).
    pub(crate) max_hold: Duration,
}

/// Starts the task that renews the lease (with a `renewer`) or only watches
/// it.
pub(crate) fn spawn<F, Fut>(state: Arc<LeaseState>, renewer: Option<Renewer<F>>)
where
    F: FnMut(u64) -> Fut + Send + 'static,
    Fut: Future<Output = Renewal> + Send,
{
    let stop = state.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = watch(&state, renewer) => {}
        }
    });
}

async fn watch<F, Fut>(state: &LeaseState, renewer: Option<Renewer<F>>)
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Renewal>,
{
    let Some(Renewer { renew, max_attempt, max_hold }) = renewer else {
        return wait_for_lease_end(state).await;
    };
    tokio::select! {
        _ = renew_until_lost(state, max_attempt, renew) => {}
        // Renewals stop here; the lease runs out by itself.
        _ = tokio::time::sleep(max_hold) => state.mark_lost(LossReason::MaxHold),
    }
}

/// Without renewal: tells the holder when the lease's validity ends, the
/// end in force (a manual extend may move it either way meanwhile).
async fn wait_for_lease_end(state: &LeaseState) {
    let mut lease = state.lease.subscribe();
    loop {
        let until = lease.borrow_and_update().valid_until;
        if until <= Instant::now() {
            state.mark_lost(LossReason::Expired);
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(until.into()) => {}
            _ = lease.changed() => {}
        }
    }
}

/// With renewal: renews every third of the lease in force until a renewal
/// finds the lock lost, or failures leave too little of the lease.
async fn renew_until_lost<F, Fut>(state: &LeaseState, max_attempt: Duration, mut renew: F)
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Renewal>,
{
    let mut lease = state.lease.subscribe();
    // After a failed renewal: when to try again.
    let mut retry_at = None;
    // After a renewal that raced a manual extend: renew again at once.
    let mut at_once = false;
    loop {
        let current = *lease.borrow_and_update();
        let period = current.length / 3;
        let due = retry_at.unwrap_or(current.set_at + period);
        if !std::mem::take(&mut at_once) {
            tokio::select! {
                _ = tokio::time::sleep_until(due.into()) => {}
                // A manual extend: plan again from it.
                _ = lease.changed() => {
                    retry_at = None;
                    continue;
                }
            }
        }
        // The holder must hear of a loss at least this long before the
        // lease's end, so no renewal attempt may run into this margin.
        let margin = current.length / 6;
        let started = Instant::now();
        let timeout = (current.length / 6).min(max_attempt);
        let budget = renewal_budget(current.valid_until, margin, started, timeout);
        if budget.is_zero() {
            state.mark_lost(LossReason::Unreachable);
            return;
        }
        let renewing = renew(duration_ms_ceil(current.length));
        let outcome = tokio::time::timeout(budget, renewing).await.unwrap_or(Renewal::Failed);
        match outcome {
            Renewal::Renewed => {
                // A renewal so late that no validity is left cannot be
                // counted on: it is handled as a failure below.
                if let Some(valid_until) = renewed_until(current.length, started, Instant::now()) {
                    let now = Lease { set_at: started, valid_until, ..current };
                    at_once = !renewed(state, current, now);
                    retry_at = None;
                    continue;
                }
            }
            Renewal::Lost(reason) => {
                state.mark_lost(reason);
                return;
            }
            Renewal::Failed => {}
        }
        let now = Instant::now();
        if !worth_retrying(state.valid_until(), now, period) {
            state.mark_lost(LossReason::Unreachable);
            return;
        }
        retry_at = Some(now + period / 4);
    }
}

/// Records a renewal of `was` that set `now`, unless a manual extend changed
/// the lease while it ran: then the renewal (to the old length) may have
/// reached Redis after the extend, and the next one must go at once, to the
/// new length. Returns false in that case.
fn renewed(state: &LeaseState, was: Lease, now: Lease) -> bool {
    state.renewals.fetch_add(1, Ordering::Relaxed);
    state.telemetry.renewed();
    state.lease.send_if_modified(|lease| {
        let untouched = *lease == was;
        if untouched {
            *lease = now;
        }
        untouched
    })
}

/// How long a renewal that starts at `started` may take: until `margin`
/// before the lease's locally measured end, and at most `attempt_timeout`
/// (zero: no time is left for one).
fn renewal_budget(
    valid_until: Instant,
    margin: Duration,
    started: Instant,
    attempt_timeout: Duration,
) -> Duration {
    valid_until
        .checked_sub(margin)
        .map_or(Duration::ZERO, |last| last.saturating_duration_since(started))
        .min(attempt_timeout)
}

/// The new end of validity after a renewal sent at `started` succeeded at
/// `now` (`None`: it came back too late to leave any validity).
fn renewed_until(lease: Duration, started: Instant, now: Instant) -> Option<Instant> {
    validity(lease, now.saturating_duration_since(started)).map(|valid| started + valid)
}

/// After a failed renewal at `now`: whether more than one renewal period of
/// the lease is left to try again in.
fn worth_retrying(valid_until: Instant, now: Instant, period: Duration) -> bool {
    valid_until.saturating_duration_since(now) > period
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_renewal_may_run_until_the_margin_before_the_lease_end_and_no_longer_than_its_timeout() {
        let t0 = Instant::now();
        let until = t0 + MS * 900;
        assert_eq!(renewal_budget(until, MS * 100, t0, MS * 50), MS * 50);
        assert_eq!(renewal_budget(until, MS * 100, t0 + MS * 780, MS * 50), MS * 20);
        assert_eq!(renewal_budget(until, MS * 100, t0 + MS * 800, MS * 50), Duration::ZERO);
        assert_eq!(renewal_budget(until, MS * 100, t0 + MS * 950, MS * 50), Duration::ZERO);
    }

    #[test]
    fn a_renewal_extends_validity_from_its_start_unless_it_came_back_too_late() {
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        assert_eq!(renewed_until(second, t0, t0 + MS * 100), Some(t0 + MS * 888));
        assert_eq!(renewed_until(second, t0, t0 + MS * 990), None);
    }

    #[test]
    fn failed_renewals_are_retried_only_while_more_than_a_period_is_left() {
        let t0 = Instant::now();
        assert!(worth_retrying(t0 + MS * 400, t0, MS * 300));
        assert!(!worth_retrying(t0 + MS * 300, t0, MS * 300));
        assert!(!worth_retrying(t0, t0 + MS * 10, MS * 300));
    }
}
