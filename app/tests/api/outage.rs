//! Postgres going away mid-flight: the service answers `503 unavailable`
//! (never a panic, never a 500), keeps answering `/healthz`, reports itself
//! not ready, and serves again once Postgres is back. And the other reason a
//! request finds no pool connection: a pool exhausted by slow work while
//! Postgres answers, which is `503 busy`, not an outage.
//!
//! The shared Postgres must not be stopped, so the service reaches it through
//! a TCP proxy owned by the test: cutting the proxy closes every connection
//! and refuses new ones, which is what the service sees when Postgres dies.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::RETRY_AFTER;
use reqwest::{StatusCode, Url};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::support::{TestApp, problem_type, provoking, test_database_url};

/// A TCP forwarder on a fixed local port that can be cut and restored.
struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    running: Mutex<CancellationToken>,
}

impl Proxy {
    /// Forwards a new local port to `upstream`.
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let token = CancellationToken::new();
        tokio::spawn(forward(listener, upstream, token.clone()));
        Proxy { addr, upstream, running: Mutex::new(token) }
    }

    /// Closes every forwarded connection and stops listening, so new
    /// connections are refused.
    fn cut(&self) {
        self.running.lock().unwrap().cancel();
    }

    /// Listens again on the same port.
    async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        let token = CancellationToken::new();
        tokio::spawn(forward(listener, self.upstream, token.clone()));
        *self.running.lock().unwrap() = token;
    }
}

/// Accepts on `listener` and pipes each connection to `upstream` until `cut`.
async fn forward(listener: TcpListener, upstream: SocketAddr, cut: CancellationToken) {
    loop {
        let mut client = tokio::select! {
            () = cut.cancelled() => return, // drops the listener
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        let cut = cut.clone();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(upstream).await else { return };
            tokio::select! {
                () = cut.cancelled() => {} // drops both sockets
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            }
        });
    }
}

/// Asserts a `503` problem `unavailable` naming Postgres, with `Retry-After`.
async fn assert_postgres_unavailable(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert!(response.headers().contains_key(RETRY_AFTER), "{what}");
    assert_eq!(response.headers()["content-type"], "application/problem+json", "{what}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "/problems/unavailable", "{what}: {body}");
    assert_eq!(body["backend"], "postgres", "{what}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_unreachable_is_503_unavailable_and_the_service_recovers() {
    provoking("a Postgres outage (pool timeouts, 503 unavailable)");
    let mut url = Url::parse(&test_database_url()).unwrap();
    let host = url.host_str().unwrap().to_owned();
    let port = url.port().unwrap_or(5432);
    let upstream = tokio::net::lookup_host((host.as_str(), port)).await.unwrap().next().unwrap();
    let proxy = Proxy::start(upstream).await;
    url.set_host(Some("127.0.0.1")).unwrap();
    url.set_port(Some(proxy.addr.port())).unwrap();
    let app = TestApp::spawn_with(|config| {
        config.backends.database_url = url.to_string();
        config.backends.db_acquire_timeout_ms = 500;
        config.backends.db_pool_size = 4;
    })
    .await;

    // One sale the service has cached, one it has never seen (its settings
    // must then come from Postgres too).
    let cached = app.sale("sql", 10).await;
    let unseen: i64 = sqlx::query_scalar(
        "INSERT INTO sales (name, total_stock, remaining_stock, strategy)
         VALUES ('unseen', 10, 10, 'sql/for-update') RETURNING id",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(app.buy(cached, 1).await.status(), StatusCode::CREATED);

    proxy.cut();

    assert_postgres_unavailable(app.buy(cached, 2).await, "purchase of a cached sale").await;
    assert_postgres_unavailable(app.buy(unseen, 2).await, "purchase of an unseen sale").await;
    assert_postgres_unavailable(app.get_sale(cached).await, "GET /sales/{id}").await;
    let readyz = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_postgres_unavailable(readyz, "/readyz").await;
    let create = app.try_create_sale(json!({ "name": "x", "stock": 1, "strategy": "sql" })).await;
    assert_postgres_unavailable(create, "POST /admin/sales").await;
    let healthz = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(healthz.status(), StatusCode::OK, "the process itself is alive");

    proxy.restore().await;

    let readyz = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), StatusCode::OK);
    assert_eq!(app.buy(cached, 2).await.status(), StatusCode::CREATED);
    let again = app.buy(unseen, 2).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    // The refused purchases took nothing.
    let audit = app.audit(cached).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (2, 8, 0));
    let audit = app.audit(unseen).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (1, 9, 0));
    assert_eq!(problem_type(app.buy(cached, 1).await).await, "/problems/already-purchased");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_exhausted_by_slow_work_is_503_busy_while_postgres_answers() {
    provoking("a Postgres pool exhausted by slow purchases (pool timeouts, 503 busy)");
    let app = TestApp::spawn_with(|config| {
        config.backends.db_acquire_timeout_ms = 300;
        config.backends.db_pool_size = 2;
        config.http.request_timeout_ms = 30_000; // longer than the slow purchases
    })
    .await;
    // Each purchase holds its connection 3..9 s (work_ms 6000 ± 50 %): room
    // for the reads below on a loaded machine.
    let sale = app
        .create_sale(json!({ "name": "slow", "stock": 10, "strategy": "sql", "work_ms": 6000 }))
        .await["id"]
        .as_i64()
        .unwrap();
    // Both connections opened first, so that the slow purchases take them
    // at once rather than racing the reads below for a connection still
    // being established.
    tokio::join!(app.sale_status(sale), app.sale_status(sale));
    let slow: Vec<_> = (1..=2)
        .map(|user| {
            let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
            tokio::spawn(async move {
                client.post(url).json(&json!({ "user_id": user })).send().await.unwrap().status()
            })
        })
        .collect();

    // Once both connections are taken, a read waits 300 ms and is told busy.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let read = loop {
        let response = app.get_sale(sale).await;
        if response.status() != StatusCode::OK {
            break response;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slow purchases never held the pool");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_postgres_busy(read, "GET /sales/{id}").await;
    assert_postgres_busy(app.buy(sale, 3).await, "a purchase").await;

    for purchase in slow {
        assert_eq!(purchase.await.unwrap(), StatusCode::CREATED, "the slow purchases complete");
    }
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (2, 8, 0));
}

/// Asserts a `503` problem `busy` with `Retry-After` and no `backend`.
async fn assert_postgres_busy(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert!(response.headers().contains_key(RETRY_AFTER), "{what}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "/problems/busy", "{what}: {body}");
    assert!(body.get("backend").is_none(), "{what}: {body}");
}
