//! Fair lock: waiters served in arrival order across processes, no barging
//! by a newcomer, a dead waiter skipped once its deadline passed, a dead
//! holder's lease, bounded waits that leave the line, and a line that lets
//! in only whom it can serve within half of their wait (before it has timed
//! a hand-over, at a pace no shorter than the current hold so far).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_lock::{FairLock, LockError, LockName, LockOptions};

use crate::harness::{
    DelayProxy, SHARED_REDIS, assert_bounded, assert_ended_with_the_lease, cleanup_keys,
    client_with, client_with_waiter_timeout, exists, raw, shared_client, unique_name,
};

const LONG: Duration = Duration::from_secs(5);

/// Waiters in line (the line's sorted set).
async fn in_line(name: &LockName) -> usize {
    let mut conn = raw(&SHARED_REDIS).await;
    redis::cmd("ZCARD").arg(format!("{}:queue", name.key())).query_async(&mut conn).await.unwrap()
}

/// Waits (at most 2 s) until `n` waiters are in line.
async fn until_in_line(name: &LockName, n: usize) {
    let reached =
        test_support::eventually(Duration::from_secs(2), || async { in_line(name).await == n })
            .await;
    assert!(reached, "{n} waiters in line");
}

async fn cleanup_fair(name: &LockName) {
    cleanup_keys(&[name], &["", ":fence", ":queue", ":waiters", ":pace"]).await;
}

