//! `pause-instance`: SIGSTOP one app instance (instance 0) for
//! `--fault-duration-ms`, by default 3 × the sale's lock lease, then SIGCONT.
//! A stopped process keeps its connections and whatever it holds, and
//! resumes where it stopped: a lock holder's lease runs out meanwhile, and on
//! resumption it may write as if it still held the lock (a fence refuses
//! that write; a lease without one does not). Its clients wait for their
//! answers.
//!
//! Whether the stopped process was inside a critical section at that moment
//! is chance: the strategy's expectation says `may_break` where that decides.

use super::{Landed, Target, lasting};

/// Stops instance 0, waits, continues it.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let victim = 0;
    on.instances.signal(victim, "STOP").await?;
    let landed = Landed::now(Some(victim));
    tokio::time::sleep(lasting(&on.settings, on.lease_ms)).await;
    on.instances.signal(victim, "CONT").await?;
    Ok(landed)
}
