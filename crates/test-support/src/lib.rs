//! What the workspace's integration tests need besides the shared servers:
//! processes a test owns, each killed when its handle is dropped, and the
//! small helpers around them.
//!
//! - [`free_port`]: a free TCP port on the loopback interface;
//! - [`RedisServer`]: a `redis-server` child on a free port that persists
//!   nothing, so a restart comes back empty; optionally a replica or a
//!   cluster node;
//! - [`RedisCluster`]: a 3-master (or larger) Redis Cluster of such servers;
//! - [`RabbitMqNode`]: a RabbitMQ node of its own beside the shared broker;
//! - [`RabbitMqCluster`]: a cluster of such nodes, one of which may be
//!   killed, and [`QueuePlacement`], where a quorum queue's leader and
//!   replicas are (these six and [`eventually`] are `owned-servers`',
//!   re-exported: the load test restarts the same servers in its fault
//!   runs);
//! - [`ServiceLauncher`] → [`ChildService`]: any HTTP service binary (the
//!   caller passes its path) on a free port, ready once its health route
//!   answers;
//! - [`Browser`]: headless Chromium driven over the DevTools protocol, for
//!   tests of pages in a real browser ([`chromium`] finds the binary);
//! - [`CutProxy`]: a TCP proxy that closes a connection right after a
//!   chosen command ran, its reply unheard;
//! - [`Haproxy`]: HAProxy on a configuration the test gives it (a shipped
//!   file with its addresses replaced), killed on drop;
//! - [`redis_url`], [`amqp_url`], [`test_database_url`]: the shared servers
//!   the tests use; [`scratch_database`]: a database of a test's own beside
//!   the test database; [`unique_prefix`]: names on shared servers no other
//!   test uses;
//! - [`heavy`]: the turn of a test that must not run beside other heavy
//!   tests of its binary;
//! - [`eventually`] and [`signal`]: polling a condition, signalling a process;
//! - [`rust_source`]: the string literals and paths of a Rust source's
//!   production code, for the tests that check the sources themselves.
//!
//! It depends on no service crate of the workspace (only on
//! `owned-servers`, and on `sqlx` for Postgres), so every test binary (the service's, the lock
//! library's, the load test's) can use it as a dev-dependency. Helpers panic on failure: they run inside tests, and a
//! panic with a message is the clearest report there.

mod browser;
mod cut_proxy;
mod database;
mod haproxy;
mod heavy;
pub mod rust_source;
mod service;

use std::process::Command;

pub use browser::{Browser, HEADLESS_FLAGS, chromium};
pub use cut_proxy::CutProxy;
pub use database::{drop_scratch_database, scratch_database, test_database_url, unique_prefix};
pub use haproxy::Haproxy;
pub use heavy::{Heavy, heavy};
pub use owned_servers::{
    QueuePlacement, RabbitMqCluster, RabbitMqNode, RedisCluster, RedisServer, eventually, free_port,
};
pub use service::{ChildService, ServiceLauncher};

/// Sends `signal` (a `kill` name such as `STOP`, `CONT`, `TERM`) to process
/// `pid`; panics when `kill` fails (no such process).
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {pid}");
}

/// The shared Redis of the tests: `TEST_REDIS_URL`, else the service's
/// default `REDIS_URL` (`redis://127.0.0.1:6379`).
pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// `host:port` of [`redis_url`], for a proxy in front of it.
pub fn redis_addr() -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let url = redis_url();
    let authority = url.split("://").nth(1).unwrap_or(&url);
    let host_port = authority.rsplit('@').next().unwrap_or(authority);
    let host_port = host_port.split('/').next().unwrap_or(host_port);
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("TEST_REDIS_URL {url}: no host:port"))
}

/// The shared RabbitMQ of the tests: `TEST_AMQP_URL`, else the service's
/// default `AMQP_URL` (`amqp://guest:guest@127.0.0.1:5672/%2f`).
pub fn amqp_url() -> String {
    std::env::var("TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}
