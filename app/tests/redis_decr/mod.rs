//! `redis-decr` against a real Redis and a real Postgres: exact books under
//! concurrency, compensation, reconciliation after a crash, one background
//! pass per period across instances, a Redis restart, the sold-out flag
//! across instances, Redis being down or asking for a password
//! ([`credentials`], with a `lock/*` sale too), and a 3-master Redis Cluster.
//!
//! Every test uses its own Redis key prefix, so runs never see each other's
//! keys; tests that kill Redis own a `redis-server` of their own.

mod cluster;
mod compensation;
mod converge;
mod crash;
mod credentials;
mod hangups;
mod interleavings;
mod purchase;
mod reconcile;
mod restart;
mod retention;
mod scheduled;
mod sold_out;

use std::time::Duration;

use redis_lock::RedisConnection;
use reqwest::StatusCode;
use seckill::backends::RedisHandle;
use seckill::config::Config;
use seckill::sale::SaleId;
use seckill::strategy::Reconciliation;
use seckill::strategy::redis_decr::counter::SaleCounter;
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, TestApp};
pub use crate::support::{buy, eventually, unique_prefix};

/// The shared Redis (`TEST_REDIS_URL`, else the service's default).
pub static SHARED_REDIS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(test_support::redis_url);

/// A service over the test database using Redis `url` under `prefix`, with
/// the background reconciler off unless `tweak` turns it on.
pub async fn spawn_app(url: &str, prefix: &str, tweak: impl FnOnce(&mut Config)) -> TestApp {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    TestApp::spawn_with(move |config| {
        config.backends.redis_url = url;
        config.backends.redis_prefix = prefix;
        config.strategies.redis_decr.reconcile_interval_ms = 0;
        tweak(config);
    })
    .await
}

/// A direct view of one sale's Redis keys, for assertions.
pub struct RedisView {
    pub conn: RedisConnection,
    pub counter: SaleCounter,
}

impl RedisView {
    pub async fn new(url: &str, prefix: &str, sale: i64) -> RedisView {
        let handle = RedisHandle::new(url, prefix).unwrap();
        let conn = handle.conn().await.expect("Redis answers");
        RedisView { conn, counter: SaleCounter::new(&handle, SaleId(sale)) }
    }

    /// The stock counter; `None` when absent.
    pub async fn stock(&mut self) -> Option<i64> {
        redis::cmd("GET").arg(&self.counter.stock_key).query_async(&mut self.conn).await.unwrap()
    }

    pub async fn set_stock(&mut self, units: i64) {
        redis::cmd("SET")
            .arg(&self.counter.stock_key)
            .arg(units)
            .query_async::<()>(&mut self.conn)
            .await
            .unwrap();
    }

    /// Number of open reservations.
    pub async fn open_reservations(&mut self) -> i64 {
        redis::cmd("HLEN")
            .arg(&self.counter.reservations_key)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    pub async fn is_buyer(&mut self, user: i64) -> bool {
        redis::cmd("SISMEMBER")
            .arg(&self.counter.buyers_key)
            .arg(user)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }
}

/// A purchase's answer ([`buy`]) as its status and its problem `type`
/// (`None` for an answer that is not a problem).
pub fn status_and_problem((status, body): &(StatusCode, Value)) -> (StatusCode, Option<&str>) {
    (*status, body["type"].as_str())
}

/// Buys for `user` until the answer is not `503` (Redis coming back), at
/// most `tries` times, 50 ms apart. Returns the last status.
pub async fn buy_until_answered(app: &TestApp, sale: i64, user: i64, tries: u32) -> StatusCode {
    for _ in 1..tries {
        let (status, _) = buy(app, sale, user).await;
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    buy(app, sale, user).await.0
}

/// `POST /admin/sales/{id}/reconcile`; panics unless `200`.
pub async fn reconcile(app: &TestApp, sale: i64) -> Reconciliation {
    app.admin(reqwest::Method::POST, &format!("/admin/sales/{sale}/reconcile")).await
}

/// `POST /admin/sales/{id}/restock`; panics unless `200`.
pub async fn restock(app: &TestApp, sale: i64, units: i64) {
    let response = app
        .client
        .post(app.url(&format!("/admin/sales/{sale}/restock")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "units": units }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

pub const SOLD_OUT: &str = "/problems/sold-out";
pub const ALREADY_PURCHASED: &str = "/problems/already-purchased";
pub const UNAVAILABLE: &str = "/problems/unavailable";