/// A waiter of its own process (its heartbeat every second): takes the lock
/// within `LONG`, notes `label` in `served` (the holders so far, and whether
/// one holds it now), holds it 20 ms, releases it.
fn waiter(
    name: &LockName,
    label: usize,
    served: &Arc<Mutex<(Vec<usize>, bool)>>,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let client = client_with_waiter_timeout(Duration::from_secs(3));
    let lock = FairLock::new(&client, name.clone());
    let served = served.clone();
    tokio::spawn(async move {
        let guard = lock.try_lock(LockOptions::new(LONG, LONG)).await?;
        {
            let mut served = served.lock().unwrap();
            assert!(!served.1, "{label} got the lock while another held it");
            served.0.push(label);
            served.1 = true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        served.lock().unwrap().1 = false;
        guard.release().await.map(drop)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order_and_a_newcomer_cannot_barge_in() {
    let name = unique_name("fair-order");
    let holder = FairLock::new(&shared_client(), name.clone());
    std::mem::forget(holder.try_lock(LockOptions::new(Duration::ZERO, LONG)).await.unwrap());
    let served = Arc::new(Mutex::new((Vec::new(), false)));
    let mut waiters = Vec::new();
    for label in 0..4 {
        waiters.push(waiter(&name, label, &served));
        until_in_line(&name, label + 1).await;
    }

    // The lock comes free without a release message (its holder's key is
    // gone), while four wait in line, each asleep until its next heartbeat:
    // a newcomer's single attempt finds it free, and is refused all the same.
    let mut conn = raw(&SHARED_REDIS).await;
    let _: i64 = redis::cmd("DEL").arg(name.key()).query_async(&mut conn).await.unwrap();
    let newcomer = FairLock::new(&shared_client(), name.clone());
    let barged = newcomer.try_lock(LockOptions::new(Duration::ZERO, LONG)).await;
    assert!(matches!(barged, Err(LockError::Timeout { .. })), "{barged:?}");
    for waiter in waiters {
        waiter.await.unwrap().expect("served within its wait");
    }
    assert_eq!(served.lock().unwrap().0, vec![0, 1, 2, 3]);
    assert_eq!(in_line(&name).await, 0);
    cleanup_fair(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_skipped_once_its_waiter_timeout_passed() {
    let name = unique_name("fair-dead");
    let waiter_timeout = Duration::from_millis(300);
    let holder = FairLock::new(&client_with_waiter_timeout(waiter_timeout), name.clone());
    let guard = holder.try_lock(LockOptions::new(Duration::ZERO, LONG)).await.unwrap();

    // The first waiter reaches Redis through a proxy, then loses it for good.
    let proxy = DelayProxy::start(test_support::redis_addr()).await;
    let config = redis_lock::LockConfig { waiter_timeout, ..Default::default() };
    let doomed = FairLock::new(&client_with(&proxy.url(), config), name.clone());
    let first = tokio::spawn(async move { doomed.try_lock(LockOptions::new(LONG, LONG)).await });
    until_in_line(&name, 1).await;
    let second = FairLock::new(&client_with_waiter_timeout(waiter_timeout), name.clone());
    let second = tokio::spawn(async move {
        let guard = second.try_lock(LockOptions::new(LONG, LONG)).await;
        (guard, Instant::now())
    });
    until_in_line(&name, 2).await;
    drop(proxy);

    let released = Instant::now();
    guard.release().await.unwrap();
    let (taken, at) = second.await.unwrap();
    let taken = taken.expect("the second waiter is served");
    let after = at - released;
    // The first waiter's last attempt was at most a third of the timeout
    // before the cut: its place held at least the rest of the timeout.
    assert!(
        after >= waiter_timeout / 2,
        "served {after:?} after the release: the dead waiter was not waited for"
    );
    assert!(after < waiter_timeout + waiter_timeout / 3 + Duration::from_millis(300), "{after:?}");
    assert!(first.await.unwrap().is_err(), "the cut-off waiter never got the lock");
    taken.release().await.unwrap();
    cleanup_fair(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_frees_a_fair_lock_when_its_lease_ends() {
    let name = unique_name("fair-lease");
    let lease = Duration::from_millis(200);
    let dead = FairLock::new(&shared_client(), name.clone());
    std::mem::forget(dead.try_lock(LockOptions::new(Duration::ZERO, lease)).await.unwrap());

    let started = Instant::now();
    let next = FairLock::new(&shared_client(), name.clone());
    let guard = next.try_lock(LockOptions::new(LONG, LONG)).await.unwrap();
    assert_ended_with_the_lease(started.elapsed(), lease);
    assert_eq!(guard.fencing_token().0, 2, "one more acquisition, one more token");
    guard.release().await.unwrap();
    cleanup_fair(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_wait_is_bounded_and_the_waiter_leaves_the_line() {
    let name = unique_name("fair-wait");
    let holder = FairLock::new(&shared_client(), name.clone());
    let guard = holder.try_lock(LockOptions::new(Duration::ZERO, LONG)).await.unwrap();
    let waiter = FairLock::new(&shared_client(), name.clone());
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let refused = waiter.try_lock(LockOptions::new(wait, LONG)).await;
    assert_bounded(started.elapsed(), wait);
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    assert_eq!(in_line(&name).await, 0, "the waiter left the line");
    // A watchdog fair lock is renewed like the reentrant lock.
    guard.release().await.unwrap();
    let options = LockOptions::new(Duration::ZERO, Duration::from_millis(300)).with_watchdog();
    let renewed = waiter.try_lock(options).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(renewed.renewals() >= 2, "{} renewals", renewed.renewals());
    assert!(!renewed.lost().is_cancelled(), "lost: {:?}", renewed.loss());
    renewed.release().await.unwrap();
    assert!(!exists(&mut raw(&SHARED_REDIS).await, name.key()).await);
    cleanup_fair(&name).await;
}

/// A newcomer with 1 s to wait behind a holder and two waiters: refused at
/// once (well before its wait ends), told at least `at_least`, and never in
/// line.
async fn refused_with_two_in_line(lock: &FairLock, at_least: Duration) {
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let refused = lock.try_lock(LockOptions::new(wait, LONG)).await;
    let elapsed = started.elapsed();
    let Err(LockError::Timeout { retry_after: Some(told), .. }) = refused else {
        panic!("refused with the wait the line predicted: {refused:?}");
    };
    assert!(told >= at_least, "told {told:?}, less than {at_least:?}");
    assert!(elapsed < wait, "refused after {elapsed:?}: it waited instead of being refused");
    assert_eq!(in_line(lock.name()).await, 2, "the refused newcomer never joined the line");
}

/// Releases `holder`, lets each waiter of `behind` take and release the
/// lock, and removes the lock's keys.
async fn serve_and_clean_up(
    name: &LockName,
    holder: redis_lock::LockGuard,
    behind: [tokio::task::JoinHandle<Result<redis_lock::LockGuard, LockError>>; 2],
) {
    holder.release().await.unwrap();
    for waiter in behind {
        waiter.await.unwrap().expect("a waiter let in is served").release().await.unwrap();
    }
    cleanup_fair(name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_the_line_cannot_serve_within_half_its_wait_is_refused_at_once() {
    const HOLD: Duration = Duration::from_millis(200);
    let name = unique_name("fair-admission");
    let lock = FairLock::new(&shared_client(), name.clone());
    let wait_in_line = |lock: &FairLock| {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock(LockOptions::new(LONG, LONG)).await })
    };

    // The line learns its pace from a hand-over: the first holder (taken
    // with a wait, so its grant is timed) keeps the lock HOLD, and the
    // waiter behind it is granted at least HOLD after it.
    let first = lock.try_lock(LockOptions::new(LONG, LONG)).await.unwrap();
    let second = wait_in_line(&lock);
    until_in_line(&name, 1).await;
    tokio::time::sleep(HOLD).await;
    first.release().await.unwrap();
    let holder = second.await.unwrap().expect("served from the line");
    // Two more are let in: with 5 s to wait, a line of two at that pace is
    // well within half of it.
    let ahead = wait_in_line(&lock);
    until_in_line(&name, 1).await;
    let behind = [ahead, wait_in_line(&lock)];
    until_in_line(&name, 2).await;

    // With 1 s to wait, the two ahead and the holder would take at least
    // 3 × HOLD, more than half of it: refused at once, never in line.
    refused_with_two_in_line(&lock, HOLD * 3).await;
    serve_and_clean_up(&name, holder, behind).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_line_has_timed_a_hand_over_the_current_hold_bounds_who_gets_in() {
    const HOLD: Duration = Duration::from_millis(300);
    let name = unique_name("fair-unpaced");
    let lock = FairLock::new(&shared_client(), name.clone());
    let wait_in_line = |lock: &FairLock| {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock(LockOptions::new(LONG, LONG)).await })
    };

    // A holder that would have waited (its grant is timed), and two waiters
    // let in behind it at once, while its hold is short.
    let holder = lock.try_lock(LockOptions::new(LONG, LONG)).await.unwrap();
    let first = wait_in_line(&lock);
    until_in_line(&name, 1).await;
    let behind = [first, wait_in_line(&lock)];
    until_in_line(&name, 2).await;

    // No hand-over has been timed; the hold so far is a floor of the pace.
    // After HOLD, the two ahead and the holder would take at least 3 × HOLD,
    // more than half of a 1 s wait: refused at once, never in line. (A line
    // that let everyone in before it knew its pace would have let it in.)
    tokio::time::sleep(HOLD).await;
    refused_with_two_in_line(&lock, HOLD * 3).await;
    serve_and_clean_up(&name, holder, behind).await;
}
