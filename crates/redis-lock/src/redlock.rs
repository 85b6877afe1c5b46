//! Redlock: one lock over N independent Redis nodes (no replication between
//! them), as described on redis.io ("Distributed locks with Redis").
//!
//! A round sends `acquire.lua` (same data model as [`LockClient`], without
//! fencing) to every node concurrently, each cut off after a short
//! per-node timeout. It succeeds when at least N/2+1 nodes granted the lock
//! and its validity `lease − elapsed − (0.01·lease + 2 ms)` is positive,
//! `elapsed` being measured on a monotonic clock from the start of that
//! successful round (node-redlock #169). Otherwise the lock is released on
//! every node that granted it or did not answer, and the round is retried
//! after a wake-up or a jittered delay while the wait lasts. A node that is
//! down or errs is a "no" vote, never an error of the whole lock
//! (redlock-rs's anti-pattern, timeline T13). The watchdog renews on all
//! nodes and needs a quorum within validity each time.
//!
//! **An efficiency lock, not a correctness guarantee.** Redlock assumes
//! bounded network delays, bounded process pauses and clock rates that do
//! not drift much; a node that restarts without persistence forgets its
//! keys and can hand a second client a majority (timeline T5), and an early
//! expiry on one node does the same (T4). It has no fencing token of its own
//! (its random value is not monotonic): a caller that must stay correct
//! takes fencing tokens from an independent, durable source and has the
//! protected resource check them (Kleppmann 2016; redis.io's disclaimer).
//!
//! [`LockClient`]: super::LockClient

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::local::{LocalEntry, LocalQueues};
use super::scripts::{self, AcquireMode, AcquireReply, ExtendReply, ReleaseReply, Wake};
use super::single::{detached, until_cancelled};
use super::wakeups::Wakeups;
use super::watchdog::{self, Lease, LeaseState, Renewal, Renewer};
use super::{
    ExtendOutcome, LockError, LockName, LockOptions, LockStats, LossReason, RoundTripHook,
    Telemetry, duration_ms_ceil, jitter, new_owner_token, validity,
};

/// The most nodes accepted (Redlock deployments use 3 or 5).
const MAX_NODES: usize = 15;

/// Settings of a [`Redlock`].
#[derive(Clone)]
pub struct RedlockConfig {
    /// How long one node may take to answer one command before it counts as
    /// a "no" vote (default 50 ms; the description suggests 5–50 ms for a
    /// 10 s lease). It should be far below the lease.
    pub node_timeout: Duration,
    /// How long a connection attempt to one node may take (default 200 ms).
    pub connect_timeout: Duration,
    /// Upper bound of the random delay before a retry (default 20 ms; the
    /// delay is uniform in [retry_jitter/2, retry_jitter]), so that
    /// competing clients do not split the votes again in lockstep.
    pub retry_jitter: Duration,
    /// Told about every round trip sent, one per node contacted.
    pub on_round_trip: Option<RoundTripHook>,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        Self {
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(20),
            on_round_trip: None,
        }
    }
}

impl std::fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockConfig")
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry_jitter", &self.retry_jitter)
            .finish_non_exhaustive()
    }
}

/// A Redlock client over N independent nodes. Create one per process and
/// share it (cheap to clone).
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<_> = self
            .inner
            .nodes
            .iter()
            .map(|n| n.client.get_connection_info().addr().to_string())
            .collect();
        f.debug_struct("Redlock")
            .field("nodes", &nodes)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    nodes: Vec<Node>,
    config: RedlockConfig,
    telemetry: Arc<Telemetry>,
    queues: LocalQueues,
}

struct Node {
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    wakeups: Arc<Wakeups>,
}

/// One node's answer in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Vote {
    Yes,
    /// Held by another owner, with its remaining lease in ms.
    No {
        pttl_ms: i64,
    },
    /// No answer or an error: our key may or may not be there.
    Unknown,
}

