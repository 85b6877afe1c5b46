//! The two answers to a hot row against a real Postgres: `sql/batched`
//! (group commit: many buyers, one transaction, each answered as `sql` would
//! answer it) and `sql/buckets` (the stock split over several rows) — exact
//! books with two instances, the answers of a mixed batch against `sql`'s,
//! restocks during batches, connections terminated mid-batch, clients that
//! leave, and buckets that sell exactly their stock, whatever the quantities
//! bought, without deadlock.

mod batched;
mod batched_faults;
mod buckets;
mod serial;

use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::StatusCode;
use seckill::audit::Audit;
use seckill::backends::{AmqpHandle, RedisHandle};
use seckill::config::Config;
use seckill::outcome::{Outcome, StrategyError};
use seckill::sale::{Sale, SaleCatalog, SaleId};
use seckill::strategy::sql_batched::SqlBatched;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{TestApp, test_database_url};

/// Two instances of the service over the test database, with the pools of
/// the comparison's instances (10 connections each): tests with two
/// instances run beside others on one Postgres.
pub async fn two_instances() -> (TestApp, TestApp) {
    let spawn = || TestApp::spawn_with(|config| config.backends.db_pool_size = 10);
    (spawn().await, spawn().await)
}

/// What one purchase was answered, comparable across strategies: `201 ×q`
/// with the units, `409 <problem>`, or the status and problem of an error.
pub async fn answer(response: reqwest::Response) -> String {
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status == StatusCode::CREATED {
        format!("201 ×{}", body["quantity"])
    } else {
        format!("{} {}", status.as_u16(), body["type"].as_str().unwrap_or("?"))
    }
}

/// The same for an answer of a strategy called directly.
pub fn outcome(answer: &Result<Outcome, StrategyError>) -> String {
    match answer {
        Ok(Outcome::Placed { quantity, .. }) => format!("201 ×{quantity}"),
        Ok(other) => format!("409 {}", other.label()),
        Err(StrategyError::Busy { .. }) => "503 busy".to_owned(),
        Err(StrategyError::Unavailable { .. }) => "503 unavailable".to_owned(),
        Err(StrategyError::Misconfigured { .. }) => "503 misconfigured".to_owned(),
        Err(StrategyError::Internal(_)) => "500 internal".to_owned(),
    }
}

/// How many of `answers` were each answer.
pub fn tally(answers: &[String]) -> BTreeMap<&str, usize> {
    let mut tally = BTreeMap::new();
    for answer in answers {
        *tally.entry(answer.as_str()).or_default() += 1;
    }
    tally
}

/// `user` buys `quantity` units of `sale` from `app`; the answer as
/// [`answer`] writes it.
pub async fn buy(app: &TestApp, sale: i64, user: i64, quantity: i64) -> String {
    answer(app.order(sale, json!({ "user_id": user, "quantity": quantity })).await).await
}

/// Users `users` buy one unit each of `sale`, all at once, spread round-robin
/// over `apps`; returns (user, answer) pairs.
pub async fn burst(
    apps: &[&TestApp],
    sale: i64,
    users: std::ops::Range<i64>,
) -> Vec<(i64, String)> {
    let mut tasks = tokio::task::JoinSet::new();
    for user in users {
        let app = apps[user as usize % apps.len()];
        let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
        tasks.spawn(async move {
            let response = client.post(url).json(&json!({ "user_id": user })).send().await;
            (user, answer(response.expect("the service answers")).await)
        });
    }
    tasks.join_all().await
}

/// Asserts the audit of an exact ledger that sold `sold` units of `total`.
pub fn assert_exact(audit: &Audit, total: i64, sold: i64) {
    assert_eq!(
        (audit.total_stock, audit.units_sold, audit.remaining_stock),
        (total, sold, total - sold),
        "{audit:?}"
    );
    assert_eq!(
        (audit.oversold, audit.ledger_drift, audit.duplicate_orders),
        (0, 0, 0),
        "{audit:?}"
    );
}

/// The buyers of `sale` who have an order, and the units of each.
pub async fn orders(db: &PgPool, sale: i64) -> BTreeMap<i64, i32> {
    let rows: Vec<(i64, i32)> =
        sqlx::query_as("SELECT user_id, quantity FROM orders WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(db)
            .await
            .unwrap();
    rows.into_iter().collect()
}

/// A `sql/batched` strategy of this test's own over the test database, to
/// drive purchases in a known order; and the sale catalogue it reads.
pub struct Direct {
    pub strategy: Arc<SqlBatched>,
    pub catalog: SaleCatalog,
    pub db: PgPool,
}

impl Direct {
    pub async fn new() -> Direct {
        let mut config = Config::defaults();
        config.backends.database_url = test_database_url();
        config.backends.redis_url = test_support::redis_url();
        config.backends.amqp_url = test_support::amqp_url();
        let prefix = test_support::unique_prefix();
        let db = PgPool::connect(&config.backends.database_url).await.unwrap();
        let redis = RedisHandle::new(&config.backends.redis_url, prefix.clone()).unwrap();
        let amqp = AmqpHandle::new(config.backends.amqp_url.clone(), prefix);
        let catalog = SaleCatalog::default();
        let deps = config.deps(db.clone(), redis, amqp, catalog.clone());
        Direct {
            strategy: Arc::new(SqlBatched::new(&deps, &deps.settings.sql_batched)),
            catalog,
            db,
        }
    }

    /// The sale record of `id`.
    pub async fn sale(&self, id: i64) -> Arc<Sale> {
        self.catalog.get(&self.db, SaleId(id)).await.unwrap().expect("the sale exists")
    }
}
