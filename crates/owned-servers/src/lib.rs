//! Servers a process starts for itself, beside the shared ones, so that it
//! may kill, stop or restart them without touching anyone else's:
//!
//! - [`RedisServer`]: a `redis-server` child on a free port that persists
//!   nothing, so a restart comes back empty; optionally a replica or a
//!   cluster node;
//! - [`RedisCluster`]: a Redis Cluster of N masters made of such servers
//!   (`redis-cli --cluster create`);
//! - [`RabbitMqNode`]: a RabbitMQ node of its own (name, ports, directories);
//! - [`free_port`], [`eventually`], [`resume`]: what starting them needs.
//!
//! The tests use them through `test-support` (which re-exports them), and the
//! load test's fault runs restart them (`loadtest compare --faults`). Each
//! start and restart comes in two forms: `try_*` answers an error message,
//! the plain form panics with it (the form tests want). Both servers are
//! stopped, and their directories removed, when dropped.

mod rabbitmq;
mod redis_cluster;
mod redis_server;

use std::future::Future;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use rabbitmq::RabbitMqNode;
pub use redis_cluster::RedisCluster;
pub use redis_server::RedisServer;

/// A free TCP port on the loopback interface: bound, read, released.
///
/// Another process may take it before the caller binds it; the servers of
/// this crate retry on another port when that happens.
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

/// Sends SIGCONT to `pid`, ignoring failures: a stopped process must be
/// continued before it can be killed and reaped.
pub fn resume(pid: u32) {
    let _ = Command::new("kill")
        .arg("-CONT")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
