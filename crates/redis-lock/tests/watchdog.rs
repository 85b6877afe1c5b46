//! The watchdog: renewals keep a long critical section's lock, and a holder
//! is told when it loses the lock — to another owner (T2's renewal half) or
//! to a partition from Redis (T12) — before its lease runs out, also after
//! an extend changed the lease (T18); and a hold ends at its `max_hold`
//! (T19).

use std::time::{Duration, Instant};

use redis_lock::{ExtendOutcome, LockClient, LockConfig, LockOptions, LossReason, ReleaseOutcome};
use test_support::RedisServer;

use crate::harness::{
    DelayProxy, SHARED_REDIS, cleanup, client_with, holds, pttl, raw, shared_client, unique_name,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_ownership_through_work_three_times_the_lease() {
    let name = unique_name("watchdog");
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    let lease = Duration::from_millis(300);
    let options = LockOptions::new(Duration::ZERO, lease).with_watchdog();

    let taken = Instant::now();
    let guard = client.try_lock_with(&name, options).await.unwrap();
    // The critical section: 3 × the lease, watching for loss.
    tokio::select! {
        _ = tokio::time::sleep(lease * 3) => {}
        _ = guard.lost().cancelled() => panic!("lost the lock: {:?}", guard.loss()),
    }
    assert!(guard.renewals() >= 2, "{} renewals", guard.renewals());
    // Once every third of the lease, not more: a load can only delay them.
    let periods = (taken.elapsed().as_millis() / (lease / 3).as_millis()) as u64;
    assert!(guard.renewals() <= periods, "{} renewals in {periods} periods", guard.renewals());
    assert_eq!(holds(&mut conn, &name, guard.owner()).await, Some(1), "still the owner");
    assert!(pttl(&mut conn, &name).await > 0);
    assert!(client.stats().renewals >= 2);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_whose_reply_came_too_late_is_retried_and_the_lock_kept() {
    let name = unique_name("renewal-retried");
    let proxy = DelayProxy::start(test_support::redis_addr()).await;
    let client = client_with(&proxy.url(), LockConfig::default());
    // Renewed every second; an attempt is cut off after half a second.
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(3)).with_watchdog();
    let guard = client.try_lock_with(&name, options).await.unwrap();

    // The first renewal's reply comes after its attempt gave up on it.
    proxy.delay_next_reply(Duration::from_millis(800));
    let renewed = async {
        while guard.renewals() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        () = renewed => {}
        _ = guard.lost().cancelled() => panic!("one late reply lost the lock: {:?}", guard.loss()),
    }
    assert!(!guard.lost().is_cancelled());
    guard.release().await.unwrap();
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lock_was_taken_over_is_told_at_its_next_renewal() {
    let name = unique_name("takeover");
    let (a, b) = (shared_client(), shared_client());
    let mut conn = raw(&SHARED_REDIS).await;
    let lease = Duration::from_millis(300);

    let stale = a
        .try_lock_with(&name, LockOptions::new(Duration::ZERO, lease).with_watchdog())
        .await
        .unwrap();
    // As if A's process had been paused past its lease (T2): the key is gone
    // and B takes the lock.
    let _: i64 = redis::cmd("DEL").arg(name.key()).query_async(&mut conn).await.unwrap();
    let next = b.try_lock(&name, Duration::ZERO, Duration::from_secs(5)).await.unwrap();

    tokio::time::timeout(lease, stale.lost().cancelled())
        .await
        .expect("told within one renewal period");
    assert_eq!(stale.loss(), Some(LossReason::NotOwner));
    assert_eq!(stale.release().await.unwrap(), ReleaseOutcome::NotOwner);
    assert_eq!(holds(&mut conn, &name, next.owner()).await, Some(1));
    next.release().await.unwrap();
    cleanup(&mut conn, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lock_without_watchdog_tells_its_holder_when_the_lease_ends() {
    let name = unique_name("lease-end");
    let client = shared_client();
    let lease = Duration::from_millis(400);
    let started = Instant::now();
    let guard = client.try_lock(&name, Duration::ZERO, lease).await.unwrap();

    tokio::time::timeout(lease * 2, guard.lost().cancelled()).await.expect("told");
    let told = started.elapsed();
    assert_eq!(guard.loss(), Some(LossReason::Expired));
    // The timer fires at the local end of validity (lease − drift − round
    // trip), before the lease ends; the test's own wake-up on a loaded
    // 2-core host may come up to half a lease later.
    assert!(told <= lease + lease / 2, "told at {told:?}, long after the lease ended");
    assert!(told >= lease / 2, "told at {told:?}, long before the lease ended");
    assert_eq!(guard.renewals(), 0);
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

/// A Redis of the test's own (killing it cuts the holder off) and a client
/// of it whose commands time out after 100 ms.
async fn partitionable() -> (RedisServer, LockClient) {
    let server = RedisServer::start().await;
    let config =
        LockConfig { command_timeout: Duration::from_millis(100), ..LockConfig::default() };
    let client = client_with(&server.url(), config);
    (server, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t12_a_holder_partitioned_from_redis_is_told_before_its_lease_runs_out() {
    let (mut server, client) = partitionable().await;
    let name = unique_name("t12");
    let lease = Duration::from_millis(600);

    let guard = client
        .try_lock_with(&name, LockOptions::new(Duration::ZERO, lease).with_watchdog())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(guard.renewals() >= 1, "renewing while connected");
    // The partition: from the holder's side Redis is gone.
    server.kill();
    let cut = Instant::now();

    tokio::time::timeout(lease, guard.lost().cancelled()).await.expect("told within a lease");
    let told = Instant::now();
    let lease_end = guard.valid_until();
    assert_eq!(guard.loss(), Some(LossReason::Unreachable));
    assert!(
        told < lease_end,
        "told {:?} after the cut, {:?} after the lease's end",
        told - cut,
        told.saturating_duration_since(lease_end)
    );
    // The lease as Redis counts it ends at least as late as our local view.
    assert!(lease_end <= cut + lease, "local validity is conservative");
    assert!(guard.release().await.is_err(), "Redis is unreachable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t18_lost_fires_at_the_new_end_after_an_extend_shortens_the_lease() {
    let name = unique_name("t18-lease");
    let client = shared_client();
    let guard = client.try_lock(&name, Duration::ZERO, Duration::from_secs(5)).await.unwrap();
    let shorter = Duration::from_millis(200);
    let extended = Instant::now();
    assert_eq!(guard.extend(shorter).await.unwrap(), ExtendOutcome::Extended);

    tokio::time::timeout(Duration::from_secs(1), guard.lost().cancelled())
        .await
        .expect("told at the end of the new lease, not the old one");
    let told = extended.elapsed();
    // The old lease had 5 s left; the test's own wake-up may lag a little.
    assert!(told <= shorter + Duration::from_millis(500), "told {told:?} after the extend");
    assert_eq!(guard.loss(), Some(LossReason::Expired));
    cleanup(&mut raw(&SHARED_REDIS).await, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t18_the_watchdog_renews_a_shortened_lease_and_tells_of_a_partition_in_time() {
    let (mut server, client) = partitionable().await;
    let name = unique_name("t18-watchdog");
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(3)).with_watchdog();
    let guard = client.try_lock_with(&name, options).await.unwrap();
    let shorter = Duration::from_millis(300);
    assert_eq!(guard.extend(shorter).await.unwrap(), ExtendOutcome::Extended);

    // Three of the new leases: the watchdog renews every third of it, to it.
    tokio::select! {
        _ = tokio::time::sleep(shorter * 3) => {}
        _ = guard.lost().cancelled() => panic!("lost the lock: {:?}", guard.loss()),
    }
    assert!(guard.renewals() >= 5, "{} renewals of the new lease", guard.renewals());
    let left = pttl(&mut raw(&server.url()).await, &name).await;
    assert!(left > 0 && left <= 300, "PTTL {left} ms: renewed to the new lease");

    server.kill();
    let cut = Instant::now();
    tokio::time::timeout(shorter, guard.lost().cancelled()).await.expect("told within the lease");
    assert_eq!(guard.loss(), Some(LossReason::Unreachable));
    assert!(Instant::now() < guard.valid_until(), "told before the new lease's end");
    assert!(guard.valid_until() <= cut + shorter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t19_the_watchdog_stops_at_max_hold_and_tells_the_holder() {
    let name = unique_name("t19");
    let client = shared_client();
    let mut conn = raw(&SHARED_REDIS).await;
    let (lease, max_hold) = (Duration::from_millis(150), Duration::from_millis(500));
    let options = LockOptions::new(Duration::ZERO, lease).with_watchdog().with_max_hold(max_hold);
    let started = Instant::now();
    // The holder hangs: it never releases, and only `lost()` can tell it.
    let guard = client.try_lock_with(&name, options).await.unwrap();

    tokio::time::timeout(max_hold * 2, guard.lost().cancelled()).await.expect("told");
    let told = started.elapsed();
    assert!(told >= max_hold && told < max_hold + Duration::from_millis(100), "told at {told:?}");
    assert_eq!(guard.loss(), Some(LossReason::MaxHold));
    assert!(guard.renewals() >= 2, "renewed until then: {} renewals", guard.renewals());
    // No renewal after it: the lease runs out.
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    assert_eq!(pttl(&mut conn, &name).await, -2, "the lock came free one lease after max_hold");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Expired);
    cleanup(&mut conn, &name).await;
}
