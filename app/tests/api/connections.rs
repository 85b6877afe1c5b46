//! The connection limits, against raw TCP sockets and a `seckill` child
//! process: partial request heads are cut off after the header timeout while
//! `/healthz` stays fast, a kept-alive connection is closed after the idle
//! timeout (not the header timeout), the connection cap refuses the excess at
//! once with `503 busy`, a request that runs too long is answered `504`, and
//! `SIGTERM` still shuts the service down gracefully.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::{TestApp, assert_problem, seckill_child};

/// A request line and one header, and nothing more: the head never ends.
const PARTIAL_HEAD: &[u8] = b"POST /sales/1/orders HTTP/1.1\r\nHost: x\r\n";

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

/// Raises this process's soft limit on open files to at least `needed` (the
/// service child inherits it), within the hard limit; panics if the hard
/// limit is lower, naming `ulimit -n`.
fn ensure_open_files(needed: u64) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0, "getrlimit");
        if limit.rlim_cur >= needed {
            return;
        }
        assert!(limit.rlim_max >= needed, "this test needs `ulimit -n` of {needed} or more");
        limit.rlim_cur = needed;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0, "setrlimit");
    }
}

/// Reads from `stream` until the server closes it (or resets it); the bytes
/// read.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 1024];
    while let Ok(n @ 1..) = stream.read(&mut chunk).await {
        bytes.extend_from_slice(&chunk[..n]);
    }
    bytes
}

/// `GET /healthz` on `stream` (kept alive); panics unless `200`.
async fn healthz_on(stream: &mut TcpStream) {
    stream.write_all(HEALTHZ).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    // The answer is small; it is complete once its JSON body has closed.
    while !answer.ends_with(b"}") {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before answering: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer));
}

/// How long a fresh connection's `GET /healthz` takes to be answered.
async fn healthz_latency(addr: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    healthz_on(&mut stream).await;
    started.elapsed()
}

