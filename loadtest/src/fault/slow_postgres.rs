//! `slow-postgres`: every round trip on the instances' links to Postgres
//! ([`super::link`]) takes `--fault-latency-ms` longer — by default the
//! sale's lock lease — for `--fault-duration-ms` (default 3 × the lease);
//! then the links pass bytes at once again. Postgres itself is not touched:
//! its locks are held as long as the slowed transactions take.
//!
//! The default latency makes any critical section with one Postgres round
//! trip outlast its lock's lease: a lease renewed by a watchdog survives
//! it, a lease without one lets a second holder in, and a fence refuses the
//! late writer. Every strategy's transactions slow down with it, and the
//! service's own timeouts (the pool's acquire, the lock's hold limit)
//! answer some purchases 503 meanwhile.

use std::time::Duration;

use super::link::Condition;
use super::{Landed, Target, lasting};

/// Slows every instance's link to Postgres, waits, restores them.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let links = &on.servers.links.postgres;
    anyhow::ensure!(!links.is_empty(), "no link to Postgres was started");
    let slow = Condition::Slow(added_latency(on.settings.latency, on.lease_ms));
    links.iter().for_each(|link| link.set(slow));
    let landed = Landed::now(None);
    tokio::time::sleep(lasting(&on.settings, on.lease_ms)).await;
    links.iter().for_each(|link| link.set(Condition::Open));
    Ok(landed)
}

/// The latency added to each round trip: `--fault-latency-ms`, else the
/// lease.
pub fn added_latency(latency: Option<Duration>, lease_ms: i32) -> Duration {
    latency.unwrap_or_else(|| Duration::from_millis(lease_ms.max(1) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_latency_is_the_lease_and_a_given_one_wins() {
        assert_eq!(added_latency(None, 2000), Duration::from_secs(2));
        assert_eq!(added_latency(Some(Duration::from_millis(50)), 2000), Duration::from_millis(50));
    }
}
