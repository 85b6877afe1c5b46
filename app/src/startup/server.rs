//! The HTTP/1.1 server: the accept loop, and the limits a public endpoint
//! needs that `axum::serve` does not offer, so that slow or idle clients
//! cannot hold the process's connections and file descriptors:
//!
//! - **a cap on open connections** (`SECKILL_MAX_CONNECTIONS`): one permit
//!   per connection; a connection accepted beyond the cap is answered a fixed
//!   `503 busy` problem (`Retry-After: 1`, written without waiting, if the
//!   socket takes it) and closed at once, before anything is read or
//!   allocated for it;
//! - **a header timeout** (`SECKILL_HEADER_TIMEOUT_MS`): a request head must
//!   be complete within this time of its first byte (of the connection's
//!   accept, for its first request), or the connection is closed — partial
//!   request lines and trickled headers (slowloris) are cut off;
//! - **an idle timeout** (`SECKILL_IDLE_TIMEOUT_MS`): a kept-alive connection
//!   with no request in progress and no byte read or written for this long is
//!   closed.
//!
//! The request timeout, which answers a problem, is the router's
//! (`crate::http`). The timeouts follow Go's `net/http` `ReadHeaderTimeout`
//! and `IdleTimeout`; hyper's own header timer is not used because it also
//! runs while a kept-alive connection waits for its next request, which would
//! make the idle timeout the header timeout. HTTP/2 is not served: hyper's
//! protocol detection waits for the 24-byte preface with no deadline.
//!
//! Shutdown is graceful: the listener stops, idle connections close, requests
//! in progress are answered, then [`serve`] returns.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// The connection limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections at most; more are refused.
    pub max_connections: usize,
    /// From a request head's first byte to its end.
    pub header_timeout: Duration,
    /// With no request in progress and no byte moving.
    pub idle_timeout: Duration,
}

/// Answer to a connection beyond the cap: an RFC 9457 problem, as
/// `crate::web::AppError` would write `busy`.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\n\
content-length: 116\r\n\r\n\
{\"type\":\"/problems/busy\",\"title\":\"Busy, retry later\",\"status\":503,\
\"detail\":\"too many open connections; retry later\"}";

/// Serves `router` on `listener` within `limits` until `shutdown` completes,
/// then stops accepting and returns once every connection has closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.keep_alive(true).header_read_timeout(None);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, most often: wait instead of spinning.
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (stream, peer) = stream;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            let _ = stream.try_write(BUSY);
            continue; // dropped: closed
        };
        let _ = stream.set_nodelay(true);
        let clock = Arc::new(Clock::new());
        let io = TokioIo::new(Clocked { inner: stream, clock: clock.clone() });
        let service = {
            // `router` for one connection, telling `clock` when each request
            // starts and ends.
            let (router, clock) = (router.clone(), clock.clone());
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                let in_progress = clock.request_started();
                let router = router.clone();
                // The client's address, for the handlers that need it.
                request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                async move {
                    let response = router.oneshot(request.map(axum::body::Body::new)).await;
                    drop(in_progress);
                    response
                }
            })
        };
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                () = clock.expired(limits) => {}
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Times of one connection, in milliseconds since it was accepted.
struct Clock {
    accepted: Instant,
    /// The last byte read or written, or the last request's end.
    last_progress: AtomicU64,
    /// When the head being read began ([`NONE`]: no head is being read).
    head_since: AtomicU64,
    in_progress: AtomicUsize,
    /// Wakes [`Clock::expired`] when a head begins (its deadline moves in).
    head_began: Notify,
}

const NONE: u64 = u64::MAX;

