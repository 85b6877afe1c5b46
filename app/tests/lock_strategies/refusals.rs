//! Who refuses a stale holder's write, through each strategy's own purchase
//! path: a holder of the sale's lock stops right before its write (the
//! `lock/before-write` failpoint), the test takes its lock away (the keys
//! deleted, as a lease that ran out while the holder stalled), and then
//! - the fence alone must refuse it, when the holder has not heard of the
//!   loss and a newer holder has sold meanwhile (`lock/fenced`, `lock/fair`,
//!   `lock/redlock`): this fails if the strategy is built unfenced, or if the
//!   claim is taken but not checked at write time;
//! - the loss signal alone must refuse it, when its watchdog has told it and
//!   nobody else claimed the sale (`lock/watchdog`, `lock/fenced`,
//!   `lock/fair`, `lock/redlock`): this fails if the check before the write
//!   is removed.
//!
//! The failpoint, not a timer, decides the order of every step.

use reqwest::StatusCode;
use seckill::failpoints::{self, Armed, LOCK_BEFORE_WRITE};
use seckill::strategy::lock::BeforeWrite;
use serde_json::json;
use test_support::RedisServer;

use super::harness::{redis_conn, sale_with, unique_prefix};
use crate::support::TestApp;

use super::harness::REDIS_URL as SHARED_REDIS;

/// A service on the shared Redis under `prefix` whose `lock/redlock` takes
/// its quorum over `nodes` (none: the default nodes, unused), with a hold
/// bound far above any stall here.
async fn service(prefix: &str, nodes: &[RedisServer]) -> TestApp {
    let (prefix, urls): (_, Vec<_>) =
        (prefix.to_owned(), nodes.iter().map(RedisServer::url).collect());
    TestApp::spawn_with(move |config| {
        config.backends.redis_url = SHARED_REDIS.to_owned();
        config.backends.redis_prefix = prefix;
        if !urls.is_empty() {
            config.strategies.lock.redlock_urls = urls;
        }
        config.strategies.lock.wait_ms = 5_000;
        config.strategies.lock.hold_ms = 120_000;
    })
    .await
}

/// The Redis servers holding `strategy`'s lock: the Redlock nodes, or the
/// shared Redis.
fn lock_servers(strategy: &str, nodes: &[RedisServer]) -> Vec<String> {
    if strategy == "lock/redlock" {
        nodes.iter().map(RedisServer::url).collect()
    } else {
        vec![SHARED_REDIS.to_owned()]
    }
}

/// Deletes the sale's lock key on every server: the holder's lease is gone.
async fn take_the_lock_away(servers: &[String], prefix: &str, sale: i64) {
    let key = format!("{prefix}:{{sale:{sale}}}:lock");
    for url in servers {
        let deleted: i64 =
            redis::cmd("DEL").arg(&key).query_async(&mut redis_conn(url).await).await.unwrap();
        assert_eq!(deleted, 1, "the holder's key on {url}");
    }
}

/// `POST /sales/{sale}/orders` for `user` in a task of its own: its status
/// and, for a refusal, the problem's `type` and `detail`.
fn buy_in_background(
    app: &TestApp,
    sale: i64,
    user: i64,
) -> tokio::task::JoinHandle<(StatusCode, Option<(String, String)>)> {
    let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
    tokio::spawn(async move {
        let response = client.post(url).json(&json!({ "user_id": user })).send().await.unwrap();
        let status = response.status();
        if status.is_success() {
            return (status, None);
        }
        let problem: serde_json::Value = response.json().await.unwrap();
        let field = |name: &str| problem[name].as_str().unwrap_or_default().to_owned();
        (status, Some((field("type"), field("detail"))))
    })
}

