//! Returns of the `lock/*` strategies do not queue behind buyers: the units
//! of a cancelled or expired order come back while another buyer holds the
//! sale's lock, and the holder's write, when it comes, keeps them.
//!
//! The holder is a buyer stopped at the `lock/before-write` failpoint: it
//! holds the lock and has read the stock, and it goes on only when the test
//! resumes it. No sleep orders anything; the bounds below are what is
//! claimed.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use seckill::failpoints::{self, Armed, LOCK_BEFORE_WRITE};
use seckill::strategy::lock::BeforeWrite;
use serde_json::json;
use sqlx::PgPool;
use test_support::RedisServer;

use super::harness::{bought, cancel, pay_pending, reaches, remaining, status_of};
use crate::support::{TestApp, assert_problem};

/// Every lock strategy.
const LOCKS: [&str; 8] = [
    "lock/local",
    "lock/setnx",
    "lock/ttl",
    "lock/token",
    "lock/watchdog",
    "lock/fenced",
    "lock/fair",
    "lock/redlock",
];

/// How long a purchase waits for a lock: far above [`BOUND`], so a return
/// that queues for the lock cannot pass for one that does not.
const LOCK_WAIT_MS: u64 = 3_000;

/// The bound on a return while the lock is held: a cancel is answered
/// within it, and an expiry lands within it after the payment window
/// closed (one sweep period, [`SWEEP_MS`], and the return's statements).
const BOUND: Duration = Duration::from_millis(1_000);

/// The expiry sweep's period.
const SWEEP_MS: u64 = 50;

/// A service whose `lock/redlock` takes its quorum over `nodes`, on
/// `database` (the test database when `None`), waiting [`LOCK_WAIT_MS`] for
/// a lock and holding it for as long as a stalled holder needs.
async fn service(database: Option<String>, nodes: &[RedisServer]) -> TestApp {
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    TestApp::spawn_with(move |config| {
        if let Some(url) = database {
            config.backends.database_url = url;
        }
        config.strategies.lock.redlock_urls = urls;
        config.strategies.lock.wait_ms = LOCK_WAIT_MS;
        config.strategies.lock.hold_ms = 120_000;
        config.lifecycle.expiry_sweep_interval_ms = SWEEP_MS;
    })
    .await
}

async fn redlock_nodes() -> [RedisServer; 3] {
    [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await]
}

/// Creates a sale of `stock` units under `strategy` with a payment window
/// of `window_ms` and a lease no stall here outlives; returns its id.
async fn lock_sale(app: &TestApp, strategy: &str, stock: i64, window_ms: i64) -> i64 {
    let body = json!({
        "name": format!("{strategy} return test"), "stock": stock, "strategy": strategy,
        "payment_window_ms": window_ms, "lock_lease_ms": 60_000,
    });
    app.create_sale(body).await["id"].as_i64().unwrap()
}

/// A buyer holding the sale's lock, stopped after its read, right before
/// its write.
struct Holder {
    stalled: Armed<BeforeWrite>,
    answer: tokio::task::JoinHandle<StatusCode>,
}

impl Holder {
    /// `user` buys one unit of `sale` and stops at the failpoint.
    async fn stopped_before_its_write(app: &TestApp, sale: i64, user: i64) -> Holder {
        let mut stalled = failpoints::arm::<BeforeWrite>(&LOCK_BEFORE_WRITE, sale);
        let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
        let answer = tokio::spawn(async move {
            let body = json!({ "user_id": user });
            client.post(url).json(&body).send().await.unwrap().status()
        });
        stalled.reached().await;
        Holder { stalled, answer }
    }

