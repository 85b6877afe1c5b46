//! A purchase whose request future is dropped (a client that hangs up, a
//! request timeout) while its reserve script waits on Redis: the reservation
//! still ends confirmed or compensated, so no unit hides behind it and the
//! buyer is not told `already-purchased` for an order that does not exist.

use std::time::Duration;

use reqwest::StatusCode;
use test_support::RedisServer;

use super::{RedisView, eventually, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_dropped_while_its_reserve_script_waits_leaves_no_reservation_behind() {
    crate::support::provoking("a request timeout while its own Redis is paused");
    let redis_server = RedisServer::start().await;
    let prefix = unique_prefix();
    // The request timeout drops the purchase's future, as a client that
    // hangs up or a timeout layer would.
    let app = spawn_app(&redis_server.url(), &prefix, |config| {
        config.http.request_timeout_ms = 300;
    })
    .await;
    let sale = app.sale("redis-decr", 2).await;
    let mut redis = RedisView::new(&redis_server.url(), &prefix, sale).await;
    // A first purchase loads the reserve script, so that the one dropped
    // below runs as soon as Redis is unpaused (not after a reload that its
    // dropped future would never ask for).
    assert_eq!(app.buy(sale, 2).await.status(), StatusCode::CREATED);
    assert_eq!(redis.stock().await, Some(1));

    // Writes (scripts included) wait until the test unpauses Redis: the
    // reserve script is sent, and the request is dropped while it waits.
    let mut admin = redis_server.client().get_multiplexed_async_connection().await.unwrap();
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let dropped = app.buy(sale, 1).await;
    assert_eq!(dropped.status(), StatusCode::GATEWAY_TIMEOUT);
    redis::cmd("CLIENT").arg("UNPAUSE").query_async::<()>(&mut admin).await.unwrap();

    // The purchase finishes without its client: an order, or the unit back.
    let settled = eventually(Duration::from_secs(5), || async {
        RedisView::new(&redis_server.url(), &prefix, sale).await.open_reservations().await == 0
    })
    .await;
    assert!(settled, "the dropped purchase left an open reservation (a hidden unit)");
    let audit = app.audit(sale).await;
    assert_eq!((audit.redis_drift, audit.ledger_drift), (Some(0), 0), "{audit:?}");
    // Buyer 1 either has the unit, or may buy it now; never "already
    // purchased" without an order.
    let again = app.buy(sale, 1).await.status();
    if audit.units_sold == 2 {
        assert_eq!(again, StatusCode::CONFLICT);
        assert_eq!(redis.stock().await, Some(0));
    } else {
        assert_eq!(again, StatusCode::CREATED, "the unit was back for buyer 1");
    }
    assert_eq!(app.audit(sale).await.units_sold, 2);
}
