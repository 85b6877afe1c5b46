//! Helpers of the lock-strategy tests: unique Redis prefixes, sales with lock
//! knobs, lock stats, a `seckill` child process that dies with the test, and
//! a proxy that cuts a replication link. Extra `redis-server` nodes come from
//! `test_support`.

#![allow(dead_code)] // helpers for the timeline tests too

use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use seckill::sale::{Knobs, Sale, SaleId};
use seckill::strategy::StrategyName;
use seckill::strategy::lock::intervals::LockStats;
use serde_json::{Value, json};
use test_support::{ChildService, RedisServer};

use crate::support::{ADMIN_TOKEN, TestApp, seckill_child};

/// The shared Redis (`TEST_REDIS_URL`, else the service's default).
pub static REDIS_URL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(test_support::redis_url);

pub use crate::support::unique_prefix;

/// A service on the shared Redis under `prefix`, waiting at most `wait_ms`
/// for a lock.
pub async fn spawn(prefix: &str, wait_ms: u64) -> TestApp {
    spawn_on(&REDIS_URL, prefix, wait_ms).await
}

/// [`spawn`] on the Redis at `url` (one node or a `redis+cluster://` URL).
pub async fn spawn_on(url: &str, prefix: &str, wait_ms: u64) -> TestApp {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    TestApp::spawn_with(move |config| {
        config.backends.redis_url = url;
        config.backends.redis_prefix = prefix;
        config.strategies.lock.wait_ms = wait_ms;
    })
    .await
}

/// A service as [`spawn`] does, whose `lock/redlock` takes its quorum over
/// `nodes`.
pub async fn spawn_on_nodes(prefix: &str, wait_ms: u64, nodes: &[RedisServer]) -> TestApp {
    spawn_on_nodes_with(&REDIS_URL, prefix, wait_ms, nodes).await
}

/// [`spawn_on_nodes`] with `REDIS_URL` = `url` (one node or a cluster).
pub async fn spawn_on_nodes_with(
    url: &str,
    prefix: &str,
    wait_ms: u64,
    nodes: &[RedisServer],
) -> TestApp {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    let urls = nodes.iter().map(RedisServer::url).collect();
    TestApp::spawn_with(move |config| {
        config.backends.redis_url = url;
        config.backends.redis_prefix = prefix;
        config.strategies.lock.wait_ms = wait_ms;
        config.strategies.lock.redlock_urls = urls;
    })
    .await
}

/// Creates a sale of `stock` units under `strategy` with the given knobs
/// (lease, work, pause in milliseconds; pause ratio); returns its id.
pub async fn sale_with(app: &TestApp, strategy: &str, stock: i64, knobs: Value) -> i64 {
    let mut body =
        json!({ "name": format!("{strategy} test"), "stock": stock, "strategy": strategy });
    for (key, value) in knobs.as_object().expect("knobs are an object") {
        body[key] = value.clone();
    }
    app.create_sale(body).await["id"].as_i64().unwrap()
}

/// `GET /admin/sales/{id}/lock-stats` on `app`.
pub async fn lock_stats(app: &TestApp, sale: i64) -> LockStats {
    app.admin(reqwest::Method::GET, &format!("/admin/sales/{sale}/lock-stats")).await
}

/// The lock stats after every app has flushed its intervals.
pub async fn lock_stats_of_all(apps: &[&TestApp], sale: i64) -> LockStats {
    let mut stats = None;
    for app in apps {
        stats = Some(lock_stats(app, sale).await);
    }
    stats.expect("at least one app")
}

/// A sale record for driving a lock directly (no row in Postgres needed).
pub fn fake_sale(id: i64, strategy: StrategyName, knobs: Knobs) -> Sale {
    Sale {
        id: SaleId(id),
        name: "direct".to_owned(),
        per_user_limit: 1,
        strategy,
        starts_at: None,
        ends_at: None,
        knobs,
        buckets: None,
        payment_window_ms: None,
        waiting_room: Default::default(),
        created_at: Utc::now(),
    }
}

/// Knobs with a lease and nothing else.
pub fn lease_ms(ms: i32) -> Knobs {
    Knobs { lock_lease_ms: ms, ..Knobs::default() }
}

/// A multiplexed connection to `url`.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
}

