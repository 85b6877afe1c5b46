//! A Redis that is slow told apart from one that is gone, as for Postgres
//! (`outage.rs`): a command Redis answers later than its timeout is `503
//! busy` with `Retry-After` while Redis still answers a probe (a fresh
//! connection's `PING`, with a longer timeout than the commands'); a Redis
//! that answers nothing, stopped or dead, is `503 unavailable` naming
//! `redis`. A look at a place in a waiting room's line is answered the same.
//!
//! The Redis is the test's own: `DEBUG SLEEP` blocks the whole server, so
//! every command in flight times out, and the probe is answered once the
//! sleep ends.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::RETRY_AFTER;
use serde_json::Value;
use test_support::RedisServer;

use crate::support::{TestApp, provoking};

/// The strategies whose purchases ask Redis: the library lock (a command
/// timeout of its own, cut to the lock wait) and the counter (the shared
/// connection's response timeout).
const STRATEGIES: [&str; 2] = ["lock/fenced", "redis-decr"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_is_busy_and_a_stopped_or_dead_one_unavailable() {
    provoking("a Redis of its own put to sleep, stopped and killed (503)");
    let mut redis = RedisServer::start_with(&["--enable-debug-command", "yes"]).await;
    let app = TestApp::spawn_with(|config| {
        config.backends.redis_url = redis.url();
        config.strategies.lock.wait_ms = 300;
    })
    .await;
    let mut sales = Vec::new();
    for strategy in STRATEGIES {
        let sale = app.sale(strategy, 100).await;
        // Connections opened, counter warmed: what follows is about answers.
        assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED, "{strategy}");
        sales.push((strategy, sale));
    }
    // A waiting room's line is in Redis too: buyer 1 takes a place.
    let room = serde_json::json!({ "name": "room", "stock": 100, "strategy": "sql",
        "waiting_room": { "admissions_per_s": 1 } });
    let room = app.create_sale(room).await["id"].as_i64().unwrap();
    let joined = app.client.post(app.url(&format!("/sales/{room}/line")));
    let joined = joined.json(&serde_json::json!({ "user_id": 1 })).send().await.unwrap();
    assert_eq!(joined.status(), StatusCode::OK);

    // Slow: Redis sleeps longer than any command timeout, then answers.
    let client = redis.client();
    let sleep = tokio::task::spawn_blocking(move || {
        let mut conn = client.get_connection().expect("a connection to the owned Redis");
        redis::cmd("DEBUG").arg("SLEEP").arg("2.5").query::<()>(&mut conn)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (bought, looked) = tokio::join!(buy_each(&app, &sales, 2), look(&app, room));
    for (strategy, answer) in bought {
        let (status, retry_after, body) = answer;
        assert_eq!(
            (status, body["type"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/busy")),
            "{strategy} while Redis sleeps: {body}"
        );
        assert!(retry_after.is_some(), "{strategy}: busy says when to retry");
    }
    let (status, body) = looked;
    assert_eq!(
        (status, body["type"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/busy")),
        "a look at a place while Redis sleeps: {body}"
    );
    sleep.await.unwrap().expect("DEBUG SLEEP answered");

    // Stopped: commands and the probe get no answer at all. (The probe's
    // last answer is reused for a second: let it lapse.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pid = redis.pid().expect("the owned Redis runs");
    test_support::signal(pid, "STOP");
    let (bought, looked) = tokio::join!(buy_each(&app, &sales, 3), look(&app, room));
    for (strategy, (status, _, body)) in bought {
        assert_eq!(
            (status, body["type"].as_str(), body["backend"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/unavailable"), Some("redis")),
            "{strategy} while Redis is stopped: {body}"
        );
    }
    let (status, body) = looked;
    assert_eq!(
        (status, body["type"].as_str(), body["backend"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/unavailable"), Some("redis")),
        "a look at a place while Redis is stopped: {body}"
    );

    // Dead: connections are refused, which is an outage without a probe.
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (strategy, (status, _, body)) in buy_each(&app, &sales, 4).await {
        assert_eq!(
            (status, body["type"].as_str(), body["backend"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("/problems/unavailable"), Some("redis")),
            "{strategy} once Redis is dead: {body}"
        );
    }
}

/// Buyer 1's look at their place in `sale`'s line: the status and body.
async fn look(app: &TestApp, sale: i64) -> (StatusCode, Value) {
    let response = app.client.get(app.url(&format!("/sales/{sale}/line/1"))).send().await.unwrap();
    (response.status(), response.json().await.unwrap_or(Value::Null))
}

/// One purchase by `user` of each sale, all at once: each strategy with its
/// status, `Retry-After` and body.
async fn buy_each(
    app: &TestApp,
    sales: &[(&'static str, i64)],
    user: i64,
) -> Vec<(&'static str, (StatusCode, Option<String>, Value))> {
    let started = Instant::now();
    let answers =
        futures_util::future::join_all(sales.iter().map(|&(strategy, sale)| async move {
            let response = app.buy(sale, user).await;
            let status = response.status();
            let retry_after =
                response.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (strategy, (status, retry_after, body))
        }))
        .await;
    println!("buyer {user} of {} sales answered within {:?}", sales.len(), started.elapsed());
    answers
}
