//! Waiting: pub/sub wake-ups, PTTL-bounded rounds when a wake-up is lost
//! (T11), waits that end on time however slow Redis is (T16), wake-ups that
//! survive a lost pub/sub connection (T17), one contender per process, and
//! clean errors for tiny leases, zero waits and bad configuration (T14).

use std::time::{Duration, Instant};

use redis_lock::{
    LockClient, LockConfig, LockError, LockGuard, LockName, LockOptions, MIN_LEASE, Redlock,
    RedlockConfig, ReleaseOutcome,
};
use test_support::RedisServer;

use crate::harness::{
    DelayProxy, SHARED_REDIS, assert_bounded, cleanup, client_with, raw, shared_addr,
    shared_client, unique_name,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_long_before_the_lease_ends() {
    let name = unique_name("wake");
    let (a, b) = (shared_client(), shared_client());
    let holder = a.try_lock(&name, Duration::ZERO, Duration::from_secs(10)).await.unwrap();

    let started = Instant::now();
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let guard = b.try_lock(&name, Duration::from_secs(5), Duration::from_secs(1)).await;
            (guard, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    holder.release().await.unwrap();
    let (guard, waited) = waiter.await.unwrap();
    guard.expect("woken and acquired").release().await.unwrap();
    assert!(waited >= Duration::from_millis(150), "acquired while held? {waited:?}");
    assert!(
        waited < Duration::from_secs(1),
        "woken by the release message, not the lease: {waited:?}"
    );
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t11_a_lost_wake_up_delays_a_waiter_only_until_the_lease_ends() {
    let name = unique_name("t11");
    let (a, b) = (shared_client(), shared_client());
    let lease = Duration::from_millis(600);
    let holder = a.try_lock(&name, Duration::ZERO, lease).await.unwrap();
    let mut conn = raw(&SHARED_REDIS).await;

    let started = Instant::now();
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let guard = b.try_lock(&name, Duration::from_secs(10), Duration::from_secs(1)).await;
            (guard, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The lock is freed but no message is ever published (a dropped PUBLISH,
    // or a waiter whose subscription was not active yet).
    let _: i64 = redis::cmd("DEL").arg(name.key()).query_async(&mut conn).await.unwrap();
    std::mem::forget(holder);

    let (guard, waited) = waiter.await.unwrap();
    let guard = guard.expect("acquired without a wake-up message");
    assert!(waited >= Duration::from_millis(100), "{waited:?}");
    assert!(
        waited <= lease + Duration::from_millis(400),
        "waited {waited:?}: the round must be bounded by the holder's PTTL"
    );
    guard.release().await.unwrap();
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_task_per_process_competes_for_a_held_lock() {
    let name = unique_name("queue");
    let (a, b) = (shared_client(), shared_client());
    let holder = a.try_lock(&name, Duration::ZERO, Duration::from_secs(10)).await.unwrap();

    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                let guard =
                    b.try_lock(&name, Duration::from_secs(10), Duration::from_secs(2)).await?;
                guard.release().await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let while_held = b.stats().round_trips;
    // The head of the local queue: one attempt, SUBSCRIBE, one attempt.
    assert!(while_held <= 4, "{while_held} round trips from 20 waiters of one process");

    holder.release().await.unwrap();
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(b.stats().acquisitions, 20);
    assert_eq!(b.stats().timeouts, 0);
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t14_tiny_leases_zero_waits_and_bad_configuration_give_typed_errors() {
    let name = unique_name("t14");
    let client = shared_client();
    let ms = Duration::from_millis;
    let invalid = |r: Result<_, LockError>| matches!(r, Err(LockError::InvalidConfig(_)));

    assert!(invalid(client.try_lock(&name, ms(100), Duration::ZERO).await.map(|_| ())));
    assert!(invalid(client.try_lock(&name, ms(100), ms(9)).await.map(|_| ())));
    assert!(invalid(client.try_lock(&name, Duration::MAX, ms(100)).await.map(|_| ())));
    assert!(invalid(client.try_lock(&name, ms(100), Duration::MAX).await.map(|_| ())));
    let watchdog = LockOptions::new(ms(100), ms(20)).with_watchdog();
    assert!(invalid(client.try_lock_with(&name, watchdog).await.map(|_| ())));
    assert!(matches!(LockName::new("no-hash-tag"), Err(LockError::InvalidName { .. })));
    assert!(matches!(LockName::new("empty-tag:{}:lock"), Err(LockError::InvalidName { .. })));
    let zero = LockConfig { command_timeout: Duration::ZERO, ..LockConfig::default() };
    assert!(invalid(
        redis_lock::LockClient::with_config(
            redis::Client::open(SHARED_REDIS.as_str()).unwrap(),
            zero
        )
        .map(|_| ())
    ));
    assert!(invalid(Redlock::new(Vec::new(), RedlockConfig::default()).map(|_| ())));
    let redlock = Redlock::new(
        vec![redis::Client::open(SHARED_REDIS.as_str()).unwrap()],
        RedlockConfig::default(),
    )
    .unwrap();
    let shorter_than_node_timeout = LockOptions::new(ms(0), ms(40));
    assert!(invalid(redlock.try_lock(&name, shorter_than_node_timeout).await.map(|_| ())));

    // The smallest lease works (an attempt whose reply takes longer than
    // its validity is retried within the wait), and its holder hears when
    // it ends.
    let tiny = client.try_lock(&name, ms(1000), MIN_LEASE).await.expect("minimum lease");
    assert!(invalid(tiny.extend(ms(1)).await.map(|_| ())));
    tokio::time::timeout(ms(500), tiny.lost().cancelled()).await.expect("told at lease end");
    drop(tiny);

    // A zero wait on a held lock is one attempt and a clean timeout.
    let other = shared_client();
    // (The tiny lease may outlive its local validity by the drift allowance.)
    let holder = client.try_lock(&name, ms(1000), ms(2000)).await.unwrap();
    let started = Instant::now();
    let busy = other.try_lock(&name, Duration::ZERO, ms(2000)).await;
    match busy {
        Err(LockError::Timeout { retry_after: Some(retry_after), .. }) => {
            assert!(retry_after <= ms(2000) && retry_after > ms(1000), "{retry_after:?}");
        }
        other => panic!("expected a timeout with the remaining lease, got {other:?}"),
    }
    assert!(started.elapsed() < ms(500), "a zero wait does not wait");
    assert_eq!(other.stats().timeouts, 1);
    holder.release().await.unwrap();

    // An unreachable Redis is an error, not a hang or a panic.
    let nowhere = client_with("redis://127.0.0.1:1", LockConfig::default());
    let down = nowhere.try_lock(&name, ms(200), ms(1000)).await;
    assert!(down.as_ref().is_err_and(LockError::is_unavailable), "{down:?}");
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

/// A lock named for `test`, held on the shared Redis for longer than any
/// wait here, and a waiter (default configuration: 1 s timeouts) that
/// reaches Redis through a proxy, its command connection open and its
/// scripts loaded.
async fn held_and_waited_for_through_a_proxy(
    test: &str,
) -> (LockName, LockGuard, DelayProxy, LockClient) {
    let name = unique_name(test);
    let holder =
        shared_client().try_lock(&name, Duration::ZERO, Duration::from_secs(10)).await.unwrap();
    let proxy = DelayProxy::start(shared_addr()).await;
    let waiter = client_with(&proxy.url(), LockConfig::default());
    let warm_up = unique_name("t16-warm-up");
    let guard = waiter.try_lock(&warm_up, Duration::ZERO, Duration::from_secs(1)).await.unwrap();
    guard.release().await.unwrap();
    (name, holder, proxy, waiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t16_a_wait_ends_on_time_when_the_wake_up_connection_hangs() {
    let (name, holder, proxy, waiter) = held_and_waited_for_through_a_proxy("t16-pubsub").await;
    // The wake-up connection, opened at the first contention, never answers;
    // its connect timeout (1 s) is longer than the wait.
    proxy.hang_new_connections();

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let refused = waiter.try_lock(&name, wait, Duration::from_secs(1)).await;
    let waited = started.elapsed();
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    assert_bounded(waited, wait);
    holder.release().await.unwrap();
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t16_a_wait_ends_on_time_when_redis_stops_answering_before_its_last_attempt() {
    let (name, holder, proxy, waiter) = held_and_waited_for_through_a_proxy("t16-silent").await;
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let waiting = {
        let name = name.clone();
        tokio::spawn(async move {
            let refused = waiter.try_lock(&name, wait, Duration::from_secs(1)).await.map(drop);
            (refused, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Subscribed and waiting: now nothing answers, neither its last attempt
    // (whose outcome is unknown) nor the release that cleans up after it.
    proxy.blackhole();

    // Redis had answered (held by A): the wait ran out, Redis is not
    // blamed for the last attempt's missing reply.
    let (refused, waited) = waiting.await.unwrap();
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    assert_bounded(waited, wait);
    holder.release().await.unwrap();
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t17_waiters_resubscribe_after_their_wake_up_connection_is_killed() {
    let server = RedisServer::start().await;
    let name = unique_name("t17");
    let (a, b) = (client_with(&server.url(), LockConfig::default()), {
        client_with(&server.url(), LockConfig::default())
    });
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(3)).with_watchdog();
    let holder = a.try_lock_with(&name, options).await.unwrap();
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let guard = b.try_lock(&name, Duration::from_secs(10), Duration::from_secs(1)).await;
            (guard, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B is subscribed and waits out a round as long as A's lease, which A's
    // watchdog keeps renewing. Then the server drops every pub/sub client.
    let mut admin = raw(&server.url()).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1, "B's wake-up connection was killed");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let released = Instant::now();
    holder.release().await.unwrap();
    let (guard, acquired) = waiter.await.unwrap();
    guard.expect("acquired").release().await.unwrap();
    let woken_after = acquired - released;
    assert!(
        woken_after < Duration::from_millis(500),
        "woken {woken_after:?} after the release: by its message, not by the end of a round"
    );
}