impl Redlock {
    /// A Redlock over `nodes` (connected lazily).
    ///
    /// Errors: [`LockError::InvalidConfig`] for no node, more than 15, or a
    /// zero or over-60 s timeout.
    pub fn new(nodes: Vec<redis::Client>, config: RedlockConfig) -> Result<Self, LockError> {
        if nodes.is_empty() || nodes.len() > MAX_NODES {
            return Err(LockError::InvalidConfig(format!(
                "Redlock needs between 1 and {MAX_NODES} nodes, got {}",
                nodes.len()
            )));
        }
        for (what, d) in
            [("node_timeout", config.node_timeout), ("connect_timeout", config.connect_timeout)]
        {
            if d.is_zero() || d > Duration::from_secs(60) {
                return Err(LockError::InvalidConfig(format!(
                    "{what} {d:?} must be positive and at most 60 s"
                )));
            }
        }
        if config.retry_jitter > Duration::from_secs(60) {
            return Err(LockError::InvalidConfig("retry_jitter must be at most 60 s".into()));
        }
        let telemetry = Telemetry::new(config.on_round_trip.clone());
        let nodes = nodes
            .into_iter()
            .map(|client| Node {
                wakeups: Wakeups::new(
                    vec![client.clone()],
                    config.connect_timeout,
                    telemetry.clone(),
                ),
                client,
                conn: OnceCell::new(),
            })
            .collect();
        Ok(Self {
            inner: Arc::new(Inner { nodes, config, telemetry, queues: LocalQueues::default() }),
        })
    }

