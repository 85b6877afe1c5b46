//! Every `lock/*` strategy on a local Redis Cluster of 3 masters: the
//! exclusion test of the single node (two instances, one holder at a time,
//! exact books) passes unchanged with a `redis+cluster://` `REDIS_URL`;
//! `lock/redlock` keeps its quorum over its own independent nodes and refuses
//! a cluster URL among them. One cluster serves every strategy.

use std::time::Duration;

use seckill::strategy::lock::library_redlock::{NAME, RedlockLock};
use serde_json::json;
use test_support::{RedisCluster, RedisServer};

use super::exclusion::{exclusive_on, one_holder_at_a_time_across_two_instances_on};
use super::harness::{spawn_on_nodes_with, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_strategy_admits_one_holder_at_a_time_on_a_three_master_cluster() {
    let cluster = RedisCluster::start(3).await;
    let url = cluster.url();
    for strategy in
        ["lock/setnx", "lock/ttl", "lock/token", "lock/watchdog", "lock/fenced", "lock/fair"]
    {
        one_holder_at_a_time_across_two_instances_on(&url, strategy).await;
    }

    let nodes =
        [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await];
    let prefix = unique_prefix();
    let one = spawn_on_nodes_with(&url, &prefix, 5000, &nodes).await;
    let two = spawn_on_nodes_with(&url, &prefix, 5000, &nodes).await;
    exclusive_on(&one, &two, "lock/redlock", 6, json!({ "work_ms": 4 })).await;
}

#[test]
fn redlock_refuses_a_cluster_url_among_its_nodes() {
    let urls = ["redis+cluster://127.0.0.1:7000,127.0.0.1:7001".to_owned()];
    let refused = RedlockLock::new(&urls, "p", NAME, Duration::from_secs(1))
        .err()
        .expect("a cluster is not a Redlock node");
    assert!(format!("{refused:#}").contains("independent masters"), "{refused:#}");
}
