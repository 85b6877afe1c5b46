//! In-process coordination of waiters: one local queue per lock name, and one
//! shared pub/sub connection per [`Wakeups`] dispatching release messages.
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
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{Notify, OnceCell, Semaphore};
use tokio_util::sync::CancellationToken;

use super::Telemetry;

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
    /// The pub/sub subscriptions that route release messages to `wake`,
    /// made by the first contender that finds the lock held, and kept while
    /// any local task waits, so a busy lock is subscribed to once.
    pub(crate) subscriptions: OnceCell<Vec<Registration>>,
}

impl LocalEntry {
    /// An entry of no queue: a fair-lock waiter's own wake-up.
    pub(crate) fn new() -> Self {
        Self {
            contender: Semaphore::new(1),
            wake: Arc::new(Notify::new()),
            subscriptions: OnceCell::new(),
        }
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

/// One pub/sub connection to one Redis node, shared by every waiter of a
/// client, routing each channel's messages to the registered [`Notify`].
pub(crate) struct Wakeups {
    client: redis::Client,
    connect_timeout: Duration,
    telemetry: Arc<Telemetry>,
    shared: Arc<Shared>,
    closed: CancellationToken,
}

struct Shared {
    routes: Mutex<HashMap<String, Arc<Notify>>>,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The current connection's sink, and the token that stops its reader.
    sink: Option<(PubSubSink, CancellationToken)>,
    /// Bumped per connection, so a reader task only clears its own.
    generation: u64,
    /// Registrations per channel; subscribed while positive.
    refs: HashMap<String, usize>,
}

impl State {
    /// Forgets the current connection and stops its reader.
    fn disconnect(&mut self) {
        if let Some((_, reader)) = self.sink.take() {
            reader.cancel();
        }
    }
}

impl Wakeups {
    pub(crate) fn new(
        client: redis::Client,
        connect_timeout: Duration,
        telemetry: Arc<Telemetry>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            connect_timeout,
            telemetry,
            shared: Arc::new(Shared {
                routes: Mutex::new(HashMap::new()),
                state: tokio::sync::Mutex::new(State::default()),
            }),
            closed: CancellationToken::new(),
        })
    }

    /// Routes `channel`'s messages to `wake` until the registration is
    /// dropped, subscribing when it is the channel's first registration.
    /// Never fails: when Redis cannot be reached the waiter just goes
    /// without messages (its waits are bounded anyway).
    pub(crate) async fn register(
        self: &Arc<Self>,
        channel: &str,
        wake: Arc<Notify>,
    ) -> Registration {
        // The route changes under the state lock, so that a concurrent
        // unregistration of the same channel cannot remove it after us.
        let mut state = self.shared.state.lock().await;
        self.shared
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(channel.to_owned(), wake);
        let refs = state.refs.entry(channel.to_owned()).or_insert(0);
        *refs += 1;
        if *refs == 1 || state.sink.is_none() {
            self.subscribe(&mut state, channel).await;
        }
        Registration { wakeups: Arc::downgrade(self), channel: channel.to_owned() }
    }

    /// Subscribes on the current connection, connecting (and re-subscribing
    /// every registered channel) when there is none.
    async fn subscribe(&self, state: &mut State, channel: &str) {
        if state.sink.is_none() {
            // A new connection subscribes to every registered channel,
            // including `channel`, so a connection lost earlier heals here.
            self.connect(state).await;
            return;
        }
        if let Some((sink, _)) = state.sink.as_mut() {
            self.telemetry.round_trips(1);
            match tokio::time::timeout(self.connect_timeout, sink.subscribe(channel)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::debug!(%err, channel, "lock wake-up subscription failed");
                    state.disconnect();
                }
                Err(_) => {
                    tracing::debug!(channel, "lock wake-up subscription timed out");
                    state.disconnect();
                }
            }
        }
    }

    /// Opens a new connection subscribed to every registered channel and
    /// makes it the current one, with a task reading its messages. On
    /// failure the state keeps no connection (the next registration tries
    /// again).
    async fn connect(&self, state: &mut State) {
        let channels: Vec<String> = state.refs.keys().cloned().collect();
        let Some((sink, stream)) = self.open(&channels).await else { return };
        state.disconnect();
        state.generation += 1;
        let closed = self.closed.child_token();
        state.sink = Some((sink, closed.clone()));
        let reader = Reader { shared: Arc::downgrade(&self.shared), generation: state.generation };
        tokio::spawn(reader.run(stream, closed));
    }

    /// A pub/sub connection subscribed to `channels`, each step bounded by
    /// the connect timeout.
    async fn open(&self, channels: &[String]) -> Option<(PubSubSink, PubSubStream)> {
        let connecting = self.client.get_async_pubsub();
        let pubsub = match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(err)) => {
                tracing::debug!(%err, "lock wake-up connection failed");
                return None;
            }
            Err(_) => {
                tracing::debug!("lock wake-up connection timed out");
                return None;
            }
        };
        let (mut sink, stream) = pubsub.split();
        if !channels.is_empty() {
            self.telemetry.round_trips(1);
            let subscribed = tokio::time::timeout(self.connect_timeout, sink.subscribe(channels));
            if !matches!(subscribed.await, Ok(Ok(()))) {
                tracing::debug!("lock wake-up subscription failed on a new connection");
                return None;
            }
        }
        Some((sink, stream))
    }
}

/// The task that routes one connection's messages to the waiters.
struct Reader {
    shared: Weak<Shared>,
    /// The connection's generation: the reader clears only its own.
    generation: u64,
}

impl Reader {
    async fn run(self, mut stream: PubSubStream, closed: CancellationToken) {
        loop {
            let msg = tokio::select! {
                _ = closed.cancelled() => return,
                msg = stream.next() => msg,
            };
            let Some(shared) = self.shared.upgrade() else { return };
            let Some(msg) = msg else {
                // The connection ended: forget it, so the next
                // registration reconnects (waits stay PTTL-bounded).
                let mut state = shared.state.lock().await;
                if state.generation == self.generation {
                    state.disconnect();
                }
                return;
            };
            let routes = shared.routes.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(wake) = routes.get(msg.get_channel_name()) {
                wake.notify_one();
            }
        }
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// Keeps a channel subscribed; unsubscribes (in the background) when the
/// last registration of the channel is dropped.
pub(crate) struct Registration {
    wakeups: Weak<Wakeups>,
    channel: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(wakeups) = self.wakeups.upgrade() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let mut state = wakeups.shared.state.lock().await;
            let Some(refs) = state.refs.get_mut(&channel) else { return };
            *refs = refs.saturating_sub(1);
            if *refs > 0 {
                return;
            }
            state.refs.remove(&channel);
            wakeups.shared.routes.lock().unwrap_or_else(|e| e.into_inner()).remove(&channel);
            if let Some((sink, _)) = state.sink.as_mut() {
                wakeups.telemetry.round_trips(1);
                let unsubscribed =
                    tokio::time::timeout(wakeups.connect_timeout, sink.unsubscribe(&channel)).await;
                if !matches!(unsubscribed, Ok(Ok(()))) {
                    state.disconnect();
                }
            }
        });
    }
}
