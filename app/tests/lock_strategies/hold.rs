//! The bound on a purchase's hold of its sale's lock (`SECKILL_LOCK_HOLD_MS`):
//! every `lock/*` strategy cuts off a critical section that runs past it and
//! answers `503 busy`; the lock is free again at once, and the books stay
//! whole, including when the section hung on a Postgres write.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::json;
use test_support::RedisServer;

use super::harness::{REDIS_URL, sale_with, unique_prefix};
use crate::support::{TestApp, eventually, hold_sale_row};

/// The bound under test.
const HOLD: Duration = Duration::from_millis(300);

/// The lock wait: far longer than the bound, so a purchase that waited for a
/// lock nobody freed is told apart from one cut off at the bound.
const WAIT: Duration = Duration::from_millis(2000);

/// Every lock strategy.
const STRATEGIES: [&str; 8] = [
    "lock/local",
    "lock/setnx",
    "lock/ttl",
    "lock/token",
    "lock/watchdog",
    "lock/fenced",
    "lock/fair",
    "lock/redlock",
];

/// A service on the shared Redis under a fresh prefix, with the Redlock
/// nodes `nodes` (none: the default ones, unused), waiting [`WAIT`] for a
/// lock and holding it [`HOLD`] at most.
async fn spawn_with_hold(nodes: &[RedisServer]) -> TestApp {
    let (prefix, urls): (_, Vec<_>) =
        (unique_prefix(), nodes.iter().map(RedisServer::url).collect());
    TestApp::spawn_with(move |config| {
        config.backends.redis_url = REDIS_URL.to_owned();
        config.backends.redis_prefix = prefix;
        if !urls.is_empty() {
            config.strategies.lock.redlock_urls = urls;
        }
        config.strategies.lock.wait_ms = WAIT.as_millis() as u64;
        config.strategies.lock.hold_ms = HOLD.as_millis() as u64;
    })
    .await
}

/// Buys one unit of `sale` as `user`; asserts a `503 busy` that says the
/// critical section was cut off at its bound, and returns how long the
/// answer took.
async fn cut_off(app: &TestApp, sale: i64, user: i64) -> Duration {
    let started = Instant::now();
    let response = app.buy(sale, user).await;
    let took = started.elapsed();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/busy", "{problem}");
    // Told apart by its reason from a lock wait that ran out or a fence.
    assert_eq!(
        problem["detail"], "the purchase held the sale's lock for SECKILL_LOCK_HOLD_MS",
        "sale {sale}, user {user}"
    );
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_strategy_cuts_off_a_critical_section_at_its_bound_and_frees_the_lock() {
    let nodes =
        [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await];
    let app = spawn_with_hold(&nodes).await;
    // 2.5–7.5 s of work inside the critical section: every holder hangs.
    let sales =
        join_all(STRATEGIES.map(|s| sale_with(&app, s, 3, json!({ "work_ms": 5000 })))).await;

    // Two buyers of each sale, one after the other: each is cut off at the
    // bound, and the second finds the lock free (it does not wait out WAIT,
    // which would end in `busy` too, but later).
    let app = &app;
    let took =
        join_all(sales.iter().map(|&sale| async move {
            (cut_off(app, sale, 1).await, cut_off(app, sale, 2).await)
        }))
        .await;
    for ((strategy, sale), (first, second)) in STRATEGIES.iter().zip(&sales).zip(took) {
        for took in [first, second] {
            assert!(took >= HOLD && took < WAIT / 2, "{strategy}: answered after {took:?}");
        }
        let audit = app.audit(*sale).await;
        let books = (audit.remaining_stock, audit.orders, audit.ledger_drift);
        assert_eq!(books, (3, 0, 0), "{strategy}: nothing written");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_that_hung_on_postgres_past_the_bound_leaves_the_books_exact() {
    let app = spawn_with_hold(&[]).await;
    let sale = sale_with(&app, "lock/fenced", 3, json!({})).await;
    // A first purchase creates the sale's fencing claim row, so that later
    // claims update it (an insert would wait on the row lock below too).
    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
    // Another transaction holds the sale's row: the next purchase claims
    // and reads, then its write waits on that lock, a Postgres call that
    // hangs, holding its share lock on the claim row.
    let blocker = hold_sale_row(&app.db, sale).await;
    let took = cut_off(&app, sale, 2).await;
    assert!(took >= HOLD && took < WAIT / 2, "answered after {took:?}");

    // Postgres answers again. The cut-off write, still queued there, commits
    // whole or not at all, and the next holder's claim is ordered after it.
    blocker.rollback().await.unwrap();
    let next = tokio::time::timeout(WAIT, app.buy(sale, 3)).await.expect("served");
    assert_eq!(next.status(), StatusCode::CREATED);
    let settled = eventually(Duration::from_secs(2), || async {
        let audit = app.audit(sale).await;
        (audit.oversold, audit.ledger_drift) == (0, 0) && audit.units_sold >= 2
    })
    .await;
    assert!(settled, "books exact: {:?}", app.audit(sale).await);
}
