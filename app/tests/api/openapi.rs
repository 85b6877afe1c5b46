//! `GET /openapi.json` against the live service: an OpenAPI 3.1 document
//! whose every path answers exactly the methods it lists (the paths
//! themselves are compared with the router's in `seckill::http`'s unit
//! tests), and whose documented limits are the ones the service enforces.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, TestApp};

/// `template` with its path parameters filled in: a sale id, a request id.
fn concrete(template: &str, sale: i64) -> String {
    template
        .replace("{id}", &sale.to_string())
        .replace("{request_id}", "00000000-0000-0000-0000-000000000000")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_path_answers_exactly_its_documented_methods() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 1).await;
    let response = app.client.get(app.url("/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    let document: Value = response.json().await.unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.len() >= 13, "{:?}", paths.keys());
    let methods = [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH];
    for (template, item) in paths {
        let url = app.url(&concrete(template, sale));
        for method in &methods {
            let documented = item.get(method.as_str().to_lowercase()).is_some();
            // Admin token and an empty object body: enough to get past the
            // method check (the body is not sold anything: user 0 of an
            // empty, already-tried sale is refused or placed, never 405).
            let answer = app
                .client
                .request(method.clone(), &url)
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = answer.status();
            if documented {
                assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {template}");
                let body = answer.text().await.unwrap();
                assert!(!body.contains("no such route"), "{method} {template}: {body}");
            } else {
                assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {template}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_limits_are_the_enforced_ones() {
    let app = TestApp::spawn().await;
    let document: Value =
        app.client.get(app.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let new_sale = &document["components"]["schemas"]["NewSale"]["properties"];
    assert_eq!(new_sale["per_user_limit"]["maximum"], 1_000_000);
    assert_eq!(new_sale["stock"]["maximum"], 1_000_000_000_000_i64);
    let limit = new_sale["per_user_limit"]["maximum"].as_i64().unwrap();
    let create = |per_user_limit: i64| {
        app.try_create_sale(json!({ "name": "limits", "stock": 1, "strategy": "sql",
                                    "per_user_limit": per_user_limit }))
    };
    assert_eq!(create(limit).await.status(), StatusCode::CREATED);
    assert_eq!(create(limit + 1).await.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // The documented time range, years 1 to 9999, is accepted to its edges.
    let edges = json!({ "name": "edges", "stock": 1, "strategy": "sql",
                        "starts_at": "0001-01-01T00:00:00Z",
                        "ends_at": "9999-12-31T23:59:59.999999Z" });
    let created = app.try_create_sale(edges).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let sale: Value = created.json().await.unwrap();
    assert_eq!(sale["starts_at"], "0001-01-01T00:00:00Z");
    assert_eq!(sale["ends_at"], "9999-12-31T23:59:59.999999Z");
}
