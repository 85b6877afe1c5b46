//! Liveness, readiness and the Prometheus metrics.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, TestApp, seckill_child};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_answers_200() {
    let app = TestApp::spawn().await;
    let response = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_200_while_postgres_is_reachable() {
    let app = TestApp::spawn().await;
    let response = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!((&body["status"], &body["postgres"]), (&Value::from("ready"), &Value::from("ok")));
}

/// The `/metrics` page of a service process of the test's own: its
/// recorder has seen this test's requests and no other test's.
pub(crate) async fn own_metrics_page(drive: impl AsyncFnOnce(&ServiceUnderTest)) -> String {
    let process = seckill_child(&[]).start().await;
    let service = ServiceUnderTest { base: process.base.clone(), client: reqwest::Client::new() };
    drive(&service).await;
    let url = format!("{}/metrics", service.base);
    let response = service.client.get(url).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

pub(crate) struct ServiceUnderTest {
    base: String,
    client: reqwest::Client,
}

impl ServiceUnderTest {
    async fn post(&self, path: &str, body: Value, admin: bool) -> reqwest::Response {
        let request = self.client.post(format!("{}{path}", self.base)).json(&body);
        let request = if admin { request.bearer_auth(ADMIN_TOKEN) } else { request };
        request.send().await.unwrap()
    }
}

/// The value of the series of `name` whose labels include every one of
/// `labels`; panics unless exactly one series matches.
fn series(page: &str, name: &str, labels: &[&str]) -> f64 {
    let matching: Vec<&str> = page
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .collect();
    assert_eq!(matching.len(), 1, "{name} {labels:?}:\n{page}");
    matching[0].rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_route_and_purchase_outcomes_by_strategy() {
    let page = own_metrics_page(async |service| {
        let sale = service
            .post(
                "/admin/sales",
                json!({ "name": "m", "stock": 1, "strategy": "sql/for-update" }),
                true,
            )
            .await;
        assert_eq!(sale.status(), StatusCode::CREATED);
        let sale = sale.json::<Value>().await.unwrap()["id"].as_i64().unwrap();
        let orders = format!("/sales/{sale}/orders");
        let first = service.post(&orders, json!({ "user_id": 1 }), false).await;
        assert_eq!(first.status(), StatusCode::CREATED);
        let second = service.post(&orders, json!({ "user_id": 2 }), false).await;
        assert_eq!(second.status(), StatusCode::CONFLICT);
    })
    .await;

    for outcome in ["placed", "sold_out"] {
        let labels = [r#"strategy="sql/for-update""#, &format!(r#"outcome="{outcome}""#)];
        assert_eq!(series(&page, "seckill_purchase_outcomes_total", &labels), 1.0, "{outcome}");
    }
    for status in ["201", "409"] {
        let labels = [
            r#"endpoint="/sales/{id}/orders""#,
            r#"method="POST""#,
            &format!(r#"status="{status}""#),
        ];
        assert_eq!(series(&page, "axum_http_requests_total", &labels), 1.0, "{status}");
    }
    let buckets = [r#"endpoint="/sales/{id}/orders""#, r#"status="201""#, r#"le="+Inf""#];
    assert_eq!(series(&page, "axum_http_requests_duration_seconds_bucket", &buckets), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_match_no_route_share_one_metrics_label() {
    let paths: Vec<String> =
        (0..3).map(|_| format!("/no-such-route-{}", uuid::Uuid::new_v4().simple())).collect();
    let page = own_metrics_page(async |service| {
        for path in &paths {
            let response = service.client.get(format!("{}{path}", service.base)).send().await;
            assert_eq!(response.unwrap().status(), StatusCode::NOT_FOUND);
        }
    })
    .await;

    for path in &paths {
        assert!(!page.contains(path.as_str()), "{path} became a label:\n{page}");
    }
    let unmatched = [r#"endpoint="unmatched""#, r#"method="GET""#, r#"status="404""#];
    assert_eq!(series(&page, "axum_http_requests_total", &unmatched), 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_the_main_address_ask_for_the_admin_token() {
    let app = TestApp::spawn().await;
    let url = app.url("/metrics");
    let anonymous = app.client.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.headers()["content-type"], "application/problem+json");
    let wrong = app.client.get(&url).bearer_auth("not-the-token").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
    let admin = app.client.get(&url).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(admin.status(), StatusCode::OK);
    assert!(admin.text().await.unwrap().contains("# TYPE"), "an exposition page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_address_serves_metrics_there_without_a_token_and_only_there() {
    let port = test_support::free_port();
    let env = [("SECKILL_METRICS_ADDR", format!("127.0.0.1:{port}"))];
    let process = seckill_child(&env).start().await;
    let client = reqwest::Client::new();
    // A request the page will count, on the main address.
    let main = client.get(format!("{}/metrics", process.base));
    let moved = main.bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(moved.status(), StatusCode::NOT_FOUND, "no /metrics on the main address");

    let private = format!("http://127.0.0.1:{port}");
    let page = client.get(format!("{private}/metrics")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let page = page.text().await.unwrap();
    // The refused request to the main address, in the same registry.
    let unmatched = [r#"endpoint="unmatched""#, r#"method="GET""#, r#"status="404""#];
    assert_eq!(series(&page, "axum_http_requests_total", &unmatched), 1.0);
    let other = client.get(format!("{private}/healthz")).send().await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND, "the metrics listener serves nothing else");
    assert_eq!(other.headers()["content-type"], "application/problem+json");
    let posted = client.post(format!("{private}/metrics")).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(posted.headers()["content-type"], "application/problem+json");
}
