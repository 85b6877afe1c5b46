//! `pause-instance`: SIGSTOP one app instance (instance 0) for
//! `--fault-pause-ms`, by default 3 × the sale's lock lease, then SIGCONT.
//! A stopped process keeps its connections and whatever it holds, and
//! resumes where it stopped: a lock holder's lease runs out meanwhile, and on
//! resumption it may write as if it still held the lock (a fence refuses
//! that write; a lease without one does not). Its clients wait for their
//! answers.
//!
//! Whether the stopped process was inside a critical section at that moment
//! is chance: the strategy's expectation says `may_break` where that decides.

use std::time::Duration;

use super::{Landed, Target};

/// Stops instance 0, waits, continues it.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let victim = 0;
    let pause = on.settings.pause.unwrap_or_else(|| default_pause(on.lease_ms));
    on.instances.signal(victim, "STOP").await?;
    let landed = Landed::now(Some(victim));
    tokio::time::sleep(pause).await;
    on.instances.signal(victim, "CONT").await?;
    Ok(landed)
}

/// 3 × the lease: long enough that a stopped holder's lease has run out
/// and another holder can have come and gone.
pub fn default_pause(lease_ms: i32) -> Duration {
    Duration::from_millis(3 * lease_ms.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pause_is_three_leases() {
        assert_eq!(default_pause(2000), Duration::from_secs(6));
    }
}
