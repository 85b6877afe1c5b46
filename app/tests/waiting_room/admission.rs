//! The purchase of a sale with a waiting room needs its buyer's own, valid,
//! unused admission; each refusal has a problem type of its own.

use std::time::Duration;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_needs_the_buyers_own_valid_admission_and_uses_it_up() {
    let app = TestApp::spawn().await;
    let body = json!({
        "name": "room", "stock": 5, "strategy": "sql", "payment_window_ms": 60_000,
        "waiting_room": { "admissions_per_s": 50 },
    });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    let mine = first_of_two_admitted(&app, sale).await;
    let (theirs, _) = until_called(&app, sale, 2, Duration::from_secs(10)).await;

    assert_refused(buy_with(&app, sale, 1, &Value::Null).await, "admission-required").await;
    let forged = json!("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl");
    assert_refused(buy_with(&app, sale, 1, &forged).await, "admission-refused").await;
    let swapped = buy_with(&app, sale, 1, admission_of(&theirs)).await;
    assert_refused(swapped, "admission-refused").await;

    let placed = buy_with(&app, sale, 1, admission_of(&mine)).await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let order: Value = placed.json().await.unwrap();
    // The order given back, the admission still does not buy again.
    let cancel = app.url(&format!("/orders/{}/cancel", order["order_id"]));
    let cancelled = app.client.post(cancel).json(&json!({ "user_id": 1 })).send().await.unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK, "{:?}", cancelled.text().await);
    assert_refused(buy_with(&app, sale, 1, admission_of(&mine)).await, "admission-refused").await;
    assert_eq!(app.audit(sale).await.units_sold, 0);

    // An admission sent to a sale without a room is refused, not ignored.
    let plain = app.sale("sql", 5).await;
    assert_refused(buy_with(&app, plain, 1, admission_of(&mine)).await, "admission-refused").await;
    let url = app.url(&format!("/sales/{plain}/line"));
    let no_room = app.client.post(url).json(&json!({ "user_id": 1 })).send().await.unwrap();
    assert_problem(no_room, StatusCode::NOT_FOUND, "not-found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_without_a_bound_or_with_one_out_of_range_is_refused_by_name() {
    let app = TestApp::spawn().await;
    for (room, field) in [
        (json!({}), "waiting_room"),
        (json!({ "admission_ttl_ms": 5000 }), "waiting_room"),
        (json!({ "concurrency": 0 }), "waiting_room.concurrency"),
        (json!({ "admissions_per_s": 1_000_001 }), "waiting_room.admissions_per_s"),
        (json!({ "concurrency": 3, "admission_ttl_ms": 99 }), "waiting_room.admission_ttl_ms"),
    ] {
        let body = json!({ "name": "room", "stock": 5, "strategy": "sql", "waiting_room": room });
        let response = app.try_create_sale(body).await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{room}");
        let problem: Value = response.json().await.unwrap();
        assert!(problem["detail"].as_str().unwrap().starts_with(field), "{room}: {problem}");
    }
}
