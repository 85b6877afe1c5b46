//! The rules of one purchase, whatever the strategy: one order per user, the
//! per-user limit, the sale's time window, unknown sales, and what
//! `GET /sales/{id}` reports.

use chrono::{Duration, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{TestApp, assert_problem};

/// The strategies that keep their state in Postgres alone.
const STRATEGIES: [&str; 3] = ["naive", "sql", "sql/for-update"];

/// Asserts that sale `sale` still holds all its `stock` and has no order.
async fn assert_untouched(app: &TestApp, sale: i64, stock: i64) {
    let audit = app.audit(sale).await;
    assert_eq!((audit.remaining_stock, audit.orders, audit.ledger_drift), (stock, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_purchase_by_the_same_user_is_refused_and_leaves_the_stock_alone() {
    let app = TestApp::spawn().await;
    for strategy in STRATEGIES {
        let sale = app.sale(strategy, 5).await;
        let first = app.buy(sale, 7).await;
        assert_eq!(first.status(), StatusCode::CREATED, "{strategy}");
        let order: Value = first.json().await.unwrap();
        assert!(order["order_id"].as_i64().is_some(), "{order}");
        assert_eq!((&order["sale_id"], &order["user_id"]), (&json!(sale), &json!(7)));
        assert_eq!(order["quantity"], 1, "{order}");

        assert_problem(app.buy(sale, 7).await, StatusCode::CONFLICT, "already-purchased").await;

        assert_eq!(app.sale_status(sale).await["remaining_stock"], 4, "{strategy}");
        let audit = app.audit(sale).await;
        assert_eq!((audit.orders, audit.units_sold, audit.ledger_drift), (1, 1, 0), "{strategy}");
    }
}

/// The unique constraint, not a prior read, stops a user who sends many
/// requests at once: the losing transactions roll their decrement back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_purchases_by_one_user_place_one_order_and_take_one_unit() {
    let app = TestApp::spawn().await;
    for strategy in ["sql", "sql/for-update"] {
        let sale = app.sale(strategy, 10).await;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let client = app.client.clone();
            let url = app.url(&format!("/sales/{sale}/orders"));
            tasks.spawn(async move {
                let response = client.post(url).json(&json!({ "user_id": 42 })).send().await;
                let response = response.unwrap();
                let status = response.status();
                let body: Value = response.json().await.unwrap();
                (status, body["type"].as_str().map(str::to_owned))
            });
        }
        let answers = tasks.join_all().await;
        let placed = answers.iter().filter(|(status, _)| *status == StatusCode::CREATED).count();
        let refused = answers
            .iter()
            .filter(|(status, kind)| {
                *status == StatusCode::CONFLICT
                    && kind.as_deref() == Some("/problems/already-purchased")
            })
            .count();
        assert_eq!((placed, refused), (1, 19), "{strategy}: {answers:?}");
        let audit = app.audit(sale).await;
        assert_eq!(
            (audit.orders, audit.remaining_stock, audit.ledger_drift, audit.duplicate_orders),
            (1, 9, 0, 0),
            "{strategy}: {audit:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantities_outside_one_to_the_per_user_limit_are_refused_with_422() {
    let app = TestApp::spawn().await;
    for strategy in STRATEGIES {
        let sale = app
            .create_sale(json!({ "name": "limit 2", "stock": 10, "strategy": strategy,
                                 "per_user_limit": 2 }))
            .await["id"]
            .as_i64()
            .unwrap();
        for quantity in [3, 0, -1, i64::from(i32::MAX) + 1, i64::MAX] {
            let response = app.order(sale, json!({ "user_id": 1, "quantity": quantity })).await;
            assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
        }
        assert_untouched(&app, sale, 10).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_user_id_is_refused_with_422() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 3).await;
    for user in [-1, i64::MIN] {
        let response = app.order(sale, json!({ "user_id": user })).await;
        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    }
    assert_untouched(&app, sale, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_user_limit_of_3_lets_one_order_take_2_units() {
    let app = TestApp::spawn().await;
    for strategy in STRATEGIES {
        let sale = app
            .create_sale(json!({ "name": "limit 3", "stock": 10, "strategy": strategy,
                                 "per_user_limit": 3 }))
            .await["id"]
            .as_i64()
            .unwrap();
        let response = app.order(sale, json!({ "user_id": 5, "quantity": 2 })).await;
        assert_eq!(response.status(), StatusCode::CREATED, "{strategy}");
        let order: Value = response.json().await.unwrap();
        assert_eq!(order["quantity"], 2, "{order}");
        // The limit caps one order; it does not open a second one.
        let again = app.order(sale, json!({ "user_id": 5, "quantity": 1 })).await;
        assert_problem(again, StatusCode::CONFLICT, "already-purchased").await;

        let audit = app.audit(sale).await;
        assert_eq!(
            (audit.orders, audit.units_sold, audit.remaining_stock, audit.ledger_drift),
            (1, 2, 8, 0),
            "{strategy}: {audit:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_larger_than_the_remaining_stock_is_sold_out_and_takes_nothing() {
    let app = TestApp::spawn().await;
    for strategy in STRATEGIES {
        let sale = app
            .create_sale(json!({ "name": "short", "stock": 2, "strategy": strategy,
                                 "per_user_limit": 3 }))
            .await["id"]
            .as_i64()
            .unwrap();
        let response = app.order(sale, json!({ "user_id": 1, "quantity": 3 })).await;
        assert_problem(response, StatusCode::CONFLICT, "sold-out").await;
        assert_untouched(&app, sale, 2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_before_starts_at_are_refused_as_not_started() {
    let app = TestApp::spawn().await;
    let now = Utc::now();
    for strategy in STRATEGIES {
        let sale = app
            .create_sale(json!({ "name": "later", "stock": 4, "strategy": strategy,
                                 "starts_at": now + Duration::hours(1),
                                 "ends_at": now + Duration::hours(2) }))
            .await["id"]
            .as_i64()
            .unwrap();
        assert_problem(app.buy(sale, 1).await, StatusCode::CONFLICT, "not-started").await;
        assert_eq!(app.sale_status(sale).await["status"], "not_started");
        assert_untouched(&app, sale, 4).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_after_ends_at_are_refused_as_ended() {
    let app = TestApp::spawn().await;
    let now = Utc::now();
    for strategy in STRATEGIES {
        let sale = app
            .create_sale(json!({ "name": "over", "stock": 4, "strategy": strategy,
                                 "starts_at": now - Duration::hours(2),
                                 "ends_at": now - Duration::hours(1) }))
            .await["id"]
            .as_i64()
            .unwrap();
        assert_problem(app.buy(sale, 1).await, StatusCode::CONFLICT, "ended").await;
        assert_eq!(app.sale_status(sale).await["status"], "ended");
        assert_untouched(&app, sale, 4).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_inside_its_window_sells() {
    let app = TestApp::spawn().await;
    let now = Utc::now();
    let sale = app
        .create_sale(json!({ "name": "now", "stock": 4, "strategy": "sql",
                             "starts_at": now - Duration::hours(1),
                             "ends_at": now + Duration::hours(1) }))
        .await["id"]
        .as_i64()
        .unwrap();
    assert_eq!(app.sale_status(sale).await["status"], "open");
    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_sale_is_404() {
    let app = TestApp::spawn().await;
    let unknown = i64::MAX;
    assert_problem(app.buy(unknown, 1).await, StatusCode::NOT_FOUND, "not-found").await;
    assert_problem(app.get_sale(unknown).await, StatusCode::NOT_FOUND, "not-found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_id_that_is_not_a_64_bit_integer_is_404() {
    let app = TestApp::spawn().await;
    for id in ["abc", "1.5", "99999999999999999999"] {
        let response = app.order(id, json!({ "user_id": 1 })).await;
        assert_problem(response, StatusCode::NOT_FOUND, "not-found").await;
        assert_problem(app.get_sale(id).await, StatusCode::NOT_FOUND, "not-found").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_sale_shows_the_remaining_stock_and_status() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 2).await;
    let status = app.sale_status(sale).await;
    assert_eq!(status["id"], sale);
    assert_eq!(status["strategy"], "sql");
    assert_eq!(status["per_user_limit"], 1);
    assert_eq!((&status["total_stock"], &status["remaining_stock"]), (&json!(2), &json!(2)));
    assert_eq!(status["status"], "open");

    assert_eq!(app.buy(sale, 1).await.status(), StatusCode::CREATED);
    let status = app.sale_status(sale).await;
    assert_eq!((&status["remaining_stock"], &status["status"]), (&json!(1), &json!("open")));

    assert_eq!(app.buy(sale, 2).await.status(), StatusCode::CREATED);
    let status = app.sale_status(sale).await;
    assert_eq!((&status["remaining_stock"], &status["status"]), (&json!(0), &json!("sold_out")));
    assert_problem(app.buy(sale, 3).await, StatusCode::CONFLICT, "sold-out").await;

    let empty = app.sale("sql", 0).await;
    assert_eq!(app.sale_status(empty).await["status"], "sold_out");
}
