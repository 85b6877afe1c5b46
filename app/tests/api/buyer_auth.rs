//! Buyer identity with buyer authentication on: the buyer is the `sub` of a
//! verified bearer token, never the body; a buyer sees only their own order.
//! (A queued request's result: `app/tests/queue/purchase.rs`.)

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    BUYER_KEY, TestApp, assert_problem, buyer_token, problem_type, with_buyer_auth,
};

/// `POST /sales/{sale}/orders` with `body` and, when given, `token`.
async fn order(app: &TestApp, sale: i64, token: Option<&str>, body: Value) -> reqwest::Response {
    let mut request = app.client.post(app.url(&format!("/sales/{sale}/orders"))).json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

/// `GET /sales/{sale}/buyers/{user}/order` with `token`.
async fn buyer_order(
    app: &TestApp,
    sale: i64,
    user: i64,
    token: Option<&str>,
) -> reqwest::Response {
    let mut request = app.client.get(app.url(&format!("/sales/{sale}/buyers/{user}/order")));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap()
}

/// Asserts a `401` that asks for a bearer token (`challenge`).
async fn assert_unauthorized(response: reqwest::Response, challenge: &str) {
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let header = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert_eq!(header, challenge);
    assert_eq!(problem_type(response).await, "/problems/unauthorized");
}

#[tokio::test]
async fn a_purchase_without_a_valid_buyer_token_is_401_and_sells_nothing() {
    let app = TestApp::spawn_with(with_buyer_auth).await;
    let sale = app.sale("sql", 10).await;
    assert_unauthorized(order(&app, sale, None, json!({ "user_id": 1 })).await, "Bearer").await;
    let invalid = r#"Bearer error="invalid_token""#;
    let now = seckill::buyer_token::now_s();
    let expired = seckill::buyer_token::mint_hs256(BUYER_KEY.as_bytes(), 1, now - 3600);
    assert_unauthorized(order(&app, sale, Some(&expired), json!({})).await, invalid).await;
    let other_key =
        seckill::buyer_token::mint_hs256(b"another-key-another-key-another-k", 1, now + 60);
    assert_unauthorized(order(&app, sale, Some(&other_key), json!({})).await, invalid).await;
    assert_unauthorized(order(&app, sale, Some("not.a.jwt"), json!({})).await, invalid).await;
    // The admin token is no buyer token.
    let admin = order(&app, sale, Some(crate::support::ADMIN_TOKEN), json!({})).await;
    assert_unauthorized(admin, invalid).await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.remaining_stock), (0, 10));
}

#[tokio::test]
async fn the_buyer_is_the_tokens_sub_and_a_body_naming_another_buyer_is_refused() {
    let app = TestApp::spawn_with(with_buyer_auth).await;
    let sale = app.sale("sql", 10).await;
    let token = buyer_token(1001);
    let placed = order(&app, sale, Some(&token), json!({})).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let body: Value = placed.json().await.unwrap();
    assert_eq!(body["user_id"], 1001);
    // Another buyer's id in the body: refused, not bought for them.
    let other = order(&app, sale, Some(&buyer_token(7)), json!({ "user_id": 1002 })).await;
    assert_problem(other, StatusCode::FORBIDDEN, "buyer-mismatch").await;
    // The same id as the token's is accepted.
    let same = order(&app, sale, Some(&buyer_token(1002)), json!({ "user_id": 1002 })).await;
    assert_eq!(same.status(), StatusCode::CREATED);
    let buyers: Vec<i64> =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1 ORDER BY user_id")
            .bind(sale)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(buyers, [1001, 1002]);
}

#[tokio::test]
async fn changing_the_body_user_id_does_not_get_round_the_per_user_limit() {
    let app = TestApp::spawn_with(with_buyer_auth).await;
    let sale = app.sale("sql", 10).await;
    let token = buyer_token(55);
    assert_eq!(order(&app, sale, Some(&token), json!({})).await.status(), StatusCode::CREATED);
    for forged in [56, 57, 58] {
        let again = order(&app, sale, Some(&token), json!({ "user_id": forged })).await;
        assert_eq!(again.status(), StatusCode::FORBIDDEN, "user_id {forged}");
    }
    let again = order(&app, sale, Some(&token), json!({})).await;
    assert_problem(again, StatusCode::CONFLICT, "already-purchased").await;
    assert_eq!(app.audit(sale).await.orders, 1);
}