    /// Lets the holder write; its answer.
    async fn writes(self) -> StatusCode {
        self.stalled.resume(BeforeWrite::Check);
        self.answer.await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_returns_its_unit_at_once_while_another_buyer_holds_the_sale_lock() {
    let nodes = redlock_nodes().await;
    let app = service(None, &nodes).await;
    for strategy in LOCKS {
        let sale = lock_sale(&app, strategy, 2, 60_000).await;
        let first = bought(&app, sale, 1).await;
        let holder = Holder::stopped_before_its_write(&app, sale, 2).await;

        let started = Instant::now();
        let cancelled = cancel(&app, first).await.status();
        let took = started.elapsed();
        assert!(
            cancelled == StatusCode::OK && took < BOUND,
            "{strategy}: the cancel was answered {cancelled} after {took:?}, not 200 within \
             {BOUND:?}, while a buyer held the lock"
        );
        assert_eq!(status_of(&app.db, first).await, "cancelled", "{strategy}");
        assert_eq!(remaining(&app.db, sale).await, 2, "{strategy}: the unit is back at once");

        // The holder read one unit on the row and sells it; the returned
        // unit, only in the returns now, sells to the next buyer.
        assert_eq!(holder.writes().await, StatusCode::CREATED, "{strategy}");
        bought(&app, sale, 3).await;
        assert_problem(app.buy(sale, 4).await, StatusCode::CONFLICT, "sold-out").await;
        let audit = app.audit(sale).await;
        let books = (audit.units_sold, audit.units_returned, audit.units_resold);
        assert_eq!(books, (2, 1, 1), "{strategy}");
        let exact = (audit.remaining_stock, audit.ledger_drift, audit.oversold);
        assert_eq!(exact, (0, 0, 0), "{strategy}");
        pay_pending(&app, sale).await;
    }
}

/// A holder reads the sale while one return waits to be folded in, and a
/// second return commits between its read and its write: the holder folds
/// the first (it sells from it) and the second stays for sale. A write that
/// folded every return, rather than the ones it read, would lose one unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_returned_between_a_holders_read_and_write_stays_for_sale() {
    let nodes = redlock_nodes().await;
    let app = service(None, &nodes).await;
    for strategy in LOCKS {
        let sale = lock_sale(&app, strategy, 3, 60_000).await;
        let first = bought(&app, sale, 1).await;
        let second = bought(&app, sale, 2).await;
        assert_eq!(cancel(&app, first).await.status(), StatusCode::OK, "{strategy}");
        // Reads 2 for sale: one on the row, one returned.
        let holder = Holder::stopped_before_its_write(&app, sale, 3).await;
        assert_eq!(cancel(&app, second).await.status(), StatusCode::OK, "{strategy}");
        assert_eq!(holder.writes().await, StatusCode::CREATED, "{strategy}");
        assert_eq!(remaining(&app.db, sale).await, 2, "{strategy}: both returns kept");

        // The two units sell once more each, and no third.
        bought(&app, sale, 4).await;
        bought(&app, sale, 5).await;
        assert_problem(app.buy(sale, 6).await, StatusCode::CONFLICT, "sold-out").await;
        let audit = app.audit(sale).await;
        let books = (audit.units_sold, audit.units_returned, audit.units_resold);
        assert_eq!(books, (3, 2, 2), "{strategy}");
        let exact = (audit.remaining_stock, audit.ledger_drift, audit.oversold);
        assert_eq!(exact, (0, 0, 0), "{strategy}");
        pay_pending(&app, sale).await;
    }
}

/// In a database of its own, so that only this service's sweep (with this
/// service's locks) can expire the orders; its sale ids start far from the
/// test database's, so that no other test's purchase reaches this test's
/// failpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expiry_sweep_returns_units_while_a_buyer_holds_the_sale_lock() {
    let url = test_support::scratch_database("lock_expiry").await;
    let nodes = redlock_nodes().await;
    let app = service(Some(url.clone()), &nodes).await;
    let db = PgPool::connect(&url).await.unwrap();
    let first_id = 1_000_000_000 + i64::from(rand::random::<u32>());
    sqlx::query("SELECT setval(pg_get_serial_sequence('sales', 'id'), $1)")
        .bind(first_id)
        .execute(&db)
        .await
        .unwrap();
    let window = Duration::from_millis(500);
    for strategy in LOCKS {
        let sale = lock_sale(&app, strategy, 2, window.as_millis() as i64).await;
        let bought_at = Instant::now();
        let first = bought(&app, sale, 1).await;
        let holder = Holder::stopped_before_its_write(&app, sale, 2).await;

        let deadline = (bought_at + window + BOUND).saturating_duration_since(Instant::now());
        let expired = reaches(&db, first, "expired", deadline).await;
        assert!(
            expired,
            "{strategy}: the order was still {} {BOUND:?} after its window closed, while a \
             buyer held the lock",
            status_of(&db, first).await
        );
        assert_eq!(remaining(&db, sale).await, 2, "{strategy}: the unit is back");

        // The holder sells, and its order expires in turn.
        assert_eq!(holder.writes().await, StatusCode::CREATED, "{strategy}");
        let second: i64 =
            sqlx::query_scalar("SELECT id FROM orders WHERE sale_id = $1 AND user_id = 2")
                .bind(sale)
                .fetch_one(&db)
                .await
                .unwrap();
        assert!(reaches(&db, second, "expired", window + BOUND).await, "{strategy}");
        let audit = app.audit(sale).await;
        let books = (audit.units_sold, audit.units_returned, audit.units_resold);
        assert_eq!(books, (0, 2, 0), "{strategy}");
        let exact = (audit.remaining_stock, audit.ledger_drift, audit.oversold);
        assert_eq!(exact, (2, 0, 0), "{strategy}");
    }
    drop(app);
    db.close().await;
    test_support::drop_scratch_database(&url).await;
}
