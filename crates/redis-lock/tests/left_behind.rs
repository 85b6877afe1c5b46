//! Nothing is left behind after a hold ends: a released lock's watchdog stops
//! (T10, seen from the round trips it would still make), and a grant whose
//! reply came back too late is released, not left to run out its lease (T3,
//! its stall placed by the `redis-lock/claim-replied` failpoint).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_lock::failpoints::{self, CLAIM_REPLIED};
use redis_lock::{LockConfig, LockError, LockOptions};

use crate::harness::{SHARED_REDIS, cleanup, client_with, exists, raw, shared_client, unique_name};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_a_released_locks_watchdog_makes_no_further_round_trip() {
    let (name, reference_name) = (unique_name("t10-stop"), unique_name("t10-reference"));
    let round_trips = Arc::new(AtomicU64::new(0));
    let counted = round_trips.clone();
    let config = LockConfig {
        on_round_trip: Some(Arc::new(move |n| {
            counted.fetch_add(n, Ordering::SeqCst);
        })),
        ..LockConfig::default()
    };
    let client = client_with(&SHARED_REDIS, config);
    let reference = shared_client();
    // Renewed every 100 ms.
    let options = LockOptions::new(Duration::ZERO, Duration::from_millis(300)).with_watchdog();

    let guard = client.try_lock_with(&name, options).await.expect("acquired");
    // Taken after `guard`, with the same period: each of its renewals is due
    // after the matching renewal of `guard`'s watchdog.
    let reference_guard = reference.try_lock_with(&reference_name, options).await.expect("taken");
    guard.release().await.expect("released");
    let after_release = round_trips.load(Ordering::SeqCst);

    let renewed_twice = test_support::eventually(Duration::from_secs(10), || {
        let renewals = reference_guard.renewals();
        async move { renewals >= 2 }
    })
    .await;
    assert!(renewed_twice, "the reference lock's watchdog renews");
    assert_eq!(
        round_trips.load(Ordering::SeqCst),
        after_release,
        "a released lock's watchdog went on renewing"
    );
    reference_guard.release().await.expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t3_a_grant_that_came_back_after_its_lease_is_released_at_once() {
    let name = unique_name("t3-released");
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    let lease = Duration::from_millis(300);
    let mut stalled = failpoints::arm::<()>(CLAIM_REPLIED, name.key());

    let late = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move { client.try_lock(&name, Duration::ZERO, lease).await })
    };
    stalled.reached().await; // granted on Redis; the reply is back, not yet judged
    // The grant outlives the client's view of it, as when the command reached
    // Redis late: only a release frees it before 60 s.
    let extended: i64 =
        redis::cmd("PEXPIRE").arg(name.key()).arg(60_000).query_async(&mut conn).await.unwrap();
    assert_eq!(extended, 1, "the grant exists on Redis");
    tokio::time::sleep(lease).await; // the reply is now older than the lease
    stalled.resume(());

    let late = late.await.unwrap();
    assert!(matches!(late, Err(LockError::AcquiredTooLate { .. })), "{late:?}");
    let released = test_support::eventually(Duration::from_secs(5), || {
        let (mut conn, key) = (conn.clone(), name.key().to_owned());
        async move { !exists(&mut conn, &key).await }
    })
    .await;
    cleanup(&mut conn, &name).await;
    assert!(released, "a grant that came back too late must be released, not left to its lease");
}
