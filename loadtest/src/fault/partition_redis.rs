//! `partition-redis`: instance 0's link to Redis ([`super::link`]) is cut
//! for `--fault-duration-ms`, by default 3 × the sale's lock lease, then
//! healed. The instance keeps running and keeps Postgres and RabbitMQ; the
//! other instances keep Redis. What it sent meanwhile executes on healing.
//!
//! For a lock, the cut instance can neither renew nor release what it
//! holds: its lease runs out and another instance takes the lock, while the
//! cut holder — not stopped, unlike `pause-instance` — goes on with a
//! critical section that needs Postgres only. For the Redis gate, a
//! decrement whose answer is cut off leaves a reservation that no order
//! follows until the reconciler returns it. Faults on the lock's Redlock
//! nodes are not part of it (their links are not relayed).

use anyhow::Context;

use super::link::Condition;
use super::{Landed, Target, lasting};

/// Cuts instance 0's link to Redis, waits, heals it.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let victim = 0;
    let link = on.servers.links.redis.get(victim).context("no link to Redis was started")?;
    link.set(Condition::Cut);
    let landed = Landed::now(Some(victim));
    tokio::time::sleep(lasting(&on.settings, on.lease_ms)).await;
    link.set(Condition::Open);
    Ok(landed)
}
