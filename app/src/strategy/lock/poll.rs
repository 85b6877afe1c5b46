//! The waiting loop of the hand-rolled lock generations (`lock/setnx`,
//! `lock/ttl`, `lock/token`): try, sleep, try again — the way those
//! generations were written. The library lock (the `redis-lock` crate) waits on a
//! pub/sub wake-up instead; this loop is part of what the comparison measures
//! (every attempt is a Redis round trip).

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::strategy::StrategyError;

/// First backoff ceiling.
const BASE: Duration = Duration::from_millis(2);
/// Largest backoff ceiling: short next to the 200 ms lease of the `slow`
/// profile, so an expired lease is noticed within a few percent of it.
const CAP: Duration = Duration::from_millis(25);

/// Calls `attempt` until it yields `Some` or `wait` has passed; `Ok(None)`
/// when the wait ran out. Between attempts it sleeps a uniformly random time
/// in `1 ms..=ceiling`, the ceiling doubling from 2 ms up to 25 ms ("full
/// jitter", AWS Architecture Blog, "Exponential Backoff And Jitter", 2015),
/// so that waiters spread out instead of retrying in lockstep. The last
/// attempt is made at the deadline. Errors of `attempt` end the wait.
pub(super) async fn poll<T, F, Fut>(
    wait: Duration,
    mut attempt: F,
) -> Result<Option<T>, StrategyError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, StrategyError>>,
{
    let deadline = Instant::now() + wait;
    let mut ceiling = BASE;
    loop {
        if let Some(held) = attempt().await? {
            return Ok(Some(held));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let nap = rand::rng().random_range(Duration::from_millis(1)..=ceiling);
        tokio::time::sleep(nap.min(deadline - now)).await;
        ceiling = (ceiling * 2).min(CAP);
    }
}
