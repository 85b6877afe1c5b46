//! Liveness, readiness and the Prometheus metrics.

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::TestApp;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_route_and_purchase_outcomes_by_strategy() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql/for-update", 1).await;
    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
    assert_eq!(app.buy(sale, 2).await.status(), StatusCode::CONFLICT);

    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    let has = |name: &str, labels: &[&str]| {
        text.lines().any(|line| {
            line.starts_with(&format!("{name}{{")) && labels.iter().all(|l| line.contains(l))
        })
    };
    for outcome in ["placed", "sold_out"] {
        let labels = [r#"strategy="sql/for-update""#, &format!(r#"outcome="{outcome}""#)];
        assert!(has("seckill_purchase_outcomes_total", &labels), "{outcome} missing:\n{text}");
    }
    for status in ["201", "409"] {
        let labels = [
            r#"endpoint="/sales/{id}/orders""#,
            r#"method="POST""#,
            &format!(r#"status="{status}""#),
        ];
        assert!(has("axum_http_requests_total", &labels), "{status} missing:\n{text}");
    }
    assert!(has("axum_http_requests_duration_seconds_bucket", &[]), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_match_no_route_share_one_metrics_label() {
    let app = TestApp::spawn().await;
    let paths: Vec<String> =
        (0..3).map(|_| format!("/no-such-route-{}", uuid::Uuid::new_v4().simple())).collect();
    for path in &paths {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    let text = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for path in &paths {
        assert!(!text.contains(path.as_str()), "{path} became a label:\n{text}");
    }
    assert!(
        text.lines().any(|line| line.starts_with("axum_http_requests_total{")
            && line.contains(r#"endpoint="unmatched""#)
            && line.contains(r#"status="404""#)),
        "no unmatched series:\n{text}"
    );
}
