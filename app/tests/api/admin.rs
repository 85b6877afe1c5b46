//! Admin routes: the bearer token, validation of new sales, and restocks that
//! keep the ledger exact.

use chrono::{Duration, Utc};
use reqwest::StatusCode;
use reqwest::header::WWW_AUTHENTICATE;
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, TestApp, assert_problem, client_from, problem_type};

/// One request to each admin route, with `auth` applied to it.
async fn admin_requests(
    app: &TestApp,
    sale: i64,
    auth: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> Vec<reqwest::Response> {
    let c = &app.client;
    let new_sale = json!({ "name": "x", "stock": 1, "strategy": "sql" });
    let requests = [
        c.post(app.url("/admin/sales")).json(&new_sale),
        c.post(app.url(&format!("/admin/sales/{sale}/restock"))).json(&json!({ "units": 1 })),
        c.get(app.url(&format!("/admin/sales/{sale}/audit"))),
    ];
    let mut responses = Vec::new();
    for request in requests {
        responses.push(auth(request).send().await.unwrap());
    }
    responses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_without_a_bearer_token_are_401_with_www_authenticate() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    let schemes: [fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder; 3] = [
        |request| request,
        |request| request.basic_auth("admin", Some(ADMIN_TOKEN)),
        |request| request.header("authorization", ADMIN_TOKEN),
    ];
    for auth in schemes {
        for response in admin_requests(&app, sale, auth).await {
            assert_eq!(response.headers()[WWW_AUTHENTICATE], "Bearer");
            assert_problem(response, StatusCode::UNAUTHORIZED, "unauthorized").await;
        }
    }
    // Nothing was restocked.
    assert_eq!(app.audit(sale).await.total_stock, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_name_is_case_insensitive() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    for scheme in ["bearer", "BEARER"] {
        let response = app
            .client
            .get(app.url(&format!("/admin/sales/{sale}/audit")))
            .header("authorization", format!("{scheme} {ADMIN_TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{scheme}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_with_a_wrong_token_are_403() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    let wrong = format!("{ADMIN_TOKEN}x");
    for token in [wrong.as_str(), &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1], "dev-admin-token"] {
        for response in admin_requests(&app, sale, |request| request.bearer_auth(token)).await {
            assert_problem(response, StatusCode::FORBIDDEN, "forbidden").await;
        }
    }
    assert_eq!(app.audit(sale).await.total_stock, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_sent_ten_wrong_tokens_is_429_even_with_the_right_one() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    let audit = app.url(&format!("/admin/sales/{sale}/audit"));
    for attempt in 1..=10 {
        let response = app.client.get(&audit).bearer_auth(format!("guess-{attempt}")).send().await;
        assert_problem(response.unwrap(), StatusCode::FORBIDDEN, "forbidden").await;
    }
    // Guessing stops here: the right token is not even compared.
    let response = app.client.get(&audit).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    assert_problem(response, StatusCode::TOO_MANY_REQUESTS, "too-many-attempts").await;
    // The public routes are not affected.
    let sales = app.client.get(app.url(&format!("/sales/{sale}"))).send().await.unwrap();
    assert_eq!(sales.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_names_the_client_from_a_trusted_balancer_only() {
    // 127.0.0.2 plays the balancer; 127.0.0.3 a client that is not one.
    let app = TestApp::spawn_with(|config| {
        config.auth.trusted_proxies = vec!["127.0.0.2/32".parse().unwrap()];
    })
    .await;
    let sale = app.sale("sql", 1).await;
    let audit = app.url(&format!("/admin/sales/{sale}/audit"));
    let (balancer, stranger) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    let get = |client: &reqwest::Client, forwarded_for: &str, token: &str| {
        let request = client.get(&audit).bearer_auth(token);
        request.header("x-forwarded-for", forwarded_for).send()
    };
    // Through the balancer: ten wrong tokens from one client block that
    // client only, not the balancer's other clients.
    for attempt in 1..=10 {
        let response = get(&balancer, "198.51.100.1", &format!("guess-{attempt}")).await;
        assert_problem(response.unwrap(), StatusCode::FORBIDDEN, "forbidden").await;
    }
    let blocked = get(&balancer, "198.51.100.1", ADMIN_TOKEN).await.unwrap();
    assert_problem(blocked, StatusCode::TOO_MANY_REQUESTS, "too-many-attempts").await;
    let other = get(&balancer, "198.51.100.2", ADMIN_TOKEN).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "another client behind the balancer");
    // From a peer that is no balancer, the header is ignored: renaming
    // itself after each guess does not give it more.
    for attempt in 1..=10 {
        let response = get(&stranger, &format!("203.0.113.{attempt}"), "guess").await;
        assert_problem(response.unwrap(), StatusCode::FORBIDDEN, "forbidden").await;
    }
    let renamed = get(&stranger, "203.0.113.99", ADMIN_TOKEN).await.unwrap();
    assert_problem(renamed, StatusCode::TOO_MANY_REQUESTS, "too-many-attempts").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sale_is_201_with_its_settings_and_stock() {
    let app = TestApp::spawn().await;
    let starts_at = Utc::now() + Duration::hours(1);
    let sale = app
        .create_sale(json!({ "name": "  launch  ", "stock": 7, "strategy": "sql/for-update",
                             "per_user_limit": 2, "starts_at": starts_at }))
        .await;
    assert!(sale["id"].as_i64().is_some(), "{sale}");
    assert_eq!(sale["name"], "launch");
    assert_eq!(sale["strategy"], "sql/for-update");
    assert_eq!(sale["per_user_limit"], 2);
    assert_eq!((&sale["total_stock"], &sale["remaining_stock"]), (&json!(7), &json!(7)));
    let stored: chrono::DateTime<Utc> = serde_json::from_value(sale["starts_at"].clone()).unwrap();
    assert_eq!(stored.timestamp_micros(), starts_at.timestamp_micros());
    assert_eq!(sale["ends_at"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_sale_bodies_are_refused_with_422_and_create_nothing() {
    let app = TestApp::spawn().await;
    // A name no other test uses, so that "nothing created" can be counted.
    let name = format!("invalid {}", uuid::Uuid::new_v4());
    let now = Utc::now();
    let cases = [
        json!({ "name": name, "stock": 5, "strategy": "optimistic" }),
        json!({ "name": name, "stock": 5, "strategy": "SQL" }),
        json!({ "name": name, "stock": -1, "strategy": "sql" }),
        json!({ "name": name, "stock": 5, "strategy": "sql",
                "starts_at": now, "ends_at": now }),
        json!({ "name": name, "stock": 5, "strategy": "sql",
                "starts_at": now + Duration::hours(1), "ends_at": now }),
        json!({ "name": name, "stock": 5, "strategy": "sql", "per_user_limit": 0 }),
        json!({ "name": name, "stock": "5", "strategy": "sql" }),
        json!({ "name": name, "stock": 5 }),
        json!({ "name": name, "stock": 5, "strategy": "sql", "colour": "red" }),
        json!({ "name": name, "stock": 5, "strategy": "sql", "starts_at": "tomorrow" }),
        json!({ "name": "", "stock": 5, "strategy": "sql" }),
        json!({ "name": "   ", "stock": 5, "strategy": "sql" }),
        json!({ "name": "n".repeat(201), "stock": 5, "strategy": "sql" }),
        // Postgres cannot store these: refused as input, not a 500.
        json!({ "name": format!("{name}\u{0}"), "stock": 5, "strategy": "sql" }),
        json!({ "name": name, "stock": 5, "strategy": "sql",
                "ends_at": "-4714-11-23T00:00:00Z" }),
        json!({ "name": name, "stock": 5, "strategy": "sql",
                "starts_at": "2030-01-01T00:00:00.0000001Z",
                "ends_at": "2030-01-01T00:00:00.0000009Z" }),
    ];
    for body in cases {
        let response = app.try_create_sale(body.clone()).await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(problem_type(response).await, "/problems/invalid-field", "{body}");
    }
    let created: i64 = sqlx::query_scalar("SELECT count(*) FROM sales WHERE name = $1")
        .bind(&name)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(created, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_keeps_the_ledger_exact_and_its_units_sell() {
    let app = TestApp::spawn().await;
    for strategy in ["sql", "sql/for-update"] {
        let sale = app.sale(strategy, 5).await;
        let first = app.burst(sale, 1, 3).await;
        assert!(first.iter().all(|status| *status == StatusCode::CREATED), "{first:?}");

        let response = app.restock(sale, json!({ "units": 4 })).await;
        assert_eq!(response.status(), StatusCode::OK);
        let restocked: Value = response.json().await.unwrap();
        assert_eq!(restocked["id"], sale);
        assert_eq!(
            (&restocked["total_stock"], &restocked["remaining_stock"]),
            (&json!(9), &json!(6))
        );
        let audit = app.audit(sale).await;
        assert_eq!((audit.total_stock, audit.remaining_stock, audit.ledger_drift), (9, 6, 0));

        // Ten more buyers at once for the 6 units left: the restocked units sell.
        let second = app.burst(sale, 100, 10).await;
        let placed = second.iter().filter(|status| **status == StatusCode::CREATED).count();
        let sold_out = second.iter().filter(|status| **status == StatusCode::CONFLICT).count();
        assert_eq!((placed, sold_out), (6, 4), "{strategy}: {second:?}");

        let audit = app.audit(sale).await;
        assert_eq!(
            (audit.total_stock, audit.remaining_stock, audit.units_sold, audit.oversold),
            (9, 0, 9, 0),
            "{strategy}: {audit:?}"
        );
        assert_eq!(audit.total_stock, audit.remaining_stock + audit.units_sold);
        assert_eq!(audit.ledger_drift, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_of_an_unknown_sale_is_404() {
    let app = TestApp::spawn().await;
    let response = app.restock(i64::MAX, json!({ "units": 1 })).await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let response = app.restock("abc", json!({ "units": 1 })).await;
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    let response = app
        .client
        .get(app.url(&format!("/admin/sales/{}/audit", i64::MAX)))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_of_zero_or_negative_units_is_422_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 3).await;
    for body in [json!({ "units": 0 }), json!({ "units": -5 }), json!({ "units": "3" }), json!({})]
    {
        let response = app.restock(sale, body.clone()).await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(problem_type(response).await, "/problems/invalid-field", "{body}");
    }
    let audit = app.audit(sale).await;
    assert_eq!((audit.total_stock, audit.remaining_stock), (3, 3));
}
