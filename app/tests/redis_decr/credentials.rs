//! The service against a Redis that asks for a password, on a `redis-server`
//! this test owns: as an ACL user limited to the keys and channels of its
//! prefix (as `scripts/services.sh` and docker-compose.yml create it), a
//! `redis-decr` sale and two `lock/*` sales sell exactly their stock; with a
//! wrong password, purchases and `/readyz` are `503 misconfigured`, the log
//! names the cause, and neither the answers nor the log show the password;
//! with an ACL that does not cover the service's prefix (`NOPERM`), purchases
//! are `503 misconfigured` too, never a 500.

use reqwest::StatusCode;
use test_support::RedisServer;

use crate::support::{ADMIN_TOKEN, TestApp, provoking, seckill_child};

/// The password of the server's default user (`--requirepass`).
const ADMIN_PASSWORD: &str = "the-redis-admin-password-of-this-test";
/// The password of the ACL user `seckill`.
const PASSWORD: &str = "the-redis-password-of-this-test";

/// Creates the ACL user `seckill` on `server`: `PASSWORD`, the keys and
/// channels under `prefix`, every command but the dangerous ones.
async fn add_the_services_user(server: &RedisServer, prefix: &str) {
    let admin = format!("redis://:{ADMIN_PASSWORD}@127.0.0.1:{}", server.port);
    let client = redis::Client::open(admin).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let rules = [
        "reset",
        "on",
        &format!(">{PASSWORD}"),
        &format!("~{prefix}:*"),
        &format!("&{prefix}:*"),
        "+@all",
        "-@dangerous",
    ];
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("seckill")
        .arg(&rules)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// 5 buyers of a sale of 3 units under `strategy`: three `201`, two `409`.
async fn assert_sells_exactly_its_stock(app: &TestApp, strategy: &str) {
    let sale = app.sale(strategy, 3).await;
    let mut statuses = Vec::new();
    for user in 1..=5 {
        statuses.push(app.buy(sale, user).await.status());
    }
    let created = statuses.iter().filter(|s| **s == StatusCode::CREATED).count();
    let refused = statuses.iter().filter(|s| **s == StatusCode::CONFLICT).count();
    assert_eq!((created, refused), (3, 2), "{strategy}: {statuses:?}");
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.oversold, audit.ledger_drift), (3, 0, 0), "{audit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sales_run_as_a_redis_acl_user_limited_to_the_services_prefix() {
    let server = RedisServer::start_with(&["--requirepass", ADMIN_PASSWORD]).await;
    let prefix = test_support::unique_prefix();
    add_the_services_user(&server, &prefix).await;
    let url = format!("redis://seckill:{PASSWORD}@127.0.0.1:{}", server.port);
    let app = TestApp::spawn_with(move |config| {
        config.backends.redis_url = url;
        config.backends.redis_prefix = prefix;
    })
    .await;
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK, "{}", ready.text().await.unwrap());
    assert_sells_exactly_its_stock(&app, "redis-decr").await;
    assert_sells_exactly_its_stock(&app, "lock/watchdog").await;
    assert_sells_exactly_its_stock(&app, "lock/fenced").await;
    // Its script names the fair lock's line and waiters' deadlines besides
    // the lock: keys under the prefix too, which the ACL must let it name.
    assert_sells_exactly_its_stock(&app, "lock/fair").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_redis_password_is_a_503_and_shows_nowhere() {
    provoking("a Redis that refuses the service's password (503 misconfigured)");
    let server = RedisServer::start_with(&["--requirepass", ADMIN_PASSWORD]).await;
    let wrong = "a-wrong-redis-password-of-this-test";
    let log = std::env::temp_dir()
        .join(format!("wrong-redis-password-{}.log", uuid::Uuid::new_v4().simple()));
    let service = seckill_child(&[
        ("REDIS_URL", format!("redis://seckill:{wrong}@127.0.0.1:{}", server.port)),
        ("SECKILL_REDIS_PREFIX", test_support::unique_prefix()),
        ("RUST_LOG", "info,seckill=debug".to_owned()),
    ])
    .stderr_to(std::fs::File::create(&log).unwrap())
    .start()
    .await;
    let client = reqwest::Client::new();
    let body =
        serde_json::json!({ "name": "wrong password", "stock": 3, "strategy": "redis-decr" });
    let sale = crate::support::create_sale_at(&service.base, ADMIN_TOKEN, body).await;
    for (what, response) in [
        (
            "a purchase",
            client
                .post(format!("{}/sales/{sale}/orders", service.base))
                .json(&serde_json::json!({ "user_id": 1 }))
                .send()
                .await
                .unwrap(),
        ),
        ("/readyz", client.get(format!("{}/readyz", service.base)).send().await.unwrap()),
    ] {
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
        let body = response.text().await.unwrap();
        assert!(!body.contains(wrong), "{what}: {body}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["type"], "/problems/misconfigured", "{what}: {body}");
        assert_eq!(problem["backend"], "redis", "{what}: {body}");
    }
    drop(service);
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(!text.contains(wrong), "the log shows the password:\n{text}");
    // The cause, in Redis's words, for the operator.
    assert!(text.contains("Password authentication failed"), "the log names the cause:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_that_does_not_cover_the_services_prefix_is_a_503_misconfigured() {
    provoking("a Redis ACL that refuses the service's keys (NOPERM)");
    let server = RedisServer::start_with(&["--requirepass", ADMIN_PASSWORD]).await;
    // The user may touch the keys under another prefix only.
    add_the_services_user(&server, &test_support::unique_prefix()).await;
    let url = format!("redis://seckill:{PASSWORD}@127.0.0.1:{}", server.port);
    let app = TestApp::spawn_with(move |config| config.backends.redis_url = url).await;
    for strategy in ["redis-decr", "lock/watchdog", "lock/fenced", "lock/fair"] {
        let body = serde_json::json!({ "name": "narrow ACL", "stock": 3, "strategy": strategy });
        let sale = crate::support::create_sale_at(&app.base, ADMIN_TOKEN, body).await;
        for user in [1, 2] {
            let response = app.buy(sale, user).await;
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{strategy}");
            assert!(!response.headers().contains_key("retry-after"), "{strategy}");
            let problem: serde_json::Value = response.json().await.unwrap();
            assert_eq!(problem["type"], "/problems/misconfigured", "{strategy}: {problem}");
            assert_eq!(problem["backend"], "redis", "{strategy}: {problem}");
            assert!(problem["detail"].as_str().unwrap().contains("NOPERM"), "{problem}");
        }
        // Nothing written (the audit of a `redis-decr` sale needs Redis).
        let (orders, remaining): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM orders WHERE sale_id = $1), \
                    (SELECT remaining_stock FROM sales WHERE id = $1)",
        )
        .bind(sale)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!((orders, remaining), (0, 3), "{strategy}");
    }
}
