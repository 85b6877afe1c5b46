//! What the lifecycle tests share: sales with a payment window, purchases
//! that return their order id, and the order routes.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use seckill::backends::{AmqpHandle, RedisHandle};
use seckill::config::Config;
use seckill::lifecycle::Context;
use seckill::sale::SaleCatalog;
use seckill::strategy::Strategies;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::TestApp;

/// Creates a sale of `stock` units under `strategy` whose orders must be paid
/// within `window_ms`; returns its id.
pub async fn window_sale(app: &TestApp, strategy: &str, stock: i64, window_ms: i64) -> i64 {
    let body = json!({
        "name": format!("{strategy} payment test"), "stock": stock, "strategy": strategy,
        "payment_window_ms": window_ms,
    });
    app.create_sale(body).await["id"].as_i64().unwrap()
}

/// Buys one unit of `sale` for `user`; panics unless `201`. Returns the order
/// id.
pub async fn bought(app: &TestApp, sale: i64, user: i64) -> i64 {
    let response = app.buy(sale, user).await;
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "user {user} buying: {body}");
    body["order_id"].as_i64().unwrap()
}

/// `POST /orders/{id}/{action}` with `body` (none when `Value::Null`) and an
/// `Idempotency-Key` when given.
pub async fn order_action(
    app: &TestApp,
    order: i64,
    action: &str,
    body: Value,
    key: Option<&str>,
) -> Response {
    let mut request = app.client.post(app.url(&format!("/orders/{order}/{action}")));
    if !body.is_null() {
        request = request.json(&body);
    }
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await.unwrap()
}

/// `POST /orders/{id}/pay` with no body.
pub async fn pay(app: &TestApp, order: i64, key: Option<&str>) -> Response {
    order_action(app, order, "pay", Value::Null, key).await
}

/// `POST /orders/{id}/cancel` with no body.
pub async fn cancel(app: &TestApp, order: i64) -> Response {
    order_action(app, order, "cancel", Value::Null, None).await
}

/// `GET /orders/{id}`; panics unless `200`.
pub async fn order(app: &TestApp, order: i64) -> Value {
    let response = app.client.get(app.url(&format!("/orders/{order}"))).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "GET /orders/{order}");
    response.json().await.unwrap()
}

/// The status of order `id`, read from Postgres.
pub async fn status_of(db: &PgPool, id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM orders WHERE id = $1")
        .bind(id)
        .fetch_one(db)
        .await
        .unwrap()
}

/// The sale's `remaining_stock` plus its buckets', read from Postgres.
pub async fn remaining(db: &PgPool, sale: i64) -> i64 {
    sqlx::query_scalar("SELECT remaining_stock FROM sale_stock WHERE sale_id = $1")
        .bind(sale)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Waits up to `within` for order `id` to reach `status`.
pub async fn reaches(db: &PgPool, id: i64, status: &str, within: Duration) -> bool {
    crate::support::eventually(within, || async { status_of(db, id).await == status }).await
}

/// The lifecycle's dependencies, built in the test process (as a service
/// builds them) over a database of the test's own: to run sweeps directly.
pub struct Sweeps {
    pub db: PgPool,
    pub catalog: SaleCatalog,
    pub strategies: Strategies,
}

impl Sweeps {
    /// Over the database at `url` (a test's own: other services sweep the
    /// shared test database), with Redis keys and broker queues of its own.
    pub async fn on(url: &str) -> Self {
        Self::sharing(url, &test_support::unique_prefix(), &test_support::unique_prefix()).await
    }

    /// Over the database at `url`, with the Redis keys and broker queues of
    /// a service whose prefixes are `redis_prefix` and `amqp_prefix`: to
    /// sweep the orders of its `redis-decr` and `queue` sales.
    pub async fn sharing(url: &str, redis_prefix: &str, amqp_prefix: &str) -> Self {
        let mut config = Config::defaults();
        config.backends.database_url = url.to_owned();
        config.backends.redis_url = test_support::redis_url();
        config.backends.amqp_url = test_support::amqp_url();
        config.backends.redis_prefix = redis_prefix.to_owned();
        config.backends.amqp_prefix = amqp_prefix.to_owned();
        let db = PgPool::connect(url).await.unwrap();
        let redis =
            RedisHandle::new(&config.backends.redis_url, config.backends.redis_prefix.clone())
                .unwrap();
        let amqp =
            AmqpHandle::new(config.backends.amqp_url.clone(), config.backends.amqp_prefix.clone());
        let catalog = SaleCatalog::default();
        let deps = config.deps(db.clone(), redis, amqp, catalog.clone());
        let strategies = Strategies::new(&deps).unwrap();
        Self { db, catalog, strategies }
    }

    pub fn context(&self) -> Context<'_> {
        Context { db: &self.db, catalog: &self.catalog, strategies: &self.strategies }
    }
}

/// `POST /sales/{id}/orders` on a `queue` sale, then its request's result:
/// the order id when placed, else the result's status.
pub async fn queued(app: &TestApp, sale: i64, user: i64) -> Result<i64, String> {
    let response = app.buy(sale, user).await;
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    if status == StatusCode::CONFLICT {
        return Err(body["type"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["request_id"].as_str().unwrap();
    let result = crate::support::resolved(app, sale, id, Duration::from_secs(20)).await;
    match result["status"].as_str() {
        Some("placed") => Ok(result["order_id"].as_i64().unwrap()),
        other => Err(other.unwrap_or_default().to_owned()),
    }
}

/// Pays every pending order of `sale` (each must be payable): a test leaves
/// no order behind for the sweeps of later tests' services, which share the
/// database but not this test's Redis nodes or broker queues.
pub async fn pay_pending(app: &TestApp, sale: i64) {
    let pending: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM orders WHERE sale_id = $1 AND status = 'pending_payment'",
    )
    .bind(sale)
    .fetch_all(&app.db)
    .await
    .unwrap();
    for id in pending {
        assert_eq!(pay(app, id, None).await.status(), StatusCode::OK, "paying order {id}");
    }
}
