//! Takes a lock and releases it, against the Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379`), printing what the library reports on the way:
//! the fencing token of the acquisition, the release outcome, and the round
//! trips it cost.
//!
//! `cargo run -p redis-lock --example take_and_release`

use std::time::Duration;

use redis_lock::{LockClient, LockName, ReleaseOutcome};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locks = LockClient::new(redis::Client::open(url.as_str())?);
    // The part in braces is the hash tag: every key of the lock shares it.
    let name = LockName::new("example:{take-and-release}:lock")?;

    let guard = locks.try_lock(&name, Duration::from_secs(1), Duration::from_secs(5)).await?;
    println!("{url}: holding {name} with fencing token {}", guard.fencing_token());
    let outcome = guard.release().await?;
    println!("released: {outcome:?}; {} round trips", locks.stats().round_trips);
    assert_eq!(outcome, ReleaseOutcome::Released);
    Ok(())
}
