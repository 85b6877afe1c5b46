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

use super::scripts::ClaimKind;
use super::{LockClient, LockError, LockName, LockOptions, SharedGuard};

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
}
