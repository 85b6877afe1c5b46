//! A cart of several items checked out under one [`MultiLock`]: the lock of
//! every item is taken, all or nothing, within one wait; the writes to each
//! item's stock carry that item's fencing token; everything is released at
//! the end. Against the Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379`).
//!
//! Two carts that share items never deadlock, whatever order their items are
//! listed in: the locks are always taken in the order of their names. A cart
//! whose last item is held by someone else for longer than the wait gets
//! `LockError::Timeout`, and the items it had already locked are released
//! before the error comes back.
//!
//! `cargo run -p redis-lock --example multi_lock`

use std::time::Duration;

use redis_lock::{LockClient, LockName, LockOptions, MultiLock};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locks = LockClient::new(redis::Client::open(url.as_str())?);
    // One lock per item, each with its own hash tag: on Redis Cluster the
    // items may live in different slots; each lock's keys share one.
    let cart: Vec<LockName> = [42, 7, 19]
        .iter()
        .map(|item| LockName::new(format!("example:{{item:{item}}}:lock")))
        .collect::<Result<_, _>>()?;

    let checkout = MultiLock::new(&locks, cart)?;
    // 1 s to take all three, each with a 5 s lease renewed by the watchdog.
    let options = LockOptions::new(Duration::from_secs(1), Duration::from_secs(5)).with_watchdog();
    let held = checkout.try_lock(options).await?;
    for (name, token) in held.fencing_tokens() {
        // Here each item's stock would be written with its token, and the
        // store would refuse a token lower than the highest it has seen.
        println!("{name}: fencing token {token}");
    }
    if held.lost().is_cancelled() {
        return Err("an item's lock was lost before the writes".into());
    }
    let outcomes = held.release().await?;
    println!("released: {outcomes:?}; {} round trips", locks.stats().round_trips);
    Ok(())
}
