//! The admin bearer token: the [`Admin`] extractor of the service's own admin
//! handlers, and [`require_admin`], the same check as a middleware in front of
//! the admin routes a strategy contributes.
//!
//! The token is compared by its SHA-256 digest in constant time, so neither
//! its content nor its length shows in the answer time. A wrong token is
//! logged at WARN with the client's address (never the token), and a client
//! that sent [`MAX_FAILURES_PER_WINDOW`] wrong tokens within [`WINDOW`] is
//! answered `429` on every admin route until that window ends, right token or
//! not, so that guessing runs at a bounded rate. Rate limiting of everything
//! else belongs in front of the service (docs/security.md).
//!
//! The client is the TCP peer, unless the peer is one of the load balancers
//! of `SECKILL_TRUSTED_PROXIES`: then it is the address that balancer wrote
//! into `X-Forwarded-For` ([`client_address`]), so that behind a balancer one
//! client's wrong tokens do not lock every other client out. From any other
//! peer the header is ignored: a client can write anything there.
//!
//! Failures are kept for at most [`MAX_TRACKED`] clients ([`AdminFailures`]).
//! A window that has not ended is never dropped, so a blocked client stays
//! blocked however many addresses others send from; while the table is full,
//! clients without an entry share one window between them. Our own table
//! rather than `governor`'s keyed limiter: that has no check that leaves a
//! key's state as it is (a blocked client's right token must be refused
//! without being counted), and no bound on its keys.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap, HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ipnet::IpNet;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::web::AppError;

pub mod settings;

/// Wrong admin tokens one client may send per [`WINDOW`] before it is
/// answered `429`: enough for a person who mistyped, far too few to guess
/// a token of 32 random bytes.
pub const MAX_FAILURES_PER_WINDOW: u32 = 10;

/// The fixed window of [`MAX_FAILURES_PER_WINDOW`], from a client's first
/// wrong token.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Clients tracked at most, a few dozen bytes each. While every entry holds
/// a window that has not ended, clients without one share a window.
const MAX_TRACKED: usize = 100_000;

/// A full table is swept of ended windows at most this often: a sweep reads
/// every entry, too much to do for each failure of an attack.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The header a load balancer names the client in (HAProxy's `option
/// forwardfor`, or `http-request set-header X-Forwarded-For %[src]`).
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Proof that the request carried the admin bearer token: `401` without an
/// `Authorization: Bearer …` header, `403` with a wrong token, `429` from an
/// address that sent too many wrong ones lately. The token is never logged.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        authorize(state, &parts.headers, &parts.extensions).map(|()| Admin)
    }
}

/// Middleware of the admin routes that a strategy contributes: answers as
/// [`Admin`] does, before the route's own extractors run.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match authorize(&state, request.headers(), request.extensions()) {
        Ok(()) => next.run(request).await,
        Err(err) => err.into_response(),
    }
}

/// The check of [`Admin`] and [`require_admin`]: the client (from the
/// connection and, behind a trusted balancer, its `X-Forwarded-For`; absent
/// when a test calls the router directly) is checked against its recent
/// failures first, then the token.
fn authorize(
    state: &AppState,
    headers: &HeaderMap,
    extensions: &Extensions,
) -> Result<(), AppError> {
    let peer = extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip());
    let client = peer.map(|peer| client_address(peer, headers, &state.auth.trusted_proxies));
    if let Some(retry_after) =
        client.and_then(|ip| state.admin_failures.blocked(ip, Instant::now()))
    {
        return Err(AppError::TooManyAttempts { retry_after });
    }
    let (expected, _) = state.auth.admin_token();
    let result = check_bearer(headers.get(header::AUTHORIZATION), expected);
    if let Err(AppError::Forbidden) = &result {
        let failures = client.map(|ip| state.admin_failures.record(ip, Instant::now()));
        tracing::warn!(client = ?client, peer = ?peer, failures, "wrong admin token");
    }
    result
}

