//! `lock/fair`: the buyers waiting for a sale's lock are served in the order
//! they joined its line, across instances and the tasks of one instance; and
//! under 200 concurrent buyers over two instances it sells exactly the stock.
//!
//! The order is observed where it is kept: the line is the fair lock's
//! sorted set `PREFIX:{sale:ID}:lock:queue`, and each buyer is sent only once
//! the previous one is seen waiting in it, so the arrival order is known
//! without a sleep. The holder that keeps them all waiting is a buyer
//! stopped at the `lock/before-write` failpoint.
//!
//! `lock/fenced` under the same timeline makes no such promise: its
//! reentrant lock keeps one first-come line per process, and on each release
//! the processes' contenders race for the key, so buyers of the instance
//! that wins the race can overtake buyers of the other that waited longer.
//! Whether they do depends on scheduling, so no test asserts it.

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use seckill::failpoints::{self, LOCK_BEFORE_WRITE};
use seckill::strategy::lock::BeforeWrite;
use serde_json::json;

use super::harness::{
    REDIS_URL, buy_until_decided, lock_stats_of_all, redis_conn, sale_with, wait_until,
};
use crate::support::{TestApp, unique_prefix};

const FAIR: &str = "lock/fair";

/// A service on the shared Redis under `prefix` whose buyers wait up to 20 s
/// for the lock and may hold it 120 s: no wait runs out and no section is
/// cut off in these tests, so every answer is a sale or a sold-out.
async fn service(prefix: &str) -> TestApp {
    let prefix = prefix.to_owned();
    TestApp::spawn_with(move |config| {
        config.backends.redis_url = REDIS_URL.to_owned();
        config.backends.redis_prefix = prefix;
        config.strategies.lock.wait_ms = 20_000;
        config.strategies.lock.hold_ms = 120_000;
    })
    .await
}

/// How many buyers wait in the line of `sale`'s lock.
async fn in_line(prefix: &str, sale: i64) -> usize {
    let key = format!("{prefix}:{{sale:{sale}}}:lock:queue");
    redis::cmd("ZCARD").arg(key).query_async(&mut redis_conn(&REDIS_URL).await).await.unwrap()
}

/// `user` buys one unit of `sale` on `app` in a task of its own; its status.
fn buy_in_background(app: &TestApp, sale: i64, user: i64) -> tokio::task::JoinHandle<StatusCode> {
    let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
    tokio::spawn(async move {
        client.post(url).json(&json!({ "user_id": user })).send().await.unwrap().status()
    })
}

/// The buyers of `sale` in the order their orders were written.
async fn served(app: &TestApp, sale: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1 ORDER BY created_at, id")
        .bind(sale)
        .fetch_all(&app.db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_serves_waiting_buyers_of_two_instances_in_the_order_they_joined_the_line() {
    const WAITERS: i64 = 6;
    let prefix = unique_prefix();
    let apps = [service(&prefix).await, service(&prefix).await];
    let sale = sale_with(&apps[0], FAIR, WAITERS + 1, json!({})).await;

    // Buyer 1 takes the free lock and stops right before its write.
    let mut stalled = failpoints::arm::<BeforeWrite>(&LOCK_BEFORE_WRITE, sale);
    let holder = buy_in_background(&apps[0], sale, 1);
    stalled.reached().await;

    // Buyers 101, 102, … join the line one at a time, alternating between
    // the instances, so that both the order across instances and the order
    // between the tasks of one instance are at stake.
    let mut arrivals = Vec::new();
    let mut answers = Vec::new();
    for (place, user) in (101..101 + WAITERS).enumerate() {
        answers.push(buy_in_background(&apps[place % 2], sale, user));
        wait_until(&format!("buyer {user} waits in line"), Duration::from_secs(5), || {
            let prefix = prefix.clone();
            async move { in_line(&prefix, sale).await == place + 1 }
        })
        .await;
        arrivals.push(user);
    }

    stalled.resume(BeforeWrite::Check);
    assert_eq!(holder.await.unwrap(), StatusCode::CREATED, "the holder sells");
    for (user, answer) in arrivals.iter().zip(join_all(answers).await) {
        assert_eq!(answer.unwrap(), StatusCode::CREATED, "buyer {user} is served in its turn");
    }

    let expected: Vec<i64> = std::iter::once(1).chain(arrivals).collect();
    assert_eq!(served(&apps[0], sale).await, expected, "orders written in arrival order");
    assert_eq!(in_line(&prefix, sale).await, 0, "every buyer left the line");
    let audit = apps[0].audit(sale).await;
    let books = (audit.units_sold, audit.remaining_stock, audit.oversold, audit.ledger_drift);
    assert_eq!(books, (WAITERS + 1, 0, 0, 0), "{audit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_lock_never_oversells_under_200_concurrent_buyers_over_two_instances() {
    const STOCK: i64 = 50;
    let prefix = unique_prefix();
    let (one, two) = (service(&prefix).await, service(&prefix).await);
    let sale = sale_with(&one, FAIR, STOCK, json!({})).await;

    let (first, second) = tokio::join!(
        buy_until_decided(&one, sale, 1, 100),
        buy_until_decided(&two, sale, 101, 100)
    );
    let statuses: Vec<StatusCode> = first.into_iter().chain(second).collect();
    let sold = statuses.iter().filter(|&&s| s == StatusCode::CREATED).count();
    let refused = statuses.iter().filter(|&&s| s == StatusCode::CONFLICT).count();
    assert_eq!((sold, refused), (50, 150), "every buyer sold or told sold out: {statuses:?}");

    let audit = one.audit(sale).await;
    let books = (audit.units_sold, audit.remaining_stock, audit.oversold, audit.ledger_drift);
    assert_eq!(books, (STOCK, 0, 0, 0), "{audit:?}");
    assert_eq!(audit.duplicate_orders, 0, "{audit:?}");
    let stats = lock_stats_of_all(&[&one, &two], sale).await;
    assert_eq!(stats.max_concurrency, 1, "{stats:?}");
}
