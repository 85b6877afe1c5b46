//! A batch with more requests than stock grants in arrival order.

use std::time::Duration;

use reqwest::StatusCode;

use crate::{Broker, buy, drained, request_id, resolved, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_batch_grant_serves_requests_in_arrival_order() {
    let prefix = unique_prefix();
    // Ten requests queue up, in order, before any consumer runs.
    let front = spawn_app(&prefix, |config| config.queue_consume = false).await;
    let sale = front.sale("queue", 3).await;
    let mut ids = Vec::new();
    for user in 1..=10 {
        let (status, body) = buy(&front, sale, user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        ids.push(request_id(&body));
    }
    // One consumer takes them in one batch (they are all there already).
    let settler = spawn_app(&prefix, |config| config.queue_batch_window_ms = 200).await;
    let stats = drained(&settler, sale, Duration::from_secs(20)).await;
    let batch = stats.batch_sizes.clone().expect("batch sizes");
    assert_eq!((stats.batches, batch.max), (1, 10.0), "one batch of ten: {stats:?}");
    for (i, id) in ids.iter().enumerate() {
        let result = resolved(&settler, sale, id, Duration::from_secs(1)).await;
        let expected = if i < 3 { "placed" } else { "sold_out" };
        assert_eq!(result["status"], expected, "buyer {} of 10: {result}", i + 1);
    }
    let audit = settler.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (3, 0, 0));
    Broker::connect(&prefix).await.delete_queues().await;
}
