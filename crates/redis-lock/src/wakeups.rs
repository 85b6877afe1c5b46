//! One pub/sub connection per [`Wakeups`] (one per client and Redis node or
//! cluster — on a cluster, to one seed at a time, the next after a loss),
//! shared by every waiter of the client, routing each channel's release
//! messages to the [`Notify`] registered for it.
//!
//! Waiters never wait on network I/O here. [`Wakeups::register`] and the
//! drop of a [`Registration`] only change a table under a mutex that no
//! `.await` ever holds; one task, the subscriber, brings the connection in
//! line with that table: it connects, subscribes and unsubscribes, each step
//! bounded by the connect timeout. A waiter that wants its subscription
//! active before its next attempt awaits [`Registration::settled`] within
//! its own deadline, so a slow or hung pub/sub connection delays no wait past
//! its end (timeline T16 of the crate README).
//!
//! When the connection ends (a network fault, `CLIENT KILL`, a server
//! restart), the subscriber reconnects at once, pausing longer after each
//! failure, and subscribes every channel still registered. Then it wakes
//! every registered waiter once: a release published while no connection was
//! up is lost (pub/sub is at-most-once), so each waiter looks at its lock
//! again instead of sleeping out its round (T17).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{Notify, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Telemetry;

/// The pause before the first reconnection attempt after a failed one; it
/// doubles with each further failure, up to [`MAX_RECONNECT_PAUSE`].
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between two connection attempts.
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// The wake-ups of one client on one Redis node.
pub(crate) struct Wakeups {
    subscriber: Subscriber,
    /// Set once the subscriber task runs (started by the first registration).
    started: OnceLock<()>,
}

/// What the waiters and the subscriber task share.
struct Shared {
    table: Mutex<Table>,
    /// Poked (one stored permit) when the table changes.
    changed: Notify,
    /// Bumped after every change of a channel's state, for
    /// [`Registration::settled`].
    passes: watch::Sender<u64>,
}

#[derive(Default)]
struct Table {
    routes: HashMap<String, Route>,
    /// The last connection attempt failed: a new channel is "failed for now"
    /// at once, and its waiter does not wait for the next attempt.
    down: bool,
}

struct Route {
    wake: Arc<Notify>,
    /// Live registrations of the channel.
    refs: usize,
    state: RouteState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RouteState {
    /// Registered, not yet subscribed.
    Pending,
    /// Subscribed on the current connection.
    Active,
    /// The last attempt could not subscribe it; a later one will try again.
    Failed,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.passes.send_modify(|passes| *passes += 1);
    }

    /// Sets the state of the channels in `channels` (every channel when
    /// `None`), tells the waiters, and records whether Redis is down.
    fn set_state(&self, channels: Option<&HashSet<String>>, state: RouteState, down: bool) {
        let mut table = self.table();
        table.down = down;
        for (channel, route) in &mut table.routes {
            if channels.is_none_or(|set| set.contains(channel)) {
                route.state = state;
            }
        }
        drop(table);
        self.bump();
    }

    /// Wakes every registered waiter once.
    fn wake_all(&self) {
        for route in self.table().routes.values() {
            route.wake.notify_one();
        }
    }

    /// What the subscriber should do next, given whether it has a
    /// connection and what that connection is subscribed to. Marks active
    /// the registered channels the connection already carries.
    fn plan(&self, connected: bool, subscribed: &HashSet<String>) -> Plan {
        let mut table = self.table();
        if !connected {
            return match table.routes.is_empty() {
                true => Plan::Idle,
                false => Plan::Connect(table.routes.keys().cloned().collect()),
            };
        }
        let mut settled = false;
        let mut subscribe = Vec::new();
        for (channel, route) in &mut table.routes {
            if !subscribed.contains(channel) {
                subscribe.push(channel.clone());
            } else if route.state != RouteState::Active {
                route.state = RouteState::Active;
                settled = true;
            }
        }
        let unsubscribe: Vec<String> =
            subscribed.iter().filter(|c| !table.routes.contains_key(*c)).cloned().collect();
        drop(table);
        if settled {
            self.bump();
        }
        match subscribe.is_empty() && unsubscribe.is_empty() {
            true => Plan::Idle,
            false => Plan::Change { subscribe, unsubscribe },
        }
    }
}

