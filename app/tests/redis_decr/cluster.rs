//! `redis-decr` on a local Redis Cluster of 3 masters: every key of one sale
//! lands on one master (one hash slot), different sales spread over the
//! masters, and the purchase, compensation, reconciliation (on demand and in
//! the background) and sold-out-broadcast tests of the single node pass
//! unchanged with a `redis+cluster://` URL. One cluster serves every part,
//! so that it is started once (about a second).

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use seckill::backends::RedisHandle;
use seckill::sale::SaleId;
use seckill::strategy::redis_decr::counter::SaleCounter;
use test_support::RedisCluster;

use super::{RedisView, buy, spawn_app, unique_prefix};
use super::{compensation, purchase, reconcile, sold_out};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_decr_keeps_exact_books_on_a_three_master_cluster() {
    let cluster = RedisCluster::start(3).await;
    let url = cluster.url();
    every_key_of_a_sale_is_on_one_master_and_sales_spread_over_all(&cluster).await;
    purchase::redis_decr_never_oversells_under_200_concurrent_buyers_with_resubmissions_on(&url)
        .await;
    purchase::a_postgres_failure_after_the_decrement_returns_the_unit_on(&url).await;
    compensation::the_compensation_script_run_twice_returns_the_units_once_on(&url).await;
    reconcile::reconciliation_corrects_a_counter_that_disagrees_with_postgres_on(&url).await;
    // One instance listening on each master: whichever master runs the
    // restock script, its broadcast reaches the two others over the bus.
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| format!("redis+cluster://127.0.0.1:{}", node.port))
        .collect();
    sold_out::restock_after_sell_out_clears_the_sold_out_flag_on_every_instance_on(&seeds).await;
    the_background_reconciler_heals_a_counter_on_the_cluster(&url).await;
}

/// Warms 30 sales' counters through the cluster URL, then asks each master
/// directly for each sale's keys: exactly one master holds them all (the
/// others answer `MOVED`), and the 30 sales use all three masters.
async fn every_key_of_a_sale_is_on_one_master_and_sales_spread_over_all(cluster: &RedisCluster) {
    let handle = RedisHandle::new(&cluster.url(), unique_prefix()).unwrap();
    let mut conn = handle.conn().await.expect("the cluster answers");
    let mut nodes = Vec::new();
    for node in &cluster.nodes {
        nodes.push(node.client().get_multiplexed_async_connection().await.unwrap());
    }
    let mut owners = HashSet::new();
    for sale in 1..=30 {
        let counter = SaleCounter::new(&handle, SaleId(sale));
        counter.warm(&mut conn, 5, 1).await.expect("warm.lua runs on the cluster");
        let keys = [
            &counter.stock_key,
            &counter.buyers_key,
            &counter.reservations_key,
            &counter.seq_key,
            &counter.origin_key,
            &counter.gate_key,
            &counter.returns_key,
            &handle.sale_key(sale, "lock:setnx"),
        ];
        let mut slots = HashSet::new();
        for key in keys {
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async(&mut nodes[0])
                .await
                .unwrap();
            slots.insert(slot);
        }
        assert_eq!(slots.len(), 1, "sale {sale}: every key in one slot");
        // The warm-up wrote the counter, its sequence and its origin.
        let written = [&counter.stock_key, &counter.seq_key, &counter.origin_key];
        let mut holders = Vec::new();
        for (i, node) in nodes.iter_mut().enumerate() {
            let found: redis::RedisResult<i64> =
                redis::cmd("EXISTS").arg(&written[..]).query_async(node).await;
            match found {
                Ok(3) => holders.push(i),
                Ok(n) => panic!("sale {sale}: master {i} holds {n} of its 3 keys"),
                Err(err) => assert!(format!("{err:?}").to_uppercase().contains("MOVED"), "{err:?}"),
            }
        }
        assert_eq!(holders.len(), 1, "sale {sale}: one master holds its keys");
        owners.insert(holders[0]);
    }
    assert_eq!(owners.len(), 3, "30 sales spread over the three masters");
}

/// The background reconciler (its scheduler lock and the index of sales on
/// the cluster) corrects a counter set too low, with no one asking.
async fn the_background_reconciler_heals_a_counter_on_the_cluster(url: &str) {
    let prefix = unique_prefix();
    let app =
        spawn_app(url, &prefix, |config| config.strategies.redis_decr.reconcile_interval_ms = 100)
            .await;
    let sale = app.sale("redis-decr", 10).await;
    for user in 1..=2 {
        assert_eq!(buy(&app, sale, user).await.0, StatusCode::CREATED);
    }
    let mut redis = RedisView::new(url, &prefix, sale).await;
    redis.set_stock(5).await;
    // The pass corrects the counter, then records its fixes in Postgres.
    let healed = super::eventually(Duration::from_secs(10), || {
        let mut view = RedisView { conn: redis.conn.clone(), counter: redis.counter.clone() };
        let app = &app;
        async move {
            view.stock().await == Some(8)
                && app.audit(sale).await.reconcile_fixes.is_some_and(|n| n > 0)
        }
    })
    .await;
    assert!(healed, "a background pass raised the counter back to Postgres's 8 and recorded it");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.redis_drift), (2, 8, Some(0)));
    assert_eq!(audit.reconcile_fixes, Some(3));
}
