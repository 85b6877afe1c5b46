//! Adversarial tests of the waiting room: each pins one guarantee, and its
//! assertion message says what a breach looks like. The first group covers
//! the room's edges (oversize, slow and cut-off purchases, a sold-out spell,
//! the sale's end, a paused leader, the settings, the pace); the second,
//! contention and failure.

use std::time::Duration;

use super::*;
use crate::support::hold_sale_row;

/// `(status, body)` of `POST /sales/{sale}/orders` with `body`.
async fn order(app: &TestApp, sale: i64, body: Value) -> (StatusCode, Value) {
    let response = app.order(sale, body).await;
    (response.status(), response.json().await.unwrap_or(Value::Null))
}

/// A connection to the test Redis, for reading a room's keys.
async fn redis_conn() -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(test_support::redis_url()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

// ---- The room's edges ---------------------------------------------------------

/// An order larger than the stock left is answered `sold-out` while the sale
/// stays open for smaller orders
/// (`support::assert_an_oversize_order_leaves_the_sale_open`), and behind a
/// room the line stays open too: while 3 units remain, waiting buyers are not
/// told `sold_out` and a newcomer gets a place. `served` marks the sale sold
/// out only for a one-unit purchase answered `sold-out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_order_does_not_close_the_line_while_units_remain() {
    let app = TestApp::spawn().await;
    let body = json!({ "name": "room", "stock": 3, "strategy": "sql", "per_user_limit": 5,
                       "waiting_room": { "concurrency": 1 } });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    for user in 1..=3 {
        join(&app, sale, user).await;
    }
    let (first, _) = until_called(&app, sale, 1, Duration::from_secs(10)).await;
    let body = json!({ "user_id": 1, "quantity": 5, "admission": admission_of(&first) });
    let (status, problem) = order(&app, sale, body).await;
    assert_eq!(
        (status, problem["type"].as_str()),
        (StatusCode::CONFLICT, Some("/problems/sold-out"))
    );
    let status = app.sale_status(sale).await;
    assert_eq!(
        (status["status"].as_str(), status["remaining_stock"].as_i64()),
        (Some("open"), Some(3))
    );

    for user in 2..=3 {
        let (_, place) = look(&app, sale, user).await;
        assert_ne!(place["state"], "sold_out", "buyer {user} told sold out while 3 units remain");
    }
    let newcomer = join(&app, sale, 4).await;
    assert_ne!(newcomer["state"], "sold_out", "a newcomer refused a place while 3 units remain");
}

/// A purchase still running after its admission's end (here: queued behind a
/// row lock) still holds its permit: with `concurrency: 1` and 1 unit, the
/// next buyer waits until it is served, and nobody is admitted to a unit
/// that is spoken for. `admit` renews the permit, as the purchase starts, for
/// as long as a purchase may run (the request timeout) plus `PERMIT_SLACK`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_that_outlives_its_admission_still_counts_against_the_bound_and_the_stock() {
    let app = TestApp::spawn().await;
    let room = json!({ "concurrency": 1, "admission_ttl_ms": 1000 });
    let sale = room_sale(&app, "sql", 1, room).await;
    let first = first_of_two_admitted(&app, sale).await;

    let holder = hold_sale_row(&app.db, sale).await;
    let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
    let body = json!({ "user_id": 1, "admission": admission_of(&first) });
    let buying = tokio::spawn(async move { client.post(url).json(&body).send().await.unwrap() });
    // Past the admission's end and its permit's slack, with time for a round.
    let end = expires_at(&first);
    let wait = (end - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(700)).await;

    let (_, place) = look(&app, sale, 2).await;
    assert!(!buying.is_finished(), "buyer 1's purchase is still queued behind the row lock");
    let verdict = place["state"].clone();
    drop(holder);
    let placed = buying.await.unwrap();
    assert_eq!(placed.status(), StatusCode::CREATED);
    assert_eq!(
        verdict, "waiting",
        "buyer 2 was admitted while buyer 1's purchase was not yet served (concurrency 1, \
         stock 1): {place}"
    );
}

