//! `redis-restart`: the invocation's own Redis (see [`super::servers`]) is
//! killed, kept down for `--fault-restart-ms`, and started again on its port
//! with nothing persisted: every key is gone — `redis-decr` counters,
//! reservations and buyer sets, lock keys. Strategies that do not use Redis
//! run through it unchanged, which is a result too.

use anyhow::{Context, anyhow};

use super::{Landed, Target};

/// Kills the owned Redis, waits, starts it again empty.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let redis = on.servers.redis.as_ref().context("no owned Redis was started")?;
    let mut redis = redis.lock().await;
    redis.kill();
    let landed = Landed::now(None);
    tokio::time::sleep(on.settings.restart_after).await;
    redis.try_restart().await.map_err(|e| anyhow!(e))?;
    Ok(landed)
}