    /// The number of nodes, N.
    pub fn nodes(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Votes needed: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    /// Counters since creation (one round trip per node contacted).
    pub fn stats(&self) -> LockStats {
        self.inner.telemetry.snapshot()
    }

    /// Takes `name` on a quorum of nodes, waiting at most `options.wait`.
    ///
    /// The lease must leave a positive validity after the drift allowance and
    /// the per-node timeout: `lease > node_timeout + 0.01·lease + 2 ms`.
    ///
    /// Errors:
    /// - [`LockError::InvalidConfig`]: lease or wait out of bounds;
    /// - [`LockError::Timeout`]: other owners kept a quorum from us;
    /// - [`LockError::NoQuorum`]: fewer than a quorum of nodes answered;
    /// - [`LockError::AcquiredTooLate`]: the last quorum came with no validity.
    ///
    /// Cancel-safe as [`LockClient::try_lock_with`](super::LockClient::try_lock_with):
    /// a dropped call's task stops waiting at once and releases what it got.
    pub async fn try_lock(
        &self,
        name: &LockName,
        options: LockOptions,
    ) -> Result<RedlockGuard, LockError> {
        let lease_ms = options.validate()?;
        let lease = Duration::from_millis(lease_ms);
        let node_timeout = self.inner.config.node_timeout;
        if validity(lease, node_timeout).is_none() {
            return Err(LockError::InvalidConfig(format!(
                "lease {lease:?} leaves no validity after the node timeout {node_timeout:?} and the drift allowance"
            )));
        }
        let (this, name) = (self.clone(), name.clone());
        detached(move |cancel| async move { this.contend(&name, options, &cancel).await }).await
    }

    /// The rounds of [`try_lock`](Self::try_lock), until one wins, the wait
    /// ends, or `cancel` fires.
    async fn contend(
        &self,
        name: &LockName,
        options: LockOptions,
        cancel: &CancellationToken,
    ) -> Result<RedlockGuard, LockError> {
        let (lease_ms, started) = (duration_ms_ceil(options.lease), Instant::now());
        let (lease, deadline) = (Duration::from_millis(lease_ms), started + options.wait);
        let entry = self.inner.queues.entry(name.key());
        let in_line = tokio::time::timeout_at(deadline.into(), entry.contender.acquire());
        let Some(Ok(Ok(_contender))) = until_cancelled(cancel, in_line).await else {
            return Err(self.inner.telemetry.timeout(name, started, None));
        };
        let owner = new_owner_token();
        loop {
            let round_started = Instant::now();
            let votes = self.acquire_round(name, &owner, lease_ms).await;
            let elapsed = round_started.elapsed();
            if let Some(valid) = granted(&votes, self.quorum(), lease, elapsed) {
                self.inner.telemetry.acquired();
                let max_hold = options.renewal();
                return Ok(self.guard(name, owner, lease, round_started + valid, max_hold));
            }
            // Failed round: free the nodes that may hold our key (when giving
            // up, in a task of its own, waited for one node timeout past the
            // deadline at most, so the wait ends on time).
            let ours = maybe_ours(&votes);
            let now = Instant::now();
            let step = next_step(&votes, self.quorum(), now, deadline, entry.subscribed());
            if let Next::GiveUp(failure) = step {
                let (redlock, lock, owner) = (self.clone(), name.clone(), owner.clone());
                let release =
                    tokio::spawn(async move { redlock.release_on(&ours, &lock, &owner).await });
                let until = deadline + self.inner.config.node_timeout;
                let _ = tokio::time::timeout_at(until.into(), release).await;
                return Err(self.give_up(failure, name, started, elapsed, lease));
            }
            self.release_on(&ours, name, &owner).await;
            until_cancelled(cancel, self.between_rounds(step, &entry, name, deadline)).await;
            if cancel.is_cancelled() {
                // Nobody waits for the outcome, and nothing is held (the
                // round's grants were released above). Never seen, nor counted.
                let waited = started.elapsed();
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited,
                    retry_after: None,
                });
            }
        }
    }

    /// Between two rounds: subscribe or wait for a release message as `step`
    /// says, then a random delay in [jitter/2, jitter], so that clients that
    /// split the votes do not retry in lockstep (and never at once).
    async fn between_rounds(
        &self,
        step: Next,
        entry: &LocalEntry,
        name: &LockName,
        deadline: Instant,
    ) {
        match step {
            Next::GiveUp(_) | Next::Retry => {}
            Next::Subscribe => {
                let nodes: Vec<&Wakeups> = self.inner.nodes.iter().map(|n| &*n.wakeups).collect();
                entry.subscribe(&nodes, name.channel(), deadline).await;
            }
            Next::Wait(round) => {
                let _ = tokio::time::timeout(round, entry.wake.notified()).await;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let half = self.inner.config.retry_jitter / 2;
        tokio::time::sleep((half + jitter(half)).min(left)).await;
    }

    /// The error of a `try_lock` that gives up after a round that took
    /// `elapsed`, for a call that started at `started`.
    fn give_up(
        &self,
        failure: Failure,
        name: &LockName,
        started: Instant,
        elapsed: Duration,
        lease: Duration,
    ) -> LockError {
        match failure {
            Failure::NoQuorum { reachable } => LockError::NoQuorum {
                name: name.to_string(),
                reachable,
                nodes: self.nodes(),
                quorum: self.quorum(),
            },
            Failure::TooLate => {
                LockError::AcquiredTooLate { name: name.to_string(), elapsed, lease }
            }
            Failure::Held { retry_after } => {
                self.inner.telemetry.timeout(name, started, retry_after)
            }
        }
    }

    /// One acquire round on every node concurrently.
    async fn acquire_round(&self, name: &LockName, owner: &str, lease_ms: u64) -> Vec<Vote> {
        let all: Vec<usize> = (0..self.nodes()).collect();
        let replies = self
            .on_nodes(&all, |mut conn| async move {
                scripts::acquire(&mut conn, name, owner, lease_ms, AcquireMode::Acquire, false)
                    .await
            })
            .await;
        replies
            .into_iter()
            .map(|reply| match reply {
                Some(AcquireReply::Acquired { .. }) => Vote::Yes,
                Some(AcquireReply::Held { pttl_ms }) => Vote::No { pttl_ms },
                Some(
                    AcquireReply::NotOwner | AcquireReply::Expired | AcquireReply::LineFull { .. },
                )
                | None => Vote::Unknown,
            })
            .collect()
    }

    fn guard(
        &self,
        name: &LockName,
        owner: String,
        lease: Duration,
        valid_until: Instant,
        max_hold: Option<Duration>,
    ) -> RedlockGuard {
        let lease = Lease { length: lease, set_at: Instant::now(), valid_until };
        let state = LeaseState::new(lease, self.inner.telemetry.clone());
        let renewer = max_hold.map(|max_hold| {
            let redlock = self.clone();
            let name = name.clone();
            let owner = owner.clone();
            let renew = move |lease_ms| {
                let redlock = redlock.clone();
                let name = name.clone();
                let owner = owner.clone();
                async move { redlock.renew(&name, &owner, lease_ms).await }
            };
            // Each node's part of a renewal is bounded by the node timeout.
            Renewer { renew, max_attempt: Duration::MAX, max_hold }
        });
        watchdog::spawn(state.clone(), renewer);
        RedlockGuard { redlock: self.clone(), name: name.clone(), owner, state, released: false }
    }

    async fn renew(&self, name: &LockName, owner: &str, lease_ms: u64) -> Renewal {
        let outcomes = self.extend_on_all(name, owner, lease_ms).await;
        let extended = outcomes.iter().filter(|o| matches!(o, Some(ExtendReply::Extended))).count();
        let unknown = outcomes.iter().filter(|o| o.is_none()).count();
        if extended >= self.quorum() {
            Renewal::Renewed
        } else if extended + unknown >= self.quorum() {
            Renewal::Failed
        } else if outcomes.iter().any(|o| matches!(o, Some(ExtendReply::NotOwner))) {
            Renewal::Lost(LossReason::NotOwner)
        } else {
            Renewal::Lost(LossReason::Expired)
        }
    }

    /// `extend.lua` on every node; `None` for a node that did not answer.
    async fn extend_on_all(
        &self,
        name: &LockName,
        owner: &str,
        lease_ms: u64,
    ) -> Vec<Option<ExtendReply>> {
        let all: Vec<usize> = (0..self.nodes()).collect();
        self.on_nodes(&all, |mut conn| async move {
            scripts::extend(&mut conn, name, owner, lease_ms).await
        })
        .await
    }

    /// `release.lua` (every hold) on the given nodes; `None` for no answer.
    async fn release_on(
        &self,
        nodes: &[usize],
        name: &LockName,
        owner: &str,
    ) -> Vec<Option<ReleaseReply>> {
        self.on_nodes(nodes, |mut conn| async move {
            scripts::release(&mut conn, name, owner, 1, true, Wake::All).await
        })
        .await
    }

    /// Runs `command` on the given nodes concurrently, each bounded by the
    /// node timeout; `None` for a node that erred or did not answer.
    async fn on_nodes<T, F, Fut>(&self, nodes: &[usize], command: F) -> Vec<Option<T>>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let config = &self.inner.config;
        let calls = nodes.iter().map(|&i| {
            let node = &self.inner.nodes[i];
            let command = &command;
            async move {
                self.inner.telemetry.round_trips(1);
                let attempt = async { command(node.conn(config).await?).await };
                match tokio::time::timeout(config.node_timeout, attempt).await {
                    Ok(Ok(value)) => Some(value),
                    Ok(Err(err)) => {
                        tracing::debug!(%err, node = i, "Redlock node failed");
                        None
                    }
                    Err(_) => None,
                }
            }
        });
        join_all(calls).await
    }
}

