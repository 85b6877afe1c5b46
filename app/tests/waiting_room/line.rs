//! The line: arrival order across instances, one place per buyer, a permit
//! that comes back when its admission lapses, and sold-out told at once.

use std::time::Duration;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buyers_are_admitted_in_arrival_order_across_two_instances_with_one_place_each() {
    let (a, b) = two_instances().await;
    let room = json!({ "admissions_per_s": 10 });
    let sale = room_sale(&a, "sql", 20, room).await;

    // Buyers arrive one after the other, alternately at each instance.
    let buyers: Vec<i64> = (1..=8).collect();
    for (i, &user) in buyers.iter().enumerate() {
        let app = if i % 2 == 0 { &a } else { &b };
        join(app, sale, user).await;
    }
    // Joining again, elsewhere, keeps the place.
    let again = join(&b, sale, 1).await;
    assert!(matches!(again["state"].as_str(), Some("waiting" | "admitted")), "{again}");
    if again["state"] == "waiting" {
        assert_eq!(again["position"], 1, "{again}");
    }

    let mut admitted = Vec::new();
    let looks = buyers.iter().enumerate().map(|(i, &user)| {
        let app = if i % 2 == 0 { &b } else { &a };
        until_called(app, sale, user, Duration::from_secs(20))
    });
    for (user, (place, _)) in buyers.iter().zip(futures_util::future::join_all(looks).await) {
        admitted.push((expires_at(&place), *user));
    }
    admitted.sort();
    let order: Vec<i64> = admitted.iter().map(|(_, user)| *user).collect();
    assert_eq!(order, buyers, "admitted in the order they joined");
    // 10 a second: eight admissions take at least 0.7 s from first to last.
    let spread = admitted[7].0 - admitted[0].0;
    assert!(spread >= chrono::TimeDelta::milliseconds(600), "paced: {spread}");

    // Every admitted buyer buys once.
    for (i, &user) in buyers.iter().enumerate() {
        let app = if i % 2 == 0 { &a } else { &b };
        let (_, place) = look(app, sale, user).await;
        let response = buy_with(app, sale, user, admission_of(&place)).await;
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    let audit = a.audit(sale).await;
    assert_eq!((audit.units_sold, audit.oversold), (8, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_admission_lapses_and_its_permit_lets_the_next_buyer_in() {
    let app = TestApp::spawn().await;
    let room = json!({ "concurrency": 1, "admission_ttl_ms": 700 });
    let sale = room_sale(&app, "sql", 5, room).await;
    join(&app, sale, 1).await;
    join(&app, sale, 2).await;

    let (first, _) = until_called(&app, sale, 1, Duration::from_secs(10)).await;
    let (_, place) = look(&app, sale, 2).await;
    assert_eq!((place["state"].as_str(), place["position"].as_u64()), (Some("waiting"), Some(1)));

    // Buyer 1 never buys: the one permit is theirs until the admission lapses.
    let (second, _) = until_called(&app, sale, 2, Duration::from_secs(10)).await;
    assert_eq!(second["state"], "admitted", "{second}");
    assert!(expires_at(&second) - expires_at(&first) >= chrono::TimeDelta::milliseconds(700));
    let late = buy_with(&app, sale, 1, admission_of(&first)).await;
    assert_refused(late, "admission-refused").await;
    let (status, _) = look(&app, sale, 1).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a lapsed admission leaves no place");
    assert_eq!(buy_with(&app, sale, 2, admission_of(&second)).await.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sold_out_reaches_every_waiting_buyer_within_a_second_and_nobody_more_is_admitted() {
    let app = TestApp::spawn().await;
    let sale = room_sale(&app, "sql", 1, json!({ "concurrency": 1 })).await;
    for user in 1..=6 {
        join(&app, sale, user).await;
    }
    let (first, _) = until_called(&app, sale, 1, Duration::from_secs(10)).await;
    for user in 2..=6 {
        assert_eq!(look(&app, sale, user).await.1["state"], "waiting");
    }
    let bought = std::time::Instant::now();
    assert_eq!(buy_with(&app, sale, 1, admission_of(&first)).await.status(), StatusCode::CREATED);

    for user in 2..=6 {
        let (place, seen) = until_called(&app, sale, user, Duration::from_secs(5)).await;
        assert_eq!(place["state"], "sold_out", "buyer {user} was admitted to nothing: {place}");
        assert!(seen - bought < Duration::from_secs(1), "told after {:?}", seen - bought);
    }
    // A newcomer is told at once, too.
    assert_eq!(join(&app, sale, 7).await["state"], "sold_out");
}
