//! One order through its lifecycle: paid, cancelled, expired; the answers
//! each state gives; a buyer buying again after their order ended.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{
    bought, cancel, order, order_action, pay, pay_pending, reaches, remaining, window_sale,
};
use crate::support::{TestApp, assert_problem};

#[tokio::test]
async fn an_order_of_a_sale_without_a_payment_window_is_paid_when_placed_and_final() {
    let app = TestApp::spawn().await;
    let sale = app.sale("sql", 2).await;
    let id = bought(&app, sale, 1).await;
    let shown = order(&app, id).await;
    assert_eq!(shown["status"], "paid");
    assert_eq!(shown["expires_at"], Value::Null);
    assert_problem(cancel(&app, id).await, StatusCode::CONFLICT, "order-paid").await;
    assert_eq!(pay(&app, id, None).await.status(), StatusCode::OK);
    assert_eq!(remaining(&app.db, sale).await, 1);
}

#[tokio::test]
async fn a_payment_within_the_window_is_idempotent_under_its_key() {
    let app = TestApp::spawn().await;
    let sale = window_sale(&app, "sql", 2, 60_000).await;
    let id = bought(&app, sale, 1).await;
    let pending = order(&app, id).await;
    assert_eq!(pending["status"], "pending_payment");
    assert!(pending["expires_at"].is_string(), "{pending}");

    let first = pay(&app, id, Some("pay-1")).await;
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["status"], "paid");
    let again: Value = pay(&app, id, Some("pay-1")).await.json().await.unwrap();
    assert_eq!(again, first, "the same key gets the same answer");
    assert_eq!(pay(&app, id, None).await.status(), StatusCode::OK);
    let other = pay(&app, id, Some("pay-2")).await;
    assert_problem(other, StatusCode::CONFLICT, "paid-under-another-key").await;
    assert_problem(cancel(&app, id).await, StatusCode::CONFLICT, "order-paid").await;

    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.units_pending, audit.units_returned), (1, 0, 0));
    assert_eq!((audit.remaining_stock, audit.ledger_drift), (1, 0));
}

#[tokio::test]
async fn a_cancelled_order_returns_its_unit_once_and_its_buyer_may_buy_again() {
    let app = TestApp::spawn().await;
    let sale = window_sale(&app, "sql", 1, 60_000).await;
    let id = bought(&app, sale, 1).await;
    assert_problem(app.buy(sale, 2).await, StatusCode::CONFLICT, "sold-out").await;
    let again = app.buy(sale, 1).await.status();
    assert_eq!(again, StatusCode::CONFLICT, "a buyer with a live order buys nothing more");

    let cancelled = cancel(&app, id).await;
    assert_eq!(cancelled.status(), StatusCode::OK);
    let cancelled: Value = cancelled.json().await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["ended_at"].is_string());
    // Cancelling again changes nothing: the unit came back once.
    assert_eq!(cancel(&app, id).await.status(), StatusCode::OK);
    assert_eq!(remaining(&app.db, sale).await, 1);
    assert_problem(pay(&app, id, None).await, StatusCode::CONFLICT, "order-cancelled").await;

    let again = bought(&app, sale, 1).await;
    assert_ne!(again, id);
    assert_problem(app.buy(sale, 2).await, StatusCode::CONFLICT, "sold-out").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.orders, audit.units_sold, audit.units_pending), (1, 1, 1));
    assert_eq!((audit.units_returned, audit.units_resold), (1, 1));
    assert_eq!((audit.remaining_stock, audit.ledger_drift, audit.oversold), (0, 0, 0));
    pay_pending(&app, sale).await;
}

#[tokio::test]
async fn an_unpaid_order_expires_and_its_unit_sells_again_to_anyone_even_its_buyer() {
    let app = TestApp::spawn_with(|config| config.lifecycle.expiry_sweep_interval_ms = 100).await;
    let sale = window_sale(&app, "sql", 1, 300).await;
    let id = bought(&app, sale, 1).await;
    assert_problem(app.buy(sale, 2).await, StatusCode::CONFLICT, "sold-out").await;
    assert!(reaches(&app.db, id, "expired", Duration::from_secs(5)).await, "the sweep expired it");
    assert_eq!(remaining(&app.db, sale).await, 1);
    assert_problem(pay(&app, id, None).await, StatusCode::CONFLICT, "order-expired").await;
    assert_problem(cancel(&app, id).await, StatusCode::CONFLICT, "order-expired").await;

    // Its buyer buys again, and that order expires too; then another buyer.
    let second = bought(&app, sale, 1).await;
    assert!(reaches(&app.db, second, "expired", Duration::from_secs(5)).await);
    let third = bought(&app, sale, 2).await;
    assert_eq!(pay(&app, third, Some("k")).await.status(), StatusCode::OK);
    let audit = app.audit(sale).await;
    // The one unit was sold three times: twice again after it came back.
    assert_eq!((audit.units_sold, audit.units_returned, audit.units_resold), (1, 2, 2));
    assert_eq!((audit.remaining_stock, audit.ledger_drift, audit.oversold), (0, 0, 0));
}

#[tokio::test]
async fn a_payment_after_the_window_is_refused_even_before_any_sweep() {
    let app = TestApp::spawn_with(|config| config.lifecycle.expiry_sweep_interval_ms = 0).await;
    let sale = window_sale(&app, "sql", 1, 200).await;
    let id = bought(&app, sale, 1).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_problem(pay(&app, id, None).await, StatusCode::CONFLICT, "order-expired").await;
    // Refused by expiring it: the unit is back at once.
    assert_eq!(order(&app, id).await["status"], "expired");
    assert_eq!(remaining(&app.db, sale).await, 1);
}

#[tokio::test]
async fn a_named_buyer_may_act_only_on_their_own_order() {
    let app = TestApp::spawn().await;
    let sale = window_sale(&app, "sql", 1, 60_000).await;
    let id = bought(&app, sale, 7).await;
    let other = order_action(&app, id, "cancel", json!({ "user_id": 8 }), None).await;
    assert_problem(other, StatusCode::NOT_FOUND, "not-found").await;
    let other = order_action(&app, id, "pay", json!({ "user_id": 8 }), None).await;
    assert_problem(other, StatusCode::NOT_FOUND, "not-found").await;
    let own = order_action(&app, id, "pay", json!({ "user_id": 7 }), None).await;
    assert_eq!(own.status(), StatusCode::OK);
}

#[tokio::test]
async fn bad_windows_keys_and_ids_are_refused_with_problems() {
    let app = TestApp::spawn().await;
    for window in [json!(0), json!(-1), json!(604_800_001), json!("soon"), json!(1.5)] {
        let body =
            json!({ "name": "w", "stock": 1, "strategy": "sql", "payment_window_ms": window });
        let refused = app.try_create_sale(body).await;
        assert_problem(refused, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    }

    let sale = window_sale(&app, "sql", 1, 60_000).await;
    let id = bought(&app, sale, 1).await;
    let long_key = "k".repeat(256);
    for key in ["", "with space", long_key.as_str()] {
        let refused = pay(&app, id, Some(key)).await;
        assert_problem(refused, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    }
    let missing = app.client.get(app.url("/orders/9223372036854775807")).send().await.unwrap();
    assert_problem(missing, StatusCode::NOT_FOUND, "not-found").await;
    let not_an_id = app.client.post(app.url("/orders/abc/pay")).send().await.unwrap();
    assert_problem(not_an_id, StatusCode::NOT_FOUND, "not-found").await;
    assert_eq!(order(&app, id).await["status"], "pending_payment");
    pay_pending(&app, sale).await;
}