/// The shortest remaining lease among the nodes held by another owner.
fn shortest_pttl(votes: &[Vote]) -> Option<Duration> {
    votes
        .iter()
        .filter_map(|v| match v {
            Vote::No { pttl_ms } => Some(
                u64::try_from(*pttl_ms)
                    .map(Duration::from_millis)
                    .unwrap_or(Duration::from_millis(250)),
            ),
            _ => None,
        })
        .min()
}

/// Counts of one round's votes.
fn tally(votes: &[Vote]) -> (usize, usize) {
    let yes = votes.iter().filter(|v| matches!(v, Vote::Yes)).count();
    let answered = votes.iter().filter(|v| !matches!(v, Vote::Unknown)).count();
    (yes, answered)
}

/// The validity of a round that took `elapsed`, when it won a quorum with
/// some validity left (`None`: the round failed).
fn granted(votes: &[Vote], quorum: usize, lease: Duration, elapsed: Duration) -> Option<Duration> {
    let (yes, _) = tally(votes);
    if yes >= quorum { validity(lease, elapsed) } else { None }
}

/// The nodes that may hold our key after a failed round: every node that
/// did not answer "held by another owner".
fn maybe_ours(votes: &[Vote]) -> Vec<usize> {
    votes
        .iter()
        .enumerate()
        .filter(|(_, v)| !matches!(v, Vote::No { .. }))
        .map(|(i, _)| i)
        .collect()
}

/// Why a `try_lock` gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// Fewer than a quorum of nodes answered at all.
    NoQuorum { reachable: usize },
    /// A quorum granted the lock, with no validity left.
    TooLate,
    /// Other owners kept a quorum from us.
    Held { retry_after: Option<Duration> },
}

/// What `try_lock` does after a failed round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// The deadline passed.
    GiveUp(Failure),
    /// Held elsewhere, first contention: subscribe on every node.
    Subscribe,
    /// Held elsewhere: wait for a release message at most this long.
    Wait(Duration),
    /// Nobody else holds it (votes split, or nodes unreachable): retry.
    Retry,
}

