//! Redis restarts mid-sale with nothing persisted: the counter is rebuilt from
//! Postgres truth, and the sale finishes exactly.

use reqwest::StatusCode;
use test_support::RedisServer;

use super::{RedisView, buy_until_answered, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_restart_mid_sale_rebuilds_the_counter_from_postgres() {
    crate::support::provoking("a restart of its own Redis (lost connections, 503)");
    let mut redis_server = RedisServer::start().await;
    let prefix = unique_prefix();
    let app = spawn_app(&redis_server.url(), &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 60).await;

    let first = app.burst(sale, 1, 25).await;
    assert!(first.iter().all(|s| *s == StatusCode::CREATED));

    redis_server.restart().await;
    let mut redis = RedisView::new(&redis_server.url(), &prefix, sale).await;
    assert_eq!(redis.stock().await, None, "the restarted Redis is empty");

    // The first purchase after the restart warms the counter from Postgres:
    // 60 − 25 sold, not the initial 60.
    assert_eq!(buy_until_answered(&app, sale, 26, 100).await, StatusCode::CREATED);
    assert_eq!(redis.stock().await, Some(60 - 26));

    // The rest of the sale, with more buyers than stock.
    let mut tasks = tokio::task::JoinSet::new();
    for user in 27..=120 {
        let app_url = app.url("");
        let client = app.client.clone();
        tasks.spawn(async move {
            let url = format!("{app_url}/sales/{sale}/orders");
            for _ in 0..100 {
                let response =
                    client.post(&url).json(&serde_json::json!({ "user_id": user })).send().await;
                let status = response.unwrap().status();
                if status != StatusCode::SERVICE_UNAVAILABLE {
                    return status;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            StatusCode::SERVICE_UNAVAILABLE
        });
    }
    let rest = tasks.join_all().await;
    let placed = rest.iter().filter(|s| **s == StatusCode::CREATED).count();
    assert_eq!(placed, 60 - 26, "the remaining stock sells, no more");
    assert!(rest.iter().all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT));

    let audit = app.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.remaining_stock, audit.oversold, audit.ledger_drift),
        (60, 0, 0, 0)
    );
    assert_eq!(audit.redis_drift, Some(0));
    assert_eq!(redis.stock().await, Some(0));
}
