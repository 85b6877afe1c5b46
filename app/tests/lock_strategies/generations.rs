//! What each lock generation is known to do — including, for the broken
//! ones, that they do break, in the way `docs/locks.md` says.

use std::time::Duration;

use redis::AsyncCommands;
use reqwest::StatusCode;
use seckill::backends::RedisHandle;
use seckill::failpoints::{self, LOCK_BEFORE_WRITE};
use seckill::strategy::StrategyName;
use seckill::strategy::lock::BeforeWrite;
use seckill::strategy::lock::setnx::{self, SetnxLock};
use seckill::strategy::lock::token::{self, TokenLock};
use seckill::strategy::lock::ttl::{self, TtlLock};
use seckill::strategy::lock::{Release, SaleLock};
use serde_json::json;
use test_support::{RedisServer, signal};

use super::harness::{
    ChildApp, REDIS_URL, fake_sale, lease_ms, lock_stats, lock_stats_of_all, redis_conn, sale_with,
    spawn, spawn_on_nodes, unique_prefix, wait_until,
};

const NO_WAIT: Duration = Duration::ZERO;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_lock_with_a_lease_shorter_than_the_work_oversells_or_drifts() {
    let app = spawn(&unique_prefix(), 2000).await;
    // Every holder works 100..300 ms on a 30 ms lease: each one outlives it.
    let knobs = json!({ "lock_lease_ms": 30, "work_ms": 200 });
    let sale = sale_with(&app, "lock/ttl", 5, knobs).await;
    app.burst(sale, 1, 20).await;
    let audit = app.audit(sale).await;
    assert!(
        audit.oversold > 0 || audit.ledger_drift != 0,
        "expected lost updates from holders past their lease: {audit:?}"
    );
    assert!(lock_stats(&app, sale).await.max_concurrency > 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_lock_late_release_deletes_the_next_holders_lock() {
    let redis = RedisHandle::new(&REDIS_URL, unique_prefix()).unwrap();
    let lock = TtlLock::new(redis);
    let sale = fake_sale(1, ttl::NAME, lease_ms(50));
    let first = lock.acquire(&sale, NO_WAIT).await.unwrap().expect("a free lock");
    tokio::time::sleep(Duration::from_millis(80)).await; // past the 50 ms lease
    let second = lock.acquire(&sale, NO_WAIT).await.unwrap().expect("the lease ran out");

    // The first holder, done late, releases "its" lock: a blind DEL.
    assert_eq!(lock.release(&sale, first).await.unwrap(), Release::Released);

    let exists: bool = redis_conn(&REDIS_URL).await.exists(lock.key(&sale)).await.unwrap();
    assert!(!exists, "the second holder's key was deleted by the first holder");
    let third = lock.acquire(&sale, NO_WAIT).await.unwrap();
    assert!(third.is_some(), "a third buyer gets in while the second still works");
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_lock_never_deletes_another_holders_lock() {
    let redis = RedisHandle::new(&REDIS_URL, unique_prefix()).unwrap();
    let lock = TokenLock::new(redis);
    let sale = fake_sale(1, token::NAME, lease_ms(50));
    let first = lock.acquire(&sale, NO_WAIT).await.unwrap().expect("a free lock");
    tokio::time::sleep(Duration::from_millis(80)).await; // past the 50 ms lease
    let second = lock.acquire(&sale, NO_WAIT).await.unwrap().expect("the lease ran out");

    assert_eq!(lock.release(&sale, first).await.unwrap(), Release::NotHeld);

    let exists: bool = redis_conn(&REDIS_URL).await.exists(lock.key(&sale)).await.unwrap();
    assert!(exists, "the second holder's key is untouched");
    assert!(lock.acquire(&sale, NO_WAIT).await.unwrap().is_none(), "no third holder");
    assert_eq!(lock.release(&sale, second).await.unwrap(), Release::Released);
    assert!(lock.acquire(&sale, NO_WAIT).await.unwrap().is_some(), "free after its release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_lock_still_runs_two_holders_once_a_lease_runs_out() {
    let app = spawn(&unique_prefix(), 2000).await;
    let knobs = json!({ "lock_lease_ms": 30, "work_ms": 200 });
    let sale = sale_with(&app, "lock/token", 5, knobs).await;
    app.burst(sale, 1, 12).await;
    assert!(lock_stats(&app, sale).await.max_concurrency > 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_lock_oversells_on_two_instances() {
    let prefix = unique_prefix();
    let (one, two) = (spawn(&prefix, 2000).await, spawn(&prefix, 2000).await);
    let sale = sale_with(&one, "lock/local", 1, json!({})).await;
    // Buyer 1 holds instance one's mutex, has read the last unit and is
    // about to write; instance two's mutex is another mutex.
    let mut stalled = failpoints::arm::<BeforeWrite>(&LOCK_BEFORE_WRITE, sale);
    let first = {
        let (client, url) = (one.client.clone(), one.url(&format!("/sales/{sale}/orders")));
        tokio::spawn(async move {
            client.post(url).json(&json!({ "user_id": 1 })).send().await.unwrap().status()
        })
    };
    stalled.reached().await;
    assert_eq!(two.buy(sale, 2).await.status(), StatusCode::CREATED, "buyer 2 takes the unit");
    stalled.resume(BeforeWrite::Check);
    assert_eq!(first.await.unwrap(), StatusCode::CREATED, "buyer 1 sells it again");

    let audit = one.audit(sale).await;
    assert_eq!((audit.units_sold, audit.oversold), (2, 1), "two processes, two mutexes: {audit:?}");
    assert!(lock_stats_of_all(&[&one, &two], sale).await.max_concurrency > 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setnx_lock_leaves_the_sale_stuck_when_its_holder_is_killed() {
    let prefix = unique_prefix();
    let app = spawn(&prefix, 300).await;
    let sale = sale_with(&app, "lock/setnx", 3, json!({ "work_ms": 10_000 })).await;
    let mut holder = ChildApp::start(&prefix, &[]).await;

    let key = SetnxLock::new(RedisHandle::new(&REDIS_URL, prefix.clone()).unwrap())
        .key(&fake_sale(sale, setnx::NAME, lease_ms(2000)));
    let buying = {
        let (client, url) = (holder.client.clone(), format!("{}/sales/{sale}/orders", holder.base));
        tokio::spawn(async move { client.post(url).json(&json!({ "user_id": 1 })).send().await })
    };
    let mut redis = redis_conn(&REDIS_URL).await;
    wait_until("the child holds the lock", Duration::from_secs(5), || {
        let (mut redis, key) = (redis.clone(), key.clone());
        async move { redis.exists::<_, bool>(&key).await.unwrap() }
    })
    .await;
    holder.kill();
    let _ = buying.await;

    let statuses = app.burst(sale, 2, 5).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::SERVICE_UNAVAILABLE), "{statuses:?}");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock), (0, 3), "undersold: stock left unsold");
    let pttl: i64 = redis.pttl(&key).await.unwrap();
    assert_eq!(pttl, -1, "the dead holder's key never expires");
    let _: () = redis.del(&key).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_lock_never_oversells_while_a_holder_is_stopped_past_its_lease() {
    let prefix = unique_prefix();
    let app = spawn(&prefix, 3000).await;
    let knobs = json!({ "lock_lease_ms": 300, "work_ms": 200 });
    let sale = sale_with(&app, "lock/fenced", 3, knobs).await;
    let holder = ChildApp::start(&prefix, &[]).await;
    let buying = {
        let (client, url) = (holder.client.clone(), format!("{}/sales/{sale}/orders", holder.base));
        tokio::spawn(async move { client.post(url).json(&json!({ "user_id": 1 })).send().await })
    };
    wait_until("the child is inside its critical section", Duration::from_secs(5), || async {
        sqlx::query("SELECT 1 FROM sale_fences WHERE sale_id = $1")
            .bind(sale)
            .fetch_optional(&app.db)
            .await
            .unwrap()
            .is_some()
    })
    .await;
    signal(holder.pid(), "STOP");

    // Meanwhile the lease runs out and two buyers on the other instance take
    // two of the three units. One unit stays, so the stale holder reaches its
    // write whether it read the stock before it was stopped or after.
    let statuses = app.burst(sale, 2, 2).await;
    assert!(statuses.iter().all(|s| *s == StatusCode::CREATED), "{statuses:?}");
    signal(holder.pid(), "CONT");
    let stale = buying.await.unwrap().unwrap().status();

    assert_eq!(stale, StatusCode::SERVICE_UNAVAILABLE, "the stale holder's write is refused");
    let audit = app.audit(sale).await;
    let books = (audit.units_sold, audit.remaining_stock, audit.oversold, audit.ledger_drift);
    assert_eq!(books, (2, 1, 0, 0), "{audit:?}");
    holder.lock_stats(sale).await;
    let stats = lock_stats(&app, sale).await;
    assert!(stats.max_concurrency > 1, "two holders were inside at once: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_known_sold_out_is_answered_without_the_lock_until_restocked() {
    let app = spawn(&unique_prefix(), 1000).await;
    let sale = sale_with(&app, "lock/token", 1, json!({})).await;
    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
    assert_eq!(app.buy(sale, 2).await.status(), StatusCode::CONFLICT, "found sold out");
    assert_eq!(app.buy(sale, 3).await.status(), StatusCode::CONFLICT, "known sold out");
    assert_eq!(lock_stats(&app, sale).await.critical_sections, 2, "the third never locked");

    let restock = app
        .client
        .post(app.url(&format!("/admin/sales/{sale}/restock")))
        .bearer_auth(crate::support::ADMIN_TOKEN)
        .json(&json!({ "units": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(restock.status(), StatusCode::OK);
    assert_eq!(app.buy(sale, 4).await.status(), StatusCode::CREATED, "the flag was cleared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_larger_than_the_stock_left_does_not_close_the_sale_under_any_lock() {
    let nodes =
        [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await];
    let app = spawn_on_nodes(&unique_prefix(), 1000, &nodes).await;
    let locks = StrategyName::ALL.iter().filter(|name| name.as_str().starts_with("lock/"));
    let mut tried = 0;
    for strategy in locks {
        crate::support::assert_an_oversize_order_leaves_the_sale_open(&app, strategy.as_str())
            .await;
        tried += 1;
    }
    assert_eq!(tried, 8, "every lock variant, lock/local to lock/redlock");
}
