//! Dropped futures and guards: an acquisition whose future is dropped —
//! after its attempt reached Redis, or while it waited — leaves no hold, no
//! place in line and no blocked local waiter behind (T20); sibling guards
//! dropped at once free the lock every time (T21).

use std::time::{Duration, Instant};

use std::sync::Arc;

use redis_lock::{FairLock, LockConfig, LockOptions};
use tokio::sync::Barrier;

use crate::harness::{
    DelayProxy, SHARED_REDIS, cleanup, cleanup_keys, client_with, client_with_waiter_timeout, pttl,
    raw, shared_addr, shared_client, unique_name,
};

const LONG: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_an_acquisition_dropped_after_its_attempt_ran_leaves_no_hold() {
    let name = unique_name("t20-grant");
    let proxy = DelayProxy::start(shared_addr()).await;
    let client = client_with(&proxy.url(), LockConfig::default());
    let warm_up = unique_name("t20-warm-up");
    client.try_lock(&warm_up, Duration::ZERO, LONG).await.unwrap().release().await.unwrap();
    let mut conn = raw(&SHARED_REDIS).await;

    // The acquire runs on Redis at once; its reply comes 300 ms later, after
    // the caller has given up on the call and dropped it.
    proxy.delay_next_reply(Duration::from_millis(300));
    let dropped =
        tokio::time::timeout(Duration::from_millis(100), client.try_lock(&name, LONG, LONG)).await;
    assert!(dropped.is_err(), "the call was dropped before its reply");
    assert!(pttl(&mut conn, &name).await > 0, "the grant exists on Redis");

    let freed = test_support::eventually(Duration::from_secs(1), || {
        let mut conn = conn.clone();
        let name = name.clone();
        async move { pttl(&mut conn, &name).await == -2 }
    })
    .await;
    assert!(freed, "the orphaned grant is released, not left for its {LONG:?} lease");
    cleanup(&mut conn, &name).await;
    cleanup(&mut conn, &warm_up).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_a_waiter_dropped_while_waiting_does_not_hold_up_the_next_local_waiter() {
    let name = unique_name("t20-local");
    let holder = shared_client().try_lock(&name, Duration::ZERO, LONG).await.unwrap();
    let client = shared_client();
    let first = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move { client.try_lock(&name, LONG, LONG).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.abort();
    let second = {
        let (client, name) = (client.clone(), name.clone());
        tokio::spawn(async move {
            let guard = client.try_lock(&name, Duration::from_secs(2), LONG).await;
            (guard, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let released = Instant::now();
    holder.release().await.unwrap();
    let (guard, acquired) = second.await.unwrap();
    guard.expect("the next waiter took the lock").release().await.unwrap();
    assert!(acquired - released < Duration::from_millis(300), "{:?}", acquired - released);
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_a_fair_waiter_dropped_while_waiting_leaves_the_line_at_once() {
    let name = unique_name("t20-fair");
    let holder = FairLock::new(&shared_client(), name.clone());
    let guard = holder.try_lock(LockOptions::new(Duration::ZERO, LONG)).await.unwrap();
    // A dead waiter would keep its place for 10 s.
    let waiter = FairLock::new(&client_with_waiter_timeout(LONG), name.clone());
    let waiting = tokio::spawn(async move { waiter.try_lock(LockOptions::new(LONG, LONG)).await });
    let line = format!("{}:queue", name.key());
    let in_line = |n: usize| {
        let line = line.clone();
        move || {
            let line = line.clone();
            async move {
                let mut conn = raw(&SHARED_REDIS).await;
                let waiting: usize =
                    redis::cmd("ZCARD").arg(&line).query_async(&mut conn).await.unwrap();
                waiting == n
            }
        }
    };
    assert!(test_support::eventually(Duration::from_secs(2), in_line(1)).await, "in line");

    waiting.abort();
    let left = test_support::eventually(Duration::from_secs(1), in_line(0)).await;
    assert!(left, "the dropped waiter left the line, and does not keep its place for {LONG:?}");
    guard.release().await.unwrap();
    cleanup_keys(&[&name], &["", ":fence", ":queue", ":waiters"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_sibling_guards_dropped_at_once_free_the_lock_every_time() {
    let name = unique_name("t21");
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    for round in 0..50 {
        let first = client.try_lock(&name, Duration::ZERO, LONG).await.unwrap();
        let second = first.reenter().await.unwrap();
        // One more hold than guards: a re-entry whose reply was lost. Only
        // the last guard's release, which frees every hold, frees the lock.
        let _: i64 = redis::cmd("HINCRBY")
            .arg(name.key())
            .arg(first.owner())
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let drops = [first, second].map(|guard| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                drop(guard);
            })
        });
        for dropped in drops {
            dropped.await.unwrap();
        }
        let freed = test_support::eventually(Duration::from_secs(1), || {
            let (mut conn, name) = (conn.clone(), name.clone());
            async move { pttl(&mut conn, &name).await == -2 }
        })
        .await;
        assert!(freed, "round {round}: the lock outlived both of its guards");
    }
    cleanup(&mut conn, &name).await;
}
