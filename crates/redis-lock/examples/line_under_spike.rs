//! A spike of waiters on one lock, against the Redis at `REDIS_URL`
//! (default `redis://127.0.0.1:6379`): `WAITERS` tasks (default 3000) join
//! within the first second, each waits at most `WAIT_MS` (default 1000) for
//! the lock, holds it `HOLD_MS` (default 1) and releases it. Prints, for the
//! fair lock and for the reentrant lock, how many took it, how many timed
//! out, the grants in each 500 ms, the longest gap between two grants, and
//! the round trips per grant.
//!
//! `cargo run --release -p redis-lock --example line_under_spike`
//!
//! What it shows: how each lock's hand-over behaves when the line is far
//! longer than what can be served within one wait (the crate README,
//! "The fair lock under a spike").

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_lock::{FairLock, LockClient, LockName, LockOptions};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Fair,
    Reentrant,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (waiters, wait_ms, hold_ms) =
        (env("WAITERS", 3000), env("WAIT_MS", 1000), env("HOLD_MS", 1));
    println!("{waiters} waiters within 1 s, wait {wait_ms} ms, hold {hold_ms} ms");
    for kind in [Kind::Fair, Kind::Reentrant] {
        let locks = LockClient::new(redis::Client::open(url.as_str())?);
        let name = LockName::new(format!("example:{{spike-{}}}:lock", std::process::id()))?;
        let started = Instant::now();
        let grants = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..waiters {
            let (locks, name, grants) = (locks.clone(), name.clone(), grants.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(i as f64 / waiters as f64)).await;
                let options =
                    LockOptions::new(Duration::from_millis(wait_ms), Duration::from_secs(5));
                let guard = match kind {
                    Kind::Fair => FairLock::new(&locks, name).try_lock(options).await,
                    Kind::Reentrant => locks.try_lock_with(&name, options).await,
                };
                let Ok(guard) = guard else { return false };
                grants.lock().unwrap().push(started.elapsed());
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                let _ = guard.release().await;
                true
            }));
        }
        let mut took = 0;
        for task in tasks {
            took += u64::from(task.await?);
        }
        let grants = grants.lock().unwrap().clone();
        let mut buckets = vec![0u64; (started.elapsed().as_millis() / 500 + 1) as usize];
        let mut gap = Duration::ZERO;
        for pair in grants.windows(2) {
            gap = gap.max(pair[1].saturating_sub(pair[0]));
        }
        for at in &grants {
            buckets[(at.as_millis() / 500) as usize] += 1;
        }
        let trips = locks.stats().round_trips;
        println!(
            "{kind:?}: took {took}, timed out {}, in {:.1} s; longest gap {} ms; {:.1} round \
             trips per grant; grants per 500 ms: {buckets:?}",
            waiters - took,
            started.elapsed().as_secs_f64(),
            gap.as_millis(),
            trips as f64 / took.max(1) as f64,
        );
    }
    Ok(())
}
