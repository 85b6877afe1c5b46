//! The background reconciler runs at most once per period across instances:
//! three `seckill` processes share a Redis prefix, and over ten periods the
//! sum of their `seckill_scheduled_job_runs_total` grows by no more than the
//! periods the job's lock records as passed. A period in which every
//! instance came too late is skipped, by design, so on a loaded machine it
//! may grow by less: the test asks that most periods ran.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionManager;
use test_support::ChildService;

use super::{SHARED_REDIS, unique_prefix};
use crate::support::{ADMIN_TOKEN, seckill_child};

const PERIOD_MS: u64 = 300;

/// `instance`'s `seckill_scheduled_job_runs_total` for the reconciler.
async fn runs(service: &ChildService, instance: &str) -> u64 {
    let request = reqwest::Client::new().get(format!("{}/metrics", service.base));
    let page = request.bearer_auth(ADMIN_TOKEN).send().await.unwrap().text().await.unwrap();
    let labels = format!("instance=\"{instance}\"");
    let line = page
        .lines()
        .find(|line| {
            line.starts_with("seckill_scheduled_job_runs_total{")
                && line.contains(&labels)
                && line.contains("job=\"redis-decr-reconcile\"")
        })
        .unwrap_or_else(|| panic!("{instance} exports its run counter:\n{page}"));
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

/// The last period the job's lock records as done.
async fn last_done(conn: &mut ConnectionManager, prefix: &str) -> u64 {
    let key = format!("{prefix}:{{job:redis-decr-reconcile}}:done");
    let done: Option<u64> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
    done.expect("a period done")
}

/// (last period done, runs summed over the instances), read twice 50 ms
/// apart until both reads agree: no run was completing meanwhile.
async fn quiet_sample(
    conn: &mut ConnectionManager,
    prefix: &str,
    services: &[ChildService],
) -> (u64, u64) {
    for _ in 0..20 {
        let mut samples = Vec::new();
        for _ in 0..2 {
            let mut total = 0;
            for (i, service) in services.iter().enumerate() {
                total += runs(service, &format!("instance-{i}")).await;
            }
            samples.push((last_done(conn, prefix).await, total));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if samples[0] == samples[1] {
            return samples[0];
        }
    }
    panic!("runs kept completing: no quiet moment to sample");
}

/// Sleeps until the middle of the next period (by this machine's clock,
/// which the instances share), far from the runs at its start.
async fn until_mid_period() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let into = now % PERIOD_MS;
    let wait = (PERIOD_MS + PERIOD_MS / 2 - into) % PERIOD_MS;
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_reconciler_runs_once_per_period_across_three_instances() {
    let prefix = unique_prefix();
    let mut services = Vec::new();
    for i in 0..3 {
        let env = [
            ("SECKILL_REDIS_PREFIX", prefix.clone()),
            ("SECKILL_REDIS_DECR_RECONCILE_INTERVAL_MS", PERIOD_MS.to_string()),
            ("SECKILL_INSTANCE", format!("instance-{i}")),
        ];
        services.push(seckill_child(&env).start().await);
    }
    // A sale for the passes to visit.
    let created = reqwest::Client::new()
        .post(format!("{}/admin/sales", services[0].base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({ "name": "scheduled", "stock": 5, "strategy": "redis-decr" }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    let mut conn =
        redis::Client::open(SHARED_REDIS.as_str()).unwrap().get_connection_manager().await.unwrap();

    until_mid_period().await;
    let (done_before, runs_before) = quiet_sample(&mut conn, &prefix, &services).await;
    tokio::time::sleep(Duration::from_millis(10 * PERIOD_MS)).await;
    until_mid_period().await;
    let (done_after, runs_after) = quiet_sample(&mut conn, &prefix, &services).await;

    let (periods, ran) = (done_after - done_before, runs_after - runs_before);
    assert!(periods >= 9, "{periods} periods passed in about ten");
    assert!(ran <= periods, "{ran} runs in {periods} periods: at most one a period");
    assert!(ran * 2 >= periods, "{ran} runs in {periods} periods: most periods ran");
}
