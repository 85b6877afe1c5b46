//! [`MultiLock`]: several locks taken all or nothing.
//!
//! As Redisson's `RedissonMultiLock`, but with one wait budget and a fixed
//! order: the members are taken one after the other in the order of their
//! keys (byte order of the names), whatever order the caller listed them
//! in, so two callers whose sets overlap always meet on their first common
//! member and never each hold what the other waits for (the classic lock
//! ordering that rules out deadlock). Each member is a reentrant lock on its
//! own name and hash tag (its scripts touch one slot, so a cluster accepts
//! them even when the members live on different nodes' slots). When a member
//! cannot be taken before the common deadline, the members already taken
//! are released before the error is returned: a partial acquisition never
//! survives the call.

use std::time::Instant;

use futures_util::FutureExt;
use futures_util::future::{join_all, select_all};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{
    FencingToken, LockClient, LockError, LockGuard, LockName, LockOptions, LossReason,
    ReleaseOutcome,
};

/// The most members a multi-lock accepts: each is one round trip to take
/// and one to release.
pub const MAX_MULTI_LOCK_MEMBERS: usize = 64;

/// A set of lock names taken together, through `client`.
#[derive(Clone, Debug)]
pub struct MultiLock {
    client: LockClient,
    /// Sorted by key, without duplicates: the order of acquisition.
    names: Vec<LockName>,
}

impl MultiLock {
    /// The multi-lock over `names` (in any order; a name listed twice is
    /// taken once).
    ///
    /// Errors: [`LockError::InvalidConfig`] for no name or more than
    /// [`MAX_MULTI_LOCK_MEMBERS`].
    pub fn new(
        client: &LockClient,
        names: impl IntoIterator<Item = LockName>,
    ) -> Result<Self, LockError> {
        let mut names: Vec<LockName> = names.into_iter().collect();
        names.sort_by(|a, b| a.key().cmp(b.key()));
        names.dedup_by(|a, b| a.key() == b.key());
        if names.is_empty() || names.len() > MAX_MULTI_LOCK_MEMBERS {
            return Err(LockError::InvalidConfig(format!(
                "a multi-lock needs between 1 and {MAX_MULTI_LOCK_MEMBERS} names, got {}",
                names.len()
            )));
        }
        Ok(Self { client: client.clone(), names })
    }

    /// The members, in the order they are taken.
    pub fn names(&self) -> &[LockName] {
        &self.names
    }

    /// Takes every member with `options.lease` (and the watchdog if asked),
    /// all within `options.wait` in total.
    ///
    /// Errors: those of [`LockClient::try_lock_with`] for the first member
    /// that could not be taken ([`LockError::Timeout`] names that member and
    /// the whole time waited); the members taken before it are released
    /// first.
    pub async fn try_lock(&self, options: LockOptions) -> Result<MultiGuard, LockError> {
        options.validate()?;
        let started = Instant::now();
        let deadline = started + options.wait;
        let mut members = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let wait = deadline.saturating_duration_since(Instant::now());
            match self.client.try_lock_with(name, LockOptions { wait, ..options }).await {
                Ok(guard) => members.push(guard),
                Err(err) => {
                    roll_back(members).await;
                    return Err(match err {
                        LockError::Timeout { name, retry_after, .. } => {
                            LockError::Timeout { name, waited: started.elapsed(), retry_after }
                        }
                        err => err,
                    });
                }
            }
        }
        Ok(MultiGuard::new(members))
    }
}

/// Releases the members of a partial acquisition, last taken first, all at
/// once; a member whose release fails keeps its lease until it runs out.
async fn roll_back(members: Vec<LockGuard>) {
    for outcome in join_all(members.into_iter().rev().map(LockGuard::release)).await {
        if let Err(err) = outcome {
            tracing::debug!(%err, "multi-lock rollback: a member's release failed");
        }
    }
}

/// Every member of a [`MultiLock`], held. Dropping it releases them all in
/// the background.
pub struct MultiGuard {
    members: Vec<LockGuard>,
    lost: CancellationToken,
    /// Stops the task that watches the members' `lost()`.
    _watch: DropGuard,
}

impl MultiGuard {
    fn new(members: Vec<LockGuard>) -> Self {
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let losses: Vec<_> =
            members.iter().map(|m| m.lost().clone().cancelled_owned().boxed()).collect();
        let (fire, stopped) = (lost.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stopped.cancelled() => {}
                _ = select_all(losses) => fire.cancel(),
            }
        });
        Self { members, lost, _watch: stop.drop_guard() }
    }

    /// The members' guards, in the order they were taken (by key).
    pub fn members(&self) -> &[LockGuard] {
        &self.members
    }

    /// Each member's fencing token, in the order of [`members`](Self::members);
    /// a write to a member's resource carries that member's token.
    pub fn fencing_tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.members.iter().map(|m| (m.name().clone(), m.fencing_token())).collect()
    }

    /// Cancelled as soon as any member is known or presumed lost: the set is
    /// no longer held as a whole.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    /// The first member found lost, and why.
    pub fn loss(&self) -> Option<(&LockName, LossReason)> {
        self.members.iter().find_map(|m| m.loss().map(|reason| (m.name(), reason)))
    }

    /// Releases every member (all at once: one round trip each, in
    /// parallel). Returns each member's outcome in the order of
    /// [`members`](Self::members).
    ///
    /// Errors: the first member's [`LockError::Redis`] /
    /// [`LockError::CommandTimeout`]; the other members are released all
    /// the same.
    pub async fn release(self) -> Result<Vec<ReleaseOutcome>, LockError> {
        let MultiGuard { members, .. } = self;
        join_all(members.into_iter().map(LockGuard::release)).await.into_iter().collect()
    }
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("members", &self.members)
            .field("lost", &self.lost.is_cancelled())
            .finish()
    }
}
