//! In-process coordination of waiters: one local queue per lock name, woken
//! by the release messages that [`Wakeups`] routes to it.
//!
//! Only the task at the head of a lock's local queue (its "contender")
//! competes for the Redis key; the others wait in process, in FIFO order, at
//! no cost to Redis. A release message wakes that one contender
//! (`Notify::notify_one`), never every waiter. A message that arrives while
//! the contender is between attempts is kept as a permit by `Notify`, so it
//! is not lost; a message that never arrives (pub/sub is at-most-once, the
//! connection may be down) only delays the contender until its wait, bounded
//! by the holder's remaining lease, runs out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use futures_util::future::join_all;
use tokio::sync::{Notify, Semaphore};

use super::wakeups::{Registration, Wakeups};

/// The local queues of one client, by lock key.
#[derive(Default)]
pub(crate) struct LocalQueues {
    entries: Mutex<HashMap<String, Weak<LocalEntry>>>,
}

/// The local state of one lock while some task of this process waits for it.
pub(crate) struct LocalEntry {
    /// One permit: the holder is the process's only contender for the key.
    pub(crate) contender: Semaphore,
    /// Woken by release messages of this lock.
    pub(crate) wake: Arc<Notify>,
    /// The pub/sub registrations that route release messages to `wake`
    /// (one per Redis node), made by the first contender that finds the lock
    /// held, and kept while any local task waits, so a busy lock is
    /// subscribed to once.
    subscriptions: OnceLock<Vec<Registration>>,
}

impl LocalEntry {
    /// An entry of no queue: a fair-lock waiter's own wake-up.
    pub(crate) fn new() -> Self {
        Self {
            contender: Semaphore::new(1),
            wake: Arc::new(Notify::new()),
            subscriptions: OnceLock::new(),
        }
    }

    /// Whether release messages are routed here already.
    pub(crate) fn subscribed(&self) -> bool {
        self.subscriptions.get().is_some()
    }

    /// First contention: routes `channel`'s messages on each of `nodes` to
    /// this entry's wake-up (no I/O: each node's subscriber subscribes in
    /// the background), then waits until every subscription is settled
    /// (active, or failed for now), but never past `deadline`.
    pub(crate) async fn subscribe(&self, nodes: &[&Wakeups], channel: &str, deadline: Instant) {
        let registrations = self.subscriptions.get_or_init(|| {
            nodes.iter().map(|node| node.register(channel, self.wake.clone())).collect()
        });
        let settled = join_all(registrations.iter().map(Registration::settled));
        let _ = tokio::time::timeout_at(deadline.into(), settled).await;
    }
}

impl LocalQueues {
    /// The entry of `key`, shared by every task of this process that wants
    /// that lock now; dropped with the last of them.
    pub(crate) fn entry(&self, key: &str) -> Arc<LocalEntry> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get(key).and_then(Weak::upgrade) {
            return entry;
        }
        if entries.len() >= 1024 {
            entries.retain(|_, e| e.strong_count() > 0);
        }
        let entry = Arc::new(LocalEntry::new());
        entries.insert(key.to_owned(), Arc::downgrade(&entry));
        entry
    }
}
