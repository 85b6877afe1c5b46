//! What the service's integration tests share: a real service on a random
//! port, over the real Postgres named by `TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/seckill_test`, created and migrated on
//! first use), and requests to it. Tests isolate themselves by creating their
//! own sales. What the other crates' tests need too (scratch databases,
//! unique names, the servers' URLs) is `test_support`'s.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::{Response, StatusCode};
use seckill::audit::Audit;
use seckill::config::Config;
use seckill::startup::Application;
use seckill::strategy::queue::QueueStats;
use serde_json::{Value, json};
use sqlx::PgPool;

pub const ADMIN_TOKEN: &str = "test-admin-token-of-at-least-32-bytes";

/// The buyer token key (`SECKILL_BUYER_JWT_KEY`) of a test service that turns
/// buyer authentication on ([`with_buyer_auth`]).
pub const BUYER_KEY: &str = "test-buyer-token-key-of-32-bytes-at-least";

/// A buyer token for `user`, signed with [`BUYER_KEY`], valid for an hour.
pub fn buyer_token(user: i64) -> String {
    seckill::buyer_token::mint_hs256(
        BUYER_KEY.as_bytes(),
        user,
        seckill::buyer_token::now_s() + 3600,
    )
}

/// A `spawn_with` tweak: buyer authentication on, with [`BUYER_KEY`].
pub fn with_buyer_auth(config: &mut Config) {
    config.auth.buyer_auth = Some(seckill::config::BuyerAuthMode::On);
    config.auth.buyer_key = Some(seckill::config::BuyerKey::Secret(BUYER_KEY.to_owned()));
}

pub use test_support::{test_database_url, unique_prefix};

/// A running service and a client for it.
pub struct TestApp {
    pub addr: SocketAddr,
    pub base: String,
    pub client: reqwest::Client,
    /// A pool on the same database, for assertions.
    pub db: PgPool,
}

