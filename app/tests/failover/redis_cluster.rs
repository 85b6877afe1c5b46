//! The engines' own failovers, mid-sale: a Redis Cluster of 3 masters with
//! one replica each loses the master that serves the sale's keys while
//! buyers buy through two instances. `redis-decr` and `lock/fenced` keep
//! exact books, every `201` has its order, every answer meanwhile is a
//! decision or a `503` (never a `500`), and the sold-out listeners, which
//! were subscribed on the killed node, follow the cluster to another one.
//!
//! Redis replicates asynchronously, so the promoted replica may miss the
//! last writes its master acknowledged: a decrement (the counter then above
//! Postgres, which refuses the excess), a reservation (returned by the
//! reconciler), a lock key (a second holder, whose stale write the fence
//! refuses). The books stay exact because Postgres has the last word.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use seckill::config::Config;
use test_support::RedisCluster;
use tokio::sync::Mutex;

use crate::redis_decr::{SOLD_OUT, restock};
use crate::support::{TestApp, buy, eventually, unique_prefix};

/// `cluster-node-timeout` of the test's cluster: a replica takes over about
/// this long after its master died.
const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// The time between two buyers' arrivals: 50 a second, so that a sale of
/// 200 lasts about 4 s, across the failover.
const ARRIVAL_GAP: Duration = Duration::from_millis(20);

