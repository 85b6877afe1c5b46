//! A room's Redis round trips are counted under the sale's strategy
//! (`seckill_redis_round_trips_total`), so a run's round trips per unit
//! include the room's: `sql` sends none of its own.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use reqwest::StatusCode;
use seckill::metric_names::REDIS_ROUND_TRIPS_TOTAL;
use serde_json::json;

use super::{admission_of, buy_with, join, room_sale, until_called};
use crate::support::TestApp;

/// `sql`'s round trips in `recorder` (0 before the first).
fn sql_round_trips(recorder: &PrometheusRecorder) -> f64 {
    let series = format!("{REDIS_ROUND_TRIPS_TOTAL}{{strategy=\"sql\"}}");
    let text = recorder.handle().render();
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

// A current-thread runtime (the default): the service, its admitter and the
// lock library's tasks run on the thread whose local recorder counts them,
// apart from the other tests in this process.
#[tokio::test]
async fn the_rooms_round_trips_count_under_the_sales_strategy() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let app = TestApp::spawn().await;

    // Without a room, a `sql` purchase sends nothing to Redis.
    let plain = app.sale("sql", 5).await;
    let bought = app.order(plain, json!({ "user_id": 1 })).await;
    assert_eq!(bought.status(), StatusCode::CREATED);
    assert_eq!(sql_round_trips(&recorder), 0.0, "sql alone sends no Redis round trip");

    // With one: the join, every look, the admitter's rounds, and the
    // purchase's use of the admission and its permit (renewed, given back).
    let sale = room_sale(&app, "sql", 5, json!({ "admissions_per_s": 100 })).await;
    join(&app, sale, 1).await;
    let (place, _) = until_called(&app, sale, 1, Duration::from_secs(10)).await;
    let before = sql_round_trips(&recorder);
    assert!(before >= 2.0, "the join and at least one look: {before}");
    let bought = buy_with(&app, sale, 1, admission_of(&place)).await;
    assert_eq!(bought.status(), StatusCode::CREATED);
    let after = sql_round_trips(&recorder);
    assert!(after >= before + 3.0, "use, renew and give back: {before} then {after}");
}
