//! The consumers' connection is lost between a batch's commit and its
//! acknowledgement (the `queue-before-ack` failpoint): the acknowledgement
//! goes through the deliveries' own channel, which is gone, so it lands
//! nowhere — not on the new channel, whose delivery tags start again at 1
//! and name other messages. The batch is redelivered and settled again
//! idempotently; every request resolves once.

use std::time::Duration;

use reqwest::StatusCode;
use seckill::metric_names::FAILPOINTS_FIRED_TOTAL;

use super::{
    Broker, buy, counted, drained, eventually, request_id, resolved, spawn_app, unique_prefix,
};

/// The failpoint's label in [`FAILPOINTS_FIRED_TOTAL`].
const BEFORE_ACK: &str = "failpoint=\"queue-before-ack\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_between_commit_and_ack_loses_and_duplicates_nothing() {
    crate::support::provoking("a lost consumer connection between commit and ack (failpoint)");
    let prefix = unique_prefix();
    // Accept first, settle later: a backlog, so that the new channel gets
    // fresh deliveries with the old batch's tags.
    let front = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = front.sale("queue", 20).await;
    let mut ids = Vec::new();
    for user in 1..=30 {
        let (status, body) = buy(&front, sale, user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        ids.push(request_id(&body));
    }
    let settler = spawn_app(&prefix, |config| {
        config.strategies.queue.batch_max = 5;
        config.failpoints = Some("queue-before-ack=lose-connection".to_owned());
    })
    .await;
    let stats = drained(&settler, sale, Duration::from_secs(30)).await;
    // The fault did happen (this is the only test of the binary that arms it).
    let fired = counted(&settler, FAILPOINTS_FIRED_TOTAL, BEFORE_ACK).await;
    assert_eq!(fired, 1, "the failpoint fired once");
    assert_eq!((stats.accepted, stats.placed, stats.sold_out), (30, 20, 10), "{stats:?}");
    let mut placed = std::collections::HashSet::new();
    for id in &ids {
        let result = resolved(&settler, sale, id, Duration::from_secs(5)).await;
        if result["status"] == "placed" {
            assert!(placed.insert(result["order_id"].as_i64().unwrap()), "an order twice");
        }
    }
    let audit = settler.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.oversold, audit.ledger_drift, audit.duplicate_orders),
        (20, 0, 0, 0)
    );
    // Nothing left behind unacknowledged or ready.
    let broker = Broker::connect(&prefix).await;
    let queue = broker.topology.queue(0);
    assert!(eventually(Duration::from_secs(5), || async { broker.ready(&queue).await == 0 }).await);
    broker.delete_queues().await;
}
