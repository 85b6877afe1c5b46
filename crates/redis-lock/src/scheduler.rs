//! [`Scheduler`]: one run of a periodic job per period, across instances.
//!
//! The textbook runner takes a lock at each tick and releases it after the
//! run (or lets a lease a little shorter than the period expire). An
//! instance whose clock is behind by more than that margin reaches the same
//! period after the lock is free again, and runs the period a second time.
//! Here the lock of a job also records the last period completed
//! (`<name>:done`, an integer that only grows): `schedule_claim.lua` takes
//! the lock only for a period after that one, and `schedule_done.lua` raises
//! it and frees the lock in one step, and only while the run still holds the
//! lock. However far a clock is behind, it computes a period that is already
//! done and skips it. A clock ahead runs the next period early; the others
//! then skip it.
//!
//! The period of an instance is `⌊clock.now() since the Unix epoch /
//! period⌋`, from the [`Clock`] it is given (tests pass a skewed one). The
//! run holds a fenced lock renewed by the watchdog, so its lease covers the
//! run however long it takes; the run is handed the fencing token, for the
//! writes it makes elsewhere, and the `lost()` signal. A run that loses its
//! lock is cut off and its period is not marked done; a run that fails
//! releases the lock unmarked. Either way the period may run again — jobs
//! must be idempotent, as the lease of a crashed run also runs out.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use super::scripts::{self, AcquireReply, Claim, ClaimKind, PeriodClaim, ReleaseReply};
use super::single::{Grant, attempt_timeout, detached};
use super::{
    DEFAULT_MAX_HOLD, FencingToken, LockClient, LockError, LockGuard, LockName, LockOptions,
    LossReason, duration_ms_ceil, new_owner_token, validity,
};

/// A wall clock. The scheduler takes its clock as a parameter, so that a test
/// can run instances whose clocks disagree.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A job run at most once per `period`, under the lock `name`, with a lease
/// of `lease` renewed while it runs.
#[derive(Clone, Debug)]
pub struct PeriodicJob {
    name: LockName,
    period: Duration,
    lease: Duration,
}

impl PeriodicJob {
    /// The job locked by `name` (its keys: the lock `<name>`, the fencing
    /// counter `<name>:fence`, the last period done `<name>:done`).
    ///
    /// Errors: [`LockError::InvalidConfig`] for a period under 1 ms or over
    /// a day, or a lease out of the watchdog's bounds.
    pub fn new(name: LockName, period: Duration, lease: Duration) -> Result<Self, LockError> {
        LockOptions::new(Duration::ZERO, lease).with_watchdog().validate()?;
        if period < Duration::from_millis(1) || period > super::MAX_LEASE {
            return Err(LockError::InvalidConfig(format!(
                "period {period:?} must be between 1 ms and {:?}",
                super::MAX_LEASE
            )));
        }
        Ok(Self { name, period, lease })
    }

    /// The job's lock name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The index of the period `time` falls in: whole periods since the Unix
    /// epoch (0 before it).
    pub fn period_at(&self, time: SystemTime) -> u64 {
        let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(since.as_millis() / u128::from(duration_ms_ceil(self.period)))
            .unwrap_or(u64::MAX)
    }

    /// How long after `time` the next period starts.
    pub fn until_next_period(&self, time: SystemTime) -> Duration {
        let period_ms = u128::from(duration_ms_ceil(self.period));
        let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let into = since.as_nanos() % (period_ms * 1_000_000);
        let left = period_ms * 1_000_000 - into;
        Duration::from_nanos(u64::try_from(left).unwrap_or(u64::MAX))
    }
}

/// What a run is handed.
#[derive(Clone, Debug)]
pub struct JobRun {
    /// The period being run.
    pub period: u64,
    /// The fencing token of this run's lock: writes elsewhere carry it, and
    /// the resource refuses a token lower than the highest it has seen.
    pub fencing_token: FencingToken,
    /// Cancelled when the lock is lost; the scheduler then drops the run.
    pub lost: CancellationToken,
}

/// What one [`Scheduler::run_once`] did.
#[derive(Debug)]
pub enum RunOutcome<E> {
    /// The job ran for `period` and the period is marked done.
    Ran { period: u64, fencing_token: FencingToken },
    /// `period` (by this instance's clock) is done already: `last_done` is
    /// the last period done, perhaps by an instance whose clock is ahead.
    AlreadyDone { period: u64, last_done: u64 },
    /// Another instance is running the job; its lease ends in `retry_after`.
    Busy { period: u64, retry_after: Option<Duration> },
    /// The run returned `error`; the lock was released, the period is not
    /// done.
    Failed { period: u64, error: E },
    /// The lock was lost during the run (`reason`), which was cut off; the
    /// period is not done.
    Lost { period: u64, reason: LossReason },
}