// A cluster and a runtime each: after a failover the new master has no
// replica left, and a test's instances live as long as its runtime (they
// would go on reconnecting to a dropped cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_lost_mid_sale_keeps_redis_decr_exact() {
    let _heavy = test_support::heavy();
    let mut cluster = RedisCluster::try_start_replicated(3, 1, NODE_TIMEOUT).await.unwrap();
    lose_the_master_mid_sale(&mut cluster, "redis-decr", 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_master_lost_mid_sale_keeps_lock_fenced_exact() {
    let _heavy = test_support::heavy();
    let mut cluster = RedisCluster::try_start_replicated(3, 1, NODE_TIMEOUT).await.unwrap();
    lose_the_master_mid_sale(&mut cluster, "lock/fenced", 100).await;
}

/// One sale of `stock` units of `strategy`, twice as many buyers through
/// two instances; the master of the sale's slot is killed once 30 % has
/// sold. Then fresh buyers buy what the reconciler returns, until the books
/// are settled.
async fn lose_the_master_mid_sale(cluster: &mut RedisCluster, strategy: &str, stock: i64) {
    let prefix = unique_prefix();
    // A first instance creates the sale; the buyers' instances then list
    // the master of its slot as their first seed, so that their listeners
    // subscribe on the node that will die.
    let creator = spawn(&cluster.url(), &prefix).await;
    let sale = creator.sale(strategy, stock).await;
    let tag = format!("{{sale:{sale}}}");
    let victim = cluster.master_of(&tag).await.unwrap();
    let url = seeds_from(cluster, victim);
    let instances = [spawn(&url, &prefix).await, spawn(&url, &prefix).await];

    let answers = Answers::default();
    let buyers = buy_all(&instances, sale, 1..=2 * stock, &answers);
    let kill = async {
        let fault_at = stock * 3 / 10;
        let reached = eventually(Duration::from_secs(30), || async {
            answers.created.load(Ordering::Relaxed) >= fault_at
        })
        .await;
        assert!(reached, "{strategy}: {fault_at} units sold before the fault");
        let killed_at = chrono::Utc::now();
        cluster.kill_master_of(&tag).await.unwrap();
        killed_at
    };
    let ((), killed_at) = tokio::join!(buyers, kill);

    // What the failover left reserved comes back through the reconciler;
    // latecomers buy it.
    let mut next = 2 * stock + 1;
    let settled = eventually(Duration::from_secs(30), || {
        let first = next;
        next += 20;
        let (instances, answers) = (&instances, &answers);
        async move {
            buy_all(instances, sale, first..=first + 19, answers).await;
            let audit = instances[0].audit(sale).await;
            audit.units_sold == stock && audit.redis_drift.unwrap_or(0) == 0
        }
    })
    .await;
    let audit = instances[0].audit(sale).await;
    let statuses = answers.statuses.lock().await.clone();
    println!("{strategy} across the failover: answers {statuses:?}; {audit:?}");
    assert!(settled, "{strategy}: settled after the failover: {audit:?} {statuses:?}");
    assert!(
        audit.last_order_at.is_some_and(|last| last > killed_at),
        "{strategy}: the sale went on after its master died at {killed_at}: {audit:?}"
    );
    assert_eq!(
        (audit.oversold, audit.ledger_drift, audit.duplicate_orders),
        (0, 0, 0),
        "{audit:?}"
    );
    assert_eq!(
        answers.created.load(Ordering::Relaxed),
        audit.units_sold,
        "{strategy}: every 201 has its order, and no order lacks its 201"
    );
    let decided = [StatusCode::CREATED, StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE];
    assert!(
        statuses.keys().all(|s| decided.contains(&StatusCode::from_u16(*s).unwrap())),
        "{strategy}: a sale or a refusal, or 503 while the cluster fails over: {statuses:?}"
    );
    if strategy == "redis-decr" {
        the_listeners_follow_the_cluster(&creator, &instances, sale, next).await;
    }
}

/// Each buyers' instance answers "sold out" (its flag now set for 60 s);
/// a restock through the creator clears the flags only by its broadcast,
/// which the instances hear on the node they subscribed on after the one
/// they started on died.
async fn the_listeners_follow_the_cluster(
    creator: &TestApp,
    instances: &[TestApp; 2],
    sale: i64,
    first_user: i64,
) {
    for (user, app) in (first_user..).zip(instances) {
        let (status, body) = buy(app, sale, user).await;
        assert_eq!((status, body["type"].as_str()), (StatusCode::CONFLICT, Some(SOLD_OUT)));
    }
    restock(creator, sale, 2).await;
    for (user, app) in (first_user + 2..).zip(instances) {
        let sold = eventually(Duration::from_secs(5), || async {
            buy(app, sale, user).await.0 == StatusCode::CREATED
        })
        .await;
        assert!(sold, "buyer {user}'s instance heard the restock: its listener moved on");
    }
}

/// Every answer of a test's buyers: the `201`s, and the count per status.
#[derive(Default)]
struct Answers {
    created: AtomicI64,
    statuses: Mutex<BTreeMap<u16, u64>>,
}

/// Each of `users` buys one unit of `sale`, alternately through each
/// instance, one arriving every [`ARRIVAL_GAP`] (so that the sale lasts
/// across the failover); a buyer answered `503` (the cluster failing over)
/// tries again 100 ms later, for up to 30 s, as a client would.
async fn buy_all(
    instances: &[TestApp; 2],
    sale: i64,
    users: std::ops::RangeInclusive<i64>,
    answers: &Answers,
) {
    let first = *users.start();
    let buyers = users.map(|user| async move {
        let arrival = ARRIVAL_GAP * u32::try_from(user - first).unwrap();
        tokio::time::sleep(arrival).await;
        let app = &instances[(user % 2) as usize];
        for _ in 0..300 {
            let (status, _) = buy(app, sale, user).await;
            *answers.statuses.lock().await.entry(status.as_u16()).or_default() += 1;
            match status {
                StatusCode::SERVICE_UNAVAILABLE => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                StatusCode::CREATED => {
                    answers.created.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                _ => return,
            }
        }
    });
    futures_util::future::join_all(buyers).await;
}

/// `redis+cluster://` with node `first` as the first seed, then the others.
fn seeds_from(cluster: &RedisCluster, first: usize) -> String {
    let port = |i: usize| format!("127.0.0.1:{}", cluster.nodes[i].port);
    let others = (0..cluster.nodes.len()).filter(|&i| i != first).map(port);
    let seeds: Vec<String> = std::iter::once(port(first)).chain(others).collect();
    format!("redis+cluster://{}", seeds.join(","))
}

/// An instance on Redis `url` under `prefix` (shared by the test's
/// instances); its sold-out flags outlive the test, so that only a
/// broadcast clears them, and its reconciler runs every 500 ms and returns
/// a reservation left 2 s without its order.
async fn spawn(url: &str, prefix: &str) -> TestApp {
    let (url, prefix) = (url.to_owned(), prefix.to_owned());
    TestApp::spawn_with(move |config: &mut Config| {
        config.backends.redis_url = url;
        config.backends.redis_prefix = prefix;
        config.strategies.sold_out_flag_ttl_ms = 60_000;
        config.strategies.redis_decr.reconcile_interval_ms = 500;
        config.strategies.redis_decr.reconcile_grace_ms = 2000;
    })
    .await
}
