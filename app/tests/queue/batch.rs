//! A batch with more requests than stock grants in arrival order; a batch
//! holds at most `SECKILL_QUEUE_BATCH_MAX` requests, and waits up to the
//! window for requests that arrive after its first; a batch reads its own
//! requests, not every request of the sale.

use std::time::Duration;

use reqwest::StatusCode;

use super::{Broker, buy, drained, request_id, resolved, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_batch_grant_serves_requests_in_arrival_order() {
    let prefix = unique_prefix();
    // Ten requests queue up, in order, before any consumer runs.
    let front = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = front.sale("queue", 3).await;
    let mut ids = Vec::new();
    for user in 1..=10 {
        let (status, body) = buy(&front, sale, user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        ids.push(request_id(&body));
    }
    // One consumer takes them in one batch (they are all there already).
    let settler = spawn_app(&prefix, |config| config.strategies.queue.batch_window_ms = 200).await;
    let stats = drained(&settler, sale, Duration::from_secs(20)).await;
    let batch = stats.batch_sizes.clone().expect("batch sizes");
    assert_eq!((stats.batches, batch.max), (1, 10.0), "one batch of ten: {stats:?}");
    for (i, id) in ids.iter().enumerate() {
        let result = resolved(&settler, sale, id, Duration::from_secs(1)).await;
        let expected = if i < 3 { "placed" } else { "sold_out" };
        assert_eq!(result["status"], expected, "buyer {} of 10: {result}", i + 1);
    }
    let audit = settler.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (3, 0, 0));
    Broker::connect(&prefix).await.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_holds_at_most_the_batch_size() {
    let prefix = unique_prefix();
    let front = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = front.sale("queue", 10).await;
    for user in 1..=10 {
        let (status, body) = buy(&front, sale, user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    // Ten requests waiting, batches of at most four, a window long enough
    // for every batch to fill: 4, 4 and 2.
    let settler = spawn_app(&prefix, |config| {
        config.strategies.queue.batch_max = 4;
        config.strategies.queue.batch_window_ms = 500;
    })
    .await;
    let stats = drained(&settler, sale, Duration::from_secs(20)).await;
    let batch = stats.batch_sizes.clone().expect("batch sizes");
    assert_eq!((stats.batches, batch.max, stats.placed), (3, 4.0, 10), "{stats:?}");
    Broker::connect(&prefix).await.delete_queues().await;
}

/// A batch waits up to the window for requests that arrive after its first:
/// four requests published 100 ms apart to a live consumer (batch size 4,
/// window 3 s) are one batch, not four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_arriving_within_the_window_join_one_batch() {
    let prefix = unique_prefix();
    let settler = spawn_app(&prefix, |config| {
        config.strategies.queue.batch_max = 4;
        config.strategies.queue.batch_window_ms = 3000;
    })
    .await;
    let sale = settler.sale("queue", 10).await;
    // A first request, settled: the consumer is subscribed and waiting.
    let (status, body) = buy(&settler, sale, 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    resolved(&settler, sale, &request_id(&body), Duration::from_secs(20)).await;
    for user in 2..=5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = buy(&settler, sale, user).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    let stats = drained(&settler, sale, Duration::from_secs(20)).await;
    let batch = stats.batch_sizes.clone().expect("batch sizes");
    assert_eq!((stats.batches, batch.max, stats.placed), (2, 4.0, 5), "{stats:?}");
    Broker::connect(&prefix).await.delete_queues().await;
}

/// Index entries read from the temporary `purchase_requests` and `orders`
/// so far, as published by this connection's backend (forced to publish
/// first).
async fn index_entries_read(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut *conn).await.unwrap();
    sqlx::query_scalar(
        "SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes
         WHERE relid IN ('pg_temp.purchase_requests'::regclass, 'pg_temp.orders'::regclass)",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// A batch looks up its own requests and buyers, however many requests and
/// orders the sale already has and whatever the planner's statistics say.
/// The test's connection shadows `purchase_requests` and `orders` with
/// temporary copies (the settling statements name them unqualified) that
/// hold 20 000 requests and orders of the sale and have never been analyzed
/// — the missing statistics under which the lookups read every request of
/// the sale, and the drain slowed to one transaction's pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_reads_its_own_requests_not_every_request_of_the_sale() {
    use seckill::strategy::queue::{PurchaseMessage, settle};

    let app = spawn_app(&unique_prefix(), |config| config.strategies.queue.consume = false).await;
    let sale = app.sale("queue", 1_000_000).await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&crate::support::test_database_url())
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    for statement in [
        "CREATE TEMP TABLE purchase_requests (LIKE public.purchase_requests INCLUDING ALL)",
        "CREATE TEMP TABLE orders (LIKE public.orders INCLUDING ALL)",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }
    for statement in [
        "INSERT INTO orders (sale_id, user_id, quantity)
         SELECT $1, g, 1 FROM generate_series(1, 20000) g",
        "INSERT INTO purchase_requests (id, sale_id, user_id, quantity, status, order_id)
         SELECT gen_random_uuid(), sale_id, user_id, 1, 'placed', id FROM orders
         WHERE sale_id = $1",
    ] {
        sqlx::query(statement).bind(sale).execute(&mut *conn).await.unwrap();
    }
    let before = index_entries_read(&mut conn).await;
    drop(conn);
    let batch: Vec<PurchaseMessage> = (20_001..=20_200)
        .map(|user| PurchaseMessage {
            request_id: uuid::Uuid::new_v4(),
            sale_id: sale,
            user_id: user,
            quantity: 1,
        })
        .collect();
    let settled = settle::settle(&pool, &batch, 1).await.expect("the batch settles");
    assert_eq!(settled.resolutions.len(), 200);
    let mut conn = pool.acquire().await.unwrap();
    let read = index_entries_read(&mut conn).await - before;
    // 200 ids and 200 buyers looked up twice, none there yet; the sale's
    // 20 000 requests and orders must not be read.
    assert!(read < 2_000, "the batch read {read} index entries of its sale");
    let in_temp: i64 = sqlx::query_scalar("SELECT count(*) FROM purchase_requests")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(in_temp, 20_200, "the batch wrote into the shadowing table");
    conn.close().await.unwrap();
}
