//! The serial hold the `sql` strategy records (`seckill::strategy::serial`):
//! it grows with work done while the sale row is locked, and not with time
//! spent before the lock is taken — waiting for the row counts toward a
//! purchase's latency, not toward the row's hold.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use seckill::metric_names::{SERIAL_HOLD_DURATION_SECONDS, SERIAL_HOLD_UNITS_TOTAL};
use seckill::sale::{Quantity, UserId};
use seckill::strategy::Strategy;
use seckill::strategy::sql::{NAME, Sql};
use serde_json::json;

use super::Direct;
use crate::support::{TestApp, hold_sale_row};

/// `sql`'s serial holds in `recorder`: seconds held, and units they sold.
fn holds(recorder: &PrometheusRecorder) -> (f64, f64) {
    let text = recorder.handle().render();
    let read = |metric: String| {
        let series = format!("{metric}{{strategy=\"{NAME}\"}}");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .map_or(0.0, |value| value.trim().parse().unwrap())
    };
    (read(format!("{SERIAL_HOLD_DURATION_SECONDS}_sum")), read(SERIAL_HOLD_UNITS_TOTAL.to_owned()))
}

/// Buyers `buyers` buy one unit of `sale` each through `sql`, all at once;
/// answers the longest purchase's latency.
async fn purchases(sale: i64, buyers: std::ops::RangeInclusive<i64>) -> Duration {
    let direct = Direct::new().await;
    let sale = direct.sale(sale).await;
    let sql = Sql::new(direct.db.clone(), NAME);
    let buy = |buyer: i64| {
        let (sale, sql) = (sale.clone(), &sql);
        async move {
            let started = Instant::now();
            let outcome = sql.purchase(&sale, UserId::parse(buyer).unwrap(), Quantity::ONE).await;
            let outcome = outcome.unwrap();
            assert!(matches!(outcome, seckill::outcome::Outcome::Placed { .. }), "{outcome:?}");
            started.elapsed()
        }
    };
    let latencies = futures_util::future::join_all(buyers.map(buy)).await;
    latencies.into_iter().max().unwrap()
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

    // Four buyers queue 800 ms for the row, which a transaction holds: each
    // after the first waited through the previous one's hold, and measures
    // it — shorter than the wait, however long they all waited before. (A
    // hold is a few ms on an idle machine; on two cores shared with the
    // rest of the suite, the holder's wait for a core between its
    // statements is part of it, so the bound is the wait, not a few ms.)
    let queue_for = Duration::from_millis(800);
    let sale = app.sale("sql", 10).await;
    let holder = hold_sale_row(&direct.db, sale).await;
    let queued = tokio::spawn(purchases(sale, 1..=4));
    tokio::time::sleep(queue_for).await;
    holder.commit().await.unwrap();
    let latency = queued.await.unwrap();
    let (waited, units) = holds(&recorder);
    assert!(latency >= queue_for, "they waited: {latency:?}");
    assert!(units >= 2.0, "the queued buyers measured the holds before theirs: {units}");
    let hold = waited / units;
    assert!(hold < queue_for.as_secs_f64() / 2.0, "but each hold left the wait out: {hold} s");

    // 100 ms (± 50 %) of work while the row is locked: the holds grow.
    let body = json!({ "name": "slow", "stock": 10, "strategy": "sql", "work_ms": 100 });
    let slow = app.create_sale(body).await["id"].as_i64().unwrap();
    purchases(slow, 1..=4).await;
    let (sum, all) = holds(&recorder);
    let held = (sum - waited) / (all - units);
    assert!(all - units >= 2.0, "{all} units");
    assert!(held >= 0.05, "work under the lock is held: {held} s a unit");
}

/// A fresh `seckill serve` lists every strategy's serial units at 0 before
/// any purchase: the load test reads the series of the strategy it runs
/// and fails when it is missing, as it was for the strategies built before
/// the process's metrics recorder existed.
#[tokio::test]
async fn a_fresh_service_lists_every_strategys_serial_units_before_its_first_hold() {
    let text = crate::api::health::own_metrics_page(async |_| {}).await;
    for registration in seckill::strategy::REGISTRY {
        let series = format!("{SERIAL_HOLD_UNITS_TOTAL}{{strategy=\"{}\"}} 0", registration.name);
        assert!(text.lines().any(|line| line == series), "{series} missing from:\n{text}");
    }
}
