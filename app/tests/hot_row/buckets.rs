//! `sql/buckets`: the stock over N rows sells exactly the stock, whether
//! demand is three times the stock or exactly the stock (no unit stranded in
//! a bucket), with books exact across the buckets, restocks spread over
//! them, and one order per buyer across them.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::{TestApp, assert_problem};
use crate::{assert_exact, burst, buy, tally, two_instances};

/// A `sql/buckets` sale of `stock` units over `buckets` rows.
async fn bucket_sale(app: &TestApp, stock: i64, buckets: i32) -> i64 {
    let body = json!({ "name": "buckets", "stock": stock, "strategy": "sql/buckets",
                       "buckets": buckets });
    let sale = app.create_sale(body).await;
    assert_eq!(sale["buckets"], buckets);
    sale["id"].as_i64().unwrap()
}

/// The units in each bucket row of `sale`, in bucket order.
async fn bucket_rows(db: &PgPool, sale: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT remaining_stock FROM sale_buckets WHERE sale_id = $1 ORDER BY bucket",
    )
    .bind(sale)
    .fetch_all(db)
    .await
    .unwrap()
}

/// Buyers `1..=buyers` of `sale`, all at once over both instances; the
/// tally of the answers.
async fn sell(apps: [&TestApp; 2], sale: i64, buyers: i64) -> Vec<String> {
    let answers = burst(&apps, sale, 1..buyers + 1).await;
    answers.into_iter().map(|(_, answer)| answer).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_buyers_per_unit_buy_exactly_the_stock_over_two_instances() {
    let (one, two) = two_instances().await;
    let sale = bucket_sale(&one, 240, 8).await;
    assert_eq!(bucket_rows(&one.db, sale).await, vec![30; 8]);
    let answers = sell([&one, &two], sale, 720).await;
    assert_eq!(
        tally(&answers),
        [("201 ×1", 240), ("409 /problems/sold-out", 480)].into_iter().collect()
    );
    assert_exact(&one.audit(sale).await, 240, 240);
    assert_eq!(bucket_rows(&one.db, sale).await, vec![0; 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_many_buyers_as_units_each_get_one_and_no_unit_is_stranded() {
    let (one, two) = two_instances().await;
    for (stock, buckets) in [(200, 8), (10, 16)] {
        let sale = bucket_sale(&one, stock, buckets).await;
        let answers = sell([&one, &two], sale, stock).await;
        assert_eq!(tally(&answers), [("201 ×1", stock as usize)].into_iter().collect());
        assert_exact(&one.audit(sale).await, stock, stock);
        assert!(bucket_rows(&one.db, sale).await.iter().all(|&units| units == 0));
    }
}

#[tokio::test]
async fn restock_spreads_over_the_buckets_and_the_sale_reads_their_sum() {
    let app = TestApp::spawn().await;
    let sale = bucket_sale(&app, 10, 4).await;
    assert_eq!(bucket_rows(&app.db, sale).await, [3, 3, 2, 2]);
    for user in 1..=3 {
        assert_eq!(buy(&app, sale, user, 1).await, "201 ×1");
    }
    assert_eq!(app.sale_status(sale).await["remaining_stock"], 7);
    let restocked: Value = app.restock(sale, json!({ "units": 6 })).await.json().await.unwrap();
    assert_eq!(
        (restocked["total_stock"].as_i64(), restocked["remaining_stock"].as_i64()),
        (Some(16), Some(13))
    );
    assert_eq!(bucket_rows(&app.db, sale).await.iter().sum::<i64>(), 13);
    let status = app.sale_status(sale).await;
    assert_eq!(
        (status["total_stock"].as_i64(), status["remaining_stock"].as_i64()),
        (Some(16), Some(13))
    );
    // One order per buyer, whichever bucket served the first.
    assert_eq!(buy(&app, sale, 2, 1).await, "409 /problems/already-purchased");
    assert_exact(&app.audit(sale).await, 16, 3);
    let answers: Vec<String> =
        burst(&[&app], sale, 100..120).await.into_iter().map(|a| a.1).collect();
    assert_eq!(tally(&answers)["201 ×1"], 13);
    assert_eq!(app.sale_status(sale).await["status"], "sold_out");
    assert_exact(&app.audit(sale).await, 16, 16);
}

#[tokio::test]
async fn buckets_are_eight_by_default_within_range_and_only_for_sql_buckets() {
    let app = TestApp::spawn().await;
    let sale = app.create_sale(json!({ "name": "b", "stock": 3, "strategy": "sql/buckets" })).await;
    assert_eq!(sale["buckets"], 8);
    let plain = app.create_sale(json!({ "name": "s", "stock": 3, "strategy": "sql" })).await;
    assert_eq!(plain["buckets"], Value::Null);
    for (strategy, buckets) in [("sql/buckets", 0), ("sql/buckets", 1025), ("sql", 8)] {
        let body = json!({ "name": "b", "stock": 3, "strategy": strategy, "buckets": buckets });
        let response = app.try_create_sale(body).await;
        assert_problem(response, StatusCode::UNPROCESSABLE_ENTITY, "invalid-field").await;
    }
}
