//! Semaphore: never more than N permits across processes, bounded waits, a
//! dead holder's permit back when its lease ends (its connection killed),
//! and a renewed permit told when it is lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redis_lock::{LockConfig, LockError, LockOptions, LossReason, ReleaseOutcome, Semaphore};

use crate::harness::{
    DelayProxy, SHARED_REDIS, assert_bounded, cleanup, client_with, join_processes, raw,
    shared_client, unique_name,
};

const LONG: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_permits_across_processes() {
    let name = unique_name("semaphore-count");
    let (inside, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let semaphore = Semaphore::new(&shared_client(), name.clone(), 3).unwrap();
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..8 {
                    let permit = semaphore.acquire(LockOptions::new(LONG, LONG)).await?;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await?;
                }
                Ok::<_, LockError>(())
            })
        })
        .collect();
    join_processes(tasks).await;
    assert_eq!(most.load(Ordering::SeqCst), 3, "3 permits in use at most, and at some point");
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_permit_comes_back_when_its_lease_ends() {
    let name = unique_name("semaphore-dead");
    // The holder renews its permit through a proxy, which then goes away:
    // its process is cut off for good.
    let proxy = DelayProxy::start(test_support::redis_addr()).await;
    let config = LockConfig { command_timeout: Duration::from_millis(100), ..Default::default() };
    let doomed = Semaphore::new(&client_with(&proxy.url(), config), name.clone(), 1).unwrap();
    let lease = Duration::from_millis(300);
    let held =
        doomed.acquire(LockOptions::new(Duration::ZERO, lease).with_watchdog()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(held.renewals() >= 1);
    drop(proxy);

    let other = Semaphore::new(&shared_client(), name.clone(), 1).unwrap();
    let cut = Instant::now();
    let permit = other.acquire(LockOptions::new(LONG, LONG)).await.expect("the permit came back");
    let waited = cut.elapsed();
    assert!(waited < lease + Duration::from_millis(400), "{waited:?}");
    tokio::time::timeout(lease, held.lost().cancelled()).await.expect("the cut-off holder is told");
    assert_eq!(held.loss(), Some(LossReason::Unreachable));
    permit.release().await.unwrap();
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_permit_is_bounded_and_a_lost_permit_is_told() {
    let name = unique_name("semaphore-wait");
    let client = shared_client();
    let semaphore = Semaphore::new(&client, name.clone(), 1).unwrap();
    let options = LockOptions::new(Duration::ZERO, Duration::from_millis(300)).with_watchdog();
    let held = semaphore.acquire(options).await.unwrap();

    let other = Semaphore::new(&shared_client(), name.clone(), 1).unwrap();
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    let refused = other.acquire(LockOptions::new(wait, LONG)).await;
    assert_bounded(started.elapsed(), wait);
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    assert!(held.renewals() >= 1, "renewed past its lease while the other waited");
    assert!(client.stats().renewals >= 1, "the client counts its permits' renewals");

    // The permits vanish behind the holder's back: its next renewal tells it.
    let mut conn = raw(&SHARED_REDIS).await;
    let _: i64 = redis::cmd("DEL").arg(name.key()).query_async(&mut conn).await.unwrap();
    tokio::time::timeout(Duration::from_millis(300), held.lost().cancelled()).await.expect("told");
    assert_eq!(held.loss(), Some(LossReason::Expired));
    assert_eq!(client.stats().losses, 1, "the client counts its permits' losses");
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Expired);
    assert!(Semaphore::new(&shared_client(), name.clone(), 0).is_err(), "zero permits");
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_permit_is_given_back_by_another_process_or_ends_with_its_lease() {
    let name = unique_name("semaphore-hand-over");
    let taker = Semaphore::new(&shared_client(), name.clone(), 2).unwrap();
    let giver = Semaphore::new(&shared_client(), name.clone(), 2).unwrap();
    let options = |lease_ms| LockOptions::new(Duration::ZERO, Duration::from_millis(lease_ms));

    let given = taker.acquire(options(10_000)).await.unwrap().hand_over();
    let lapsing = taker.acquire(options(400)).await.unwrap().hand_over();
    assert_eq!(giver.in_use().await.unwrap(), 2, "a handed-over permit stays in use");
    assert!(matches!(taker.acquire(options(1000)).await, Err(LockError::Timeout { .. })));

    assert!(giver.renew(&lapsing, Duration::from_millis(400)).await.unwrap(), "renewed");
    assert_eq!(giver.give_back(&given).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(giver.give_back(&given).await.unwrap(), ReleaseOutcome::Expired, "once only");
    assert_eq!(giver.in_use().await.unwrap(), 1);

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(giver.in_use().await.unwrap(), 0, "an unused permit ends with its lease");
    assert_eq!(giver.give_back(&lapsing).await.unwrap(), ReleaseOutcome::Expired);
    assert!(!giver.renew(&lapsing, LONG).await.unwrap(), "an ended lease is not revived");
    assert_eq!(giver.in_use().await.unwrap(), 0);
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}
