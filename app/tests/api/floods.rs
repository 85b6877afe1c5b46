//! What a flood of cheap requests may not cost: a repeated buyer answered
//! before the strategy, ids with no sale answered from the catalogue, lock
//! intervals pruned.

use std::time::Duration;

use reqwest::StatusCode;
use seckill::sale::{SaleCatalog, SaleId};
use seckill::strategy::lock::intervals::Intervals;
use sqlx::PgPool;

use crate::support::{TestApp, assert_problem, test_database_url};

/// A service with the cache of known buyers on, as deployed.
async fn with_known_buyers() -> TestApp {
    TestApp::spawn_with(|config| config.known_buyers = 1_000).await
}

/// Critical sections recorded for `sale` by `apps` (each flushes its own on
/// the lock-stats call).
async fn critical_sections(apps: &[&TestApp], sale: i64) -> i64 {
    for app in apps {
        let _: serde_json::Value =
            app.admin(reqwest::Method::GET, &format!("/admin/sales/{sale}/lock-stats")).await;
    }
    sqlx::query_scalar("SELECT count(*) FROM lock_intervals WHERE sale_id = $1")
        .bind(sale)
        .fetch_one(&apps[0].db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_buyer_on_a_lock_sale_is_answered_without_taking_the_lock() {
    let app = with_known_buyers().await;
    let sale = app.sale("lock/watchdog", 10).await;
    assert_eq!(app.buy(sale, 7).await.status(), StatusCode::CREATED);
    for _ in 0..50 {
        assert_problem(app.buy(sale, 7).await, StatusCode::CONFLICT, "already-purchased").await;
    }
    assert_eq!(critical_sections(&[&app], sale).await, 1, "the repeats took the lock");
    // Another buyer still buys, under the lock.
    assert_eq!(app.buy(sale, 8).await.status(), StatusCode::CREATED);
    assert_eq!(critical_sections(&[&app], sale).await, 2);
    assert_eq!(app.audit(sale).await.orders, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_refused_as_already_purchased_by_the_strategy_is_then_answered_from_the_cache() {
    // Another instance placed the order: this one learns it from the
    // strategy's own refusal, once.
    let (first, second) = (with_known_buyers().await, with_known_buyers().await);
    let sale = first.sale("lock/watchdog", 10).await;
    assert_eq!(first.buy(sale, 9).await.status(), StatusCode::CREATED);
    for _ in 0..5 {
        assert_problem(second.buy(sale, 9).await, StatusCode::CONFLICT, "already-purchased").await;
    }
    assert_eq!(
        critical_sections(&[&first, &second], sale).await,
        2,
        "one for the order, one for the refusal"
    );
}

#[tokio::test]
async fn an_id_with_no_sale_is_answered_from_the_catalogue_for_a_second() {
    let db = PgPool::connect(&test_database_url()).await.unwrap();
    let catalog = SaleCatalog::default();
    let (absent, other) = (SaleId(i64::MAX), SaleId(i64::MAX - 1));
    assert!(catalog.get(&db, absent).await.unwrap().is_none());
    db.close().await;
    // No query: the closed pool would fail it.
    assert!(catalog.get(&db, absent).await.unwrap().is_none());
    assert!(catalog.get(&db, other).await.is_err(), "another id is queried");
    tokio::time::sleep(seckill::sale::MISS_TTL + Duration::from_millis(200)).await;
    assert!(catalog.get(&db, absent).await.is_err(), "the miss is forgotten after its TTL");
}

#[tokio::test]
async fn lock_intervals_past_their_retention_are_deleted() {
    let app = TestApp::spawn().await;
    let sale = app.sale("lock/watchdog", 10).await;
    for (instance, ended_ago_s) in [("old", 7200.0), ("recent", 60.0)] {
        sqlx::query(
            "INSERT INTO lock_intervals (sale_id, instance, started_at, ended_at)
             VALUES ($1, $2, now() - make_interval(secs => $3 + 1), now() - make_interval(secs => $3))",
        )
        .bind(sale)
        .bind(instance)
        .bind(ended_ago_s)
        .execute(&app.db)
        .await
        .unwrap();
    }
    let intervals = Intervals::new(app.db.clone(), Duration::from_secs(3600));
    assert!(intervals.prune().await.unwrap() >= 1);
    let left: Vec<String> =
        sqlx::query_scalar("SELECT instance FROM lock_intervals WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(left, ["recent"]);
}
