//! Read-write lock: readers share, a writer excludes everyone across
//! processes, a waiting writer keeps new readers out, the writer re-enters,
//! waits are bounded, and a dead reader stops counting when its lease ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use redis_lock::{LockError, LockName, LockOptions, ReleaseOutcome, RwLock};

use crate::harness::{
    assert_bounded, assert_ended_with_the_lease, cleanup_keys, join_processes, shared_client,
    unique_name,
};

const LONG: Duration = Duration::from_secs(5);

async fn cleanup_rw(name: &LockName) {
    cleanup_keys(&[name], &["", ":fence", ":readers", ":writer-waiting"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_writer_waits_for_them_and_keeps_new_readers_out() {
    let name = unique_name("rw-share");
    let [a, b, c] = [0; 3].map(|_| RwLock::new(&shared_client(), name.clone()));
    let now = LockOptions::new(Duration::ZERO, LONG);
    let first = a.read(now).await.expect("a reader");
    let second = b.read(now).await.expect("readers share");
    assert!(
        matches!(c.write(now).await, Err(LockError::Timeout { .. })),
        "readers exclude a writer"
    );

    let started = Instant::now();
    let writer = tokio::spawn(async move {
        let guard = c.write(LockOptions::new(LONG, LONG)).await;
        (guard, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // The writer waits: a new reader is kept out, so readers cannot starve it.
    let late = RwLock::new(&shared_client(), name.clone());
    assert!(matches!(late.read(now).await, Err(LockError::Timeout { .. })), "writer preferred");
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!writer.is_finished(), "one reader still holds");
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    let (guard, waited) = writer.await.unwrap();
    let guard = guard.expect("the writer follows the last reader");
    assert!(waited < Duration::from_millis(250) + Duration::from_millis(400), "{waited:?}");

    // Reentrant for the writer; readers wait for its last hold.
    let inner = guard.reenter().await.expect("re-entry by the writer");
    assert_eq!(inner.fencing_token(), guard.fencing_token());
    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let refused = late.read(LockOptions::new(wait, LONG)).await;
    assert_bounded(started.elapsed(), wait);
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    assert_eq!(inner.release().await.unwrap(), ReleaseOutcome::StillHeld { holds: 1 });
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    late.read(now).await.expect("free for readers again").release().await.unwrap();
    cleanup_rw(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_excludes_readers_and_writers_under_concurrency() {
    let name = unique_name("rw-exclusion");
    // Positive: readers inside; −1000: a writer inside.
    let inside = Arc::new(AtomicI64::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|process| {
            let lock = RwLock::new(&shared_client(), name.clone());
            let inside = inside.clone();
            tokio::spawn(async move {
                for round in 0..12 {
                    let options = LockOptions::new(LONG, Duration::from_secs(2));
                    if (process + round) % 3 == 0 {
                        let guard = lock.write(options).await?;
                        let before = inside.swap(-1000, Ordering::SeqCst);
                        assert_eq!(before, 0, "a writer entered beside {before}");
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        inside.store(0, Ordering::SeqCst);
                        guard.release().await?;
                    } else {
                        let guard = lock.read(options).await?;
                        let before = inside.fetch_add(1, Ordering::SeqCst);
                        assert!(before >= 0, "a reader entered beside a writer");
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        guard.release().await?;
                    }
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    join_processes(tasks).await;
    cleanup_rw(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_reader_stops_blocking_writers_when_its_lease_ends() {
    let name = unique_name("rw-dead");
    let lease = Duration::from_millis(200);
    let reader = RwLock::new(&shared_client(), name.clone());
    std::mem::forget(reader.read(LockOptions::new(Duration::ZERO, lease)).await.unwrap());

    let started = Instant::now();
    let writer = RwLock::new(&shared_client(), name.clone());
    let guard = writer.write(LockOptions::new(LONG, LONG)).await.unwrap();
    assert_ended_with_the_lease(started.elapsed(), lease);
    guard.release().await.unwrap();

    // A reader renewed by its watchdog keeps its hold past its lease.
    let options = LockOptions::new(Duration::ZERO, Duration::from_millis(300)).with_watchdog();
    let renewed = reader.read(options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(renewed.renewals() >= 2, "{} renewals", renewed.renewals());
    assert!(!renewed.lost().is_cancelled(), "lost: {:?}", renewed.loss());
    let now = LockOptions::new(Duration::ZERO, LONG);
    assert!(matches!(writer.write(now).await, Err(LockError::Timeout { .. })));
    assert_eq!(renewed.release().await.unwrap(), ReleaseOutcome::Released);
    writer.write(now).await.expect("free").release().await.unwrap();
    cleanup_rw(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_stops_keeping_readers_out() {
    let name = unique_name("rw-give-up");
    let [a, b, c] = [0; 3].map(|_| RwLock::new(&shared_client(), name.clone()));
    let now = LockOptions::new(Duration::ZERO, LONG);
    let reader = a.read(now).await.unwrap();
    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let refused = b.write(LockOptions::new(wait, LONG)).await;
    assert_bounded(started.elapsed(), wait);
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    // Its marker went with it: a reader gets in at once, well within the
    // waiter timeout the marker would otherwise have lasted.
    let next = c.read(now).await.expect("readers welcome again");
    next.release().await.unwrap();
    reader.release().await.unwrap();
    cleanup_rw(&name).await;
}