/// Polls `check` every 10 ms until it is true; panics after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(crate::support::eventually(timeout, check).await, "timed out waiting until {what}");
}

/// A `seckill serve` child process on the test database and the shared
/// Redis under a prefix; killed on drop.
pub struct ChildApp {
    process: ChildService,
    pub base: String,
    pub client: reqwest::Client,
}

impl ChildApp {
    /// Starts the binary with the test configuration, the shared Redis under
    /// `prefix`, plus `env`, and waits until it answers `/healthz`.
    pub async fn start(prefix: &str, env: &[(&str, String)]) -> ChildApp {
        let process = seckill_child(&[
            ("REDIS_URL", REDIS_URL.to_owned()),
            ("SECKILL_REDIS_PREFIX", prefix.to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ])
        .envs(env)
        .inherit_stderr()
        .ready_within(Duration::from_secs(15))
        .start()
        .await;
        ChildApp { base: process.base.clone(), process, client: reqwest::Client::new() }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// `POST /sales/{id}/orders` with `{user_id}`; the status.
    pub async fn buy(&self, sale: i64, user: i64) -> StatusCode {
        self.client
            .post(format!("{}/sales/{sale}/orders", self.base))
            .json(&json!({ "user_id": user }))
            .send()
            .await
            .map(|r| r.status())
            .unwrap_or(StatusCode::BAD_GATEWAY)
    }

    /// `GET /admin/sales/{id}/lock-stats` of this process (flushes its
    /// critical-section intervals).
    pub async fn lock_stats(&self, sale: i64) -> LockStats {
        let url = format!("{}/admin/sales/{sale}/lock-stats", self.base);
        let response = self.client.get(url).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    /// `GET /metrics` of this process.
    pub async fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// SIGKILL: the process dies at once, holding whatever it held.
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// The value of counter `name` with label `strategy` in a Prometheus text
/// page; 0 when absent.
pub fn counter(metrics: &str, name: &str, strategy: &str) -> u64 {
    let series = format!("{name}{{strategy=\"{strategy}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .map(|value| value.trim().parse::<f64>().unwrap() as u64)
        .unwrap_or(0)
}

/// A TCP proxy in front of a Redis master, for a replica's replication link:
/// once [`block`](Self::block)ed, it stops forwarding the master's bytes (a
/// partition on the replication path); the replica keeps what it had.
pub struct BlockingProxy {
    pub port: u16,
    blocked: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl BlockingProxy {
    pub async fn start(upstream_port: u16) -> BlockingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (blocked, _) = tokio::sync::watch::channel(false);
        let watch = blocked.clone();
        let task = tokio::spawn(async move {
            while let Ok((downstream, _)) = listener.accept().await {
                let Ok(upstream) =
                    tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                else {
                    continue;
                };
                let (mut down_read, mut down_write) = downstream.into_split();
                let (mut up_read, mut up_write) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut down_read, &mut up_write).await;
                });
                let mut blocked = watch.subscribe();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let Ok(n) = up_read.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        // Bytes read once blocked are held forever.
                        if blocked.wait_for(|blocked| !*blocked).await.is_err() {
                            return;
                        }
                        if down_write.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        BlockingProxy { port, blocked, task }
    }

    /// From now on, nothing more reaches the replica.
    pub fn block(&self) {
        self.blocked.send_replace(true);
    }
}

impl Drop for BlockingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `n` buyers from `first` on, all at once, each buying from `app` until it
/// gets an answer other than `503` (at most [`ATTEMPTS`] tries, 200 ms
/// apart), as a buyer told `busy` retries: the books then say whether every
/// unit sold, and a lock that stalls or is answered late under a loaded
/// machine (other tests' servers failing over beside it) is not mistaken for
/// one that strands stock. Returns each buyer's last answer.
pub async fn buy_until_decided(app: &TestApp, sale: i64, first: i64, n: i64) -> Vec<StatusCode> {
    let buying = (first..first + n).map(|user| async move {
        let mut status = app.buy(sale, user).await.status();
        for _ in 1..ATTEMPTS {
            if status != StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            status = app.buy(sale, user).await.status();
        }
        status
    });
    futures_util::future::join_all(buying).await
}

/// Tries per buyer in [`buy_until_decided`].
const ATTEMPTS: usize = 5;
