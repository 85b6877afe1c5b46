//! [`RwLock`]: many readers or one writer.
//!
//! The writer is the reentrant lock's hash (`rwlock_write.lua` takes it only
//! when no reader holds a live lease), so a write guard is a [`LockGuard`]:
//! reentrant through [`LockGuard::reenter`], renewed by the watchdog, fenced,
//! told through `lost()`. Readers are entries `{owner → end of lease}` in
//! `<name>:readers` (`shared_acquire.lua`), each a [`SharedGuard`] with its own
//! lease and, if asked, its own watchdog; a dead reader's entry stops
//! counting when its lease ends. A writer that has to wait sets
//! `<name>:writer-waiting`, renewed by its attempts, which keeps new readers
//! out: a stream of readers cannot starve a writer. Releases of either side
//! publish on `<name>:released`, which wakes the waiters of both.
//!
//! Not provided: upgrading a read hold to a write hold (two upgrading readers
//! would wait for each other until their waits end), re-entry of a read hold
//! (take another one), and a writer taking a read hold of its own lock (it
//! is refused like any other reader).

use std::time::Duration;

use super::scripts::ClaimKind;
use super::{
    LockClient, LockError, LockGuard, LockName, LockOptions, SharedGuard, duration_ms_ceil,
};

/// A read-write lock named `name` on one node, through `client`.
#[derive(Clone, Debug)]
pub struct RwLock {
    client: LockClient,
    name: LockName,
}

impl RwLock {
    /// The read-write lock `name`. Its keys: the writer hash `<name>`, the
    /// fencing counter `<name>:fence`, the readers `<name>:readers`, the
    /// marker `<name>:writer-waiting`; all keep the name's hash tag.
    pub fn new(client: &LockClient, name: LockName) -> Self {
        Self { client: client.clone(), name }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Takes the write side, waiting at most `options.wait` for the writer
    /// and every reader to leave. Errors and cancel-safety: as
    /// [`LockClient::try_lock_with`] (a writer dropped while it waits drops
    /// its marker at once).
    pub async fn write(&self, options: LockOptions) -> Result<LockGuard, LockError> {
        let waiter_timeout = self.client.config().waiter_timeout;
        let marker_ms = if options.wait.is_zero() { 0 } else { duration_ms_ceil(waiter_timeout) };
        let kind = ClaimKind::Write { waiter_timeout_ms: marker_ms };
        let heartbeat = Some(waiter_timeout / 3);
        self.client.take(&self.name, kind, options, heartbeat, LockClient::guard).await
    }

    /// Takes a read hold, waiting at most `options.wait` while a writer holds
    /// the lock or waits for it. Errors and cancel-safety: as
    /// [`LockClient::try_lock_with`].
    pub async fn read(&self, options: LockOptions) -> Result<SharedGuard, LockError> {
        self.client.take(&self.name, ClaimKind::Read, options, None, SharedGuard::new).await
    }

    /// How long a waiting writer keeps new readers out after its last
    /// attempt: the client's waiter timeout.
    pub fn writer_patience(&self) -> Duration {
        self.client.config().waiter_timeout
    }
}
