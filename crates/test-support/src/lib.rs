//! What the workspace's integration tests need besides the shared servers:
//! processes a test owns, each killed when its handle is dropped, and the
//! small helpers around them.
//!
//! - [`free_port`]: a free TCP port on the loopback interface;
//! - [`RedisServer`]: a `redis-server` child on a free port that persists
//!   nothing, so a restart comes back empty; optionally a replica or a
//!   cluster node;
//! - [`RabbitMqNode`]: a RabbitMQ node of its own beside the shared broker;
//! - [`ServiceLauncher`] → [`ChildService`]: any HTTP service binary (the
//!   caller passes its path) on a free port, ready once its health route
//!   answers;
//! - [`Browser`]: headless Chromium driven over the DevTools protocol, for
//!   tests of pages in a real browser ([`chromium`] finds the binary);
//! - [`eventually`] and [`signal`]: polling a condition, signalling a process.
//!
//! It depends on no crate of the workspace, so every test binary (the
//! service's, the lock library's, the load test's) can use it as a
//! dev-dependency. Helpers panic on failure: they run inside tests, and a
//! panic with a message is the clearest report there.

mod browser;
mod rabbitmq;
mod redis_server;
mod service;

use std::future::Future;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use browser::{Browser, HEADLESS_FLAGS, chromium};
pub use rabbitmq::RabbitMqNode;
pub use redis_server::RedisServer;
pub use service::{ChildService, ServiceLauncher};

/// A free TCP port on the loopback interface: bound, read, released.
///
/// Another process may take it before the caller binds it; the helpers of
/// this crate that start servers retry on another port when that happens.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Polls `check` every 10 ms until it holds (`true`) or `within` has passed
/// (`false`). `check` runs at least once.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `signal` (a `kill` name such as `STOP`, `CONT`, `TERM`) to process
/// `pid`; panics when `kill` fails (no such process).
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {pid}");
}

/// Sends SIGCONT to `pid`, ignoring failures: a stopped process must be
/// continued before it can be reaped.
fn resume(pid: u32) {
    let _ = Command::new("kill")
        .arg("-CONT")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
