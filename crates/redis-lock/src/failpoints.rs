//! Pause points for tests (compiled only with the `failpoints` feature).
//!
//! A test that must put a task at an exact point — a holder between its read
//! and its write, a grant between its reply and its validity check — arms a
//! pause for that point and a key (a lock's key, a sale id), waits until the
//! task has [`Armed::reached`] it, does what the timeline needs, then
//! [`Armed::resume`]s it, optionally with a value the code at the point acts
//! on. Only the first task to reach an armed point stops (the pause is
//! one-shot), so other tasks at the same point and key pass through; pauses of
//! other keys never meet, so tests running side by side in one binary do not
//! see each other's.
//!
//! Production builds do not compile this module, nor the calls to it (each
//! call site is `#[cfg(feature = "failpoints")]`): it costs nothing in a
//! release. The workspace's tests enable the feature through a
//! dev-dependency of each crate on itself.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use tokio::sync::oneshot;

/// One armed pause, waiting for its first task.
struct Slot<T> {
    reached: oneshot::Sender<()>,
    resume: oneshot::Receiver<T>,
}

type AnySlot = Box<dyn Any + Send>;

static ARMED: LazyLock<Mutex<HashMap<(&'static str, String), AnySlot>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The test's side of an armed pause. Dropping it disarms the point (if no
/// task reached it yet) and lets a stopped task go on with
/// [`reached`]'s `None`.
pub struct Armed<T> {
    point: &'static str,
    key: String,
    reached: Option<oneshot::Receiver<()>>,
    resume: Option<oneshot::Sender<T>>,
}

/// Arms `point` for `key`: the next task that calls [`reached`] with both
/// stops there until the returned handle resumes it. Panics when the same
/// point and key are already armed.
pub fn arm<T: Send + 'static>(point: &'static str, key: impl ToString) -> Armed<T> {
    let key = key.to_string();
    let (reached_tx, reached_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel();
    let slot: AnySlot = Box::new(Slot { reached: reached_tx, resume: resume_rx });
    let previous = ARMED.lock().expect("failpoints").insert((point, key.clone()), slot);
    assert!(previous.is_none(), "failpoint {point} for {key} armed twice");
    Armed { point, key, reached: Some(reached_rx), resume: Some(resume_tx) }
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
/// test armed the point for the key with a value type `T`; otherwise stops
/// until the test resumes it, and returns the test's value.
pub async fn reached<T: Send + 'static>(point: &'static str, key: impl ToString) -> Option<T> {
    let slot = ARMED.lock().expect("failpoints").remove(&(point, key.to_string()))?;
    let slot = slot.downcast::<Slot<T>>().expect("a failpoint armed with another value type");
    let Slot { reached, resume } = *slot;
    let _ = reached.send(());
    resume.await.ok()
}

/// In every acquire round on one node: after the claim's reply came back,
/// before its validity is judged; keyed by the lock's key. A test that holds
/// a task here for longer than the lease makes the grant come back too late
/// (timeline T3), as a client stalled at that moment would.
pub const CLAIM_REPLIED: &str = "redis-lock/claim-replied";
