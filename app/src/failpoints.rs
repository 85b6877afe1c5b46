//! The service's fault injection, for tests and fault drills: compiled only
//! with the cargo feature `failpoints`, never in a release build.
//!
//! Every failpoint of the service is a [`Point`] of the catalogue below, and
//! a point is armed in one of two ways:
//!
//! - **in the test's own process**, as a pause: a test [`arm`]s a point for a
//!   key (a sale id), waits until a task has [`Armed::reached`] it, does what
//!   its timeline needs, then [`Armed::resume`]s the task, optionally with a
//!   value the code at the point acts on. Only the first task to reach an
//!   armed point stops (the pause is one-shot); pauses of other keys never
//!   meet, so tests running side by side in one process do not see each
//!   other's.
//! - **by configuration**, for a service (often a child process of the test)
//!   that must fail in a set way: `SECKILL_FAILPOINTS` (the configuration's
//!   `failpoints`) is a comma-separated `name=action` list, parsed once per
//!   service at start by [`Failpoints::parse`], which refuses an unknown
//!   name, an action the point does not take, or a point named twice. The
//!   code at the point asks [`Failpoints::fire`]; a point that fires is
//!   logged and counted in `seckill_failpoints_fired_total{failpoint}`.
//!
//! A build without the feature has neither: the call sites are
//! `#[cfg(feature = "failpoints")]`, and the service refuses to start when
//! `SECKILL_FAILPOINTS` is set, rather than run a fault drill that injects
//! nothing (or a production instance with a drill's setting).
//!
//! The pauses are the service's own, not the `redis-lock` crate's (which
//! keeps pause points of its own for its own tests): the points here are
//! about sales, and a library's test hooks are no contract for the service to
//! build on. With this one module, every fault the service can be made to
//! show is listed in one place.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::oneshot;

/// A place in the service's code where a fault can be injected, and the
/// actions [`Failpoints`] may configure for it (none: a pause point, armed
/// only by tests in the same process).
#[derive(Debug)]
pub struct Point {
    name: &'static str,
    actions: &'static [Action],
}

impl Point {
    /// Its name, in `SECKILL_FAILPOINTS` and the metric's `failpoint` label.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// `redis-decr`: right after a successful reservation, before Postgres is
/// asked. `error`: the purchase is answered `503 unavailable` as if Postgres
/// had failed, and its reservation is compensated; `exit`: the process ends
/// at once with [`EXIT_CODE`], as a crash would, its reservation left open
/// for the reconciler.
pub static REDIS_DECR_AFTER_RESERVE: Point =
    Point { name: "redis-decr-after-reserve", actions: &[Action::Error, Action::Exit] };

/// `queue`: between a batch's commit and its acknowledgement. The first time
/// it is reached, `lose-connection` closes the consumers' connection, so the
/// acknowledgement that follows finds its channel gone.
pub static QUEUE_BEFORE_ACK: Point =
    Point { name: "queue-before-ack", actions: &[Action::LoseConnection] };

/// The expiry sweep, before it commits a return. `hang`: the transaction
/// hangs uncommitted, its order's row locked, until the process dies (to kill
/// an instance mid-sweep).
pub static EXPIRY_SWEEP_BEFORE_COMMIT: Point =
    Point { name: "expiry-sweep-before-commit", actions: &[Action::Hang] };

/// Pause: a batch that has locked its sale and read what it decides from,
/// right before its write; keyed by sale id.
pub static BATCH_BEFORE_TAKE_STOCK: Point = Point { name: "batch/before-take-stock", actions: &[] };

/// Pause: a holder of a `lock/*` sale's lock, after its read and its
/// simulated work, right before it asks whether it still holds the lock;
/// keyed by sale id, resumed with a `strategy::lock::BeforeWrite`.
pub static LOCK_BEFORE_WRITE: Point = Point { name: "lock/before-write", actions: &[] };

/// Pause: a `redis-decr` measurement between its Redis snapshot and its
/// Postgres read; keyed by sale id.
pub static REDIS_DECR_AFTER_SNAPSHOT: Point =
    Point { name: "redis-decr/after-snapshot", actions: &[] };

/// Every point, for the parser.
static POINTS: &[&Point] = &[
    &REDIS_DECR_AFTER_RESERVE,
    &QUEUE_BEFORE_ACK,
    &EXPIRY_SWEEP_BEFORE_COMMIT,
    &BATCH_BEFORE_TAKE_STOCK,
    &LOCK_BEFORE_WRITE,
    &REDIS_DECR_AFTER_SNAPSHOT,
];

/// Exit status of a process ended by an `exit` action.
pub const EXIT_CODE: i32 = 86;

/// What a configured failpoint does when reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The operation fails as if its backing server had.
    Error,
    /// The process ends at once ([`EXIT_CODE`]); [`Failpoints::fire`] does it.
    Exit,
    /// The operation never finishes.
    Hang,
    /// The connection in use is closed; fires once per process.
    LoseConnection,
}