/// The client of a request whose TCP peer is `peer`: `peer` itself, unless it
/// is in `trusted` (the balancers of `SECKILL_TRUSTED_PROXIES`). Then the
/// `X-Forwarded-For` addresses (every line of the header, in order) are read
/// from the right, each written by the hop after it, until one that is not
/// trusted: that is the client. An entry that is no IP address ends the walk
/// at the last address read, since only trusted hops' entries are believed
/// and a trusted hop writes addresses. Addresses are compared in canonical
/// form (an IPv4-mapped IPv6 address as IPv4).
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    let mut client = peer.to_canonical();
    if !is_trusted(&client) {
        return client;
    }
    let entries: Vec<&str> = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .flat_map(|line| line.to_str().unwrap_or("").split(','))
        .collect();
    for entry in entries.into_iter().rev() {
        let Ok(ip) = entry.trim().parse::<IpAddr>() else { break };
        client = ip.to_canonical();
        if !is_trusted(&client) {
            break;
        }
    }
    client
}

/// `Ok` when `authorization` is `Bearer <expected>`. The scheme name is
/// case-insensitive (RFC 9110, section 11.1); the tokens' SHA-256 digests are
/// compared in constant time. Errors: `Unauthorized` without a bearer token,
/// `Forbidden` with a wrong one.
fn check_bearer(authorization: Option<&HeaderValue>, expected: &str) -> Result<(), AppError> {
    let given = authorization
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
        .ok_or(AppError::Unauthorized)?;
    let (given, expected) = (Sha256::digest(given), Sha256::digest(expected));
    if bool::from(given[..].ct_eq(&expected[..])) { Ok(()) } else { Err(AppError::Forbidden) }
}

/// Wrong admin tokens per client, in fixed windows of [`WINDOW`] from each
/// client's first failure; an IPv6 client is counted by its /64 network,
/// the least RFC 6177 has a site given, so that walking the addresses of one
/// network counts as one client.
///
/// At most `capacity` clients have an entry of their own. A window that
/// ended is dropped when room is needed (it decides nothing any more); one
/// that has not ended is never dropped, so no number of new addresses
/// unblocks a client. While the table is full, clients without an entry are
/// counted together in one more window, the overflow: guessing stays bounded
/// by `capacity + 1` windows a minute, and memory by `capacity`.
pub struct AdminFailures {
    table: Mutex<Table>,
}

struct Table {
    windows: HashMap<IpAddr, Window>,
    capacity: usize,
    /// The failures of clients counted while the table was full.
    overflow: Window,
    /// A full table is not swept again before this.
    next_sweep: Instant,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

impl Default for AdminFailures {
    fn default() -> Self {
        Self::with_capacity(MAX_TRACKED)
    }
}

impl AdminFailures {
    /// A table of at most `capacity` clients (at least 1).
    pub fn with_capacity(capacity: usize) -> Self {
        let now = Instant::now();
        let table = Table {
            windows: HashMap::new(),
            capacity: capacity.max(1),
            overflow: Window { started: now, failures: 0 },
            next_sweep: now,
        };
        AdminFailures { table: Mutex::new(table) }
    }

    /// How long `ip` must still wait when its window (its own, or the
    /// overflow while the table is full and it has none) used up its
    /// failures, else `None`.
    pub fn blocked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let mut table = self.table.lock().expect("no panic while held");
        let client = client_key(ip);
        if let Some(window) = table.windows.get(&client) {
            return window.blocked(now);
        }
        if table.has_room(now) { None } else { table.overflow.blocked(now) }
    }

    /// Counts one wrong token from `ip`; answers the failures of the window
    /// it was counted in.
    pub fn record(&self, ip: IpAddr, now: Instant) -> u32 {
        let mut table = self.table.lock().expect("no panic while held");
        let client = client_key(ip);
        let table = &mut *table;
        let window = if table.windows.contains_key(&client) || table.has_room(now) {
            table.windows.entry(client).or_insert(Window { started: now, failures: 0 })
        } else {
            &mut table.overflow
        };
        window.count(now)
    }
}

