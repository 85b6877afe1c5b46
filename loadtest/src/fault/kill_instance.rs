//! `kill-instance`: SIGKILL one app instance, then start it again on the same
//! port after `--fault-restart-ms`. Whatever it held dies with it: its
//! transactions roll back, its Redis lock keys stay until they expire (or
//! forever, for `lock/setnx`), its unacknowledged messages go back to the
//! queue. Clients of the dead instance fail over to the others.
//!
//! Which instance, so that the kill hits where it matters, is the
//! strategy's registration's `kill` ([`KillTarget`]):
//! - `ActiveConsumer`: the one whose consumer is active for the run's
//!   partition, told by whose batch counter (`<metric>_count`) grows over
//!   [`ACTIVE_SAMPLE`];
//! - `LockHolder` (the hand-rolled Redis locks) on a single instance: that
//!   instance, at a moment it holds the sale's lock — it is stopped, the
//!   lock key is looked up, and it is continued and tried again a few
//!   milliseconds later until the key is there (for up to [`HOLDER_WAIT`]),
//!   then killed while stopped;
//! - otherwise instance 0. With several instances a lock holder cannot be
//!   told from outside (the key does not name its owner), so the killed
//!   instance holds the lock at that moment only by chance: the strategy's
//!   expectation says `may_break` where that decides.

use std::time::{Duration, Instant};

use seckill::strategy::{KillTarget, registration};

use super::{Landed, Target};

/// How long consumer activity is sampled to find the active consumer.
const ACTIVE_SAMPLE: Duration = Duration::from_millis(200);

/// How long the kill waits for a moment the single instance holds the lock.
const HOLDER_WAIT: Duration = Duration::from_secs(2);

/// Kills the chosen instance, waits, restarts it.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let victim = match registration(on.strategy).kill {
        KillTarget::ActiveConsumer { batches_metric } => {
            active_consumer(on, batches_metric).await.unwrap_or(0)
        }
        KillTarget::LockHolder { key } => {
            if let Some(key) = lock_key(on, key) {
                stop_while_holding(on, &key).await?;
            }
            0
        }
        KillTarget::First => 0,
    };
    on.instances.signal(victim, "KILL").await?;
    let landed = Landed::now(Some(victim));
    tokio::time::sleep(on.settings.restart_after).await;
    on.instances.restart(victim).await?;
    Ok(landed)
}

/// The Redis key `key` of the run's (first) sale, when one instance serves
/// it; `None` otherwise.
fn lock_key(on: &Target<'_>, key: &str) -> Option<String> {
    let prefix = on.instances.redis_prefix.as_deref()?;
    let sale = *on.sales.first()?;
    (on.instances.urls.len() == 1).then(|| sale_key(prefix, sale, key))
}

/// `PREFIX:{sale:ID}:<key>`, as `seckill::backends::RedisHandle::sale_key`
/// names a sale's keys.
fn sale_key(prefix: &str, sale: i64, key: &str) -> String {
    format!("{prefix}:{{sale:{sale}}}:{key}")
}

/// Leaves instance 0 stopped at a moment its lock key exists (or after
/// [`HOLDER_WAIT`], stopped all the same).
async fn stop_while_holding(on: &Target<'_>, key: &str) -> anyhow::Result<()> {
    let client = redis_lock::RedisClient::open(on.redis_url)?;
    let timeout = Duration::from_secs(5);
    let mut conn = client.connection(timeout, timeout, 1).await?;
    let deadline = Instant::now() + HOLDER_WAIT;
    loop {
        on.instances.signal(0, "STOP").await?;
        let held: bool = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await?;
        if held || Instant::now() >= deadline {
            return Ok(());
        }
        on.instances.signal(0, "CONT").await?;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// The instance whose consumer settled the most batches (counted by the
/// histogram `metric`) over [`ACTIVE_SAMPLE`]; `None` when none settled any
/// (or one did not answer).
async fn active_consumer(on: &Target<'_>, metric: &str) -> Option<usize> {
    let before = batches(on, metric).await?;
    tokio::time::sleep(ACTIVE_SAMPLE).await;
    let after = batches(on, metric).await?;
    let grown: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    busiest(&grown)
}

/// Batches each instance's consumers have settled so far.
async fn batches(on: &Target<'_>, metric: &str) -> Option<Vec<f64>> {
    let count = format!("{metric}_count");
    let mut all = Vec::new();
    for url in &on.instances.urls {
        let counters = on.admin.counters(std::slice::from_ref(url)).await.ok()?;
        all.push(counters.get(&count, None).unwrap_or(0.0));
    }
    Some(all)
}

/// Index of the largest positive value.
fn busiest(grown: &[f64]) -> Option<usize> {
    grown
        .iter()
        .enumerate()
        .filter(|(_, g)| **g > 0.0)
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_active_consumer_is_the_one_that_settled_batches() {
        assert_eq!(busiest(&[0.0, 12.0]), Some(1));
        assert_eq!(busiest(&[3.0, 1.0]), Some(0));
        assert_eq!(busiest(&[0.0, 0.0]), None);
    }

    #[test]
    fn the_holder_is_looked_up_by_the_key_its_registration_names() {
        use seckill::strategy::REGISTRY;
        let keys: Vec<String> = REGISTRY
            .iter()
            .filter_map(|r| match r.kill {
                KillTarget::LockHolder { key } => Some(sale_key("lt", 7, key)),
                _ => None,
            })
            .collect();
        assert!(keys.contains(&"lt:{sale:7}:lock:setnx".to_owned()), "{keys:?}");
        assert!(keys.iter().all(|key| key.starts_with("lt:{sale:7}:lock:")), "{keys:?}");
    }
}