/// Every look counts as the buyer still being there (docs/api.md), also while
/// the sale is marked sold out: a buyer who keeps looking through a sold-out
/// spell of more than 10 s (`LEFT_AFTER`) keeps the place for when a
/// cancelled order reopens the line. `place.lua` records the look before it
/// answers `sold_out`. Read here in `room:seen` directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_while_the_sale_is_marked_sold_out_still_counts_as_being_there() {
    let prefix = test_support::unique_prefix();
    let shared = prefix.clone();
    let app = TestApp::spawn_with(move |config| config.backends.redis_prefix = shared).await;
    let body = json!({ "name": "room", "stock": 1, "strategy": "sql", "payment_window_ms": 60_000,
                       "waiting_room": { "concurrency": 1 } });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    let first = first_of_two_admitted(&app, sale).await;
    assert_eq!(buy_with(&app, sale, 1, admission_of(&first)).await.status(), StatusCode::CREATED);
    let (told, _) = until_called(&app, sale, 2, Duration::from_secs(5)).await;
    assert_eq!(told["state"], "sold_out");

    let seen_key = format!("{prefix}:{{sale:{sale}}}:room:seen");
    let mut redis = redis_conn().await;
    let seen = |redis: &mut redis::aio::MultiplexedConnection| {
        let key = seen_key.clone();
        let mut redis = redis.clone();
        async move {
            redis::cmd("ZSCORE")
                .arg(key)
                .arg(2)
                .query_async::<Option<f64>>(&mut redis)
                .await
                .unwrap()
        }
    };
    let before = seen(&mut redis).await.expect("buyer 2 still has a place in the line");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(look(&app, sale, 2).await.1["state"], "sold_out");
    let after = seen(&mut redis).await.expect("buyer 2 still has a place in the line");
    assert!(
        after >= before + 400.0,
        "a look during the sold-out mark was not recorded (seen {before} → {after}): a buyer \
         who keeps looking is dropped as gone once the line reopens"
    );
}

/// After `ends_at` a buyer already in line learns that the sale is over: a
/// look is `409 ended`, as a join is, not `waiting` for ever behind an
/// admitter that has stopped. `place` checks the sale's phase before it reads
/// the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_buyer_is_told_when_the_sale_ends() {
    let app = TestApp::spawn().await;
    let ends_at = chrono::Utc::now() + chrono::TimeDelta::milliseconds(1500);
    let body = json!({ "name": "room", "stock": 5, "strategy": "sql", "ends_at": ends_at,
                       "waiting_room": { "concurrency": 1 } });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    join(&app, sale, 1).await;
    join(&app, sale, 2).await;
    until_called(&app, sale, 1, Duration::from_secs(10)).await;
    let wait = (ends_at - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(300)).await;

    let url = app.url(&format!("/sales/{sale}/line"));
    let joined = app.client.post(url).json(&json!({ "user_id": 3 })).send().await.unwrap();
    assert_problem(joined, StatusCode::CONFLICT, "ended").await;
    let (status, place) = look(&app, sale, 2).await;
    assert!(
        !(status == StatusCode::OK && place["state"] == "waiting"),
        "after the sale ended, a waiting buyer is still told to wait (a join answers 409 ended): \
         {status} {place}"
    );
}

/// A purchase answered `504 timeout` may have had its effect, and docs/api.md
/// says to retry it: "a purchase already placed answers 409
/// already-purchased". Behind a room that holds too: the retry with the same
/// admission, used by the first try, is `201` or `409 already-purchased`, not
/// `403 admission-refused`. A used admission (`RoomError::AdmissionUsed`) is
/// answered `already-purchased` when the buyer holds a live order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_answered_504_can_be_retried_with_its_admission() {
    let app = TestApp::spawn_with(|config| config.http.request_timeout_ms = 500).await;
    let sale = room_sale(&app, "sql", 5, json!({ "concurrency": 1 })).await;
    join(&app, sale, 1).await;
    let (place, _) = until_called(&app, sale, 1, Duration::from_secs(10)).await;

    let holder = hold_sale_row(&app.db, sale).await;
    let (status, problem) =
        order(&app, sale, json!({ "user_id": 1, "admission": admission_of(&place) })).await;
    assert_eq!(
        (status, problem["type"].as_str()),
        (StatusCode::GATEWAY_TIMEOUT, Some("/problems/timeout"))
    );
    drop(holder);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let (status, answer) =
        order(&app, sale, json!({ "user_id": 1, "admission": admission_of(&place) })).await;
    let retried_ok = status == StatusCode::CREATED
        || (status == StatusCode::CONFLICT && answer["type"] == "/problems/already-purchased");
    let sold = app.audit(sale).await.units_sold;
    assert!(retried_ok, "the retry after a 504 was answered {status} {answer} ({sold} sold)");
}

