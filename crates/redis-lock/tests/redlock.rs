//! Redlock over three `redis-server` children: a minority down is a "no"
//! vote (T13), a majority down is a clean error, the watchdog renews on a
//! quorum, contenders exclude each other, and — the known limitation — a
//! node restarted empty lets a second client take a majority (T5).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use redis_lock::{
    ExtendOutcome, LockError, LockName, LockOptions, LossReason, Redlock, RedlockConfig,
};
use test_support::RedisServer;

use crate::harness::{holds, pttl, raw, unique_name};

async fn nodes(n: usize) -> Vec<RedisServer> {
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(RedisServer::start().await);
    }
    servers
}

fn redlock(servers: &[RedisServer]) -> Redlock {
    Redlock::new(servers.iter().map(RedisServer::client).collect(), RedlockConfig::default())
        .expect("a valid Redlock")
}

async fn key_exists(server: &RedisServer, name: &LockName) -> bool {
    let mut conn = raw(&server.url()).await;
    redis::cmd("EXISTS").arg(name.key()).query_async::<i64>(&mut conn).await.unwrap() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t13_redlock_acquires_with_one_of_three_nodes_down() {
    let mut servers = nodes(3).await;
    servers[0].kill();
    let (name, lock) = (unique_name("t13"), redlock(&servers));

    let guard = lock
        .try_lock(&name, LockOptions::new(Duration::from_secs(1), Duration::from_secs(2)))
        .await
        .expect("two of three votes are a quorum");
    assert!(key_exists(&servers[1], &name).await && key_exists(&servers[2], &name).await);
    let released = guard.release().await;
    assert_eq!((released.released, released.unreachable), (2, 1));
    assert!(!key_exists(&servers[1], &name).await && !key_exists(&servers[2], &name).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_without_a_quorum_fails_cleanly_and_leaves_no_key() {
    let mut servers = nodes(3).await;
    servers[0].kill();
    servers[1].kill();
    let (name, lock) = (unique_name("no-quorum"), redlock(&servers));

    let failed = lock
        .try_lock(&name, LockOptions::new(Duration::from_millis(300), Duration::from_secs(2)))
        .await;
    match failed {
        Err(LockError::NoQuorum { reachable: 1, nodes: 3, quorum: 2, .. }) => {}
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    assert!(!key_exists(&servers[2], &name).await, "the minority grant was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_contenders_never_hold_the_lock_together() {
    let servers = nodes(3).await;
    let name = unique_name("redlock-exclusion");
    let locks = [redlock(&servers), redlock(&servers)];
    let inside = Arc::new(AtomicU32::new(0));
    let max_inside = Arc::new(AtomicU32::new(0));

    let mut tasks = Vec::new();
    for lock in &locks {
        for _ in 0..4 {
            let (lock, name) = (lock.clone(), name.clone());
            let (inside, max_inside) = (inside.clone(), max_inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let options = LockOptions::new(Duration::from_secs(20), Duration::from_secs(2));
                    let guard = lock.try_lock(&name, options).await.expect("acquired");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max_inside.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    let released = guard.release().await;
                    assert!(released.held_to_the_end(lock.quorum()), "{released:?}");
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(max_inside.load(Ordering::SeqCst), 1);
    assert_eq!(locks[0].stats().acquisitions + locks[1].stats().acquisitions, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_watchdog_renews_on_a_quorum_and_tells_the_holder_when_it_is_lost() {
    let mut servers = nodes(3).await;
    let (name, lock) = (unique_name("redlock-watchdog"), redlock(&servers));
    let lease = Duration::from_millis(300);

    let guard = lock
        .try_lock(&name, LockOptions::new(Duration::ZERO, lease).with_watchdog())
        .await
        .unwrap();
    tokio::time::sleep(lease).await;
    servers[0].kill(); // a minority: renewals still reach a quorum
    tokio::select! {
        _ = tokio::time::sleep(lease * 2) => {}
        _ = guard.lost().cancelled() => panic!("lost with a quorum up: {:?}", guard.loss()),
    }
    assert!(guard.renewals() >= 2, "{} renewals", guard.renewals());
    assert!(key_exists(&servers[1], &name).await && key_exists(&servers[2], &name).await);

    servers[1].kill(); // now the quorum is gone
    let cut = Instant::now();
    tokio::time::timeout(lease, guard.lost().cancelled()).await.expect("told within a lease");
    assert!(Instant::now() < guard.valid_until(), "told before the validity ended");
    assert!(guard.valid_until() <= cut + lease);
    assert_eq!(guard.loss(), Some(LossReason::Unreachable));
}

/// The known limitation, demonstrated: Redlock's safety needs a crashed node
/// to stay out for longer than the longest lease (or to persist with fsync
/// always). Here one node restarts at once, empty, and two clients each
/// believe they hold the lock. Only fencing at the resource can catch this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t5_a_node_restarted_empty_lets_a_second_client_take_a_majority() {
    let mut servers = nodes(3).await;
    let name = unique_name("t5");
    let (a, b) = (redlock(&servers), redlock(&servers));
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(10));

    servers[2].kill(); // A gets nodes 0 and 1: a quorum
    let first = a.try_lock(&name, options).await.expect("A holds 2 of 3");
    servers[2].restart().await; // back, empty
    servers[0].restart().await; // one of A's nodes crashes and restarts empty at once

    let second = b.try_lock(&name, options).await.expect("B takes nodes 0 and 2");
    let now = Instant::now();
    assert!(
        !first.lost().is_cancelled() && first.valid_until() > now,
        "A still believes it holds the lock"
    );
    assert!(second.valid_until() > now);
    assert!(key_exists(&servers[1], &name).await, "A's key on node 1");
    assert!(
        key_exists(&servers[0], &name).await && key_exists(&servers[2], &name).await,
        "B's keys"
    );
    drop((first, second));
}

/// A renewal that reached one node, found the key gone on a second and got
/// no answer from the third might still have a quorum (the silent node may
/// hold the key): it is retried, and the holder is told `Unreachable` when
/// the renewals run out of time — not `Expired` at the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_short_of_a_quorum_with_a_node_silent_is_retried_not_taken_as_expired() {
    let mut servers = nodes(3).await;
    let (name, lock) = (unique_name("redlock-undecided"), redlock(&servers));
    let lease = Duration::from_millis(300);
    let guard = lock
        .try_lock(&name, LockOptions::new(Duration::ZERO, lease).with_watchdog())
        .await
        .unwrap();

    let mut conn = raw(&servers[1].url()).await;
    let _: i64 = redis::cmd("DEL").arg(name.key()).query_async(&mut conn).await.unwrap();
    servers[0].kill();
    tokio::time::timeout(lease * 2, guard.lost().cancelled()).await.expect("told within a lease");
    assert_eq!(guard.loss(), Some(LossReason::Unreachable));
}

/// A contender waits for the holder's release message (or the lease's end)
/// between its rounds, instead of asking the nodes again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_contender_waits_between_rounds_instead_of_polling() {
    let servers = nodes(3).await;
    let name = unique_name("redlock-waits");
    let (holder, waiter) = (redlock(&servers), redlock(&servers));
    let held = holder
        .try_lock(&name, LockOptions::new(Duration::ZERO, Duration::from_secs(10)))
        .await
        .unwrap();

    let before = waiter.stats().round_trips;
    let refused = waiter
        .try_lock(&name, LockOptions::new(Duration::from_secs(1), Duration::from_secs(5)))
        .await;
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    let round_trips = waiter.stats().round_trips - before;
    // A first round (3), the subscriptions (3), then one wait to the end of
    // the wait budget, and the release of the round (3 at most).
    assert!(round_trips <= 30, "{round_trips} round trips in a 1 s wait");
    held.release().await;
}

/// `DEL` of the lock's key on `server`.
async fn delete_key(server: &RedisServer, name: &LockName) {
    let mut conn = raw(&server.url()).await;
    let _: i64 = redis::cmd("DEL").arg(name.key()).query_async(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_guard_extends_on_a_quorum_and_its_release_counts_each_nodes_answer() {
    let mut servers = nodes(3).await;
    let (name, lock) = (unique_name("redlock-extend"), redlock(&servers));
    let guard = lock
        .try_lock(&name, LockOptions::new(Duration::ZERO, Duration::from_secs(1)))
        .await
        .unwrap();
    for server in &servers {
        let mut conn = raw(&server.url()).await;
        assert_eq!(holds(&mut conn, &name, guard.owner()).await, Some(1), "the owner token");
    }
    assert_eq!(guard.lease(), Duration::from_secs(1));

    let extended = Instant::now();
    assert_eq!(guard.extend(Duration::from_secs(5)).await.unwrap(), ExtendOutcome::Extended);
    assert_eq!(guard.lease(), Duration::from_secs(5));
    assert!(guard.valid_until() > extended + Duration::from_secs(4), "valid for the new lease");
    let mut conn = raw(&servers[1].url()).await;
    assert!(pttl(&mut conn, &name).await > 1000, "the nodes hold the new lease");

    // One node answers that the key is gone, one does not answer: exactly a
    // quorum answered, and too few extended. The lock is lost, not unknown.
    delete_key(&servers[0], &name).await;
    servers[2].kill();
    assert_eq!(guard.extend(Duration::from_secs(5)).await.unwrap(), ExtendOutcome::Expired);
    assert_eq!(guard.loss(), Some(LossReason::Expired));
    let released = guard.release().await;
    let counts = (released.released, released.expired, released.unreachable);
    assert_eq!(counts, (1, 1, 1), "{released:?}");
    assert!(!released.held_to_the_end(lock.quorum()), "{released:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_guard_whose_lock_another_client_took_is_told_not_owner() {
    let servers = nodes(3).await;
    let name = unique_name("redlock-not-owner");
    let (a, b) = (redlock(&servers), redlock(&servers));
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(5));
    let stale = a.try_lock(&name, options).await.unwrap();
    for server in &servers {
        delete_key(server, &name).await;
    }
    let next = b.try_lock(&name, options).await.expect("the key is gone everywhere");

    assert_eq!(stale.extend(Duration::from_secs(5)).await.unwrap(), ExtendOutcome::NotOwner);
    assert_eq!(stale.loss(), Some(LossReason::NotOwner));
    let released = stale.release().await;
    assert_eq!((released.not_owner, released.released), (3, 0), "{released:?}");
    assert!(next.release().await.held_to_the_end(b.quorum()), "the next owner kept it");
}

/// A wait that runs out when exactly a quorum of nodes answered, the lock
/// held on them, is the lock being busy, not too few nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_lock_held_on_exactly_a_quorum_of_answering_nodes_is_a_timeout() {
    let mut servers = nodes(3).await;
    let name = unique_name("redlock-busy-quorum");
    let (holder, waiter) = (redlock(&servers), redlock(&servers));
    let held = holder
        .try_lock(&name, LockOptions::new(Duration::ZERO, Duration::from_secs(10)))
        .await
        .unwrap();
    servers[0].kill();
    let refused = waiter
        .try_lock(&name, LockOptions::new(Duration::from_millis(200), Duration::from_secs(5)))
        .await;
    assert!(matches!(refused, Err(LockError::Timeout { .. })), "{refused:?}");
    held.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_redlock_guard_releases_its_key_on_every_node() {
    let servers = nodes(3).await;
    let (name, lock) = (unique_name("redlock-dropped"), redlock(&servers));
    let guard = lock
        .try_lock(&name, LockOptions::new(Duration::ZERO, Duration::from_secs(30)))
        .await
        .unwrap();
    drop(guard);
    for server in &servers {
        let gone = test_support::eventually(Duration::from_secs(5), || async {
            !key_exists(server, &name).await
        })
        .await;
        assert!(gone, "the key outlived its dropped guard");
    }
}
