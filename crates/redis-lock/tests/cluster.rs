//! Redis Cluster readiness (T15): every key of a lock hashes to the slot of
//! its hash tag, and the scripts of every primitive of the family run on a
//! cluster node that rejects cross-slot scripts — and through a
//! `redis+cluster://` client on a cluster of 3 masters, where a waiter is
//! woken by a release broadcast from another master.

use std::time::Duration;

use std::sync::Arc;

use redis_lock::{
    FairLock, LockClient, LockOptions, MultiLock, PeriodicJob, RedisClient, ReleaseOutcome,
    RunOutcome, RwLock, Scheduler, Semaphore, SystemClock,
};
use test_support::{RedisCluster, RedisServer, eventually};

use crate::harness::{client_with, raw, unique_name, unique_names};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t15_every_key_of_a_lock_shares_the_slot_of_its_hash_tag() {
    let dir_conf = format!("nodes-{}.conf", uuid::Uuid::new_v4().simple());
    let server =
        RedisServer::start_with(&["--cluster-enabled", "yes", "--cluster-config-file", &dir_conf])
            .await;
    let mut conn = raw(&server.url()).await;
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut conn)
        .await
        .unwrap();
    let ready = eventually(Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move {
            let info: String =
                redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn).await.unwrap();
            info.contains("cluster_state:ok")
        }
    })
    .await;
    assert!(ready, "a one-node cluster owning every slot");

    let name = unique_name("t15");
    let mut slots = Vec::new();
    for key in [name.key(), name.fence_key(), name.channel(), &format!("{{{}}}", name.hash_tag())] {
        let slot: i64 =
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut conn).await.unwrap();
        slots.push(slot);
    }
    assert!(slots.windows(2).all(|w| w[0] == w[1]), "slots {slots:?}");

    // The node does check: a script over two slots is refused ...
    let crossslot: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg("redis.call('get', KEYS[1]); return redis.call('get', KEYS[2]) or 0")
        .arg(2)
        .arg("a")
        .arg("b")
        .query_async(&mut conn)
        .await;
    let refused = crossslot.expect_err("a cross-slot script must fail");
    assert!(format!("{refused:?}").to_uppercase().contains("CROSSSLOT"), "{refused:?}");

    // ... while every lock script runs.
    let client = client_with(&server.url(), Default::default());
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(2)).with_watchdog();
    let guard = client.try_lock_with(&name, options).await.expect("acquire on a cluster node");
    let inner = guard.reenter().await.expect("re-entry on a cluster node");
    assert_eq!(inner.release().await.unwrap(), ReleaseOutcome::StillHeld { holds: 1 });
    assert_eq!(guard.fencing_token().0, 1);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    the_rest_of_the_family_runs_on_a_cluster_node(&client).await;
}

/// One acquisition and release of each primitive of the family: none of
/// their scripts is refused with `CROSSSLOT`.
async fn the_rest_of_the_family_runs_on_a_cluster_node(client: &LockClient) {
    let options = LockOptions::new(std::time::Duration::ZERO, std::time::Duration::from_secs(2));
    let multi = MultiLock::new(client, unique_names("t15-multi", 3)).unwrap();
    multi.try_lock(options).await.expect("multi-lock").release().await.unwrap();

    let fair = FairLock::new(client, unique_name("t15-fair"));
    let held = fair.try_lock(options).await.expect("fair lock");
    let queued = FairLock::new(client, fair.name().clone());
    let waited =
        queued.try_lock(LockOptions { wait: std::time::Duration::from_millis(50), ..options });
    assert!(waited.await.is_err(), "joined and left the line");
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);

    let rw = RwLock::new(client, unique_name("t15-rw"));
    rw.read(options).await.expect("read").release().await.unwrap();
    rw.write(options).await.expect("write").release().await.unwrap();

    let semaphore = Semaphore::new(client, unique_name("t15-semaphore"), 2).unwrap();
    semaphore.acquire(options).await.expect("permit").release().await.unwrap();

    let period = std::time::Duration::from_secs(60);
    let job = PeriodicJob::new(unique_name("t15-job"), period, options.lease).unwrap();
    let scheduler = Scheduler::new(client, Arc::new(SystemClock));
    let ran = scheduler.run_once(&job, |_| async { Ok::<(), ()>(()) }).await.unwrap();
    assert!(matches!(ran, RunOutcome::Ran { .. }), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t15_every_primitive_runs_through_a_cluster_client_on_three_masters() {
    let cluster = RedisCluster::start(3).await;
    let client = || LockClient::new(RedisClient::open(&cluster.url()).expect("a cluster URL"));
    let (holder, waiter) = (client(), client());
    the_rest_of_the_family_runs_on_a_cluster_node(&holder).await;

    // Locks of 12 names, whose slots fall on the three masters: a waiter
    // (its pub/sub on the first seed) is woken by the release broadcast of
    // a lock held on whichever master.
    for name in unique_names("t15-spread", 12) {
        let options = LockOptions::new(Duration::ZERO, Duration::from_secs(30));
        let held = holder.try_lock_with(&name, options).await.expect("acquire on the cluster");
        let waiting = LockOptions::new(Duration::from_secs(20), Duration::from_secs(2));
        let (next, released) = tokio::join!(waiter.try_lock_with(&name, waiting), async {
            // Released once the waiter has tried and is waiting.
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.release().await
        });
        assert_eq!(released.unwrap(), ReleaseOutcome::Released);
        // Woken by the broadcast well before the 30 s lease would let it in.
        let next = next.expect("the waiter takes the released lock");
        assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    }
}