/// The subscriber's next step.
enum Plan {
    /// Nothing to do until the table changes or the connection ends.
    Idle,
    /// Open a connection subscribed to these channels.
    Connect(Vec<String>),
    /// Change the subscriptions of the current connection.
    Change { subscribe: Vec<String>, unsubscribe: Vec<String> },
}

impl Wakeups {
    /// Wake-ups over a connection to one of `nodes` at a time (the next
    /// one after each connection ends or fails: any node of a cluster
    /// hears every release). `nodes` must not be empty.
    pub(crate) fn new(
        nodes: Vec<redis::Client>,
        connect_timeout: Duration,
        telemetry: Arc<Telemetry>,
    ) -> Arc<Self> {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
            changed: Notify::new(),
            passes: watch::Sender::new(0),
        });
        let closed = CancellationToken::new();
        let nodes = Arc::new(Nodes { clients: nodes, next: AtomicUsize::new(0) });
        let subscriber = Subscriber { nodes, connect_timeout, telemetry, shared, closed };
        Arc::new(Self { subscriber, started: OnceLock::new() })
    }

    /// Routes `channel`'s messages to `wake` until the registration is
    /// dropped; the subscriber subscribes the channel in the background.
    /// Needs a Tokio runtime for that (without one, the waiter goes without
    /// messages: its waits are bounded anyway).
    pub(crate) fn register(&self, channel: &str, wake: Arc<Notify>) -> Registration {
        self.start();
        let shared = &self.subscriber.shared;
        let mut table = shared.table();
        let state = if table.down { RouteState::Failed } else { RouteState::Pending };
        let route = table.routes.entry(channel.to_owned()).or_insert_with(|| Route {
            wake: wake.clone(),
            refs: 0,
            state,
        });
        route.refs += 1;
        // A process has one wake-up per lock at a time; a new one replaces
        // that of an entry whose last registration is being dropped.
        route.wake = wake;
        drop(table);
        shared.changed.notify_one();
        Registration { shared: Arc::downgrade(shared), channel: channel.to_owned() }
    }

    fn start(&self) {
        self.started.get_or_init(|| {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(self.subscriber.clone().run());
            }
        });
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        self.subscriber.closed.cancel();
    }
}

/// Keeps a channel registered; the subscriber unsubscribes it once its
/// last registration is dropped.
pub(crate) struct Registration {
    shared: Weak<Shared>,
    channel: String,
}

impl Registration {
    /// Resolves once the channel is subscribed, or the subscriber's attempt
    /// to subscribe it failed (the waiter then goes without messages for
    /// now). Callers bound it by their deadline.
    pub(crate) async fn settled(&self) {
        let Some(shared) = self.shared.upgrade() else { return };
        let mut passes = shared.passes.subscribe();
        loop {
            let state = shared.table().routes.get(&self.channel).map(|route| route.state);
            if state != Some(RouteState::Pending) || passes.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(shared) = self.shared.upgrade() else { return };
        let mut table = shared.table();
        let Some(route) = table.routes.get_mut(&self.channel) else { return };
        route.refs -= 1;
        if route.refs == 0 {
            table.routes.remove(&self.channel);
            drop(table);
            shared.changed.notify_one();
        }
    }
}

/// The task that keeps the connection in line with the table.
#[derive(Clone)]
struct Subscriber {
    nodes: Arc<Nodes>,
    connect_timeout: Duration,
    telemetry: Arc<Telemetry>,
    shared: Arc<Shared>,
    /// Cancelled when the [`Wakeups`] is dropped.
    closed: CancellationToken,
}

/// The nodes a connection may go to, and the next one to try.
struct Nodes {
    clients: Vec<redis::Client>,
    next: AtomicUsize,
}

impl Nodes {
    /// The node for the next connection: each in turn.
    fn next(&self) -> &redis::Client {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.clients[i % self.clients.len()]
    }
}

/// The current pub/sub connection.
struct Connection {
    sink: PubSubSink,
    /// Cancelled by the reader when the connection ends.
    ended: CancellationToken,
    /// Stops the reader when the connection is given up.
    _reader: DropGuard,
}

impl Subscriber {
    async fn run(self) {
        let mut conn: Option<Connection> = None;
        let mut subscribed = HashSet::new();
        let mut failures = 0;
        // Whether a connection was lost: the next one wakes every waiter.
        let mut lost = false;
        while !self.closed.is_cancelled() {
            if conn.as_ref().is_some_and(|c| c.ended.is_cancelled()) {
                lost = self.forget(&mut conn, &mut subscribed);
            }
            match self.shared.plan(conn.is_some(), &subscribed) {
                Plan::Idle => self.idle(conn.as_ref()).await,
                Plan::Connect(channels) => {
                    if let Some(opened) = self.open(&channels).await {
                        (conn, failures) = (Some(opened), 0);
                        subscribed = channels.into_iter().collect();
                        self.shared.set_state(Some(&subscribed), RouteState::Active, false);
                        if std::mem::take(&mut lost) {
                            self.shared.wake_all();
                        }
                    } else {
                        self.shared.set_state(None, RouteState::Failed, true);
                        failures += 1;
                        self.pause(failures).await;
                    }
                }
                Plan::Change { subscribe, unsubscribe } => {
                    let Some(current) = conn.as_mut() else { continue };
                    if self.change(&mut current.sink, &subscribe, &unsubscribe).await {
                        subscribed.extend(subscribe);
                        subscribed.retain(|channel| !unsubscribe.contains(channel));
                    } else {
                        lost = self.forget(&mut conn, &mut subscribed);
                    }
                }
            }
        }
    }