/// A purchase whose request future is dropped (the request timeout here; a
/// client that hangs up does the same) gives its permit back when it ends,
/// not when the admission's lease does: with `concurrency: 1` the next buyer
/// is admitted within 2 s. Its `Pass`, dropped before `served`, gives the
/// permit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_cut_off_by_the_request_timeout_gives_its_permit_back_when_it_ends() {
    let app = TestApp::spawn_with(|config| config.http.request_timeout_ms = 500).await;
    let room = json!({ "concurrency": 1, "admission_ttl_ms": 8000 });
    let sale = room_sale(&app, "sql", 5, room).await;
    let place = first_of_two_admitted(&app, sale).await;

    let holder = hold_sale_row(&app.db, sale).await;
    let (status, _) =
        order(&app, sale, json!({ "user_id": 1, "admission": admission_of(&place) })).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    drop(holder);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (_, next) = look(&app, sale, 2).await;
        if next["state"] == "admitted" {
            break;
        }
        let sold = app.audit(sale).await.units_sold;
        assert!(
            std::time::Instant::now() < deadline,
            "buyer 2 still waits 2 s after buyer 1's purchase ended ({sold} sold): its permit is \
             held until the admission's lease ends: {next}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `pause-instance` fault: a leader paused mid-round (here about 50
/// admissions into the first round, 400 units, while the follower leads and
/// admits up to the stock) admits nobody beyond the stock when it wakes.
/// Each admission carries its leader's fencing token, and `admit.lua`
/// refuses one older than the newest it has seen as `fenced`, which ends the
/// stale leader's round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_paused_mid_round_admits_nobody_beyond_the_stock_when_it_wakes() {
    let prefix = test_support::unique_prefix();
    let mut leader =
        crate::support::seckill_child(&[("SECKILL_REDIS_PREFIX", prefix.clone())]).start().await;
    let shared = prefix.clone();
    let follower = TestApp::spawn_with(move |config| config.backends.redis_prefix = shared).await;
    let starts_at = chrono::Utc::now() + chrono::TimeDelta::milliseconds(3000);
    let body = json!({ "name": "room", "stock": 400, "strategy": "sql", "starts_at": starts_at,
                       "waiting_room": { "concurrency": 100_000, "admission_ttl_ms": 60_000 } });
    let sale = follower.create_sale(body).await["id"].as_i64().unwrap();

    // The child's admitter starts first, and leads.
    let url = format!("{}/sales/{sale}/line", leader.base);
    let first = follower.client.post(url).json(&json!({ "user_id": 0 })).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joins = futures_util::stream::iter((1..=600).map(|user| join(&follower, sale, user)));
    futures_util::StreamExt::collect::<Vec<_>>(futures_util::StreamExt::buffer_unordered(
        joins, 32,
    ))
    .await;
    assert!(chrono::Utc::now() < starts_at, "the joins took too long for the test");

    // Paused 50 admissions into the round that starts the sale.
    let admitted_key = format!("{prefix}:{{sale:{sale}}}:room:admitted");
    let mut redis = redis_conn().await;
    let admitted = |redis: &mut redis::aio::MultiplexedConnection| {
        let (key, mut redis) = (admitted_key.clone(), redis.clone());
        async move { redis::cmd("HLEN").arg(key).query_async::<i64>(&mut redis).await.unwrap() }
    };
    while admitted(&mut redis).await < 50 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    test_support::signal(leader.pid(), "STOP");
    let paused_at = admitted(&mut redis).await;
    // The follower leads once the lease ends (≤ 2.5 s) and admits up to the
    // stock; the old leader is woken as soon as it has.
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while admitted(&mut redis).await < 399 && std::time::Instant::now() < deadline {
        look(&follower, sale, 600).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let by_follower = admitted(&mut redis).await;
    test_support::signal(leader.pid(), "CONT");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let total = admitted(&mut redis).await;
    leader.kill();
    assert!(
        total <= 400,
        "{total} buyers admitted to 400 units ({paused_at} when the leader was paused, \
         {by_follower} after the follower led)"
    );
}

/// `waiting_room` must be a JSON object (docs/api.md): an array, which
/// serde's derived struct would read by position (`[5, 2, 1000]`: 5
/// admissions a second, concurrency 2, 1 s admissions), is refused with
/// `422`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_room_that_is_not_an_object_is_refused() {
    let app = TestApp::spawn().await;
    for room in [json!([5, 2, 1000]), json!([5]), json!([])] {
        let body = json!({ "name": "room", "stock": 5, "strategy": "sql", "waiting_room": room });
        let response = app.try_create_sale(body).await;
        let status = response.status();
        let answer: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "waiting_room {room}: {answer}");
    }
}

