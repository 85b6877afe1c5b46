//! Nothing grows forever: once a sale sold out or ended with its books
//! settled, the reconciler sets its Redis keys to expire and stops visiting
//! it (`seckill_reconcile_sales_visited` falls to 0).

use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::json;
use test_support::ChildService;

use super::{RedisView, SHARED_REDIS, eventually, unique_prefix};
use crate::support::{ADMIN_TOKEN, buy_at, create_sale_at, seckill_child};

const INSTANCE: &str = "retention-test";

/// The instance's `seckill_reconcile_sales_visited`; `None` before its
/// first pass.
async fn visited(service: &ChildService) -> Option<u64> {
    let request = reqwest::Client::new().get(format!("{}/metrics", service.base));
    let page = request.bearer_auth(ADMIN_TOKEN).send().await.unwrap().text().await.unwrap();
    let line = page.lines().find(|line| {
        line.starts_with("seckill_reconcile_sales_visited{")
            && line.contains(&format!("instance=\"{INSTANCE}\""))
    })?;
    Some(line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
}

async fn create(service: &ChildService, body: serde_json::Value) -> i64 {
    create_sale_at(&service.base, ADMIN_TOKEN, body).await
}

async fn buy(service: &ChildService, sale: i64, user: i64) -> StatusCode {
    buy_at(&reqwest::Client::new(), &service.base, sale, user).await.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_sales_that_sold_out_or_ended_expire_and_the_reconciler_stops_visiting_them() {
    let prefix = unique_prefix();
    let service = seckill_child(&[
        ("SECKILL_REDIS_PREFIX", prefix.clone()),
        ("SECKILL_REDIS_DECR_RECONCILE_INTERVAL_MS", "300".into()),
        ("SECKILL_REDIS_DECR_KEY_TTL_MS", "2000".into()),
        ("SECKILL_INSTANCE", INSTANCE.into()),
    ])
    .start()
    .await;
    let sold_out = create(
        &service,
        json!({ "name": "sells out", "stock": 2,
                                             "strategy": "redis-decr" }),
    )
    .await;
    let ends_at = (Utc::now() + chrono::Duration::milliseconds(1500)).to_rfc3339();
    let ending = create(
        &service,
        json!({ "name": "ends", "stock": 5, "strategy": "redis-decr",
                                           "ends_at": ends_at }),
    )
    .await;
    for (sale, user) in [(sold_out, 1), (sold_out, 2), (ending, 1)] {
        assert_eq!(buy(&service, sale, user).await, StatusCode::CREATED);
    }
    let ending_visited =
        eventually(Duration::from_secs(5), || async { visited(&service).await == Some(1) }).await;
    assert!(ending_visited, "the sale still open is visited: {:?}", visited(&service).await);

    // Sold out at once; ended 1.5 s after creation: both leave the index.
    let none_visited =
        eventually(Duration::from_secs(6), || async { visited(&service).await == Some(0) }).await;
    assert!(none_visited, "still visited: {:?}", visited(&service).await);
    for sale in [sold_out, ending] {
        let mut redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&redis.counter.stock_key)
            .query_async(&mut redis.conn)
            .await
            .unwrap();
        assert!((1..=2000).contains(&ttl), "sale {sale}: the counter expires ({ttl} ms)");
        let gone = eventually(Duration::from_secs(4), || async {
            RedisView::new(&SHARED_REDIS, &prefix, sale).await.stock().await.is_none()
        })
        .await;
        assert!(gone, "sale {sale}: its keys expired");
    }
    // A purchase after the expiry finds the books in Postgres again.
    assert_eq!(buy(&service, sold_out, 3).await, StatusCode::CONFLICT);
}