    /// Gives up the current connection (it ended, or a step on it failed):
    /// every channel waits for the next one. Returns true (a connection was
    /// lost).
    fn forget(&self, conn: &mut Option<Connection>, subscribed: &mut HashSet<String>) -> bool {
        *conn = None;
        subscribed.clear();
        self.shared.set_state(None, RouteState::Pending, false);
        true
    }

    /// Waits until the table changes, the connection ends or the client
    /// goes.
    async fn idle(&self, conn: Option<&Connection>) {
        let ended = async {
            match conn {
                Some(conn) => conn.ended.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.shared.changed.notified() => {}
            _ = ended => {}
            _ = self.closed.cancelled() => {}
        }
    }

    /// The pause after the `failures`-th failed connection attempt in a row.
    async fn pause(&self, failures: u32) {
        let pause = RECONNECT_PAUSE.saturating_mul(1u32 << failures.min(16)) / 2;
        tokio::select! {
            _ = tokio::time::sleep(pause.min(MAX_RECONNECT_PAUSE)) => {}
            _ = self.closed.cancelled() => {}
        }
    }

    /// A new connection subscribed to `channels`, each step bounded by the
    /// connect timeout, with a task routing its messages.
    async fn open(&self, channels: &[String]) -> Option<Connection> {
        let connecting = self.nodes.next().get_async_pubsub();
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
        if !self.change(&mut sink, channels, &[]).await {
            return None;
        }
        let (ended, stop) = (CancellationToken::new(), CancellationToken::new());
        let reader = read(stream, Arc::downgrade(&self.shared), ended.clone(), stop.clone());
        tokio::spawn(reader);
        Some(Connection { sink, ended, _reader: stop.drop_guard() })
    }

    /// One `SUBSCRIBE` and one `UNSUBSCRIBE` (each one round trip, left out
    /// when it has no channel), each bounded by the connect timeout. False
    /// when either failed: the connection is no longer trusted.
    async fn change(&self, sink: &mut PubSubSink, subscribe: &[String], drop: &[String]) -> bool {
        for (channels, subscribing) in [(subscribe, true), (drop, false)] {
            if channels.is_empty() {
                continue;
            }
            self.telemetry.round_trips(1);
            let step = async {
                match subscribing {
                    true => sink.subscribe(channels).await,
                    false => sink.unsubscribe(channels).await,
                }
            };
            match tokio::time::timeout(self.connect_timeout, step).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::debug!(%err, subscribing, "lock wake-up (un)subscription failed");
                    return false;
                }
                Err(_) => {
                    tracing::debug!(subscribing, "lock wake-up (un)subscription timed out");
                    return false;
                }
            }
        }
        true
    }
}

/// Routes one connection's messages to the waiters until the connection
/// ends (then cancels `ended`) or `stop` is cancelled.
async fn read(
    mut stream: PubSubStream,
    shared: Weak<Shared>,
    ended: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return,
            msg = stream.next() => msg,
        };
        let Some(msg) = msg else {
            ended.cancel();
            return;
        };
        let Some(shared) = shared.upgrade() else { return };
        if let Some(route) = shared.table().routes.get(msg.get_channel_name()) {
            route.wake.notify_one();
        }
    }
}