/// A long line is admitted close to `admissions_per_s`: 16 buyers at 10 a
/// second take 1.5 s from the first admission to the last (by the
/// admissions' own ends, Redis's clock); allowed here: 1.4–1.7 s. The
/// leader's token bucket holds two ticks' admissions (at least 2), so a token
/// that comes due just after one tick's check is still there at the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pace_admits_close_to_admissions_per_s_when_the_line_is_long() {
    let app = TestApp::spawn().await;
    let room = json!({ "admissions_per_s": 10, "admission_ttl_ms": 20_000 });
    let sale = room_sale(&app, "sql", 100, room).await;
    let buyers: Vec<i64> = (1..=16).collect();
    for &user in &buyers {
        join(&app, sale, user).await;
    }
    let looks = buyers.iter().map(|&user| until_called(&app, sale, user, Duration::from_secs(8)));
    let mut ends: Vec<_> = futures_util::future::join_all(looks)
        .await
        .iter()
        .map(|(place, _)| expires_at(place))
        .collect();
    ends.sort();
    let spread = ends[15] - ends[0];
    assert!(spread >= chrono::TimeDelta::milliseconds(1400), "faster than the pace: {spread}");
    assert!(
        spread <= chrono::TimeDelta::milliseconds(1700),
        "15 intervals at 10/s took {spread} (≈ {:.1} admissions a second)",
        15.0 / (spread.num_milliseconds() as f64 / 1000.0)
    );
}

// ---- Contention and failure ---------------------------------------------------

/// 20 purchases with one admission, at once, over two instances: one order;
/// every other answer is `403 admission-refused`, or `409
/// already-purchased` for a try that found the admission used after the
/// order had committed (the answer a retry of a lost answer gets).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_admission_used_by_twenty_concurrent_purchases_on_two_instances_buys_once() {
    let (a, b) = two_instances().await;
    let sale = room_sale(&a, "sql", 10, json!({ "concurrency": 5 })).await;
    join(&a, sale, 1).await;
    let (place, _) = until_called(&a, sale, 1, Duration::from_secs(10)).await;
    let body = json!({ "user_id": 1, "admission": admission_of(&place) });
    let tries = (0..20).map(|i| {
        let app = if i % 2 == 0 { &a } else { &b };
        order(app, sale, body.clone())
    });
    let answers = futures_util::future::join_all(tries).await;
    let placed = answers.iter().filter(|(status, _)| *status == StatusCode::CREATED).count();
    let refused = answers
        .iter()
        .filter(|(status, problem)| {
            let kind = problem["type"].as_str().unwrap_or("");
            (*status == StatusCode::FORBIDDEN && kind == "/problems/admission-refused")
                || (*status == StatusCode::CONFLICT && kind == "/problems/already-purchased")
        })
        .count();
    assert_eq!((placed, refused), (1, 19), "{answers:?}");
    assert_eq!(a.audit(sale).await.units_sold, 1);
}

/// 30 buyers, 3 units, a concurrency of 30: the admitter lets in 3 (the stock
/// less the admissions in flight), and once they bought, the rest are told
/// `sold_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_units_and_thirty_buyers_only_three_are_ever_admitted() {
    let app = TestApp::spawn().await;
    let sale = room_sale(&app, "sql", 3, json!({ "concurrency": 30 })).await;
    for user in 1..=30 {
        join(&app, sale, user).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let places = futures_util::future::join_all((1..=30).map(|user| look(&app, sale, user))).await;
    let admitted: Vec<(i64, Value)> = (1..=30)
        .zip(places)
        .filter(|(_, (_, place))| place["state"] == "admitted")
        .map(|(user, (_, place))| (user, place))
        .collect();
    assert_eq!(admitted.iter().map(|(user, _)| *user).collect::<Vec<_>>(), vec![1, 2, 3]);
    for (user, place) in &admitted {
        assert_eq!(
            buy_with(&app, sale, *user, admission_of(place)).await.status(),
            StatusCode::CREATED
        );
    }
    for user in 4..=30 {
        let (place, _) = until_called(&app, sale, user, Duration::from_secs(2)).await;
        assert_eq!(place["state"], "sold_out", "buyer {user}: {place}");
    }
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.oversold), (3, 0));
}

