//! Requests the service cannot read get a problem document with the right
//! status and type, and never touch the stock.

use reqwest::StatusCode;
use reqwest::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use serde_json::json;

use crate::support::{ADMIN_TOKEN, TestApp, assert_problem};

/// `POST /sales/{sale}/orders` with a raw body and content type.
async fn post_raw(
    app: &TestApp,
    sale: i64,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    let mut request = app.client.post(app.url(&format!("/sales/{sale}/orders"))).body(body);
    if let Some(content_type) = content_type {
        request = request.header(CONTENT_TYPE, content_type);
    }
    request.send().await.unwrap()
}

async fn assert_untouched(app: &TestApp, sale: i64, stock: i64) {
    let audit = app.audit(sale).await;
    assert_eq!((audit.remaining_stock, audit.orders), (stock, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_400_problem() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    for body in [r#"{"user_id":"#, "not json", "", r#"{"user_id": 1} trailing"#] {
        let response = post_raw(&app, sale, Some("application/json"), body).await;
        assert_problem(response, StatusCode::BAD_REQUEST, "malformed-request").await;
    }
    assert_untouched(&app, sale, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn well_formed_json_with_a_wrong_or_missing_field_is_422() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    for body in [
        json!({ "user_id": "seven" }),
        json!({ "user_id": 1.5 }),
        json!({ "user_id": 1, "quantity": "two" }),
        json!({}),
        json!([1]),
        // Serde reads an array as a struct's fields in order: refused all the same.
        json!([1, 1]),
        json!([1, null]),
        json!({ "user_id": 1, "coupon": "FREE" }),
    ] {
        let response = app.order(sale, body).await;
        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    }
    assert_untouched(&app, sale, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_a_json_content_type_is_415() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    for content_type in [None, Some("text/plain"), Some("application/x-www-form-urlencoded")] {
        let response = post_raw(&app, sale, content_type, r#"{"user_id": 1}"#).await;
        assert_problem(response, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type")
            .await;
    }
    assert_untouched(&app, sale, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bodies_that_are_json_arrays_are_422() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    let create = app.try_create_sale(json!(["array sale", 5, "sql"])).await;
    assert_problem(create, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    let restock = app.restock(sale, json!([5])).await;
    assert_problem(restock, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.total_stock, audit.remaining_stock), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_a_content_encoding_is_415_and_never_read_as_plain() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    for coding in ["gzip", "br", "identity, gzip"] {
        // A plain body labelled compressed: reading it as plain would sell.
        let response = app
            .client
            .post(app.url(&format!("/sales/{sale}/orders")))
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_ENCODING, coding)
            .body(r#"{"user_id": 1}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()[ACCEPT_ENCODING], "identity", "{coding}");
        assert_problem(response, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-encoding").await;
    }
    assert_untouched(&app, sale, 1).await;
    let identity = app
        .client
        .post(app.url(&format!("/sales/{sale}/orders")))
        .header(CONTENT_ENCODING, "identity")
        .json(&json!({ "user_id": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(identity.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_404_echoes_the_path_it_was_given() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    let marker = "zz-echo-marker";
    let (get, post) = (reqwest::Method::GET, reqwest::Method::POST);
    let paths = [
        (&get, format!("/{marker}")),
        (&get, format!("/sales/{marker}")),
        (&post, format!("/sales/{marker}/orders")),
        (&get, format!("/sales/{marker}/requests/{marker}")),
        (&get, format!("/sales/{sale}/requests/{marker}")),
        (&get, format!("/sales/{sale}/requests/%FF{marker}")),
        (&get, format!("/admin/sales/{marker}/audit")),
    ];
    for (method, path) in paths {
        let request = app.client.request(method.clone(), app.url(&path)).bearer_auth(ADMIN_TOKEN);
        let response = request.json(&json!({ "user_id": 1 })).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        let body = response.text().await.unwrap();
        assert!(!body.contains(marker), "{path} echoed: {body}");
        assert!(body.contains("/problems/not-found"), "{path}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_size_limit_is_413() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    // Valid JSON, padded with whitespace past the 16 KiB limit.
    let body = format!(r#"{{"user_id": 1{}}}"#, " ".repeat(64 * 1024));
    // The server answers before reading the whole body and then closes the
    // connection; a client of its own keeps that connection out of the shared
    // pool, where the next request could pick it up just as it closes.
    let response = reqwest::Client::new()
        .post(app.url(&format!("/sales/{sale}/orders")))
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
    assert_untouched(&app, sale, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_route_is_404_problem() {
    let app = TestApp::spawn().await;
    for path in ["/nope", "/sales", "/sales/1/orders/2", "/admin"] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
    }
}