impl TestApp {
    /// Starts a service with the test configuration.
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    /// Starts a service after `tweak` has adjusted the test configuration
    /// (the defaults, the test database, `TEST_REDIS_URL` and `TEST_AMQP_URL`,
    /// port 0, the test token, a Redis key prefix of its own, buyer
    /// authentication off — the buyer is the body's `user_id`; turn it on
    /// with [`with_buyer_auth`]).
    pub async fn spawn_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
        // Not the start-up WARN that buyer authentication is off: every test
        // service runs so unless it turns it on.
        seckill::telemetry::init_tracing_or("warn,seckill::startup=error");
        // The defaults, not the environment: no stray SECKILL_* applies.
        let mut config = Config::defaults();
        config.backends.database_url = test_database_url();
        config.backends.redis_url = test_support::redis_url();
        config.backends.amqp_url = test_support::amqp_url();
        config.http.addr = "127.0.0.1:0".parse().unwrap();
        config.auth.admin_token = Some(ADMIN_TOKEN.to_owned());
        config.backends.db_pool_size = 20;
        // Tests drive the strategies themselves: no answer from the cache of
        // known buyers in front of them, unless a test turns it on.
        config.known_buyers = 0;
        // Tests name their buyers in the body, unless a test turns buyer
        // authentication on.
        config.auth.buyer_auth = Some(seckill::config::BuyerAuthMode::Off);
        // Test sales share ids with other databases' sales; a prefix of their
        // own keeps their Redis keys apart. Tests that run several instances
        // of one service set a shared prefix in `tweak`.
        config.backends.redis_prefix = unique_prefix();
        // Likewise for RabbitMQ queue names; and no queue consumers (whose
        // quorum queues would outlive the test) unless a test of the `queue`
        // strategy turns them on and deletes its queues afterwards.
        config.backends.amqp_prefix = unique_prefix();
        config.strategies.queue.consume = false;
        // Tests share the database but not the broker's queue names: one
        // test's republish job would publish another test's pending requests
        // to its own queues. Only the tests of the job turn it on.
        config.strategies.queue.republish_after_ms = TEST_REPUBLISH_AFTER_MS;
        tweak(&mut config);
        let app = Application::build(config).await.expect("service builds");
        let addr = app.local_addr();
        tokio::spawn(app.run_until(std::future::pending()));
        let db = PgPool::connect(&test_database_url()).await.expect("test pool");
        // Every request is bounded, so a service that stops answering fails
        // the test instead of hanging the suite.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        TestApp { addr, base: format!("http://{addr}"), client, db }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// `POST /admin/sales`; panics unless `201`. Returns the sale's JSON.
    pub async fn create_sale(&self, body: Value) -> Value {
        let response = self
            .client
            .post(self.url("/admin/sales"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "creating a sale: {body}");
        body
    }

    /// Creates a sale of `stock` units under `strategy`; returns its id.
    pub async fn sale(&self, strategy: &str, stock: i64) -> i64 {
        let sale = self
            .create_sale(
                json!({ "name": format!("{strategy} test"), "stock": stock, "strategy": strategy }),
            )
            .await;
        sale["id"].as_i64().unwrap()
    }

    /// `POST /sales/{id}/orders` with `{user_id}`.
    pub async fn buy(&self, sale: i64, user: i64) -> Response {
        buy_at(&self.client, &self.base, sale, user).await
    }

    /// `GET /admin/sales/{id}/audit`; panics unless `200`.
    pub async fn audit(&self, sale: i64) -> Audit {
        self.admin(reqwest::Method::GET, &format!("/admin/sales/{sale}/audit")).await
    }

    /// `method path` with the admin token and no body, read as JSON; panics
    /// unless `200`.
    pub async fn admin<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> T {
        let response = self
            .client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.json().await.unwrap()
    }

    /// `n` distinct buyers (user ids `first..first+n`) all at once; returns
    /// the status of every answer.
    pub async fn burst(&self, sale: i64, first: i64, n: i64) -> Vec<StatusCode> {
        let mut tasks = tokio::task::JoinSet::new();
        for user in first..first + n {
            let client = self.client.clone();
            let url = self.url(&format!("/sales/{sale}/orders"));
            tasks.spawn(async move {
                client.post(url).json(&json!({ "user_id": user })).send().await.unwrap().status()
            });
        }
        tasks.join_all().await
    }
}

/// `POST {base}/sales/{sale}/orders` with `{user_id}` through `client`, on
/// any service (an in-process one, a child process, a script's replicas).
pub async fn buy_at(client: &reqwest::Client, base: &str, sale: i64, user: i64) -> Response {
    let request = client.post(format!("{base}/sales/{sale}/orders"));
    request.json(&json!({ "user_id": user })).send().await.expect("the service answers")
}

/// `user` buys one unit of `sale` from `app`: the status and the JSON body
/// (`null` when there is none), e.g. the order, or a problem whose `type`
/// says why not.
pub async fn buy(app: &TestApp, sale: i64, user: i64) -> (StatusCode, Value) {
    let response = app.buy(sale, user).await;
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A transaction of its own holding `sale`'s row lock (`SELECT … FOR
/// UPDATE`): every purchase that writes the row queues behind it until it
/// commits or is dropped.
pub async fn hold_sale_row(db: &PgPool, sale: i64) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = db.begin().await.expect("a transaction");
    sqlx::query("SELECT 1 FROM sales WHERE id = $1 FOR UPDATE")
        .bind(sale)
        .execute(&mut *holder)
        .await
        .expect("the sale row locked");
    holder
}

/// The `type` of a problem+json answer, after checking its content type.
pub async fn problem_type(response: Response) -> String {
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.unwrap();
    body["type"].as_str().unwrap().to_owned()
}

/// Request helpers that return the raw answer, for tests of refusals.
impl TestApp {
    /// `POST /sales/{sale}/orders` with `body` as JSON, whatever its shape.
    pub async fn order(&self, sale: impl std::fmt::Display, body: Value) -> Response {
        self.client
            .post(self.url(&format!("/sales/{sale}/orders")))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// `GET /sales/{sale}`.
    pub async fn get_sale(&self, sale: impl std::fmt::Display) -> Response {
        self.client.get(self.url(&format!("/sales/{sale}"))).send().await.unwrap()
    }

    /// `GET /sales/{sale}`; panics unless `200`. Returns the sale's status JSON.
    pub async fn sale_status(&self, sale: i64) -> Value {
        let response = self.get_sale(sale).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    /// `POST /admin/sales` with the admin token and `body`, whatever its shape.
    pub async fn try_create_sale(&self, body: Value) -> Response {
        self.client
            .post(self.url("/admin/sales"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /admin/sales/{sale}/restock` with the admin token and `body`.
    pub async fn restock(&self, sale: impl std::fmt::Display, body: Value) -> Response {
        self.client
            .post(self.url(&format!("/admin/sales/{sale}/restock")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }
}

/// Asserts that `response` has `status` and is a problem+json document of
/// type `/problems/{kind}`.
pub async fn assert_problem(response: Response, status: StatusCode, kind: &str) {
    assert_eq!(response.status(), status, "expected {status} /problems/{kind}");
    assert_eq!(problem_type(response).await, format!("/problems/{kind}"));
}

/// A client that connects from `source`, an address of 127.0.0.0/8 (all of
/// it is the loopback interface's), so that one test can be several clients
/// as the service sees them.
pub fn client_from(source: &str) -> reqwest::Client {
    let source: std::net::IpAddr = source.parse().expect("an IP address");
    let builder = reqwest::Client::builder().local_address(source);
    builder.timeout(Duration::from_secs(60)).build().unwrap()
}

/// Polls a condition every 10 ms until it holds or a time limit passes.
#[allow(unused_imports)] // not every module polls
pub use test_support::eventually;

/// The result of a queued purchase (`GET /sales/{sale}/requests/{id}`) once
/// it is no longer `pending`, long-polling 2 s at a time for up to `within`;
/// panics if it stays pending or an answer is not `200`.
pub async fn resolved(app: &TestApp, sale: i64, id: &str, within: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let response = app
            .client
            .get(app.url(&format!("/sales/{sale}/requests/{id}?wait_ms=2000")))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["status"] != "pending" {
            return body;
        }
        assert!(tokio::time::Instant::now() < deadline, "request {id} still pending: {body}");
    }
}

/// `GET /admin/sales/{id}/queue`; panics unless `200`.
pub async fn queue_stats(app: &TestApp, sale: i64) -> QueueStats {
    app.admin(reqwest::Method::GET, &format!("/admin/sales/{sale}/queue")).await
}

/// Waits until the `queue` sale has no unresolved request; panics after
/// `within`.
pub async fn drained(app: &TestApp, sale: i64, within: Duration) -> QueueStats {
    let done =
        eventually(within, || async { queue_stats(app, sale).await.accepted_unresolved == 0 })
            .await;
    let stats = queue_stats(app, sale).await;
    assert!(done, "requests still unresolved: {stats:?}");
    stats
}

/// `POST {base}/admin/sales` with `token` and `body`, on a service the test
/// started itself (a child process, a script's replicas); panics unless the
/// answer carries a sale id, which it returns.
pub async fn create_sale_at(base: &str, token: &str, body: Value) -> i64 {
    let sale: Value = reqwest::Client::new()
        .post(format!("{base}/admin/sales"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    sale["id"].as_i64().unwrap_or_else(|| panic!("no sale was created: {sale}"))
}

/// The `queue` republish threshold of test services: 0, the job off, since
/// tests share the database but not the broker's queue names (see
/// [`TestApp::spawn_with`]).
pub const TEST_REPUBLISH_AFTER_MS: u64 = 0;

/// `seckill serve` as a child process of the test (killed when the returned
/// service is dropped), with no `SECKILL_*` of the test's environment: on the
/// test database and the test Redis and RabbitMQ, with the test admin token,
/// buyer authentication off, no `queue` consumers (their quorum queues would
/// outlive the test), no `queue` republish job ([`TEST_REPUBLISH_AFTER_MS`]) and error-level logs, plus `env` on top,
/// which may override any of them.
/// Ready once `/healthz` answers.
pub fn seckill_child(env: &[(&str, String)]) -> test_support::ServiceLauncher {
    test_support::ServiceLauncher::new(env!("CARGO_BIN_EXE_seckill"), "SECKILL_ADDR", "/healthz")
        .arg("serve")
        .without_inherited("SECKILL_")
        .env("DATABASE_URL", test_database_url())
        .env("REDIS_URL", test_support::redis_url())
        .env("AMQP_URL", test_support::amqp_url())
        .env("SECKILL_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("SECKILL_BUYER_AUTH", "off")
        .env("RUST_LOG", "error")
        .env("SECKILL_QUEUE_CONSUME", "false")
        .env("SECKILL_QUEUE_REPUBLISH_AFTER_MS", TEST_REPUBLISH_AFTER_MS.to_string())
        .env("SECKILL_KNOWN_BUYERS", "0")
        .envs(env)
}

/// Says on the test run's output that the running test provokes `what` on
/// purpose, so that the WARN lines the service logs about it (which the test
/// harness does not capture) read as expected. Written straight to stderr,
/// past the harness's capture, like those lines.
pub fn provoking(what: &str) {
    use std::io::Write as _;
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(
        std::io::stderr(),
        "note: {test} provokes {what} on purpose; the WARN lines about it are expected"
    );
}

/// Creates a sale of 3 units with a per-user limit of 5 under `strategy`;
/// returns its id. The sale of the "an order larger than the stock left"
/// sequence: a buyer of 5 units cannot be served, a buyer of 1 can.
pub async fn sale_of_three_for_up_to_five(app: &TestApp, strategy: &str) -> i64 {
    let body = json!({ "name": format!("{strategy} oversize"), "stock": 3, "strategy": strategy,
                       "per_user_limit": 5 });
    app.create_sale(body).await["id"].as_i64().unwrap()
}

/// For a strategy that answers at once (`201` or `409`): buyer 1 orders 5 of
/// the 3 units and is told `sold-out`; buyers 2, 3 and 4 then get one unit
/// each, and buyer 5 is told `sold-out`. A strategy whose sold-out flag were
/// set by the oversize order would refuse buyer 2 while 3 units are left.
pub async fn assert_an_oversize_order_leaves_the_sale_open(app: &TestApp, strategy: &str) {
    let sale = sale_of_three_for_up_to_five(app, strategy).await;
    let oversize = app.order(sale, json!({ "user_id": 1, "quantity": 5 })).await;
    assert_problem(oversize, StatusCode::CONFLICT, "sold-out").await;
    for user in 2..=4 {
        let response = app.order(sale, json!({ "user_id": user, "quantity": 1 })).await;
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{strategy}: buyer {user} of 1 unit: {body}");
    }
    let late = app.order(sale, json!({ "user_id": 5, "quantity": 1 })).await;
    assert_problem(late, StatusCode::CONFLICT, "sold-out").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (3, 0, 0));
}

/// Deletes the queues a service declared under `prefix` with `partitions`
/// partitions on the shared broker.
pub async fn delete_queues(prefix: &str, partitions: u16) {
    let config = Config::defaults();
    let topology = seckill::strategy::queue::Topology::new(
        prefix,
        partitions,
        config.strategies.queue.max_length,
        config.strategies.queue.delivery_limit,
    );
    let url = test_support::amqp_url();
    let connection =
        lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    topology.delete_queues(&channel).await.unwrap();
}
