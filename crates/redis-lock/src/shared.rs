//! [`SharedGuard`]: a hold that others may share — one reader of an
//! [`RwLock`](super::RwLock), or one permit of a
//! [`Semaphore`](super::Semaphore).
//!
//! Both are an entry `{owner token → end of lease}` in a sorted set, with the
//! lease's end on the Redis server's clock. An entry whose lease ended counts
//! as free for every script that reads the set, so a holder that dies gives
//! its hold back when its lease ends, with no sweeper. The holder's side is
//! the reentrant lock's: a [`LeaseState`] watched (and, with the watchdog,
//! renewed every lease/3 by `shared_acquire.lua`) by one task, which fires
//! [`lost`](SharedGuard::lost) when the lease is gone.

use std::sync::Arc;
use std::time::Duration;

use super::scripts::{self, Claim};
use super::single::Grant;
use super::watchdog::{LeaseState, lease_accessors};
use super::{LockClient, LockError, LockName, LossReason, ReleaseOutcome};

/// One read hold or one semaphore permit. Dropping it without
/// [`release`](Self::release) gives it back in the background (when a Tokio
/// runtime is running; otherwise its lease runs out).
pub struct SharedGuard {
    client: LockClient,
    claim: Claim,
    state: Arc<LeaseState>,
    released: bool,
}

impl SharedGuard {
    /// The guard of a granted read or permit `claim`, renewed for
    /// `max_hold` when there is one.
    pub(crate) fn new(
        client: &LockClient,
        claim: Claim,
        grant: Grant,
        max_hold: Option<Duration>,
    ) -> Self {
        let lease = grant.lease(Duration::from_millis(claim.lease_ms));
        let state = LeaseState::new(lease, client.telemetry().clone());
        client.watch(claim.clone(), state.clone(), max_hold);
        Self { client: client.clone(), claim, state, released: false }
    }

    /// The name of the read-write lock or semaphore.
    pub fn name(&self) -> &LockName {
        &self.claim.name
    }

    /// The owner token (hex, 160 bits) of this hold.
    pub fn owner(&self) -> &str {
        &self.claim.owner
    }

    /// The lease requested (each renewal restores it).
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.claim.lease_ms)
    }

    lease_accessors!();

    /// Hands the hold over to whoever will give it back: stops watching and
    /// renewing it here, and returns its owner token. The hold stays until
    /// its lease ends or a [`Semaphore::give_back`](super::Semaphore::give_back)
    /// (from any process) names the token; dropping what this returns
    /// releases nothing. No round trip.
    pub fn hand_over(mut self) -> String {
        self.released = true;
        self.state.stop();
        std::mem::take(&mut self.claim.owner)
    }

    /// Gives the hold back and wakes the waiters (one round trip):
    /// [`ReleaseOutcome::Released`], or [`ReleaseOutcome::Expired`] when its
    /// lease had ended (the hold may have gone to someone else meanwhile).
    ///
    /// Errors: [`LockError::Redis`] / [`LockError::CommandTimeout`] (outcome
    /// unknown; the lease runs out at worst).
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.released = true;
        self.state.stop();
        let mut conn = self.client.conn().await?;
        let timeout = self.client.config().command_timeout;
        let (holders, owner) = (self.claim.holders_key(), self.claim.owner.as_str());
        let channel = self.claim.name.channel();
        let release = scripts::shared_release(&mut conn, &holders, owner, channel);
        if self.client.call(timeout, release).await? {
            return Ok(ReleaseOutcome::Released);
        }
        self.state.mark_lost(LossReason::Expired);
        Ok(ReleaseOutcome::Expired)
    }
}

impl Drop for SharedGuard {
    fn drop(&mut self) {
        self.state.stop();
        if self.released {
            return;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(self.client.abandon(&self.claim));
        }
    }
}

impl std::fmt::Debug for SharedGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedGuard")
            .field("name", &self.claim.name)
            .field("kind", &self.claim.kind)
            .field("lost", &self.state.loss())
            .finish_non_exhaustive()
    }
}