impl Table {
    /// Whether a new client may have an entry: below capacity, or once the
    /// windows that ended are dropped (at most once per [`SWEEP_EVERY`]).
    fn has_room(&mut self, now: Instant) -> bool {
        if self.windows.len() >= self.capacity && now >= self.next_sweep {
            self.windows.retain(|_, window| !window.ended(now));
            self.next_sweep = now + SWEEP_EVERY;
        }
        self.windows.len() < self.capacity
    }
}

impl Window {
    fn ended(&self, now: Instant) -> bool {
        now >= self.started + WINDOW
    }

    fn blocked(&self, now: Instant) -> Option<Duration> {
        let left = (self.started + WINDOW).saturating_duration_since(now);
        (self.failures >= MAX_FAILURES_PER_WINDOW && !left.is_zero()).then_some(left)
    }

    /// One more failure, in a new window when this one ended.
    fn count(&mut self, now: Instant) -> u32 {
        if self.ended(now) {
            *self = Window { started: now, failures: 0 };
        }
        self.failures = self.failures.saturating_add(1);
        self.failures
    }
}

/// What a client's failures are counted under: an IPv4 address itself, an
/// IPv6 address's /64 network (its first 64 bits).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(header: Option<&'static str>) -> Result<(), AppError> {
        check_bearer(header.map(HeaderValue::from_static).as_ref(), "s3cret")
    }

    #[test]
    fn the_right_bearer_token_passes_whatever_the_scheme_case() {
        assert!(check(Some("Bearer s3cret")).is_ok());
        assert!(check(Some("bEARER s3cret")).is_ok());
    }

    #[test]
    fn no_bearer_token_is_unauthorized() {
        for header in [None, Some("s3cret"), Some("Basic s3cret"), Some("Bearer")] {
            assert!(matches!(check(header), Err(AppError::Unauthorized)), "{header:?}");
        }
    }

    #[test]
    fn a_wrong_bearer_token_is_forbidden() {
        for header in ["Bearer s3cre", "Bearer s3cret ", "Bearer S3CRET", "Bearer "] {
            assert!(matches!(check(Some(header)), Err(AppError::Forbidden)), "{header}");
        }
    }

    #[test]
    fn an_address_is_blocked_after_its_failures_until_its_window_ends() {
        let failures = AdminFailures::default();
        let (ip, other): (IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let start = Instant::now();
        for n in 1..MAX_FAILURES_PER_WINDOW {
            assert_eq!(failures.record(ip, start), n);
            assert_eq!(failures.blocked(ip, start), None, "after {n} failures");
        }
        failures.record(ip, start);
        let later = start + Duration::from_secs(20);
        assert_eq!(failures.blocked(ip, later), Some(WINDOW - Duration::from_secs(20)));
        assert_eq!(failures.blocked(other, later), None, "another address is not blocked");
        assert_eq!(failures.blocked(ip, start + WINDOW), None, "the window ended");
        assert_eq!(failures.record(ip, start + WINDOW), 1, "a new window starts");
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// `n` wrong tokens from `client` at `now`.
    fn fail(failures: &AdminFailures, client: IpAddr, n: u32, now: Instant) {
        for _ in 0..n {
            failures.record(client, now);
        }
    }

    #[test]
    fn a_full_table_never_unblocks_a_client_and_shares_one_window_among_the_rest() {
        let failures = AdminFailures::with_capacity(3);
        let start = Instant::now();
        let blocked = ip("10.0.0.1");
        fail(&failures, blocked, MAX_FAILURES_PER_WINDOW, start);
        fail(&failures, ip("10.0.0.2"), 1, start);
        fail(&failures, ip("10.0.0.3"), 1, start);
        // Many more addresses than the table holds, each guessing once.
        let later = start + Duration::from_secs(1);
        for n in 0..1000u32 {
            let other = IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + n));
            assert!(failures.blocked(blocked, later).is_some(), "after {n} other addresses");
            failures.record(other, later);
        }
        assert!(failures.blocked(blocked, later).is_some(), "still blocked");
        // The addresses without an entry used up their shared window: a new
        // one is refused too; the tracked ones keep their own count.
        assert!(failures.blocked(ip("12.0.0.1"), later).is_some(), "the overflow is used up");
        assert_eq!(failures.blocked(ip("10.0.0.2"), later), None);
        assert_eq!(failures.record(ip("10.0.0.2"), later), 2);
        // Once the first windows ended, they make room again.
        let after = start + WINDOW;
        assert_eq!(failures.blocked(blocked, after), None, "its window ended");
        assert_eq!(failures.blocked(ip("12.0.0.1"), after + WINDOW), None);
        assert_eq!(failures.record(ip("12.0.0.1"), after + WINDOW), 1, "an entry of its own");
    }

    #[test]
    fn the_addresses_of_one_ipv6_network_count_as_one_client() {
        let failures = AdminFailures::default();
        let now = Instant::now();
        for n in 0..MAX_FAILURES_PER_WINDOW {
            failures.record(ip(&format!("2001:db8:1:2::{:x}", n + 1)), now);
        }
        assert!(failures.blocked(ip("2001:db8:1:2:ffff::9"), now).is_some(), "same /64");
        assert_eq!(failures.blocked(ip("2001:db8:1:3::1"), now), None, "another /64");
        // An IPv4-mapped IPv6 address is its IPv4 address.
        fail(&failures, ip("192.0.2.7"), MAX_FAILURES_PER_WINDOW, now);
        assert!(failures.blocked(ip("::ffff:192.0.2.7"), now).is_some());
    }

    fn forwarded(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(X_FORWARDED_FOR, HeaderValue::from_str(line).unwrap());
        }
        headers
    }

    #[test]
    fn the_client_is_the_peer_unless_a_trusted_balancer_names_it() {
        let trusted: Vec<IpNet> = vec!["10.0.0.10/32".parse().unwrap()];
        let claims = forwarded(&["198.51.100.9"]);
        // From anyone else, the header is the client's own text: ignored.
        assert_eq!(client_address(ip("203.0.113.5"), &claims, &trusted), ip("203.0.113.5"));
        assert_eq!(client_address(ip("10.0.0.10"), &claims, &[]), ip("10.0.0.10"));
        // From the balancer: the address it wrote, the rightmost.
        assert_eq!(client_address(ip("10.0.0.10"), &claims, &trusted), ip("198.51.100.9"));
        let appended = forwarded(&["1.2.3.4, 5.6.7.8", "198.51.100.9"]);
        assert_eq!(client_address(ip("10.0.0.10"), &appended, &trusted), ip("198.51.100.9"));
        // No header: the balancer itself.
        assert_eq!(client_address(ip("10.0.0.10"), &HeaderMap::new(), &trusted), ip("10.0.0.10"));
        // IPv4-mapped peers are matched as IPv4.
        let mapped = ip("::ffff:10.0.0.10");
        assert_eq!(client_address(mapped, &claims, &trusted), ip("198.51.100.9"));
    }

    #[test]
    fn behind_several_trusted_hops_the_client_is_the_first_untrusted_address_from_the_right() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/24".parse().unwrap()];
        let peer = ip("10.0.0.1");
        let chain = forwarded(&["6.6.6.6, 198.51.100.9, 10.0.0.2"]);
        assert_eq!(client_address(peer, &chain, &trusted), ip("198.51.100.9"));
        // Every hop trusted: the leftmost address read.
        assert_eq!(
            client_address(peer, &forwarded(&["10.0.0.3, 10.0.0.2"]), &trusted),
            ip("10.0.0.3")
        );
        // What is no address ends the walk at the last address read.
        let garbage = forwarded(&["198.51.100.9, unknown, 10.0.0.2"]);
        assert_eq!(client_address(peer, &garbage, &trusted), ip("10.0.0.2"));
        assert_eq!(client_address(peer, &forwarded(&["nonsense"]), &trusted), peer);
    }
}