/// The step after a failed round whose votes are `votes`, decided at `now`.
/// Every step but [`Next::GiveUp`] is followed by the jittered retry delay.
fn next_step(
    votes: &[Vote],
    quorum: usize,
    now: Instant,
    deadline: Instant,
    subscribed: bool,
) -> Next {
    let pttl = shortest_pttl(votes);
    if now >= deadline {
        let (yes, answered) = tally(votes);
        return Next::GiveUp(if answered < quorum {
            Failure::NoQuorum { reachable: answered }
        } else if yes >= quorum {
            Failure::TooLate
        } else {
            Failure::Held { retry_after: pttl }
        });
    }
    match pttl {
        Some(pttl) if subscribed => Next::Wait(pttl.min(deadline - now)),
        Some(_) => Next::Subscribe,
        None => Next::Retry,
    }
}

/// A lock held on a quorum of Redlock nodes. Dropping it without
/// [`release`](Self::release) releases it in the background.
pub struct RedlockGuard {
    redlock: Redlock,
    name: LockName,
    owner: String,
    state: Arc<LeaseState>,
    released: bool,
}

/// What [`RedlockGuard::release`] found, node by node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedlockRelease {
    /// Nodes where our key was deleted.
    pub released: usize,
    /// Nodes where another owner holds the lock.
    pub not_owner: usize,
    /// Nodes where nobody held it any more.
    pub expired: usize,
    /// Nodes that did not answer.
    pub unreachable: usize,
}

impl RedlockRelease {
    /// True when a quorum of nodes still had our key until this release,
    /// i.e. we held the lock to the end.
    pub fn held_to_the_end(&self, quorum: usize) -> bool {
        self.released >= quorum
    }
}

impl RedlockGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The owner token (hex, 160 bits) stored on each node.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The lease in force: the one requested, or the last one set by
    /// [`extend`](Self::extend).
    pub fn lease(&self) -> Duration {
        self.state.length()
    }

    watchdog::lease_accessors!();

    /// Sets the lease to `lease` on every node that still has our key;
    /// [`ExtendOutcome::Extended`] only when a quorum did so within validity.
    ///
    /// Errors: [`LockError::InvalidConfig`]; [`LockError::NoQuorum`] when too
    /// few nodes answered to tell.
    pub async fn extend(&self, lease: Duration) -> Result<ExtendOutcome, LockError> {
        let lease_ms = LockOptions::new(Duration::ZERO, lease).validate()?;
        let started = Instant::now();
        let outcomes = self.redlock.extend_on_all(&self.name, &self.owner, lease_ms).await;
        let quorum = self.redlock.quorum();
        let extended = outcomes.iter().filter(|o| matches!(o, Some(ExtendReply::Extended))).count();
        let answered = outcomes.iter().filter(|o| o.is_some()).count();
        let length = Duration::from_millis(lease_ms);
        if extended >= quorum
            && let Some(valid) = validity(length, started.elapsed())
        {
            self.state.extended(Lease { length, set_at: started, valid_until: started + valid });
            return Ok(ExtendOutcome::Extended);
        }
        if answered < quorum {
            return Err(LockError::NoQuorum {
                name: self.name.to_string(),
                reachable: answered,
                nodes: self.redlock.nodes(),
                quorum,
            });
        }
        let outcome = if outcomes.iter().any(|o| matches!(o, Some(ExtendReply::NotOwner))) {
            ExtendOutcome::NotOwner
        } else {
            ExtendOutcome::Expired
        };
        self.state.mark_lost(match outcome {
            ExtendOutcome::NotOwner => LossReason::NotOwner,
            _ => LossReason::Expired,
        });
        Ok(outcome)
    }

    /// Stops the watchdog and deletes our key on every node.
    pub async fn release(mut self) -> RedlockRelease {
        self.released = true;
        self.state.stop();
        let all: Vec<usize> = (0..self.redlock.nodes()).collect();
        let outcomes = self.redlock.release_on(&all, &self.name, &self.owner).await;
        let mut summary = RedlockRelease::default();
        for outcome in outcomes {
            match outcome {
                Some(ReleaseReply::Released | ReleaseReply::StillHeld(_)) => summary.released += 1,
                Some(ReleaseReply::NotOwner) => summary.not_owner += 1,
                Some(ReleaseReply::Expired) => summary.expired += 1,
                None => summary.unreachable += 1,
            }
        }
        summary
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        self.state.stop();
        if self.released {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let redlock = self.redlock.clone();
        let name = self.name.clone();
        let owner = std::mem::take(&mut self.owner);
        runtime.spawn(async move {
            let all: Vec<usize> = (0..redlock.nodes()).collect();
            redlock.release_on(&all, &name, &owner).await;
        });
    }
}

