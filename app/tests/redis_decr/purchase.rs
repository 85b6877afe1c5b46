//! The purchase path: exact books under concurrency, duplicates, a Postgres
//! failure after the decrement, and Redis being down.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::free_port;

use super::{
    ALREADY_PURCHASED, RedisView, SHARED_REDIS, SOLD_OUT, UNAVAILABLE, buy, spawn_app,
    status_and_problem, unique_prefix,
};
use crate::support::{problem_type, provoking};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_decr_never_oversells_under_200_concurrent_buyers_with_resubmissions() {
    redis_decr_never_oversells_under_200_concurrent_buyers_with_resubmissions_on(&SHARED_REDIS)
        .await;
}

/// The body of the test of that name on the Redis at `url` (one node or a cluster).
pub async fn redis_decr_never_oversells_under_200_concurrent_buyers_with_resubmissions_on(
    url: &str,
) {
    let prefix = unique_prefix();
    let app = spawn_app(url, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 100).await;

    // 200 buyers, each submitting twice at once (a double click).
    let mut tasks = tokio::task::JoinSet::new();
    for user in 1..=200_i64 {
        for _ in 0..2 {
            let client = app.client.clone();
            let url = app.url(&format!("/sales/{sale}/orders"));
            tasks.spawn(async move {
                let response = client.post(url).json(&json!({ "user_id": user })).send().await;
                let response = response.unwrap();
                let status = response.status();
                let body: Value = response.json().await.unwrap();
                (user, status, body["type"].as_str().map(str::to_owned))
            });
        }
    }
    let answers = tasks.join_all().await;

    let placed: Vec<i64> =
        answers.iter().filter(|(_, s, _)| *s == StatusCode::CREATED).map(|(u, _, _)| *u).collect();
    let distinct: HashSet<i64> = placed.iter().copied().collect();
    assert_eq!(placed.len(), 100, "exactly the stock is sold");
    assert_eq!(distinct.len(), 100, "no buyer is served twice");
    for (user, status, kind) in &answers {
        if *status != StatusCode::CREATED {
            assert_eq!(*status, StatusCode::CONFLICT, "user {user}: {kind:?}");
            let kind = kind.as_deref().unwrap();
            assert!(kind == SOLD_OUT || kind == ALREADY_PURCHASED, "user {user}: {kind}");
        }
    }

    let audit = app.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.remaining_stock, audit.oversold, audit.ledger_drift),
        (100, 0, 0, 0)
    );
    assert_eq!(audit.duplicate_orders, 0);
    assert_eq!(audit.redis_drift, Some(0));
    assert_eq!(audit.reconcile_fixes, Some(0));
    let mut redis = RedisView::new(url, &prefix, sale).await;
    assert_eq!(redis.stock().await, Some(0));
    assert_eq!(redis.open_reservations().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_buyer_does_not_consume_a_unit() {
    let prefix = unique_prefix();
    let app = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 5).await;
    let mut redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;

    assert_eq!(buy(&app, sale, 7).await.0, StatusCode::CREATED);
    let mut repeats = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let client = app.client.clone();
        let url = app.url(&format!("/sales/{sale}/orders"));
        repeats.spawn(async move {
            let response = client.post(url).json(&json!({ "user_id": 7 })).send().await.unwrap();
            problem_type(response).await
        });
    }
    for kind in repeats.join_all().await {
        assert_eq!(kind, ALREADY_PURCHASED);
    }
    assert_eq!(redis.stock().await, Some(4));
    assert_eq!(app.audit(sale).await.remaining_stock, 4);

    // Redis forgets its buyers (as after a restart): Postgres's unique
    // constraint refuses the repeat, and the unit taken in Redis comes back.
    redis::cmd("DEL")
        .arg(&redis.counter.buyers_key)
        .query_async::<()>(&mut redis.conn)
        .await
        .unwrap();
    assert_eq!(
        status_and_problem(&buy(&app, sale, 7).await),
        (StatusCode::CONFLICT, Some(ALREADY_PURCHASED))
    );
    assert_eq!(redis.stock().await, Some(4), "the duplicate's unit was returned");
    assert_eq!(redis.open_reservations().await, 0);
    assert!(redis.is_buyer(7).await, "a buyer with an order stays a buyer");

    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (1, 4, 0));
    assert_eq!(audit.redis_drift, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_failure_after_the_decrement_returns_the_unit() {
    a_postgres_failure_after_the_decrement_returns_the_unit_on(&SHARED_REDIS).await;
}

/// The body of the test of that name on the Redis at `url` (one node or a cluster).
pub async fn a_postgres_failure_after_the_decrement_returns_the_unit_on(url: &str) {
    provoking("a Postgres failure after the decrement (an armed failpoint, 503)");
    let prefix = unique_prefix();
    let failing = spawn_app(url, &prefix, |config| {
        config.failpoints = Some("redis-decr-after-reserve=error".into());
    })
    .await;
    let sale = failing.sale("redis-decr", 3).await;
    let mut redis = RedisView::new(url, &prefix, sale).await;

    let answer = buy(&failing, sale, 1).await;
    assert_eq!(status_and_problem(&answer), (StatusCode::SERVICE_UNAVAILABLE, Some(UNAVAILABLE)));
    assert_eq!(redis.stock().await, Some(3), "the unit is back");
    assert_eq!(redis.open_reservations().await, 0);
    assert!(!redis.is_buyer(1).await, "the buyer may try again");
    let audit = failing.audit(sale).await;
    assert_eq!((audit.orders, audit.redis_drift), (0, Some(0)));

    // The same buyer, on a healthy instance, gets the unit.
    let healthy = spawn_app(url, &prefix, |_| {}).await;
    assert_eq!(buy(&healthy, sale, 1).await.0, StatusCode::CREATED);
    assert_eq!(redis.stock().await, Some(2));
    let audit = healthy.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.redis_drift), (1, 2, Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_unavailable_not_500() {
    provoking("a Redis that does not answer (503 unavailable)");
    let nothing_there = format!("redis://127.0.0.1:{}", free_port());
    let app = spawn_app(&nothing_there, &unique_prefix(), |_| {}).await;
    // Creating the sale succeeds: the first purchase would warm the counter.
    let sale = app.sale("redis-decr", 3).await;

    let response = app.buy(sale, 1).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        (body["type"].as_str(), body["backend"].as_str()),
        (Some(UNAVAILABLE), Some("redis"))
    );

    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = ready.json().await.unwrap();
    assert_eq!(body["backend"], "redis");

    let (orders, remaining): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE sale_id = $1), remaining_stock
         FROM sales WHERE id = $1",
    )
    .bind(sale)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!((orders, remaining), (0, 3));
}