/// The buyers with an order for `sale`.
async fn buyers(app: &TestApp, sale: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1 ORDER BY user_id")
        .bind(sale)
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// A one-unit sale whose first buyer holds the lock, has read the last unit
/// and is stopped right before its write, its lock taken away.
struct StalledHolder {
    app: TestApp,
    sale: i64,
    stalled: Armed<BeforeWrite>,
    /// The first buyer's answer, once resumed.
    answer: tokio::task::JoinHandle<(StatusCode, Option<(String, String)>)>,
    _nodes: Vec<RedisServer>,
}

/// A [`StalledHolder`] of `strategy` with a lease of `lease_ms`; its lock is
/// taken away by deleting its keys on every server.
async fn stalled_holder_without_its_lock(strategy: &str, lease_ms: i32) -> StalledHolder {
    let nodes = if strategy == "lock/redlock" {
        vec![RedisServer::start().await, RedisServer::start().await, RedisServer::start().await]
    } else {
        Vec::new()
    };
    let prefix = unique_prefix();
    let app = service(&prefix, &nodes).await;
    let sale = sale_with(&app, strategy, 1, json!({ "lock_lease_ms": lease_ms })).await;
    let mut stalled = failpoints::arm::<BeforeWrite>(&LOCK_BEFORE_WRITE, sale);
    let answer = buy_in_background(&app, sale, 1);
    stalled.reached().await;
    take_the_lock_away(&lock_servers(strategy, &nodes), &prefix, sale).await;
    StalledHolder { app, sale, stalled, answer, _nodes: nodes }
}

/// Asserts that the stalled holder was answered `503 busy` with `detail`,
/// the reason its write was refused (the fence, or the loss signal).
async fn refused(
    answer: tokio::task::JoinHandle<(StatusCode, Option<(String, String)>)>,
    detail: &str,
    why: &str,
) {
    let (status, problem) = answer.await.unwrap();
    let (kind, told) = problem.unwrap_or_default();
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "/problems/busy"),
        "{why}"
    );
    assert_eq!(told, detail, "{why}");
}

async fn fence_alone_refuses(strategy: &str) {
    let StalledHolder { app, sale, stalled, answer, _nodes } =
        stalled_holder_without_its_lock(strategy, 10_000).await;
    let b = app.buy(sale, 2).await;
    assert_eq!(b.status(), StatusCode::CREATED, "{strategy}: B takes the free lock and sells");
    // A has not heard of its loss: only the fence can refuse its write.
    stalled.resume(BeforeWrite::AsIfStillHeld);

    let why = format!("{strategy}: the stale holder's write is refused by the fence");
    refused(answer, "a newer lock holder fenced this one off", &why).await;
    assert_eq!(buyers(&app, sale).await, [2], "{strategy}");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.oversold, audit.ledger_drift), (1, 0, 0), "{strategy}");
}

async fn loss_signal_alone_refuses(strategy: &str) {
    // A short lease: the watchdog renews every 200 ms and finds the key gone.
    let StalledHolder { app, sale, stalled, answer, _nodes } =
        stalled_holder_without_its_lock(strategy, 600).await;
    // Nobody else claims the sale: A's fencing claim (if any) still stands.
    stalled.resume(BeforeWrite::OnceLost);

    let why = format!("{strategy}: a holder told of its loss must not write");
    refused(answer, "the sale's lock was lost before the write", &why).await;
    assert!(buyers(&app, sale).await.is_empty(), "{strategy}");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (0, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_lock_refuses_a_holder_unaware_of_its_loss_by_the_fence_alone() {
    fence_alone_refuses("lock/fenced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_refuses_a_holder_unaware_of_its_loss_by_the_fence_alone() {
    fence_alone_refuses("lock/fair").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_holder_unaware_of_its_loss_by_the_fence_alone() {
    fence_alone_refuses("lock/redlock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_lock_holder_told_of_its_loss_writes_nothing() {
    loss_signal_alone_refuses("lock/watchdog").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_lock_holder_told_of_its_loss_writes_nothing_while_its_claim_stands() {
    loss_signal_alone_refuses("lock/fenced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_holder_told_of_its_loss_writes_nothing_while_its_claim_stands() {
    loss_signal_alone_refuses("lock/fair").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_holder_told_of_its_loss_writes_nothing_while_its_claim_stands() {
    loss_signal_alone_refuses("lock/redlock").await;
}