/// A buyer who gives up an admission (`DELETE`) hands its permit to the next
/// buyer at once, not when the admission would have lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_given_up_lets_the_next_buyer_in_at_once() {
    let app = TestApp::spawn().await;
    let sale = room_sale(&app, "sql", 5, json!({ "concurrency": 1 })).await;
    let first = first_of_two_admitted(&app, sale).await;
    let url = app.url(&format!("/sales/{sale}/line/1"));
    assert_eq!(app.client.delete(url).send().await.unwrap().status(), StatusCode::NO_CONTENT);
    let (second, _) = until_called(&app, sale, 2, Duration::from_secs(2)).await;
    assert_eq!(second["state"], "admitted", "{second}");
    assert_refused(buy_with(&app, sale, 1, admission_of(&first)).await, "admission-refused").await;
    assert_eq!(look(&app, sale, 1).await.0, StatusCode::NOT_FOUND);
    assert_eq!(buy_with(&app, sale, 2, admission_of(&second)).await.status(), StatusCode::CREATED);
}

/// A cancelled order reopens a sold-out line: the buyer still looking is
/// admitted once the sold-out mark ends (2 s after its last renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_order_reopens_a_sold_out_line_for_the_buyer_still_looking() {
    let app = TestApp::spawn().await;
    let body = json!({ "name": "room", "stock": 1, "strategy": "sql", "payment_window_ms": 60_000,
                       "waiting_room": { "concurrency": 1 } });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    let first = first_of_two_admitted(&app, sale).await;
    let placed: Value = buy_with(&app, sale, 1, admission_of(&first)).await.json().await.unwrap();
    assert_eq!(until_called(&app, sale, 2, Duration::from_secs(5)).await.0["state"], "sold_out");

    let cancel = app.url(&format!("/orders/{}/cancel", placed["order_id"]));
    let cancelled = app.client.post(cancel).json(&json!({ "user_id": 1 })).send().await.unwrap();
    assert_eq!(cancelled.status(), StatusCode::OK);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let place = loop {
        let (status, place) = look(&app, sale, 2).await;
        assert_eq!(status, StatusCode::OK, "{place}");
        if place["state"] == "admitted" {
            break place;
        }
        assert!(std::time::Instant::now() < deadline, "the line did not reopen: {place}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(buy_with(&app, sale, 2, admission_of(&place)).await.status(), StatusCode::CREATED);
}

/// A service whose Redis does not answer: the line's routes and a purchase
/// with a valid admission are `503 unavailable` naming Redis, never `500`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_the_line_and_the_purchase_answer_503_naming_redis() {
    let healthy = TestApp::spawn().await;
    let sale = room_sale(&healthy, "sql", 5, json!({ "concurrency": 2 })).await;
    join(&healthy, sale, 1).await;
    let (place, _) = until_called(&healthy, sale, 1, Duration::from_secs(10)).await;

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("redis://127.0.0.1:{port}");
    let app = TestApp::spawn_with(move |config| config.backends.redis_url = url).await;
    let line = app.url(&format!("/sales/{sale}/line"));
    let mine = app.url(&format!("/sales/{sale}/line/1"));
    let answers = [
        app.client.post(&line).json(&json!({ "user_id": 1 })).send().await.unwrap(),
        app.client.get(&mine).send().await.unwrap(),
        app.client.delete(&mine).send().await.unwrap(),
        buy_with(&app, sale, 1, admission_of(&place)).await,
    ];
    for response in answers {
        assert_eq!(response.headers().get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
        let status = response.status();
        let problem: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{problem}");
        assert_eq!(
            (problem["type"].as_str(), problem["backend"].as_str()),
            (Some("/problems/unavailable"), Some("redis")),
            "{problem}"
        );
    }
    // The admission was not used: it still buys at the healthy instance.
    assert_eq!(
        buy_with(&healthy, sale, 1, admission_of(&place)).await.status(),
        StatusCode::CREATED
    );
}
