//! [`Semaphore`]: N permits whose leases expire.
//!
//! The permits in use are a sorted set `{owner → end of lease}` on the Redis
//! server's clock (`shared_acquire.lua`); a permit whose lease ended is free again
//! for the next caller, whether its holder released it, crashed, or lost
//! Redis. Each permit is a [`SharedGuard`]: `lost()` when its lease is gone,
//! a watchdog if asked, a release that wakes the waiters of every process.
//!
//! As a rate limiter in front of a sale it bounds **concurrency** — at most
//! N purchases in flight across every instance — not a rate: a token bucket
//! admits up to a burst at once and then a steady number per second however
//! long each request takes, while a semaphore admits a new request only when
//! one finishes (or its lease ends), so its throughput follows the latency
//! of what it protects. A semaphore costs two round trips per admitted
//! request (take, give back); a token bucket one.
//!
//! A permit may also outlive the task that took it: [`SharedGuard::hand_over`]
//! turns it into its owner token, which another task or process renews
//! ([`Semaphore::renew`]) and gives back ([`Semaphore::give_back`]) — or
//! nobody does, and it is free again when its lease ends. A waiting room admits a buyer that way: the permit is
//! taken when the buyer is let in and given back by whichever instance
//! serves the buyer's purchase.

use std::time::Duration;

use super::scripts::{self, ClaimKind};
use super::{
    LockClient, LockError, LockName, LockOptions, ReleaseOutcome, SharedGuard, duration_ms_ceil,
};

/// A semaphore of `permits` permits named `name` on one node.
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: LockClient,
    name: LockName,
    permits: u32,
}

impl Semaphore {
    /// The semaphore `name` with `permits` permits; every user of the name
    /// must pass the same number. Its key: the set of permits in use,
    /// `<name>`.
    ///
    /// Errors: [`LockError::InvalidConfig`] for zero permits.
    pub fn new(client: &LockClient, name: LockName, permits: u32) -> Result<Self, LockError> {
        if permits == 0 {
            return Err(LockError::InvalidConfig("a semaphore needs at least one permit".into()));
        }
        Ok(Self { client: client.clone(), name, permits })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// N, the number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Takes one permit for `options.lease`, waiting at most `options.wait`
    /// while all N are in use. Errors and cancel-safety: as
    /// [`LockClient::try_lock_with`] ([`LockError::Timeout`]: no permit came
    /// free in time).
    pub async fn acquire(&self, options: LockOptions) -> Result<SharedGuard, LockError> {
        let kind = ClaimKind::Permit { permits: self.permits };
        self.client.take(&self.name, kind, options, None, SharedGuard::new).await
    }

    /// Gives back the permit of `owner` (an owner token from
    /// [`SharedGuard::owner`] or [`SharedGuard::hand_over`]), whoever holds
    /// it, and wakes the waiters (one round trip):
    /// [`ReleaseOutcome::Released`], or [`ReleaseOutcome::Expired`] when no
    /// permit of that owner was live (its lease had ended, or it was given
    /// back already — so a second give-back frees nothing).
    ///
    /// Errors: [`LockError::Redis`] / [`LockError::CommandTimeout`] (outcome
    /// unknown; the lease runs out at worst).
    pub async fn give_back(&self, owner: &str) -> Result<ReleaseOutcome, LockError> {
        let mut conn = self.client.conn().await?;
        let timeout = self.client.config().command_timeout;
        let release =
            scripts::shared_release(&mut conn, self.name.key(), owner, self.name.channel());
        Ok(match self.client.call(timeout, release).await? {
            true => ReleaseOutcome::Released,
            false => ReleaseOutcome::Expired,
        })
    }

    /// Sets the lease of `owner`'s permit to `lease` from now, whoever
    /// holds it (one round trip): `true`, or `false` when no permit of that
    /// owner was live — an ended lease is never revived, since its permit
    /// may already be someone else's. What holds a handed-over permit
    /// through a long step (a purchase) keeps it counted.
    ///
    /// Errors: [`LockError::Redis`] / [`LockError::CommandTimeout`].
    pub async fn renew(&self, owner: &str, lease: Duration) -> Result<bool, LockError> {
        let mut conn = self.client.conn().await?;
        let timeout = self.client.config().command_timeout;
        let renew =
            scripts::shared_extend(&mut conn, self.name.key(), owner, duration_ms_ceil(lease));
        Ok(self.client.call(timeout, renew).await? == scripts::ExtendReply::Extended)
    }

    /// The permits in use now — those whose lease has not ended, on the
    /// Redis server's clock (one round trip, read-only): 0 to N.
    ///
    /// Errors: [`LockError::Redis`] / [`LockError::CommandTimeout`].
    pub async fn in_use(&self) -> Result<u32, LockError> {
        let mut conn = self.client.conn().await?;
        let timeout = self.client.config().command_timeout;
        self.client.call(timeout, scripts::shared_count(&mut conn, self.name.key())).await
    }
}
