//! Faults between client and Redis, through a proxy that delays replies:
//! a grant whose reply comes too late is never used (T3), and an acquire
//! retried after a lost reply holds the lock once (T9).

use std::time::Duration;

use redis_lock::failpoints::{self, CLAIM_REPLIED};
use redis_lock::{LockConfig, LockError, ReleaseOutcome};

use crate::harness::{
    DelayProxy, SHARED_REDIS, cleanup, client_with, holds, pttl, raw, shared_addr, shared_client,
    unique_name,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t3_a_grant_whose_reply_arrives_after_its_validity_is_released_not_used() {
    let name = unique_name("t3");
    let proxy = DelayProxy::start(shared_addr()).await;
    let config = LockConfig { command_timeout: Duration::from_secs(2), ..LockConfig::default() };
    let a = client_with(&proxy.url(), config);
    let b = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    let lease = Duration::from_millis(200);
    // Connect and load the scripts through the proxy first.
    a.try_lock(&name, Duration::ZERO, lease).await.unwrap().release().await.unwrap();

    proxy.delay_next_reply(Duration::from_millis(500));
    let late = {
        let (a, name) = (a.clone(), name.clone());
        tokio::spawn(async move { a.try_lock(&name, Duration::ZERO, lease).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // B waits while A's grant exists on Redis but A has not heard of it.
    let next = b
        .try_lock(&name, Duration::from_secs(2), Duration::from_secs(5))
        .await
        .expect("B gets the lock");

    let late = late.await.unwrap();
    assert!(
        matches!(late, Err(LockError::CommandTimeout(_) | LockError::AcquiredTooLate { .. })),
        "A must not get a lock whose validity is gone: {late:?}"
    );
    // A's delayed reply has arrived by now; B's lock is untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holds(&mut conn, &name, next.owner()).await, Some(1));
    assert!(pttl(&mut conn, &name).await > 3000);
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t9_an_acquire_retried_after_a_lost_reply_holds_once_and_one_release_frees_it() {
    let name = unique_name("t9");
    let proxy = DelayProxy::start(shared_addr()).await;
    let config =
        LockConfig { command_timeout: Duration::from_millis(150), ..LockConfig::default() };
    let client = client_with(&proxy.url(), config);
    let mut conn = raw(&SHARED_REDIS).await;
    let warm_up = unique_name("t9-warm-up");
    client
        .try_lock(&warm_up, Duration::ZERO, Duration::from_secs(1))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = client.stats().round_trips;

    // The first acquire runs on Redis, but its reply comes after the client
    // gave up on it; the client tries again.
    proxy.delay_next_reply(Duration::from_millis(300));
    let guard = client
        .try_lock(&name, Duration::from_secs(3), Duration::from_secs(5))
        .await
        .expect("acquired");

    assert!(client.stats().round_trips - before >= 2, "the acquire was retried");
    assert_eq!(
        holds(&mut conn, &name, guard.owner()).await,
        Some(1),
        "hold count stays 1 (Redisson #7367)"
    );
    let fence: u64 = redis::cmd("GET").arg(name.fence_key()).query_async(&mut conn).await.unwrap();
    assert_eq!((fence, guard.fencing_token().0), (1, 1), "one acquisition, one fencing token");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(pttl(&mut conn, &name).await, -2, "one release frees it");
    cleanup(&mut conn, &name).await;
    cleanup(&mut conn, &warm_up).await;
}

/// A wait that runs out while its last claim is unanswered is a timeout (the
/// lock busy), not a Redis failure, once Redis has answered a claim of the
/// same wait: on a loaded machine the last claim, sent at the end of the
/// wait, has only [`redis_lock::WAIT_SLACK`] for its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_running_out_on_an_unanswered_last_claim_is_a_timeout_once_redis_answered() {
    let name = unique_name("wait-runs-out");
    let proxy = DelayProxy::start(shared_addr()).await;
    let config = LockConfig { command_timeout: Duration::from_secs(2), ..LockConfig::default() };
    let waiter = client_with(&proxy.url(), config);
    let holder = shared_client()
        .try_lock(&name, Duration::ZERO, Duration::from_secs(10))
        .await
        .expect("the holder takes the lock");

    let mut replied = failpoints::arm::<()>(CLAIM_REPLIED, name.key());
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.clone());
        tokio::spawn(async move {
            waiter.try_lock(&name, Duration::from_secs(1), Duration::from_secs(5)).await
        })
    };
    // Redis answered the first claim (held by another); from now on the
    // waiter hears nothing more, so its claim at the end of the wait goes
    // unanswered.
    replied.reached().await;
    proxy.blackhole();
    replied.resume(());

    let outcome = waiting.await.unwrap();
    assert!(matches!(outcome, Err(LockError::Timeout { .. })), "{outcome:?}");
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

/// An error Redis answers (here a lock key of the wrong type) is reported as
/// that error, not as a command that timed out: the caller sorts a broken
/// lock from an unreachable Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_redis_answers_is_a_redis_error_not_a_timeout() {
    let name = unique_name("wrong-type");
    let mut conn = raw(&SHARED_REDIS).await;
    let _: () =
        redis::cmd("SET").arg(name.key()).arg("not a lock").query_async(&mut conn).await.unwrap();
    let refused = shared_client().try_lock(&name, Duration::ZERO, Duration::from_secs(1)).await;
    assert!(matches!(refused, Err(LockError::Redis(_))), "{refused:?}");
    cleanup(&mut conn, &name).await;
}