fn addr_of(service: &test_support::ChildService) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], service.port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_partial_heads_are_closed_after_the_header_timeout_while_healthz_stays_fast() {
    const CONNECTIONS: usize = 1000;
    let header_timeout = Duration::from_millis(1000);
    ensure_open_files(CONNECTIONS as u64 + 512);
    let service = seckill_child(&[
        ("SECKILL_HEADER_TIMEOUT_MS", header_timeout.as_millis().to_string()),
        ("SECKILL_MAX_CONNECTIONS", (CONNECTIONS + 100).to_string()),
    ])
    .start()
    .await;
    let addr = addr_of(&service);

    let mut partial = JoinSet::new();
    for _ in 0..CONNECTIONS {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(PARTIAL_HEAD).await.unwrap();
        let sent = Instant::now();
        partial.spawn(async move {
            let answer = read_to_close(&mut stream).await;
            (sent.elapsed(), answer)
        });
    }
    // Meanwhile, /healthz on fresh connections, until every partial one closed.
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    let deadline = Instant::now() + header_timeout * 3;
    let mut closed = Vec::with_capacity(CONNECTIONS);
    while closed.len() < CONNECTIONS {
        assert!(Instant::now() < deadline, "{} connections still open", CONNECTIONS - closed.len());
        slowest = slowest.max(healthz_latency(addr).await);
        probes += 1;
        while let Some(done) = partial.try_join_next() {
            closed.push(done.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let latest = closed.iter().map(|(after, _)| *after).max().unwrap();
    let earliest = closed.iter().map(|(after, _)| *after).min().unwrap();
    println!(
        "{CONNECTIONS} partial heads, header timeout {header_timeout:?}: closed after \
         {earliest:?} to {latest:?}; /healthz {probes} times meanwhile, slowest {slowest:?}"
    );
    assert!(latest <= header_timeout * 2, "the last partial head was closed after {latest:?}");
    assert!(earliest >= header_timeout * 9 / 10, "a partial head was closed early: {earliest:?}");
    assert!(closed.iter().all(|(_, answer)| answer.is_empty()), "closed without an answer");
    assert!(probes >= 10, "only {probes} probes of /healthz");
    assert!(slowest < Duration::from_millis(100), "/healthz took {slowest:?} at worst");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_outlives_the_header_timeout_and_closes_after_the_idle_one() {
    let (header_timeout, idle_timeout) = (Duration::from_millis(300), Duration::from_millis(1500));
    let service = seckill_child(&[
        ("SECKILL_HEADER_TIMEOUT_MS", header_timeout.as_millis().to_string()),
        ("SECKILL_IDLE_TIMEOUT_MS", idle_timeout.as_millis().to_string()),
    ])
    .start()
    .await;
    let mut stream = TcpStream::connect(addr_of(&service)).await.unwrap();
    healthz_on(&mut stream).await;
    // Idle for three header timeouts: still open, and serving.
    tokio::time::sleep(header_timeout * 3).await;
    healthz_on(&mut stream).await;
    let answered = Instant::now();
    let rest = tokio::time::timeout(idle_timeout * 3, read_to_close(&mut stream)).await;
    assert_eq!(rest.expect("closed once idle").len(), 0);
    let idle = answered.elapsed();
    assert!(idle >= idle_timeout * 9 / 10 && idle <= idle_timeout * 2, "closed after {idle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_refused_at_once_with_503_busy() {
    const CAP: usize = 10;
    let service = seckill_child(&[("SECKILL_MAX_CONNECTIONS", CAP.to_string())]).start().await;
    let addr = addr_of(&service);
    // CAP connections that each got an answer, so each holds a permit (the
    // readiness probe's connection may still hold one for a moment).
    let mut held = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while held.len() < CAP {
        assert!(Instant::now() < deadline, "only {} connections were served", held.len());
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut first = [0u8; 12];
        stream.write_all(HEALTHZ).await.unwrap();
        if stream.read_exact(&mut first).await.is_ok() && first.starts_with(b"HTTP/1.1 200") {
            let mut rest = [0u8; 4096];
            let _ = stream.read(&mut rest).await; // the rest of the small answer
            held.push(stream);
        }
    }

    for _ in 0..3 {
        let started = Instant::now();
        let mut excess = TcpStream::connect(addr).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(2), read_to_close(&mut excess))
            .await
            .expect("refused at once, not held");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        assert!(text.contains("retry-after: 1") && text.contains("/problems/busy"), "{text}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refused after {:?}",
            started.elapsed()
        );
    }

    // A held connection closes: its permit serves a new one.
    drop(held.pop());
    let served = crate::support::eventually(Duration::from_secs(5), || async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(HEALTHZ).await.unwrap();
        let mut first = [0u8; 12];
        stream.read_exact(&mut first).await.is_ok() && first.starts_with(b"HTTP/1.1 200")
    })
    .await;
    assert!(served, "a freed permit serves a new connection");
    for stream in &mut held {
        healthz_on(stream).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_runs_past_the_request_timeout_is_504_timeout() {
    let app = TestApp::spawn_with(|config| config.http.request_timeout_ms = 300).await;
    // 1..3 s of simulated work inside the purchase's transaction.
    let sale = app
        .create_sale(json!({ "name": "slow", "stock": 1, "strategy": "sql", "work_ms": 2000 }))
        .await["id"]
        .as_i64()
        .unwrap();
    let started = Instant::now();
    let response = app.buy(sale, 1).await;
    let answered = started.elapsed();
    assert_problem(response, StatusCode::GATEWAY_TIMEOUT, "timeout").await;
    assert!(answered < Duration::from_millis(900), "answered after {answered:?}");
    // The dropped transaction rolled back: nothing was sold.
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (0, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_the_request_in_progress_closes_idle_connections_and_exits() {
    let mut service = seckill_child(&[]).start().await;
    let client = reqwest::Client::new();
    let body = json!({ "name": "slow", "stock": 1, "strategy": "sql", "work_ms": 1000 });
    let sale =
        crate::support::create_sale_at(&service.base, crate::support::ADMIN_TOKEN, body).await;
    let mut idle = TcpStream::connect(addr_of(&service)).await.unwrap();
    healthz_on(&mut idle).await;
    // 0.5..1.5 s of work inside the purchase's transaction.
    let url = format!("{}/sales/{sale}/orders", service.base);
    let purchase = tokio::spawn(async move {
        client.post(url).json(&json!({ "user_id": 1 })).send().await.unwrap().status()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    test_support::signal(service.pid(), "TERM");
    let closed = tokio::time::timeout(Duration::from_secs(5), read_to_close(&mut idle)).await;
    assert!(closed.is_ok(), "the idle connection was closed");
    assert_eq!(purchase.await.unwrap(), StatusCode::CREATED, "the purchase in progress ends");
    assert_eq!(service.exit_code().await, Some(0), "the process exits by itself");
}
