//! The sold-out flag: answered without Redis once set, cleared on every
//! instance when stock comes back, and bounded in time.

use std::time::Duration;

use reqwest::StatusCode;

use super::{
    RedisView, SHARED_REDIS, SOLD_OUT, buy, eventually, restock, spawn_app, unique_prefix,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restock_after_sell_out_clears_the_sold_out_flag_on_every_instance() {
    let urls = [SHARED_REDIS.clone(), SHARED_REDIS.clone()];
    restock_after_sell_out_clears_the_sold_out_flag_on_every_instance_on(&urls).await;
}

/// The body of the test of that name: instance A on `urls[0]` (it creates,
/// sells and restocks the sale), one more instance on each other URL (the
/// same Redis, one node or a cluster; on a cluster, a URL whose first seed
/// is another node makes that instance listen for the broadcast there).
pub async fn restock_after_sell_out_clears_the_sold_out_flag_on_every_instance_on(urls: &[String]) {
    let prefix = unique_prefix();
    // Flags that outlive the test: only the broadcast can clear them.
    let long_flags =
        |config: &mut seckill::config::Config| config.strategies.sold_out_flag_ttl_ms = 60_000;
    let a = spawn_app(&urls[0], &prefix, long_flags).await;
    let mut others = Vec::new();
    for url in &urls[1..] {
        others.push(spawn_app(url, &prefix, long_flags).await);
    }
    let sale = a.sale("redis-decr", 1).await;
    let mut redis = RedisView::new(&urls[0], &prefix, sale).await;
    // Buyer 2 tries on A, buyers 3, 4, ... on the others.
    let buyers = (3..).take(others.len());

    assert_eq!(buy(&a, sale, 1).await.0, StatusCode::CREATED);
    assert_eq!(buy(&a, sale, 2).await.1["type"].as_str(), Some(SOLD_OUT));
    for (b, user) in others.iter().zip(buyers.clone()) {
        assert_eq!(buy(b, sale, user).await.1["type"].as_str(), Some(SOLD_OUT));
    }

    // Every instance now answers from its flag: stock that appears in Redis
    // without a broadcast is not seen.
    redis.set_stock(1).await;
    assert_eq!(buy(&a, sale, 2).await.1["type"].as_str(), Some(SOLD_OUT));
    for (b, user) in others.iter().zip(buyers.clone()) {
        assert_eq!(buy(b, sale, user).await.1["type"].as_str(), Some(SOLD_OUT));
    }
    redis.set_stock(0).await;

    // A restock through instance A clears the flag on the others as well.
    let units = i64::try_from(others.len()).unwrap() + 1;
    restock(&a, sale, units).await;
    for (b, user) in others.iter().zip(buyers) {
        let cleared = eventually(Duration::from_secs(5), || async {
            buy(b, sale, user).await.0 == StatusCode::CREATED
        })
        .await;
        assert!(cleared, "the instance of buyer {user} sells the restocked units");
    }
    assert_eq!(buy(&a, sale, 2).await.0, StatusCode::CREATED);

    let audit = a.audit(sale).await;
    assert_eq!(
        (audit.total_stock, audit.units_sold, audit.remaining_stock, audit.ledger_drift),
        (units + 1, units + 1, 0, 0)
    );
    assert_eq!(audit.redis_drift, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_broadcast_cannot_strand_stock_behind_the_flag() {
    let prefix = unique_prefix();
    let app =
        spawn_app(&SHARED_REDIS, &prefix, |config| config.strategies.sold_out_flag_ttl_ms = 1000)
            .await;
    let sale = app.sale("redis-decr", 1).await;
    let mut redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    assert_eq!(buy(&app, sale, 1).await.0, StatusCode::CREATED);
    assert_eq!(buy(&app, sale, 2).await.1["type"].as_str(), Some(SOLD_OUT));

    // A restock whose broadcast is lost: Postgres and Redis gain a unit, but
    // nobody tells the instance.
    sqlx::query(
        "UPDATE sales SET total_stock = total_stock + 1, remaining_stock = remaining_stock + 1
         WHERE id = $1",
    )
    .bind(sale)
    .execute(&app.db)
    .await
    .unwrap();
    redis::cmd("INCRBY")
        .arg(&redis.counter.stock_key)
        .arg(1)
        .query_async::<i64>(&mut redis.conn)
        .await
        .unwrap();

    let sold = eventually(Duration::from_secs(5), || async {
        buy(&app, sale, 2).await.0 == StatusCode::CREATED
    })
    .await;
    assert!(sold, "the flag expired and the unit sold");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.redis_drift), (2, 0, Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_larger_than_the_stock_left_does_not_close_the_sale() {
    // Flags that would outlive the test: only a wrong flag could refuse buyer 2.
    let app = spawn_app(&SHARED_REDIS, &unique_prefix(), |config| {
        config.strategies.sold_out_flag_ttl_ms = 60_000;
    })
    .await;
    crate::support::assert_an_oversize_order_leaves_the_sale_open(&app, "redis-decr").await;
}

/// An instance started after the sale sold out heard no broadcast and has
/// no flag: its first buyer is asked of Redis, whose counter holds what
/// Postgres holds, and refused — at once, not after a period. The same
/// with the counter lost (a Redis restarted empty): it is warmed from
/// Postgres, at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_after_the_sale_sold_out_refuses_its_first_buyer() {
    let prefix = unique_prefix();
    let a = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = a.sale("redis-decr", 1).await;
    let redis = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    assert_eq!(buy(&a, sale, 1).await.0, StatusCode::CREATED);
    assert_eq!(buy(&a, sale, 2).await.1["type"].as_str(), Some(SOLD_OUT));

    let b = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    for user in 3..6 {
        assert_eq!(buy(&b, sale, user).await.1["type"].as_str(), Some(SOLD_OUT), "buyer {user}");
    }

    let mut conn = redis.conn.clone();
    redis::cmd("DEL").arg(&redis.counter.stock_key).query_async::<i64>(&mut conn).await.unwrap();
    let c = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    assert_eq!(
        buy(&c, sale, 6).await.1["type"].as_str(),
        Some(SOLD_OUT),
        "after the counter was lost"
    );
    let audit = a.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.oversold), (1, 0, 0));
}