impl std::fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("name", &self.name)
            .field("lost", &self.state.loss())
            .finish_non_exhaustive()
    }
}

impl Node {
    async fn conn(&self, config: &RedlockConfig) -> redis::RedisResult<ConnectionManager> {
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.node_timeout))
            .set_number_of_retries(1);
        self.conn
            .get_or_try_init(|| async {
                ConnectionManager::new_lazy_with_config(self.client.clone(), manager_config)
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const HELD: Vote = Vote::No { pttl_ms: 300 };

    /// N/2 + 1 votes, a strict majority; no node is contacted.
    #[tokio::test]
    async fn the_quorum_is_a_strict_majority_of_the_nodes() {
        let node = || redis::Client::open("redis://127.0.0.1:1").unwrap();
        for (nodes, quorum) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)] {
            let clients = (0..nodes).map(|_| node()).collect();
            let redlock = Redlock::new(clients, RedlockConfig::default()).unwrap();
            assert_eq!(redlock.quorum(), quorum, "{nodes} nodes");
        }
    }

    #[test]
    fn a_round_wins_with_a_quorum_of_yes_votes_and_validity_left() {
        let second = Duration::from_secs(1);
        let votes = [Vote::Yes, Vote::Yes, Vote::Unknown];
        assert_eq!(granted(&votes, 2, second, MS * 100), Some(MS * 888));
        assert_eq!(granted(&votes, 2, second, MS * 990), None, "no validity left");
        assert_eq!(granted(&[Vote::Yes, HELD, Vote::Unknown], 2, second, MS), None);
    }

    #[test]
    fn a_failed_round_releases_every_node_but_those_held_by_another_owner() {
        assert_eq!(maybe_ours(&[Vote::Yes, HELD, Vote::Unknown]), vec![0, 2]);
        assert_eq!(maybe_ours(&[HELD, HELD, HELD]), Vec::<usize>::new());
    }

    #[test]
    fn the_shortest_lease_seen_bounds_the_wait() {
        let votes = [Vote::No { pttl_ms: 900 }, HELD, Vote::No { pttl_ms: -1 }];
        assert_eq!(shortest_pttl(&votes), Some(MS * 250), "no lease: a 250 ms round");
        assert_eq!(shortest_pttl(&[Vote::Yes, Vote::Unknown]), None);
    }

    #[test]
    fn before_the_deadline_a_held_lock_subscribes_then_waits_and_a_split_retries() {
        let t0 = Instant::now();
        let held = [Vote::Yes, HELD, HELD];
        assert_eq!(next_step(&held, 2, t0, t0 + MS * 1000, false), Next::Subscribe);
        assert_eq!(next_step(&held, 2, t0, t0 + MS * 1000, true), Next::Wait(MS * 300));
        assert_eq!(next_step(&held, 2, t0, t0 + MS * 40, true), Next::Wait(MS * 40));
        let split = [Vote::Yes, Vote::Unknown, Vote::Unknown];
        assert_eq!(next_step(&split, 2, t0, t0 + MS * 1000, true), Next::Retry);
    }

    #[test]
    fn at_the_deadline_the_failure_says_why() {
        let t0 = Instant::now();
        let give_up = |votes: &[Vote]| next_step(votes, 2, t0, t0, true);
        let unreachable = [Vote::Yes, Vote::Unknown, Vote::Unknown];
        assert_eq!(give_up(&unreachable), Next::GiveUp(Failure::NoQuorum { reachable: 1 }));
        assert_eq!(give_up(&[Vote::Yes, Vote::Yes, HELD]), Next::GiveUp(Failure::TooLate));
        let held = Failure::Held { retry_after: Some(MS * 300) };
        assert_eq!(give_up(&[Vote::Yes, HELD, HELD]), Next::GiveUp(held));
    }
}
