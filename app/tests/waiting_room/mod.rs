//! The waiting room (`seckill::waiting_room`, docs/waiting-room.md) against
//! real Postgres and Redis: buyers admitted in arrival order across two
//! instances, one place per buyer, an unused admission whose permit comes
//! back, sold-out told to the whole line, purchases refused without a
//! valid admission or with a used one, and a Redis restarted empty.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{TestApp, assert_problem};

mod admission;
mod attacks;
mod line;
mod restart;
mod round_trips;

/// Two instances of the service sharing one Redis key prefix, so one line
/// and one admitter lock: a room as two replicas serve it.
async fn two_instances() -> (TestApp, TestApp) {
    let prefix = test_support::unique_prefix();
    let shared =
        |config: &mut seckill::config::Config| config.backends.redis_prefix = prefix.clone();
    (TestApp::spawn_with(shared).await, TestApp::spawn_with(shared).await)
}

/// Creates a `strategy` sale of `stock` units with the waiting room `room`;
/// returns its id.
async fn room_sale(app: &TestApp, strategy: &str, stock: i64, room: Value) -> i64 {
    let body =
        json!({ "name": "room", "stock": stock, "strategy": strategy, "waiting_room": room });
    app.create_sale(body).await["id"].as_i64().unwrap()
}

/// `POST /sales/{sale}/line` for `user`: the place (panics unless `200`).
async fn join(app: &TestApp, sale: i64, user: i64) -> Value {
    let url = app.url(&format!("/sales/{sale}/line"));
    let response = app.client.post(url).json(&json!({ "user_id": user })).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

/// `GET /sales/{sale}/line/{user}`: the status and the body.
async fn look(app: &TestApp, sale: i64, user: i64) -> (StatusCode, Value) {
    let url = app.url(&format!("/sales/{sale}/line/{user}"));
    let response = app.client.get(url).send().await.unwrap();
    (response.status(), response.json().await.unwrap_or(Value::Null))
}

/// Looks at `user`'s place every 20 ms until it is no longer `waiting`
/// (panics after `within`): the place, and when it was first seen.
async fn until_called(app: &TestApp, sale: i64, user: i64, within: Duration) -> (Value, Instant) {
    let deadline = Instant::now() + within;
    loop {
        let (status, place) = look(app, sale, user).await;
        assert_eq!(status, StatusCode::OK, "{place}");
        if place["state"] != "waiting" {
            return (place, Instant::now());
        }
        assert!(Instant::now() < deadline, "buyer {user} still waiting: {place}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Buyers 1 and 2 join `sale`'s line, in that order; buyer 1's place once
/// admitted (buyer 2 then waits behind it).
async fn first_of_two_admitted(app: &TestApp, sale: i64) -> Value {
    join(app, sale, 1).await;
    join(app, sale, 2).await;
    until_called(app, sale, 1, Duration::from_secs(10)).await.0
}

/// `user` buys one unit of `sale` with `admission` (none: `null`).
async fn buy_with(app: &TestApp, sale: i64, user: i64, admission: &Value) -> reqwest::Response {
    app.order(sale, json!({ "user_id": user, "admission": admission })).await
}

/// The admission of an `admitted` place.
fn admission_of(place: &Value) -> &Value {
    assert_eq!(place["state"], "admitted", "{place}");
    &place["admission"]
}

/// The end of an `admitted` place's admission.
fn expires_at(place: &Value) -> chrono::DateTime<chrono::Utc> {
    place["expires_at"].as_str().unwrap().parse().unwrap()
}

async fn assert_refused(response: reqwest::Response, kind: &str) {
    assert_problem(response, StatusCode::FORBIDDEN, kind).await;
}
