//! The settings of the HTTP server ([`HttpSettings`]): where it listens,
//! its connection limits (applied by `crate::startup::server`) and the
//! router's request timeout.

use std::net::SocketAddr;
use std::time::Duration;

use crate::bounds::MAX_MS;

/// `SECKILL_ADDR`: the address the service listens on.
pub const ADDR_ENV: &str = "SECKILL_ADDR";

/// Settings of the HTTP server: its addresses, the connection limits of
/// `crate::startup::server`, and the router's request timeout.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "HTTP server")]
pub struct HttpSettings {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = ADDR_ENV, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,

    /// Address of a listener of its own for `GET /metrics`, served there
    /// without a token for a scraper on a private network (port 0 picks a
    /// free port); `/metrics` then leaves the main address. Unset: `/metrics`
    /// is served on the main address and asks for the admin token, like
    /// `/admin/*` (docs/security.md).
    #[arg(long, env = "SECKILL_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// Open HTTP connections at most; a connection beyond the cap is answered
    /// `503 busy` and closed at once. Keep it under the process's file
    /// descriptor limit (`ulimit -n`), with room for the connection pools.
    #[arg(
        long,
        env = "SECKILL_MAX_CONNECTIONS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections: u32,

    /// Milliseconds a client has to send a complete request head, from its
    /// first byte (from the accept, for a connection's first request); then
    /// the connection is closed.
    #[arg(
        long,
        env = "SECKILL_HEADER_TIMEOUT_MS",
        default_value_t = 5_000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub header_timeout_ms: u64,

    /// Milliseconds a kept-alive connection may stay open with no request in
    /// progress and no byte read or written; then it is closed.
    #[arg(
        long,
        env = "SECKILL_IDLE_TIMEOUT_MS",
        default_value_t = 60_000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub idle_timeout_ms: u64,

    /// Milliseconds a request may run, reading its body included, before it
    /// is answered `504 timeout`. What it set in motion may still complete
    /// (a purchase is never placed twice for one buyer, so a retry is safe).
    #[arg(
        long,
        env = "SECKILL_REQUEST_TIMEOUT_MS",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub request_timeout_ms: u64,
}

impl HttpSettings {
    /// `SECKILL_REQUEST_TIMEOUT_MS`.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}
