//! Contract fuzzing: schemathesis against a `seckill` child process, from
//! the service's own `GET /openapi.json` (`scripts/schemathesis.sh`, which
//! installs its pinned version under `target/` on first use). Every check
//! must pass, in every phase, the stateful chains of linked calls included:
//! no `5xx` (but the `503 busy` a purchase documents, of a lock sale cut off
//! at its lock's wait or hold bound: `scripts/schemathesis.toml`), every
//! status, content type, header and body as the document says, invalid data
//! refused and valid data accepted. The script gets this process's
//! environment: `SCHEMATHESIS_PHASES`, `_SEED` and `_MAX_EXAMPLES` reach it.
//!
//! The service gets what every strategy needs, so that no purchase of a
//! sale the fuzzer creates fails for want of a server: three `redis-server`
//! nodes of its own for `lock/redlock`, and queue names of its own on the
//! shared broker, deleted at the end.

use std::path::Path;
use std::time::Duration;

use seckill::config::Config;
use test_support::RedisServer;

use crate::support::{ADMIN_TOKEN, seckill_child};

/// The run's bound: installing schemathesis the first time, then the run
/// itself (about 10 s on a 2-core machine, every phase).
const RUN_WITHIN: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_keeps_its_openapi_contract_under_schemathesis() {
    let _heavy = test_support::heavy();
    let nodes =
        [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await];
    let redlock = nodes.iter().map(RedisServer::url).collect::<Vec<_>>().join(",");
    let prefix = test_support::unique_prefix();
    let service = seckill_child(&[
        ("SECKILL_LOCK_REDLOCK_URLS", redlock),
        ("SECKILL_REDIS_PREFIX", prefix.clone()),
        ("SECKILL_AMQP_PREFIX", prefix.clone()),
        ("RUST_LOG", "warn".to_owned()),
    ])
    .inherit_stderr()
    .start()
    .await;

    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let run = tokio::process::Command::new("bash")
        .arg("scripts/schemathesis.sh")
        .args(["run", &service.base])
        .current_dir(workspace)
        .env("SECKILL_ADMIN_TOKEN", ADMIN_TOKEN)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(RUN_WITHIN, run)
        .await
        .expect("schemathesis finishes within its bound")
        .expect("bash runs scripts/schemathesis.sh");
    let report = String::from_utf8_lossy(&output.stdout);
    let summary = report.lines().rev().find(|line| line.contains(" in ")).unwrap_or_default();
    println!("schemathesis: {summary}");

    crate::support::delete_queues(&prefix, Config::defaults().strategies.queue.partitions).await;
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("passed"), "no test case ran:\n{report}");
}
