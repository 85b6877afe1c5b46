//! Units returned exactly once, per strategy: every strategy that returns
//! units (its `returns_units`) sells a returned unit again, and its books
//! stay exact.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use test_support::RedisServer;

use seckill::strategy::redis_decr::counter::SaleCounter;

use super::harness::{bought, cancel, pay_pending, queued, remaining, window_sale};
use crate::support::{TestApp, assert_problem, eventually};

/// The strategies whose returns this test drives through a service of its
/// own: every one but `lock/redlock` (three Redis nodes of its own) and
/// `queue` (a consumer and queues of its own), which have a test each below.
pub(super) const RETURNING: &[&str] = &[
    "naive",
    "sql",
    "sql/for-update",
    "sql/batched",
    "sql/buckets",
    "redis-decr",
    "lock/local",
    "lock/setnx",
    "lock/ttl",
    "lock/token",
    "lock/watchdog",
    "lock/fenced",
    "lock/fair",
];

#[tokio::test]
async fn every_returning_strategy_sells_a_cancelled_unit_again_exactly_once() {
    let app = TestApp::spawn().await;
    for &strategy in RETURNING {
        cancelled_unit_sells_again_once(&app, strategy).await;
    }
}

#[tokio::test]
async fn redlock_sells_a_cancelled_unit_again_exactly_once() {
    let nodes =
        [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await];
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let app = TestApp::spawn_with(move |config| config.strategies.lock.redlock_urls = urls).await;
    cancelled_unit_sells_again_once(&app, "lock/redlock").await;
}

/// Three units sold to buyers 1–3; buyer 1 cancels (twice); buyer 4 buys
/// the returned unit and buyer 5 finds none.
async fn cancelled_unit_sells_again_once(app: &TestApp, strategy: &str) {
    let sale = window_sale(app, strategy, 3, 60_000).await;
    let first = bought(app, sale, 1).await;
    bought(app, sale, 2).await;
    bought(app, sale, 3).await;
    assert_problem(app.buy(sale, 4).await, StatusCode::CONFLICT, "sold-out").await;
    assert_eq!(cancel(app, first).await.status(), StatusCode::OK, "{strategy}");
    assert_eq!(cancel(app, first).await.status(), StatusCode::OK, "{strategy}");
    assert_eq!(remaining(&app.db, sale).await, 1, "{strategy}: the unit came back once");
    bought(app, sale, 4).await;
    assert_problem(app.buy(sale, 5).await, StatusCode::CONFLICT, "sold-out").await;
    let audit = app.audit(sale).await;
    assert_eq!(
        (audit.units_sold, audit.units_returned, audit.units_resold),
        (3, 1, 1),
        "{strategy}"
    );
    assert_eq!(
        (audit.remaining_stock, audit.ledger_drift, audit.oversold),
        (0, 0, 0),
        "{strategy}"
    );
    if strategy == "redis-decr" {
        assert_eq!(audit.redis_drift, Some(0), "the counter got the unit back once");
    }
    // Every strategy's orders pay alike; nothing is left to expire.
    pay_pending(app, sale).await;
    assert_eq!(app.audit(sale).await.units_pending, 0, "{strategy}");
}

