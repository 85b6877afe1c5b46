//! Redis Cluster readiness (T15): every key of a lock hashes to the slot of
//! its hash tag, and the scripts run on a cluster node that rejects
//! cross-slot scripts.

use std::time::Duration;

use redis_lock::{LockOptions, ReleaseOutcome};
use test_support::{RedisServer, eventually};

use crate::harness::{client_with, raw, unique_name};

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
}