impl Action {
    #[cfg(test)]
    const ALL: [Action; 4] = [Action::Error, Action::Exit, Action::Hang, Action::LoseConnection];

    /// Its name in `SECKILL_FAILPOINTS`.
    pub fn name(self) -> &'static str {
        match self {
            Action::Error => "error",
            Action::Exit => "exit",
            Action::Hang => "hang",
            Action::LoseConnection => "lose-connection",
        }
    }
}

/// A `SECKILL_FAILPOINTS` list that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SECKILL_FAILPOINTS: {0}")]
pub struct ParseError(String);

/// One configured point.
#[derive(Debug)]
struct Configured {
    point: &'static Point,
    action: Action,
    /// Set once a one-shot action has fired.
    spent: AtomicBool,
}

/// The failpoints configured for one service (its `SECKILL_FAILPOINTS`);
/// empty by default. Cheap to clone: clones share what has fired.
#[derive(Debug, Clone, Default)]
pub struct Failpoints {
    configured: Arc<[Configured]>,
}

impl Failpoints {
    /// Parses a comma-separated `name=action` list (blank entries are
    /// skipped). Errors: an entry without `=`, an unknown name, an action the
    /// point does not take, a point named twice.
    pub fn parse(list: &str) -> Result<Failpoints, ParseError> {
        let mut configured: Vec<Configured> = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|entry| !entry.is_empty()) {
            let Some((name, action)) = entry.split_once('=') else {
                return Err(ParseError(format!("`{entry}` is not `name=action`")));
            };
            let (name, action) = (name.trim(), action.trim());
            let point = point_named(name)?;
            let Some(action) = point.actions.iter().copied().find(|a| a.name() == action) else {
                return Err(ParseError(format!(
                    "`{name}` takes {}, not `{action}`",
                    accepted(point.actions)
                )));
            };
            if configured.iter().any(|c| c.point.name == name) {
                return Err(ParseError(format!("`{name}` is named twice")));
            }
            configured.push(Configured { point, action, spent: AtomicBool::new(false) });
        }
        Ok(Failpoints { configured: configured.into() })
    }

    /// The service's failpoints from its `failpoints` setting (none when
    /// unset), each armed one logged as a warning.
    pub fn from_setting(setting: Option<&str>) -> Result<Failpoints, ParseError> {
        let failpoints = Failpoints::parse(setting.unwrap_or_default())?;
        for configured in failpoints.configured.iter() {
            tracing::warn!(
                failpoint = configured.point.name,
                action = configured.action.name(),
                "failpoint armed (SECKILL_FAILPOINTS): a test or fault drill only"
            );
        }
        Ok(failpoints)
    }

    /// Called by the code at `point`: the configured action, if any (a
    /// one-shot action only the first time), logged and counted. An `exit`
    /// action ends the process here.
    pub fn fire(&self, point: &Point) -> Option<Action> {
        let configured = self.configured.iter().find(|c| c.point.name == point.name)?;
        let one_shot = configured.action == Action::LoseConnection;
        if one_shot && configured.spent.swap(true, Ordering::SeqCst) {
            return None;
        }
        let (name, action) = (point.name, configured.action.name());
        metrics::counter!(crate::metric_names::FAILPOINTS_FIRED_TOTAL, "failpoint" => name)
            .increment(1);
        if configured.action == Action::Exit {
            tracing::error!(failpoint = name, "failpoint {name}=exit: the process ends now");
            std::process::exit(EXIT_CODE);
        }
        tracing::warn!(failpoint = name, action, "failpoint fired");
        Some(configured.action)
    }
}

/// The point called `name`.
fn point_named(name: &str) -> Result<&'static Point, ParseError> {
    POINTS.iter().copied().find(|point| point.name == name).ok_or_else(|| {
        let known: Vec<&str> =
            POINTS.iter().filter(|p| !p.actions.is_empty()).map(|p| p.name).collect();
        ParseError(format!("unknown failpoint `{name}` (known: {})", known.join(", ")))
    })
}

/// "`a` or `b`", or why there is nothing to configure.
fn accepted(actions: &[Action]) -> String {
    if actions.is_empty() {
        return "no action (a pause point, armed by tests in their own process)".to_owned();
    }
    let names: Vec<String> = actions.iter().map(|a| format!("`{}`", a.name())).collect();
    names.join(" or ")
}

impl fmt::Display for Failpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries: Vec<String> = self
            .configured
            .iter()
            .map(|c| format!("{}={}", c.point.name, c.action.name()))
            .collect();
        f.write_str(&entries.join(","))
    }
}

/// One armed pause, waiting for its first task.
struct Slot<T> {
    reached: oneshot::Sender<()>,
    resume: oneshot::Receiver<T>,
}

type AnySlot = Box<dyn Any + Send>;