/// `queue`: a cancelled order's unit goes to the next request, once. A late
/// copy of the cancelled request's message (its ack was lost, say) keeps the
/// request's result and takes nothing: it is known by its request id, whose
/// row reads `returned`.
#[tokio::test]
async fn queue_sells_a_cancelled_unit_again_and_its_buyer_may_queue_again() {
    let prefix = test_support::unique_prefix();
    let queues = prefix.clone();
    let app = TestApp::spawn_with(move |config| {
        config.backends.amqp_prefix = queues;
        config.strategies.queue.partitions = 1;
        config.strategies.queue.consume = true;
    })
    .await;
    let config = seckill::config::Config::defaults();
    let topology = seckill::strategy::queue::Topology::new(
        &prefix,
        1,
        config.strategies.queue.max_length,
        config.strategies.queue.delivery_limit,
    );
    let sale = window_sale(&app, "queue", 2, 60_000).await;
    let first = queued(&app, sale, 1).await.unwrap();
    queued(&app, sale, 2).await.unwrap();
    assert!(queued(&app, sale, 3).await.is_err(), "sold out");
    assert_eq!(cancel(&app, first).await.status(), StatusCode::OK);
    assert_eq!(cancel(&app, first).await.status(), StatusCode::OK);
    assert_eq!(remaining(&app.db, sale).await, 1, "the unit came back once");
    // A late copy of the cancelled request, then a purchase of another sale
    // (a marker): once the marker's request is recorded, the partition's one
    // consumer has settled the copy (in the marker's batch or an earlier
    // one), before the buyer's new request exists.
    let request: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM purchase_requests WHERE sale_id = $1 AND user_id = 1")
            .bind(sale)
            .fetch_one(&app.db)
            .await
            .unwrap();
    let copy = seckill::strategy::queue::PurchaseMessage {
        request_id: request,
        sale_id: sale,
        user_id: 1,
        quantity: 1,
    };
    let connection = lapin::Connection::connect(
        &test_support::amqp_url(),
        lapin::ConnectionProperties::default(),
    )
    .await
    .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel.confirm_select(lapin::options::ConfirmSelectOptions::default()).await.unwrap();
    let other_sale = window_sale(&app, "queue", 1, 60_000).await;
    let marker = seckill::strategy::queue::PurchaseMessage {
        request_id: uuid::Uuid::new_v4(),
        sale_id: other_sale,
        ..copy
    };
    let queue = topology.queue_of(seckill::sale::SaleId(sale));
    assert_eq!(queue, topology.queue_of(seckill::sale::SaleId(other_sale)), "one partition");
    for message in [copy, marker] {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                lapin::options::BasicPublishOptions::default(),
                &serde_json::to_vec(&message).unwrap(),
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    let settled = eventually(Duration::from_secs(20), || async {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM purchase_requests WHERE id = $1")
                .bind(marker.request_id)
                .fetch_optional(&app.db)
                .await
                .unwrap();
        status.is_some_and(|status| status != "pending")
    });
    assert!(settled.await, "the marker was settled");
    // The buyer whose order was cancelled queues a new request, and gets the unit.
    let again = queued(&app, sale, 1).await.unwrap();
    assert_ne!(again, first);
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.units_returned, audit.units_resold), (2, 1, 1));
    assert_eq!((audit.remaining_stock, audit.ledger_drift, audit.oversold), (0, 0, 0));
    pay_pending(&app, sale).await;
    pay_pending(&app, other_sale).await;
    topology.delete_queues(&channel).await.unwrap();
}

/// A `redis-decr` sale of one unit, with a payment window, sold to buyer 1
/// by a service with the background reconciler off; and a connection to its
/// Redis.
struct OneUnitSold {
    app: TestApp,
    sale: i64,
    order: i64,
    redis: redis::aio::MultiplexedConnection,
    /// The sale's key names (its returns in progress: `returns_key`).
    counter: SaleCounter,
}