/// Runs periodic jobs through `client`, reading periods off `clock`.
#[derive(Clone)]
pub struct Scheduler {
    client: LockClient,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("client", &self.client).finish_non_exhaustive()
    }
}

/// The lock of one claimed period, or why there is none.
enum Claimed {
    Held(LockGuard),
    Done(u64),
    Busy(Option<Duration>),
}

impl Scheduler {
    /// A scheduler on `client`'s Redis, reading the time off `clock`.
    pub fn new(client: &LockClient, clock: Arc<dyn Clock>) -> Self {
        Self { client: client.clone(), clock }
    }

    /// The period this instance's clock is in for `job`.
    pub fn current_period(&self, job: &PeriodicJob) -> u64 {
        job.period_at(self.clock.now())
    }

    /// Runs `job` once for the current period if no instance has completed
    /// that period (or a later one) and none is running it now. The run is
    /// dropped when its lock is lost.
    ///
    /// Errors: [`LockError::Redis`] / [`LockError::CommandTimeout`] when the
    /// claim or the mark could not reach Redis (a grant whose outcome is
    /// unknown is released); [`LockError::AcquiredTooLate`] as for a lock.
    pub async fn run_once<F, Fut, E>(
        &self,
        job: &PeriodicJob,
        run: F,
    ) -> Result<RunOutcome<E>, LockError>
    where
        F: FnOnce(JobRun) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let period = self.current_period(job);
        // Detached, so that a run dropped while it claims leaves no hold.
        let (this, claimed) = (self.clone(), job.clone());
        let claim = detached(move |_| async move { this.claim(&claimed, period).await });
        let guard = match claim.await? {
            Claimed::Held(guard) => guard,
            Claimed::Done(last_done) => return Ok(RunOutcome::AlreadyDone { period, last_done }),
            Claimed::Busy(retry_after) => return Ok(RunOutcome::Busy { period, retry_after }),
        };
        let lost = guard.lost().clone();
        let fencing_token = guard.fencing_token();
        let context = JobRun { period, fencing_token, lost: lost.clone() };
        let finished = tokio::select! {
            finished = run(context) => finished,
            _ = lost.cancelled() => {
                let reason = guard.loss().unwrap_or(LossReason::Expired);
                return Ok(RunOutcome::Lost { period, reason });
            }
        };
        if let Err(error) = finished {
            guard.release().await?;
            return Ok(RunOutcome::Failed { period, error });
        }
        let (client, owner) = guard.hand_over();
        let timeout = client.config().command_timeout;
        let mut conn = client.conn().await?;
        let marked = scripts::period_done(&mut conn, &job.name, &owner, period);
        Ok(match client.call(timeout, marked).await? {
            ReleaseReply::Released | ReleaseReply::StillHeld(_) => {
                RunOutcome::Ran { period, fencing_token }
            }
            ReleaseReply::NotOwner => RunOutcome::Lost { period, reason: LossReason::NotOwner },
            ReleaseReply::Expired => RunOutcome::Lost { period, reason: LossReason::Expired },
        })
    }

    /// One attempt at the lock of `period` (one round trip).
    async fn claim(&self, job: &PeriodicJob, period: u64) -> Result<Claimed, LockError> {
        let lease_ms = LockOptions::new(Duration::ZERO, job.lease).with_watchdog().validate()?;
        let lease = Duration::from_millis(lease_ms);
        let kind = ClaimKind::Reentrant;
        let (name, owner) = (job.name.clone(), new_owner_token());
        // A run's writes carry its token: always fenced.
        let claim = Claim { name, owner, lease_ms, kind, fenced: true };
        let client = &self.client;
        let mut conn = client.conn().await?;
        let timeout = attempt_timeout(lease, client.config().command_timeout);
        let started = Instant::now();
        let attempt = scripts::claim_period(&mut conn, &claim.name, &claim.owner, lease_ms, period);
        let reply = match client.call(timeout, attempt).await {
            Ok(reply) => reply,
            Err(err) => {
                let _ = client.abandon(&claim).await;
                return Err(err);
            }
        };
        match reply {
            PeriodClaim::Done(last_done) => Ok(Claimed::Done(last_done)),
            PeriodClaim::Lock(AcquireReply::Acquired { fence, .. }) => {
                let elapsed = started.elapsed();
                let Some(valid) = validity(lease, elapsed) else {
                    let _ = client.abandon(&claim).await;
                    let name = job.name.to_string();
                    return Err(LockError::AcquiredTooLate { name, elapsed, lease });
                };
                client.telemetry().acquired();
                let grant = Grant { fence: FencingToken(fence), valid_until: started + valid };
                Ok(Claimed::Held(client.guard(claim, grant, Some(DEFAULT_MAX_HOLD))))
            }
            PeriodClaim::Lock(AcquireReply::Held { pttl_ms }) => {
                Ok(Claimed::Busy(u64::try_from(pttl_ms).ok().map(Duration::from_millis)))
            }
            PeriodClaim::Lock(
                AcquireReply::NotOwner | AcquireReply::Expired | AcquireReply::LineFull { .. },
            ) => Err(LockError::Redis(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "schedule_claim.lua answered with a re-entry reply",
            )))),
        }
    }

    /// Runs `job` every period until `stop` is cancelled:
    /// [`run_once`](Self::run_once), `report` its outcome, then sleep until
    /// the next period by this instance's clock — or, when another instance
    /// was running the job or the run did not complete, try again sooner.
    pub async fn run_every<F, Fut, E, R>(
        &self,
        job: &PeriodicJob,
        stop: CancellationToken,
        mut run: F,
        mut report: R,
    ) where
        F: FnMut(JobRun) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        R: FnMut(&Result<RunOutcome<E>, LockError>),
    {
        while !stop.is_cancelled() {
            let outcome = tokio::select! {
                outcome = self.run_once(job, &mut run) => outcome,
                _ = stop.cancelled() => return,
            };
            report(&outcome);
            let pause = next_attempt(job, self.clock.now(), &outcome);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// How long [`Scheduler::run_every`] sleeps after `outcome`, at `now` by its
/// clock: until the next period after a completed or skipped period; after a
/// busy lock, until its holder's lease would end; after a failure or a loss,
/// a quarter period — never past the start of the next period, and never
/// less than 1 ms.
fn next_attempt<E>(
    job: &PeriodicJob,
    now: SystemTime,
    outcome: &Result<RunOutcome<E>, LockError>,
) -> Duration {
    let next_period = job.until_next_period(now);
    let retry = match outcome {
        Ok(RunOutcome::Ran { .. } | RunOutcome::AlreadyDone { .. }) => next_period,
        Ok(RunOutcome::Busy { retry_after: Some(after), .. }) => *after,
        _ => job.period / 4,
    };
    retry.min(next_period).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn job(period_ms: u64) -> PeriodicJob {
        let name = LockName::new("job:{tick}").unwrap();
        PeriodicJob::new(name, MS * period_ms as u32, Duration::from_secs(1)).unwrap()
    }

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn the_period_is_whole_periods_since_the_epoch_by_the_given_clock() {
        let job = job(500);
        assert_eq!(job.period_at(at(0)), 0);
        assert_eq!(job.period_at(at(499)), 0);
        assert_eq!(job.period_at(at(500)), 1);
        assert_eq!(job.period_at(at(1_700_000_000_250)), 3_400_000_000);
        assert_eq!(job.until_next_period(at(1_250)), MS * 250);
        assert_eq!(job.until_next_period(at(1_500)), MS * 500);
    }

    #[test]
    fn after_a_run_the_scheduler_sleeps_to_the_next_period_and_retries_sooner_otherwise() {
        let job = job(400);
        let now = at(1_100);
        let ran: Result<RunOutcome<()>, LockError> =
            Ok(RunOutcome::Ran { period: 2, fencing_token: FencingToken(1) });
        assert_eq!(next_attempt(&job, now, &ran), MS * 100);
        let busy: Result<RunOutcome<()>, LockError> =
            Ok(RunOutcome::Busy { period: 2, retry_after: Some(MS * 30) });
        assert_eq!(next_attempt(&job, now, &busy), MS * 30);
        let failed = Ok(RunOutcome::Failed { period: 2, error: () });
        assert_eq!(next_attempt(&job, at(1_000), &failed), MS * 100);
        let down: Result<RunOutcome<()>, LockError> = Err(LockError::CommandTimeout(MS));
        assert_eq!(next_attempt(&job, at(1_590), &down), MS * 10, "never past the next period");
        assert_eq!(
            next_attempt(&job, at(1_600) - Duration::from_micros(10), &ran),
            MS,
            "never less than 1 ms"
        );
    }

    #[test]
    fn a_job_refuses_a_period_or_lease_out_of_bounds() {
        let name = || LockName::new("job:{tick}").unwrap();
        assert!(PeriodicJob::new(name(), Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(PeriodicJob::new(name(), Duration::from_secs(1), MS * 10).is_err());
        assert!(PeriodicJob::new(name(), Duration::from_secs(1), Duration::from_secs(1)).is_ok());
    }
}
