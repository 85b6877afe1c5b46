//! Ownership: reentrancy through the guard, typed outcomes for stale holders
//! (T7, T8), no renewal after release (T10), mutual exclusion and fencing,
//! and the fencing counter that outlives a fenced lock (and only a fenced
//! one).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis_lock::{ExtendOutcome, FairLock, LockError, LockOptions, ReleaseOutcome, RwLock};

use crate::harness::{SHARED_REDIS, cleanup, exists, holds, pttl, raw, shared_client, unique_name};

const LONG: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_through_the_guard_needs_one_release_per_hold() {
    let name = unique_name("reentry");
    let (client, other) = (shared_client(), shared_client());
    let mut conn = raw(&SHARED_REDIS).await;

    let first = client.try_lock(&name, Duration::ZERO, LONG).await.expect("free lock");
    let second = first.reenter().await.expect("re-entry by the owner");
    assert_eq!(holds(&mut conn, &name, first.owner()).await, Some(2));
    assert_eq!(second.fencing_token(), first.fencing_token(), "one acquisition, one token");

    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::StillHeld { holds: 1 });
    assert_eq!(holds(&mut conn, &name, first.owner()).await, Some(1));
    let refused = other.try_lock(&name, Duration::ZERO, LONG).await;
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "still held: {refused:?}");

    // The guard, not the task, owns the lock (Redisson #6878): release it
    // from another task.
    let released = tokio::spawn(async move { first.release().await }).await.unwrap();
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    assert_eq!(pttl(&mut conn, &name).await, -2, "free: the hash is gone");
    let next = other.try_lock(&name, Duration::ZERO, LONG).await.expect("free again");
    next.release().await.unwrap();
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t7_a_stale_holder_release_is_refused_and_the_next_owner_keeps_the_lock() {
    let name = unique_name("t7");
    let (a, b) = (shared_client(), shared_client());
    let mut conn = raw(&SHARED_REDIS).await;

    let stale = a.try_lock(&name, Duration::ZERO, Duration::from_millis(50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let next = b.try_lock(&name, Duration::ZERO, LONG).await.expect("lease of A ran out");

    assert_eq!(stale.release().await.unwrap(), ReleaseOutcome::NotOwner);
    assert_eq!(holds(&mut conn, &name, next.owner()).await, Some(1), "B's lock untouched");
    assert!(pttl(&mut conn, &name).await > 1000, "B's lease untouched");
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t8a_extend_after_expiry_fails_when_another_owner_holds_the_lock() {
    let name = unique_name("t8a");
    let (a, b) = (shared_client(), shared_client());
    let mut conn = raw(&SHARED_REDIS).await;

    let stale = a.try_lock(&name, Duration::ZERO, Duration::from_millis(50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let next = b.try_lock(&name, Duration::ZERO, Duration::from_secs(2)).await.unwrap();

    assert_eq!(stale.extend(LONG).await.unwrap(), ExtendOutcome::NotOwner);
    assert_eq!(holds(&mut conn, &name, stale.owner()).await, None);
    assert!(pttl(&mut conn, &name).await <= 2000, "B's lease was not stretched by A");
    assert!(stale.lost().is_cancelled(), "A now knows it lost the lock");
    next.release().await.unwrap();
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t8b_extend_after_expiry_fails_and_does_not_recreate_the_lock() {
    let name = unique_name("t8b");
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;

    let stale = client.try_lock(&name, Duration::ZERO, Duration::from_millis(50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;

    assert_eq!(stale.extend(LONG).await.unwrap(), ExtendOutcome::Expired);
    assert_eq!(pttl(&mut conn, &name).await, -2, "the key was not re-created");
    assert_eq!(stale.release().await.unwrap(), ReleaseOutcome::Expired);
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_after_release_the_key_stays_gone_across_renewal_periods() {
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    let lease = Duration::from_millis(60); // renewal period 20 ms
    let options = LockOptions::new(Duration::ZERO, lease).with_watchdog();

    let mut names = Vec::new();
    for i in 0..20 {
        let name = unique_name("t10");
        let guard = client.try_lock_with(&name, options).await.unwrap();
        if i % 2 == 1 {
            // Let a renewal or two happen before releasing.
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if i % 5 == 4 {
            drop(guard); // released in the background
        } else {
            assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        }
        names.push(name);
    }
    // Seven renewal periods: a leaked renewal would have re-set a lease.
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for name in &names {
            assert_eq!(pttl(&mut conn, name).await, -2, "{name} came back after release");
        }
    }
    for name in &names {
        cleanup(&mut conn, name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_hold_the_lock_together_and_tokens_only_grow() {
    let name = unique_name("exclusion");
    let clients = [shared_client(), shared_client()];
    let inside = Arc::new(AtomicU32::new(0));
    let max_inside = Arc::new(AtomicU32::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));

    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..6 {
            let (client, name) = (client.clone(), name.clone());
            let (inside, max_inside, tokens) = (inside.clone(), max_inside.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..8 {
                    let guard = client
                        .try_lock(&name, Duration::from_secs(20), Duration::from_secs(2))
                        .await
                        .expect("acquired within the wait");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now, Ordering::SeqCst);
                    tokens.lock().unwrap().push(guard.fencing_token());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1, "two holders at once");
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 96);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "fencing tokens in holding order: {tokens:?}");
    let stats = [clients[0].stats(), clients[1].stats()];
    assert_eq!(stats[0].acquisitions + stats[1].acquisitions, 96);
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_cost_two_round_trips() {
    let name = unique_name("cost");
    let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let hook = {
        let counted = counted.clone();
        Arc::new(move |n: u64| {
            counted.fetch_add(n, Ordering::Relaxed);
        })
    };
    let config = redis_lock::LockConfig { on_round_trip: Some(hook), ..Default::default() };
    let client = crate::harness::client_with(&SHARED_REDIS, config);

    for _ in 0..10 {
        let guard = client.try_lock(&name, Duration::ZERO, LONG).await.unwrap();
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(client.stats().round_trips, 20);
    assert_eq!(counted.load(Ordering::Relaxed), 20, "the hook sees every round trip");
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_lock_leaves_its_counter_and_one_without_fencing_leaves_no_key() {
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    let fenced = unique_name("fence-kept");
    let guard = client.try_lock(&fenced, Duration::ZERO, LONG).await.unwrap();
    assert_eq!(guard.fencing_token().0, 1);
    guard.release().await.unwrap();
    assert!(exists(&mut conn, fenced.fence_key()).await, "the counter outlives the lock");

    // Without fencing, no primitive that issues tokens creates the counter.
    let bare = unique_name("fence-none");
    let options = LockOptions::new(Duration::ZERO, LONG).without_fencing();
    for primitive in 0..3 {
        let guard = match primitive {
            0 => client.try_lock_with(&bare, options).await,
            1 => FairLock::new(&client, bare.clone()).try_lock(options).await,
            _ => RwLock::new(&client, bare.clone()).write(options).await,
        };
        let guard = guard.unwrap();
        assert_eq!(guard.fencing_token().0, 0, "no token");
        guard.release().await.unwrap();
    }
    let mut keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}*", bare.key())).query_async(&mut conn).await.unwrap();
    keys.sort();
    assert_eq!(keys, Vec::<String>::new(), "nothing outlives a lock without fencing");
    cleanup(&mut conn, &fenced).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reports_the_lease_it_was_given_and_the_one_an_extend_set() {
    let name = unique_name("lease");
    let lease = Duration::from_millis(1500);
    let guard = shared_client().try_lock(&name, Duration::ZERO, lease).await.unwrap();
    assert_eq!(guard.lease(), lease);
    assert_eq!(guard.extend(LONG).await.unwrap(), ExtendOutcome::Extended);
    assert_eq!(guard.lease(), LONG);
    let mut conn = raw(&SHARED_REDIS).await;
    assert!(pttl(&mut conn, &name).await > 1500, "Redis holds the extended lease");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    cleanup(&mut conn, &name).await;
}
