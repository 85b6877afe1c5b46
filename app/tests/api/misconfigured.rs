//! A Postgres role without a privilege the service needs: a purchase is
//! answered `503 misconfigured` naming Postgres — never a 500 — and writes
//! nothing. (Redis's and RabbitMQ's refusals are tested beside their own
//! servers: `redis_decr::credentials`, `queue_broker::least_privilege`.)
//!
//! The role works on a scratch database, migrated by the superuser first:
//! it may read and write every table but update `sales`, which is where a
//! `sql` purchase takes its unit, and insert into `purchase_requests`, where
//! a `queue` purchase registers its request.

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::{Connection, PgConnection};

use crate::support::{ADMIN_TOKEN, TestApp, create_sale_at, provoking};

/// `url` with the user `role` instead of its own.
fn as_role(url: &str, role: &str) -> String {
    let mut url = reqwest::Url::parse(url).expect("a database URL");
    url.set_username(role).expect("a URL with a user");
    url.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_role_without_a_privilege_is_answered_503_misconfigured() {
    provoking("a Postgres role refused an UPDATE of sales (42501)");
    let scratch = test_support::scratch_database("misconfigured").await;
    seckill::startup::prepare_database(&scratch).await.expect("migrated as the superuser");
    let role = format!("seckill_narrow_{}", std::process::id());
    let mut admin = PgConnection::connect(&scratch).await.unwrap();
    for statement in [
        format!("DROP ROLE IF EXISTS {role}"),
        format!("CREATE ROLE {role} LOGIN"),
        // The migrator checks its table under `CREATE TABLE IF NOT EXISTS`.
        format!("GRANT USAGE, CREATE ON SCHEMA public TO {role}"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"),
        format!("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {role}"),
        format!("REVOKE UPDATE ON sales FROM {role}"),
        format!("REVOKE INSERT ON purchase_requests FROM {role}"),
    ] {
        // The role's name is this test's own, not input.
        let query = sqlx::query(sqlx::AssertSqlSafe(statement.clone()));
        query.execute(&mut admin).await.expect(&statement);
    }
    let url = as_role(&scratch, &role);
    let app = TestApp::spawn_with(move |config| config.backends.database_url = url).await;
    let body = serde_json::json!({ "name": "narrow role", "stock": 3, "strategy": "sql" });
    let sale = create_sale_at(&app.base, ADMIN_TOKEN, body).await;
    // `queue` registers its requests in a batch of its own before it
    // publishes them: the refusal reaches every request of the batch.
    let body = serde_json::json!({ "name": "narrow role", "stock": 3, "strategy": "queue" });
    let queued = create_sale_at(&app.base, ADMIN_TOKEN, body).await;
    for (sale, user) in [(sale, 1), (sale, 2), (queued, 1)] {
        let response = app.buy(sale, user).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!response.headers().contains_key("retry-after"), "retrying cannot help");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "/problems/misconfigured", "{problem}");
        assert_eq!(problem["backend"], "postgres", "{problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("insufficient_privilege"),
            "{problem}"
        );
    }
    let (orders, remaining): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE sale_id = $1), \
                (SELECT remaining_stock FROM sales WHERE id = $1)",
    )
    .bind(sale)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!((orders, remaining), (0, 3), "nothing written");
    drop(app);
    admin.close().await.unwrap();
    test_support::drop_scratch_database(&scratch).await;
    let mut server = PgConnection::connect(&test_support::test_database_url()).await.unwrap();
    let drop_role = sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {role}")));
    drop_role.execute(&mut server).await.unwrap();
}
