//! [`FairLock`]: a lock served in arrival order across processes.
//!
//! As Redisson's `RFairLock`: the lock is the reentrant lock's hash (so
//! re-entry, the watchdog, fencing and release are the reentrant lock's),
//! and beside it a line of waiters ordered by their arrival on the Redis
//! server, each with a deadline (`fair.lua`). Only the first waiter in line
//! may take a free lock; a release wakes that waiter alone, on its own
//! channel (`<name>:turn:<owner>`). Every attempt of a waiter renews its
//! deadline ([`LockConfig::waiter_timeout`](super::LockConfig), renewed
//! every third of it); a waiter that stops coming back (its process died,
//! it lost Redis) is dropped from the line by the next call after its
//! deadline, so a dead waiter delays the others by at most the waiter
//! timeout plus one renewal period.
//!
//! A newcomer is let into the line only if the line can serve it within
//! half of its wait: under a spike, a line that lets everyone in is served
//! from a head that is always about to give up, and stalls. Until the line
//! has timed a hand-over, its pace is taken as the time since the last
//! grant, a floor of the current hold.
//!
//! Unlike [`LockClient::try_lock`], every task is its own waiter in line:
//! tasks of one process are not merged into one contender, so the order
//! holds between tasks as well as between processes.

use std::time::Instant;

use super::local::LocalEntry;
use super::scripts::{Claim, ClaimKind, turn_channel_prefix};
use super::single::{Waiting, detached};
use super::{LockClient, LockError, LockGuard, LockName, LockOptions, duration_ms_ceil};

/// A fair lock named `name` on one node, through `client`.
#[derive(Clone, Debug)]
pub struct FairLock {
    client: LockClient,
    name: LockName,
}

impl FairLock {
    /// The fair lock `name`. Its keys: the lock hash `<name>`, the fencing
    /// counter `<name>:fence`, the line `<name>:queue`, the deadlines
    /// `<name>:waiters` and the line's pace `<name>:pace`; all keep the
    /// name's hash tag.
    pub fn new(client: &LockClient, name: LockName) -> Self {
        Self { client: client.clone(), name }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Takes the lock when it is this caller's turn, waiting in line at most
    /// `options.wait`. A zero wait takes it only if it is free and nobody is
    /// waiting, and never joins the line. A caller is let into the line only
    /// if the waiters ahead of it would be served, at the line's pace (the
    /// smoothed time between two grants to waiters in line), within half of
    /// its wait; otherwise it gets [`LockError::Timeout`] at once, with
    /// `retry_after` the wait the line predicted (`fair.lua`, "A line longer
    /// than a wait can serve"). Before the line has timed a hand-over (the
    /// time from a grant to the next grant to a waiter in line), its pace is
    /// taken as the time since the last grant, a floor of the current hold
    /// that grows while it lasts (`fair.lua`, "A spike before the pace is
    /// known"). The guard is the reentrant lock's:
    /// fencing token, `lost()`, re-entry, watchdog; its release hands the
    /// lock to the next waiter in line.
    ///
    /// Errors and cancel-safety: as [`LockClient::try_lock_with`]. On every
    /// error, and when the future is dropped while it waits, the caller
    /// leaves the line at once (or, when Redis cannot be reached, is dropped
    /// from it after the waiter timeout).
    pub async fn try_lock(&self, options: LockOptions) -> Result<LockGuard, LockError> {
        let lease_ms = options.validate()?;
        let this = self.clone();
        detached(move |cancel| async move {
            let started = Instant::now();
            let deadline = started + options.wait;
            let waiter_timeout = this.client.config().waiter_timeout;
            let kind = ClaimKind::Fair {
                enqueue: !options.wait.is_zero(),
                waiter_timeout_ms: duration_ms_ceil(waiter_timeout),
                until: deadline,
            };
            let owner = super::new_owner_token();
            let channel = format!("{}{owner}", turn_channel_prefix(&this.name));
            let (name, fenced) = (this.name.clone(), options.fenced);
            let claim = Claim { name, owner, lease_ms, kind, fenced };
            let (own, heartbeat) = (LocalEntry::new(), Some(waiter_timeout / 3));
            let waiting = Waiting { entry: &own, channel: &channel, heartbeat, cancel: &cancel };
            let grant = this.client.contend(&claim, &waiting, started, deadline).await?;
            Ok(this.client.guard(claim, grant, options.renewal()))
        })
        .await
    }
}