/// The armed pauses of the process, by point name and key.
static ARMED: LazyLock<Mutex<HashMap<(&'static str, String), AnySlot>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The test's side of an armed pause. Dropping it disarms the point (if no
/// task reached it yet) and lets a stopped task go on with [`reached`]'s
/// `None`.
pub struct Armed<T> {
    point: &'static str,
    key: String,
    reached: Option<oneshot::Receiver<()>>,
    resume: Option<oneshot::Sender<T>>,
}

/// Arms `point` for `key` in this process: the next task that calls
/// [`reached`] with both stops there until the returned handle resumes it.
/// Panics when the same point and key are already armed.
pub fn arm<T: Send + 'static>(point: &'static Point, key: impl ToString) -> Armed<T> {
    let key = key.to_string();
    let (reached_tx, reached_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel();
    let slot: AnySlot = Box::new(Slot { reached: reached_tx, resume: resume_rx });
    let previous = ARMED.lock().expect("failpoints").insert((point.name, key.clone()), slot);
    assert!(previous.is_none(), "failpoint {} for {key} armed twice", point.name);
    Armed { point: point.name, key, reached: Some(reached_rx), resume: Some(resume_tx) }
}

impl<T> Armed<T> {
    /// Waits until a task has stopped at the point.
    pub async fn reached(&mut self) {
        let reached = self.reached.take().expect("reached() awaited once");
        reached.await.expect("the failpoint was reached");
    }

    /// Lets the stopped task go on; [`reached`] returns `Some(value)` to it.
    pub fn resume(mut self, value: T) {
        let resume = self.resume.take().expect("resumed once");
        let _ = resume.send(value);
    }
}

impl<T> Drop for Armed<T> {
    fn drop(&mut self) {
        ARMED.lock().expect("failpoints").remove(&(self.point, std::mem::take(&mut self.key)));
    }
}

/// Called by the code at `point` for `key`: returns `None` at once unless a
/// test of this process armed the point for the key with a value type `T`;
/// otherwise stops until the test resumes it, and returns the test's value.
pub async fn reached<T: Send + 'static>(point: &Point, key: impl ToString) -> Option<T> {
    let slot = ARMED.lock().expect("failpoints").remove(&(point.name, key.to_string()))?;
    let slot = slot.downcast::<Slot<T>>().expect("a failpoint armed with another value type");
    let Slot { reached, resume } = *slot;
    let _ = reached.send(());
    resume.await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(list: &str) -> String {
        Failpoints::parse(list).unwrap_err().to_string()
    }

    #[test]
    fn a_list_is_parsed_once_into_every_point_it_names() {
        let list = " redis-decr-after-reserve = exit ,, expiry-sweep-before-commit=hang,";
        let failpoints = Failpoints::parse(list).unwrap();
        let shown = "redis-decr-after-reserve=exit,expiry-sweep-before-commit=hang";
        assert_eq!(failpoints.to_string(), shown);
        assert_eq!(failpoints.fire(&EXPIRY_SWEEP_BEFORE_COMMIT), Some(Action::Hang));
        assert_eq!(failpoints.fire(&QUEUE_BEFORE_ACK), None);
        assert_eq!(Failpoints::parse("").unwrap().to_string(), "");
    }

    #[test]
    fn a_one_shot_action_fires_once_and_others_every_time() {
        let failpoints =
            Failpoints::parse("queue-before-ack=lose-connection,redis-decr-after-reserve=error")
                .unwrap();
        let shared = failpoints.clone();
        assert_eq!(failpoints.fire(&QUEUE_BEFORE_ACK), Some(Action::LoseConnection));
        assert_eq!(shared.fire(&QUEUE_BEFORE_ACK), None);
        for _ in 0..2 {
            assert_eq!(failpoints.fire(&REDIS_DECR_AFTER_RESERVE), Some(Action::Error));
        }
    }

    #[test]
    fn unknown_names_wrong_actions_repeats_and_bare_names_are_refused() {
        assert!(error_of("nope=error").contains("unknown failpoint `nope`"));
        assert!(error_of("queue-before-ack=exit").contains("takes `lose-connection`, not `exit`"));
        assert!(error_of("lock/before-write=hang").contains("a pause point"));
        let twice = "expiry-sweep-before-commit=hang,expiry-sweep-before-commit=hang";
        assert!(error_of(twice).contains("named twice"));
        assert!(error_of("redis-decr-after-reserve").contains("is not `name=action`"));
    }

    #[test]
    fn every_action_has_a_distinct_name() {
        let mut names: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Action::ALL.len());
    }

    #[tokio::test]
    async fn a_pause_stops_the_first_task_of_its_key_until_resumed() {
        let mut armed = arm::<u8>(&BATCH_BEFORE_TAKE_STOCK, "unit-test-1");
        let task = tokio::spawn(reached::<u8>(&BATCH_BEFORE_TAKE_STOCK, "unit-test-1"));
        armed.reached().await;
        assert_eq!(reached::<u8>(&BATCH_BEFORE_TAKE_STOCK, "unit-test-1").await, None);
        armed.resume(7);
        assert_eq!(task.await.unwrap(), Some(7));
    }
}