#[tokio::test]
async fn a_buyer_cannot_read_another_buyers_order() {
    let app = TestApp::spawn_with(with_buyer_auth).await;
    let sale = app.sale("sql", 10).await;
    assert_eq!(order(&app, sale, Some(&buyer_token(1)), json!({})).await.status(), 201);
    let own = buyer_order(&app, sale, 1, Some(&buyer_token(1))).await;
    assert_eq!(own.status(), StatusCode::OK);
    assert_eq!(own.json::<Value>().await.unwrap()["user_id"], 1);
    // Buyer 2 asking for buyer 1's order gets what a buyer without an order
    // gets: 404, the same body.
    let other = buyer_order(&app, sale, 1, Some(&buyer_token(2))).await;
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    let other: Value = other.json().await.unwrap();
    let none = buyer_order(&app, sale, 2, Some(&buyer_token(2))).await;
    assert_eq!(none.status(), StatusCode::NOT_FOUND);
    assert_eq!(other, none.json::<Value>().await.unwrap());
    assert_unauthorized(buyer_order(&app, sale, 1, None).await, "Bearer").await;
}

/// `method /orders/{id}{action}` with `token`, and `body` when given.
async fn order_route(
    app: &TestApp,
    method: reqwest::Method,
    path: String,
    token: Option<&str>,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = app.client.request(method, app.url(&path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn only_the_buyer_may_see_pay_or_cancel_their_order() {
    use reqwest::Method;
    let app = TestApp::spawn_with(with_buyer_auth).await;
    let body = json!({ "name": "paid later", "stock": 2, "strategy": "sql",
                       "payment_window_ms": 600_000 });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    let placed = order(&app, sale, Some(&buyer_token(1)), json!({})).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let id = placed.json::<Value>().await.unwrap()["order_id"].as_i64().unwrap();
    let (own, other) = (buyer_token(1), buyer_token(2));
    let route = |action: &str| format!("/orders/{id}{action}");

    // Another buyer: 404 for every route, as for an order that does not
    // exist, and the order is untouched.
    for (method, action) in [(Method::GET, ""), (Method::POST, "/pay"), (Method::POST, "/cancel")] {
        let answer = order_route(&app, method.clone(), route(action), Some(&other), None).await;
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "{method} {action}");
        let anonymous = order_route(&app, method, route(action), None, None).await;
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "{action}");
    }
    // A body naming another buyer than the token's is refused.
    let named = Some(json!({ "user_id": 2 }));
    let mismatch = order_route(&app, Method::POST, route("/cancel"), Some(&own), named).await;
    assert_problem(mismatch, StatusCode::FORBIDDEN, "buyer-mismatch").await;
    let seen = order_route(&app, Method::GET, route(""), Some(&own), None).await;
    assert_eq!(seen.json::<Value>().await.unwrap()["status"], "pending_payment");

    // The buyer: sees it, and pays it.
    let paid = order_route(&app, Method::POST, route("/pay"), Some(&own), None).await;
    assert_eq!(paid.status(), StatusCode::OK);
    assert_eq!(paid.json::<Value>().await.unwrap()["status"], "paid");
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.remaining_stock), (1, 1));
}

#[tokio::test]
async fn with_buyer_auth_off_the_body_names_the_buyer_and_is_required() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 10).await;
    let missing = order(&app, sale, None, json!({ "quantity": 1 })).await;
    assert_problem(missing, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    assert_eq!(order(&app, sale, None, json!({ "user_id": 9 })).await.status(), 201);
    // Any order is readable by anyone: there is no buyer to check.
    assert_eq!(buyer_order(&app, sale, 9, None).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_document_declares_the_buyer_token_on_buyer_routes_only_when_it_is_on() {
    let on = TestApp::spawn_with(with_buyer_auth).await;
    let off = TestApp::spawn().await;
    let document = |app: TestApp| async move {
        let response = app.client.get(app.url("/openapi.json")).send().await.unwrap();
        response.json::<Value>().await.unwrap()
    };
    let (on, off) = (document(on).await, document(off).await);
    let buyer = json!([{ "buyer": [] }]);
    for (path, method) in [
        ("/sales/{id}/orders", "post"),
        ("/sales/{id}/buyers/{user_id}/order", "get"),
        ("/sales/{id}/requests/{request_id}", "get"),
    ] {
        let operation = &on["paths"][path][method];
        assert_eq!(operation["security"], buyer, "{method} {path}");
        assert!(operation["responses"].get("401").is_some(), "{method} {path}");
        assert!(off["paths"][path][method].get("security").is_none(), "{method} {path}");
    }
    assert!(on["paths"]["/sales/{id}"]["get"].get("security").is_none(), "the sale is public");
    assert_eq!(on["components"]["securitySchemes"]["buyer"]["bearerFormat"], "JWT");
    assert!(off["components"]["securitySchemes"].get("buyer").is_none());
}
