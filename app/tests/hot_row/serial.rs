//! The serial hold the `sql` strategy records (`seckill::strategy::serial`):
//! it grows with work done while the sale row is locked, and not with time
//! spent before the lock is taken — waiting for the row counts toward a
//! purchase's latency, not toward the row's hold.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use seckill::metric_names::SERIAL_HOLD_DURATION_SECONDS;
use seckill::sale::{Quantity, UserId};
use seckill::strategy::Strategy;
use seckill::strategy::sql::{NAME, Sql};
use serde_json::json;

use super::Direct;
use crate::support::TestApp;

/// The `_sum` and `_count` of `sql`'s serial holds in `recorder`.
fn holds(recorder: &PrometheusRecorder) -> (f64, f64) {
    let text = recorder.handle().render();
    let read = |suffix: &str| {
        let series = format!("{SERIAL_HOLD_DURATION_SECONDS}_{suffix}{{strategy=\"{}\"}}", NAME);
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0.0, |value| value.trim().parse().unwrap())
    };
    (read("sum"), read("count"))
}

/// One purchase of `sale` by `buyer` through `sql`, and how long it took.
async fn purchase(direct: &Direct, sale: i64, buyer: i64) -> Duration {
    let sql = Sql::new(direct.db.clone(), NAME);
    let sale = direct.sale(sale).await;
    let started = Instant::now();
    let outcome = sql.purchase(&sale, UserId::parse(buyer).unwrap(), Quantity::ONE).await.unwrap();
    assert!(matches!(outcome, seckill::outcome::Outcome::Placed { .. }), "{outcome:?}");
    started.elapsed()
}

// A current-thread runtime (the default): every task of the test runs on
// the thread whose local recorder collects its holds, apart from the other
// tests' `sql` purchases in this process.
#[tokio::test]
async fn the_hold_grows_with_work_under_the_row_lock_and_not_with_waiting_for_it() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let app = TestApp::spawn().await;
    let direct = Direct::new().await;

    // Waiting 300 ms for the row (a transaction holds it) before the lock.
    let sale = app.sale("sql", 10).await;
    let mut holder = direct.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sales WHERE id = $1 FOR UPDATE")
        .bind(sale)
        .execute(&mut *holder)
        .await
        .unwrap();
    let buyer = Direct::new().await;
    let waiting = tokio::spawn(async move { purchase(&buyer, sale, 1).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.commit().await.unwrap();
    let latency = waiting.await.unwrap();
    let (sum, count) = holds(&recorder);
    assert_eq!(count, 1.0);
    assert!(latency >= Duration::from_millis(300), "it waited: {latency:?}");
    assert!(sum < 0.1, "but held the row {sum} s: the wait is not the hold");

    // 100 ms (± 50 %) of work while the row is locked.
    let body = json!({ "name": "slow", "stock": 10, "strategy": "sql", "work_ms": 100 });
    let slow = app.create_sale(body).await["id"].as_i64().unwrap();
    for buyer in 1..=3 {
        purchase(&direct, slow, buyer).await;
    }
    let (slow_sum, slow_count) = holds(&recorder);
    assert_eq!(slow_count, 4.0);
    let held = (slow_sum - sum) / 3.0;
    assert!(held >= 0.05, "work under the lock is held: {held} s a purchase");
}