impl OneUnitSold {
    async fn new() -> OneUnitSold {
        let prefix = test_support::unique_prefix();
        let keys = prefix.clone();
        let app = TestApp::spawn_with(move |config| {
            config.backends.redis_prefix = keys;
            config.strategies.redis_decr.reconcile_interval_ms = 0;
        })
        .await;
        let sale = window_sale(&app, "redis-decr", 1, 60_000).await;
        let order = bought(&app, sale, 1).await;
        let redis = redis::Client::open(test_support::redis_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let handle = seckill::backends::RedisHandle::new(&test_support::redis_url(), prefix)
            .expect("a Redis URL");
        let counter = SaleCounter::new(&handle, seckill::sale::SaleId(sale));
        OneUnitSold { app, sale, order, redis, counter }
    }

    /// Records a return of buyer 1's unit begun at `begun_ms` (Redis time,
    /// ms), as `return_begin.lua` does before the Postgres transaction.
    async fn begin_return(&mut self, begun_ms: i64) {
        let record = format!("1:1:{begun_ms}");
        let command =
            redis::cmd("HSET").arg(&self.counter.returns_key).arg(self.order).arg(record).clone();
        command.query_async::<i64>(&mut self.redis).await.unwrap();
    }

    async fn returns_left(&mut self) -> i64 {
        redis::cmd("HLEN")
            .arg(&self.counter.returns_key)
            .query_async(&mut self.redis)
            .await
            .unwrap()
    }

    async fn reconcile(&self) -> Value {
        let path = format!("/admin/sales/{}/reconcile", self.sale);
        self.app.admin(reqwest::Method::POST, &path).await
    }
}

/// `redis-decr`, an instance that died between its return's Postgres commit
/// and `return_complete.lua`: the audit counts the recorded return (drift
/// 0, not −1), and a reconciliation pass gives the unit to the counter once
/// and the buyer back to the sale.
#[tokio::test]
async fn a_redis_decr_return_cut_off_after_its_commit_is_finished_by_the_reconciler() {
    let mut sold = OneUnitSold::new().await;
    // What return_begin.lua and the claim's transaction leave behind when
    // the process ends before the completion.
    sold.begin_return(0).await;
    let (app, sale, order) = (&sold.app, sold.sale, sold.order);
    let mut tx = app.db.begin().await.unwrap();
    sqlx::query("UPDATE sales SET remaining_stock = remaining_stock + 1 WHERE id = $1")
        .bind(sale)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE orders SET status = 'cancelled', ended_at = now() WHERE id = $1")
        .bind(order)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(app.audit(sale).await.redis_drift, Some(0), "the recorded return is counted");
    let report = sold.reconcile().await;
    assert_eq!(report["redis_drift"], 0, "{report}");
    assert_eq!(report["corrected_units"], 0, "{report}");
    assert_eq!(sold.returns_left().await, 0, "the return was completed");
    // The counter has the unit once: the buyer buys it again, nobody else.
    let app = &sold.app;
    let again = bought(app, sale, 1).await;
    assert_problem(app.buy(sale, 2).await, StatusCode::CONFLICT, "sold-out").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.redis_drift, audit.ledger_drift, audit.oversold), (Some(0), 0, 0));
    assert_eq!(cancel(app, again).await.status(), StatusCode::OK);
    pay_pending(app, sale).await;
}

/// `redis-decr`, a return begun whose Postgres transaction never committed
/// (the order is still live): within the grace period the reconciler leaves
/// it in flight, and does not retire the sold-out sale's keys under it;
/// after the grace period it drops the return, and the counter gets nothing.
#[tokio::test]
async fn a_redis_decr_return_whose_commit_never_came_is_dropped_after_the_grace_period() {
    let mut sold = OneUnitSold::new().await;
    let (now_s, now_us): (i64, i64) =
        redis::cmd("TIME").query_async(&mut sold.redis).await.unwrap();
    sold.begin_return(now_s * 1000 + now_us / 1000).await;

    let report = sold.reconcile().await;
    assert_eq!(report["redis_drift"], 0, "{report}");
    assert_eq!(report["in_flight_reservations"], 1, "{report}");
    assert_eq!(sold.returns_left().await, 1, "a return in its grace period is left alone");
    let ttl: i64 =
        redis::cmd("PTTL").arg(&sold.counter.stock_key).query_async(&mut sold.redis).await.unwrap();
    assert_eq!(ttl, -1, "keys with a return in flight are not retired");

    sold.begin_return(0).await; // begun long ago
    let report = sold.reconcile().await;
    assert_eq!(report["redis_drift"], 0, "{report}");
    assert_eq!(report["in_flight_reservations"], 0, "{report}");
    assert_eq!(report["corrected_units"], 0, "{report}");
    assert_eq!(sold.returns_left().await, 0, "the return is dropped");
    let (app, sale) = (&sold.app, sold.sale);
    assert_problem(app.buy(sale, 2).await, StatusCode::CONFLICT, "sold-out").await;
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.redis_drift, audit.ledger_drift), (1, Some(0), 0));
    pay_pending(app, sale).await;
}
