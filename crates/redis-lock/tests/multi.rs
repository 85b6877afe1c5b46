//! Multi-lock: all or nothing (a partial acquisition is rolled back), no
//! deadlock between acquirers that list overlapping sets in different
//! orders, lost when any member is lost, and a dead holder's members freed
//! when their leases end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis_lock::{LockError, LockName, LockOptions, LossReason, MultiLock, ReleaseOutcome};

use crate::harness::{
    SHARED_REDIS, assert_bounded, assert_ended_with_the_lease, cleanup_keys, pttl, raw,
    shared_client, unique_names,
};

async fn cleanup_members(names: &[LockName]) {
    cleanup_keys(&names.iter().collect::<Vec<_>>(), &["", ":fence"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_acquisition_is_rolled_back_within_the_wait() {
    let names = unique_names("multi-rollback", 3);
    let (a, holder) = (shared_client(), shared_client());
    let mut conn = raw(&SHARED_REDIS).await;
    // The last member in key order is held elsewhere.
    let blocker = holder.try_lock(&names[2], Duration::ZERO, Duration::from_secs(5)).await.unwrap();

    let multi = MultiLock::new(&a, names.iter().rev().cloned()).unwrap();
    assert_eq!(multi.names(), &names[..], "taken in key order, whatever the order given");
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let refused = multi.try_lock(LockOptions::new(wait, Duration::from_secs(5))).await;
    assert_bounded(started.elapsed(), wait);
    match refused {
        Err(LockError::Timeout { name, .. }) => assert_eq!(name, names[2].key()),
        other => panic!("expected a timeout on the held member, got {other:?}"),
    }
    for name in &names[..2] {
        assert_eq!(pttl(&mut conn, name).await, -2, "{name} was rolled back");
    }

    blocker.release().await.unwrap();
    let all = multi.try_lock(LockOptions::new(wait, Duration::from_secs(5))).await.unwrap();
    let tokens = all.fencing_tokens();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.iter().all(|(_, token)| token.0 >= 1));
    assert_eq!(all.release().await.unwrap(), vec![ReleaseOutcome::Released; 3]);
    for name in &names {
        assert_eq!(pttl(&mut conn, name).await, -2);
    }
    cleanup_members(&names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_sets_in_different_orders_never_deadlock_and_never_share_a_member() {
    let names = unique_names("multi-order", 4);
    // A lists {0, 1, 2}; B lists {3, 2, 1}: they overlap on 1 and 2, listed
    // in opposite orders. Taken as listed, each could hold one and wait for
    // the other until both waits ran out.
    let sets = [vec![0, 1, 2], vec![3, 2, 1]];
    let busy: Arc<Vec<AtomicBool>> = Arc::new((0..4).map(|_| AtomicBool::new(false)).collect());
    let rounds = 25;
    let acquirers = sets.map(|set| {
        let client = shared_client();
        let members = set.iter().map(|&i| names[i].clone());
        let multi = MultiLock::new(&client, members).unwrap();
        let busy = busy.clone();
        tokio::spawn(async move {
            for _ in 0..rounds {
                let options = LockOptions::new(Duration::from_secs(3), Duration::from_secs(2));
                let guard = multi.try_lock(options).await?;
                for &i in &set {
                    assert!(!busy[i].swap(true, Ordering::SeqCst), "member {i} held twice");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                for &i in &set {
                    busy[i].store(false, Ordering::SeqCst);
                }
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        })
    });
    let both =
        tokio::time::timeout(Duration::from_secs(20), futures_util::future::join_all(acquirers));
    for outcome in both.await.expect("no deadlock") {
        outcome.unwrap().expect("every round took its whole set within its wait");
    }
    cleanup_members(&names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_is_lost_when_any_member_is_lost() {
    let names = unique_names("multi-lost", 3);
    let (a, b) = (shared_client(), shared_client());
    let mut conn = raw(&SHARED_REDIS).await;
    let lease = Duration::from_millis(300);
    let multi = MultiLock::new(&a, names.clone()).unwrap();
    let guard =
        multi.try_lock(LockOptions::new(Duration::ZERO, lease).with_watchdog()).await.unwrap();

    // One member's key disappears (as in T2) and B takes that member.
    let _: i64 = redis::cmd("DEL").arg(names[1].key()).query_async(&mut conn).await.unwrap();
    let thief = b.try_lock(&names[1], Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    tokio::time::timeout(lease, guard.lost().cancelled()).await.expect("told within a renewal");
    assert_eq!(guard.loss(), Some((&names[1], LossReason::NotOwner)));
    let outcomes = guard.release().await.unwrap();
    assert_eq!(
        outcomes,
        vec![ReleaseOutcome::Released, ReleaseOutcome::NotOwner, ReleaseOutcome::Released]
    );
    thief.release().await.unwrap();
    cleanup_members(&names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_members_come_free_when_their_leases_end() {
    let names = unique_names("multi-dead", 2);
    let (a, b) = (shared_client(), shared_client());
    let lease = Duration::from_millis(200);
    let dead = MultiLock::new(&a, names.clone()).unwrap();
    let held = dead.try_lock(LockOptions::new(Duration::ZERO, lease)).await.unwrap();
    // The holder dies: no release, no renewal.
    std::mem::forget(held);

    let started = Instant::now();
    let next = MultiLock::new(&b, names.clone()).unwrap();
    let guard = next.try_lock(LockOptions::new(Duration::from_secs(2), lease)).await.unwrap();
    assert_ended_with_the_lease(started.elapsed(), lease);
    guard.release().await.unwrap();
    assert!(MultiLock::new(&b, Vec::new()).is_err(), "an empty set is refused");
    cleanup_members(&names).await;
}