impl Clock {
    /// A connection just accepted: it owes its first head from now.
    fn new() -> Self {
        Self {
            accepted: Instant::now(),
            last_progress: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            in_progress: AtomicUsize::new(0),
            head_began: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.accepted.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn read(&self) {
        let now = self.now();
        self.last_progress.store(now, Ordering::Relaxed);
        if self.in_progress.load(Ordering::Acquire) == 0 {
            // The first byte of the next head, unless one is being read.
            let began =
                self.head_since.compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Relaxed);
            if began.is_ok() {
                self.head_began.notify_one();
            }
        }
    }

    fn wrote(&self) {
        self.last_progress.store(self.now(), Ordering::Relaxed);
    }

    /// A head was read and its request runs until the guard is dropped.
    fn request_started(self: &Arc<Self>) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
        InProgress(self.clone())
    }

    /// Completes when the connection has broken a limit: a head unfinished
    /// `header_timeout` after its start, or nothing in progress and nothing
    /// moving for `idle_timeout`. Never while a request is in progress.
    async fn expired(&self, limits: Limits) {
        let header = u64::try_from(limits.header_timeout.as_millis()).unwrap_or(NONE - 1);
        let idle = u64::try_from(limits.idle_timeout.as_millis()).unwrap_or(NONE - 1);
        loop {
            let deadline = if self.in_progress.load(Ordering::Acquire) > 0 {
                self.now().saturating_add(idle.max(1)) // look again later
            } else {
                match self.head_since.load(Ordering::Acquire) {
                    NONE => self.last_progress.load(Ordering::Relaxed).saturating_add(idle),
                    since => since.saturating_add(header),
                }
            };
            let now = self.now();
            if deadline <= now && self.in_progress.load(Ordering::Acquire) == 0 {
                return;
            }
            let wait = deadline.saturating_sub(now).max(1);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(wait)) => {}
                () = self.head_began.notified() => {}
            }
        }
    }
}

/// A request in progress on a connection; its end is progress.
struct InProgress(Arc<Clock>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.wrote();
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A TCP stream that tells its [`Clock`] of every byte read or written.
struct Clocked {
    inner: TcpStream,
    clock: Arc<Clock>,
}

impl AsyncRead for Clocked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.read();
        }
        polled
    }
}

impl AsyncWrite for Clocked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.wrote();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.clock.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_is_a_complete_problem_response() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length, "content-length matches the body");
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            (problem["type"].as_str(), problem["status"].as_u64()),
            (Some("/problems/busy"), Some(503))
        );
    }

    const LIMITS: Limits = Limits {
        max_connections: 1,
        header_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(600),
    };

    /// How long `clock` takes to expire from now, within `LIMITS`.
    async fn expires_after(clock: &Arc<Clock>) -> Duration {
        let from = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), clock.expired(LIMITS)).await.unwrap();
        from.elapsed()
    }

    fn about(elapsed: Duration, expected: Duration) -> bool {
        elapsed >= expected && elapsed < expected + Duration::from_millis(150)
    }

    #[tokio::test]
    async fn a_new_connection_owes_its_first_head_within_the_header_timeout() {
        let after = expires_after(&Arc::new(Clock::new())).await;
        assert!(about(after, LIMITS.header_timeout), "{after:?}");
    }

    #[tokio::test]
    async fn a_request_in_progress_is_never_cut_and_idle_time_counts_from_its_end() {
        let clock = Arc::new(Clock::new());
        let request = clock.request_started();
        let expired = tokio::time::timeout(LIMITS.idle_timeout * 2, clock.expired(LIMITS)).await;
        assert!(expired.is_err(), "cut while a request was in progress");
        drop(request);
        let after = expires_after(&clock).await;
        assert!(about(after, LIMITS.idle_timeout), "{after:?}");
    }

    #[tokio::test]
    async fn the_next_head_has_the_header_timeout_from_its_first_byte() {
        let clock = Arc::new(Clock::new());
        drop(clock.request_started());
        let watch = tokio::spawn({
            let clock = clock.clone();
            async move { expires_after(&clock).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        clock.read(); // the next head's first byte, 100 ms into the idle time
        let after = watch.await.unwrap();
        let expected = Duration::from_millis(100) + LIMITS.header_timeout;
        assert!(about(after, expected), "{after:?}");
    }
}
