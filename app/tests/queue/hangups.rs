//! A purchase whose request future is dropped between the registration of
//! its request and the publish of its message (a client that hangs up, a
//! request timeout): the request still gets its message and resolves, so
//! the sold-out gate never hands back an id that cannot resolve.

use std::time::Duration;

use reqwest::StatusCode;

use super::{Broker, buy, drained, eventually, request_id, resolved, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_dropped_while_its_request_is_registered_still_resolves() {
    crate::support::provoking("a request timeout while the request table is locked");
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |config| config.http.request_timeout_ms = 500).await;
    // Results are long-polled (2 s) from an instance with the default
    // request timeout; it does not consume.
    let reader = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = app.sale("queue", 1).await;

    // Registration waits behind the test's lock; the request times out (its
    // future is dropped) before the row is written.
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK purchase_requests IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let dropped = app.buy(sale, 1).await;
    assert_eq!(dropped.status(), StatusCode::GATEWAY_TIMEOUT);
    lock.rollback().await.unwrap();
    let registered = eventually(Duration::from_secs(5), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM purchase_requests WHERE sale_id = $1 AND user_id = 1",
        )
        .bind(sale)
        .fetch_one(&app.db)
        .await
        .unwrap()
            == 1
    })
    .await;
    assert!(registered, "the registration went on without its client");

    // Buyer 2 comes next, and the sale sells out (to buyer 2, or to buyer 1
    // whose request went on without its client: then buyer 2 may be told
    // so at once).
    let (status, body) = buy(&app, sale, 2).await;
    let second = match status {
        StatusCode::ACCEPTED => {
            resolved(&reader, sale, &request_id(&body), Duration::from_secs(10)).await
        }
        _ => {
            assert_eq!(status, StatusCode::CONFLICT, "{body}");
            serde_json::json!({ "status": "sold_out" })
        }
    };
    // Buyer 1 comes back: the same request, which resolves.
    let (status, body) = buy(&app, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let first = resolved(&reader, sale, &request_id(&body), Duration::from_secs(10)).await;
    let placed = [&first, &second].iter().filter(|r| r["status"] == "placed").count();
    assert_eq!(placed, 1, "one unit: {first} {second}");
    let stats = drained(&reader, sale, Duration::from_secs(5)).await;
    assert_eq!((stats.placed, stats.rejected), (1, 0), "{stats:?}");
    Broker::connect(&prefix).await.delete_queues().await;
}
