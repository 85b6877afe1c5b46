//! A comparison cut short: `SIGINT` (Ctrl-C), `SIGTERM` (what `kill`, a CI
//! runner or a container stop sends), `SIGHUP` (its terminal went away) or a
//! panic of the comparison itself.
//!
//! [`supervise`] runs `compare` or `drain-check` until it ends or one of
//! those happens. On a signal the comparison is dropped where it waits, so
//! that its destructors run (the instances, the balancer and the owned
//! servers stop as at a normal end); on a panic it has unwound. Then, and
//! after a normal end too, every process left below this one is stopped
//! ([`crate::descendants::stop_all`]), so that the stop does not depend on
//! those destructors. Without these handlers a signal's default action ends
//! the process at once, no destructor run, its children orphaned.
//!
//! `SIGINT` is taken with the `ctrlc` crate, not tokio: goose installs its
//! own Ctrl-C handler with that crate at the start of every load test (to
//! stop the test and print its metrics), which replaces any other `SIGINT`
//! handler of the process, tokio's included. The crate takes one handler
//! per process, so the one installed here first keeps `SIGINT` for the
//! comparison, and goose's attempt fails (goose then runs without one).
//!
//! Once the handlers are installed they stay: a second signal while the
//! processes are being stopped is ignored (the stop is bounded). What is not
//! caught: `SIGKILL`, which nothing can catch (the children then die with
//! this process: [`owned_servers::die_with_parent`]), and a panic in a task
//! the comparison spawned and did not wait for.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::task::Poll;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use crate::descendants;

/// Why a comparison ended before its end.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    /// `SIGINT`, `SIGTERM` or `SIGHUP`, by name, with its number.
    Signal(&'static str, i32),
    /// The comparison panicked, with the panic's message.
    Panic(String),
}

impl Cause {
    /// The exit status: 128 + the signal's number (130 after `SIGINT`, 143
    /// after `SIGTERM`), as a shell reports a process a signal ended; 101
    /// after a panic, as Rust's runtime exits after an uncaught one.
    pub fn exit_code(&self) -> u8 {
        match self {
            Cause::Signal(_, number) => (128 + number) as u8,
            Cause::Panic(_) => 101,
        }
    }

    /// In words, for the report and the terminal: `interrupted by SIGTERM`,
    /// `the comparison panicked: <message>`.
    pub fn reason(&self) -> String {
        match self {
            Cause::Signal(name, _) => format!("interrupted by {name}"),
            Cause::Panic(message) => format!("the comparison panicked: {message}"),
        }
    }
}

/// Runs `work` until it ends, `SIGINT`, `SIGTERM` or `SIGHUP` arrives, or it panics;
/// then stops every process left below this one. The signal handlers are
/// installed before `work` is first polled, so before it starts anything.
pub async fn supervise<F: Future>(work: F) -> Result<F::Output, Cause> {
    let ended = guard(work).await;
    descendants::stop_all().await;
    ended
}

/// [`supervise`] without the stop: `work`'s output, or why it was cut short
/// (`work` is dropped by then).
async fn guard<F: Future>(work: F) -> Result<F::Output, Cause> {
    let sigint = catch_sigint();
    let (terminate, hangup) = (signal(SignalKind::terminate()), signal(SignalKind::hangup()));
    if !sigint || terminate.is_err() || hangup.is_err() {
        tracing::warn!("could not install the SIGINT, SIGTERM and SIGHUP handlers");
    }
    tokio::select! {
        ended = catch_panic(work) => ended,
        _ = SIGINT.notified(), if sigint => Err(Cause::Signal("SIGINT", libc::SIGINT)),
        _ = received(terminate) => Err(Cause::Signal("SIGTERM", libc::SIGTERM)),
        // The terminal that started the comparison went away.
        _ = received(hangup) => Err(Cause::Signal("SIGHUP", libc::SIGHUP)),
    }
}

/// Waits for the first signal of `stream`; for ever when it could not be
/// installed.
async fn received(stream: std::io::Result<tokio::signal::unix::Signal>) {
    match stream {
        Ok(mut stream) => {
            stream.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

/// Told of every `SIGINT` once [`catch_sigint`] installed its handler (a
/// signal that comes while nobody waits is kept for the next wait).
static SIGINT: Notify = Notify::const_new();

/// Installs the process's `SIGINT` handler, once (see the module
/// documentation); false when it could not be installed.
fn catch_sigint() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| ctrlc::set_handler(|| SIGINT.notify_one()).is_ok())
}

/// `work`'s output, or [`Cause::Panic`] when a poll of it panicked (it has
/// unwound, and is dropped on return).
async fn catch_panic<F: Future>(work: F) -> Result<F::Output, Cause> {
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(Cause::Panic(message(&*payload)))),
        }
    })
    .await
}

/// The message of a panic's payload (`panic!` gives a `&str` or a `String`).
fn message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_owned(),
        (_, Some(text)) => text.clone(),
        _ => "(a panic without a message)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its drops: the comparison's handles stop their processes when
    /// dropped.
    struct Handle(std::sync::Arc<std::sync::atomic::AtomicU32>);

    impl Drop for Handle {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    // `catch_panic` rather than `guard`: installing the signal handlers
    // would leave this test binary deaf to Ctrl-C.
    #[tokio::test]
    async fn a_panic_of_the_work_is_its_cause_and_the_works_handles_are_dropped() {
        let drops = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let handle = Handle(drops.clone());
        let ended = catch_panic(async move {
            let _held = handle;
            tokio::task::yield_now().await;
            panic!("a run went wrong: {}", 42);
        })
        .await;
        assert_eq!(ended, Err(Cause::Panic("a run went wrong: 42".into())));
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1, "its handle was dropped");
        assert_eq!(ended.unwrap_err().exit_code(), 101);
    }

    #[tokio::test]
    async fn work_that_ends_gives_its_output() {
        assert_eq!(catch_panic(async { 7 }).await, Ok(7));
    }

    #[test]
    fn a_signal_exits_with_128_plus_its_number_and_says_its_name() {
        let term = Cause::Signal("SIGTERM", libc::SIGTERM);
        assert_eq!((term.exit_code(), term.reason().as_str()), (143, "interrupted by SIGTERM"));
        assert_eq!(Cause::Signal("SIGINT", libc::SIGINT).exit_code(), 130);
    }
}
