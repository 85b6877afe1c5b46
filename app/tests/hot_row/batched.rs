//! `sql/batched`: exact books with two instances, each purchase of a mixed
//! batch answered as `sql` answers it, restocks during batches.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use reqwest::Method;
use seckill::outcome::{Outcome, StrategyError};
use seckill::sale::{Quantity, SaleId, UserId};
use seckill::strategy::Strategy;
use seckill::strategy::sql::Sql;
use seckill::strategy::sql_batched::BatchStats;
use serde_json::json;
use sqlx::PgPool;

use super::{Direct, assert_exact, burst, buy, orders, outcome, tally, two_instances};
use crate::support::{TestApp, eventually, hold_sale_row, provoking};

/// The batch statistics of `sale` over `apps`.
async fn batch_stats(apps: &[&TestApp], sale: i64) -> BatchStats {
    let mut all = Vec::new();
    for app in apps {
        all.push(app.admin(Method::GET, &format!("/admin/sales/{sale}/batches")).await);
    }
    BatchStats::merge(SaleId(sale), &all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_buyers_of_one_unit_over_two_instances_leave_exact_books() {
    let (one, two) = two_instances().await;
    let sale = one.sale("sql/batched", 1).await;
    let answers = burst(&[&one, &two], sale, 1..501).await;
    let all: Vec<String> = answers.iter().map(|(_, answer)| answer.clone()).collect();
    assert_eq!(tally(&all), BTreeMap::from([("201 ×1", 1), ("409 /problems/sold-out", 499)]));
    let winner = answers.iter().find(|(_, answer)| answer == "201 ×1").unwrap().0;
    assert_eq!(orders(&one.db, sale).await, BTreeMap::from([(winner, 1)]));
    assert_exact(&one.audit(sale).await, 1, 1);
    // Group commit grouped them: fewer transactions than purchases.
    let stats = batch_stats(&[&one, &two], sale).await;
    assert_eq!(stats.purchases, 500, "{stats:?}");
    assert!(stats.batches < stats.purchases, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_buyers_per_unit_over_two_instances_buy_exactly_the_stock() {
    let (one, two) = two_instances().await;
    let sale = one.sale("sql/batched", 150).await;
    let answers = burst(&[&one, &two], sale, 1..451).await;
    let placed: BTreeMap<i64, i32> = answers
        .iter()
        .filter(|(_, answer)| answer == "201 ×1")
        .map(|&(user, _)| (user, 1))
        .collect();
    assert_eq!(
        placed.len(),
        150,
        "{:?}",
        tally(&answers.into_iter().map(|a| a.1).collect::<Vec<_>>())
    );
    assert_eq!(orders(&one.db, sale).await, placed, "every 201, and only they, have an order");
    assert_exact(&one.audit(sale).await, 150, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restocks_during_batches_keep_the_books_exact_and_every_unit_sells() {
    let (one, two) = two_instances().await;
    let sale = one.sale("sql/batched", 40).await;
    let restocks = async {
        for _ in 0..6 {
            let response = two.restock(sale, json!({ "units": 10 })).await;
            assert_eq!(response.status(), reqwest::StatusCode::OK);
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    };
    let apps = [&one, &two];
    let (answers, ()) = tokio::join!(burst(&apps, sale, 1..301), restocks);
    let placed: BTreeSet<i64> =
        answers.iter().filter(|(_, answer)| answer == "201 ×1").map(|&(user, _)| user).collect();
    assert_eq!(orders(&one.db, sale).await.into_keys().collect::<BTreeSet<_>>(), placed);
    let sold = placed.len() as i64;
    assert_exact(&one.audit(sale).await, 100, sold);
    // What the restocks added after the burst ran dry sells to new buyers.
    let rest = burst(&[&one, &two], sale, 1001..1001 + (100 - sold) + 20).await;
    let more = rest.iter().filter(|(_, answer)| answer == "201 ×1").count() as i64;
    assert_eq!(sold + more, 100);
    assert_exact(&one.audit(sale).await, 100, 100);
}

/// Postgres refuses the orders of this buyer (a test trigger), as it might
/// refuse any one order.
const REFUSED: i64 = 13;

/// The purchases of the mixed batch, in arrival order, as (buyer, units),
/// on a sale of 6 units of which buyer 1 already bought 1. The first settles
/// alone while the test holds the sale row; the others arrive meanwhile and
/// form one batch.
const MIXED: [(i64, i64); 9] = [
    (1, 1),       // buyer 1 has an order: already purchased (and alone in its batch)
    (2, 3),       // 5 left: granted, 2 left
    (2, 1),       // the same buyer earlier in the batch: already purchased
    (1, 1),       // ordered before the batch: already purchased
    (REFUSED, 1), // Postgres refuses the order: the error `sql` gets
    (3, 3),       // more than the 2 left: sold out
    (4, 2),       // fits: granted, none left
    (3, 1),       // none left: sold out
    (1, 3),       // none left: sold out, before the buyer is checked
];

/// A 6-unit sale of `strategy` (3 units per buyer at most) of which buyer 1
/// bought 1.
async fn mixed_sale(app: &TestApp, strategy: &str) -> i64 {
    let body = json!({ "name": "mixed", "stock": 6, "strategy": strategy, "per_user_limit": 3 });
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    assert_eq!(buy(app, sale, 1, 1).await, "201 ×1");
    sale
}

/// `purchases` of `sale` through the `sql` strategy, one after the other.
async fn sql_answers(direct: &Direct, sale: i64, purchases: &[(i64, i64)]) -> Vec<String> {
    let sql = Sql::new(direct.db.clone(), seckill::strategy::sql::NAME);
    let sale = direct.sale(sale).await;
    let mut answers = Vec::new();
    for &(user, units) in purchases {
        let (user, units) = (UserId::parse(user).unwrap(), Quantity::parse(units, 3).unwrap());
        answers.push(outcome(&sql.purchase(&sale, user, units).await));
    }
    answers
}

/// Polls `future` once.
async fn poll_once<F: Future + ?Sized>(future: &mut Pin<Box<F>>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Whether some backend waits for a lock that backend `holder` holds.
async fn blocks_someone(db: &PgPool, holder: i32) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))",
    )
    .bind(holder)
    .fetch_one(db)
    .await
    .unwrap()
}

/// `purchases` of `sale` through a `sql/batched` strategy, in this arrival
/// order: the first settles alone while the test holds the sale row, the
/// others join the queue meanwhile, one after the other, and settle as one
/// batch. Returns the answers and the batches.
async fn batched_answers(
    direct: &Direct,
    sale: i64,
    purchases: &[(i64, i64)],
) -> (Vec<String>, BatchStats) {
    let record = direct.sale(sale).await;
    let mut holder = hold_sale_row(&direct.db, sale).await;
    let holder_pid: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *holder).await.unwrap();
    type Pending<'a> = Pin<Box<dyn Future<Output = Result<Outcome, StrategyError>> + Send + 'a>>;
    let mut pending: Vec<Pending<'_>> = Vec::new();
    for (i, &(user, units)) in purchases.iter().enumerate() {
        let (user, units) = (UserId::parse(user).unwrap(), Quantity::parse(units, 3).unwrap());
        let mut purchase = direct.strategy.purchase(&record, user, units);
        assert!(poll_once(&mut purchase).await.is_pending(), "purchase {i} waits for its batch");
        pending.push(purchase);
        if i == 0 {
            let waiting =
                eventually(Duration::from_secs(10), || blocks_someone(&direct.db, holder_pid));
            assert!(waiting.await, "the first batch waits for the sale row");
        }
    }
    holder.rollback().await.unwrap();
    let mut answers = Vec::new();
    for purchase in pending {
        answers.push(outcome(&purchase.await));
    }
    (answers, direct.strategy.stats(SaleId(sale)))
}

/// Makes Postgres refuse every order of [`REFUSED`] for `sales` (a trigger
/// and its function, named after the sales), until [`allow`] drops them.
async fn refuse(db: &PgPool, sales: [i64; 2]) -> String {
    let name = format!("refuse_{}_{}", sales[0], sales[1]);
    let function = format!(
        "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql
         AS $$ BEGIN RAISE EXCEPTION 'this order is refused by a test'; END $$"
    );
    let trigger = format!(
        "CREATE TRIGGER {name} BEFORE INSERT ON orders FOR EACH ROW
         WHEN (NEW.user_id = {REFUSED} AND NEW.sale_id IN ({}, {}))
         EXECUTE FUNCTION {name}()",
        sales[0], sales[1]
    );
    for statement in [function, trigger] {
        sqlx::query(sqlx::AssertSqlSafe(statement)).execute(db).await.unwrap();
    }
    name
}

async fn allow(db: &PgPool, name: &str) {
    for statement in [format!("DROP TRIGGER {name} ON orders"), format!("DROP FUNCTION {name}()")] {
        sqlx::query(sqlx::AssertSqlSafe(statement)).execute(db).await.unwrap();
    }
}

/// Runs [`MIXED`] (without the refused buyer unless `with_refused`) on a
/// `sql` sale one purchase after the other and on a `sql/batched` sale as
/// one batch, and compares every answer and the books.
async fn mixed_batch_answers_as_sql(with_refused: bool) {
    let (app, direct) = (TestApp::spawn().await, Direct::new().await);
    let purchases: Vec<(i64, i64)> =
        MIXED.iter().copied().filter(|&(user, _)| with_refused || user != REFUSED).collect();
    let (sql_sale, batched_sale) =
        (mixed_sale(&app, "sql").await, mixed_sale(&app, "sql/batched").await);
    let refused =
        if with_refused { Some(refuse(&app.db, [sql_sale, batched_sale]).await) } else { None };
    let expected = sql_answers(&direct, sql_sale, &purchases).await;
    let (answers, stats) = batched_answers(&direct, batched_sale, &purchases).await;
    if let Some(refused) = refused {
        allow(&app.db, &refused).await;
    }
    assert_eq!(answers, expected);
    let rest = purchases.len() as u32 - 1;
    assert_eq!(stats.size_counts, BTreeMap::from([(1, 1), (rest, 1)]), "the plug, then one batch");
    let (sql_audit, batched_audit) = (app.audit(sql_sale).await, app.audit(batched_sale).await);
    assert_exact(&batched_audit, 6, 6);
    assert_eq!(orders(&app.db, batched_sale).await, orders(&app.db, sql_sale).await);
    assert_eq!(sql_audit.units_sold, batched_audit.units_sold);
    // The batch's orders (buyers 2 and 4) were written by one statement: one
    // transaction id. The fallback that settles a failed batch again one
    // purchase at a time writes each under a savepoint of its own, each with
    // a transaction id of its own — the same answers and books, so only this
    // tells that a batch which should have gone through did not (a buyer who
    // had an order before the batch must be refused by the batch itself, not
    // by the unique constraint failing the whole batch).
    let writers = if with_refused { 2 } else { 1 };
    assert_eq!(transactions_writing(&app.db, batched_sale).await, writers);
}

/// The distinct transaction ids (`xmin`) that wrote the orders of `sale`
/// other than buyer 1's, bought before the batch.
async fn transactions_writing(db: &PgPool, sale: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT xmin::text) FROM orders WHERE sale_id = $1 AND user_id <> 1",
    )
    .bind(sale)
    .fetch_one(db)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_purchase_of_a_mixed_batch_gets_the_answer_sql_gives_it() {
    mixed_batch_answers_as_sql(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_postgres_refuses_fails_alone_and_the_batch_goes_on() {
    provoking("a purchase whose order Postgres refuses, inside a batch");
    mixed_batch_answers_as_sql(true).await;
}

/// Per-sale state in memory does not grow with every sale ever sold from:
/// a queue idle for `IDLE_SALE_STATE` is dropped, and a sale sold from
/// again gets a new one.
#[tokio::test]
async fn the_queues_of_sales_no_longer_sold_from_are_dropped_after_the_idle_time() {
    let app = TestApp::spawn().await;
    let direct = Direct::new().await;
    let mut sales = Vec::new();
    for _ in 0..40 {
        sales.push(app.sale("sql/batched", 2).await);
    }
    let user = UserId::parse(1).unwrap();
    for &id in &sales {
        let sold = direct.strategy.purchase(&*direct.sale(id).await, user, Quantity::ONE).await;
        assert!(matches!(sold, Ok(Outcome::Placed { .. })), "{sold:?}");
    }
    assert_eq!(direct.strategy.len(), sales.len());

    let idle = seckill::sale::IDLE_SALE_STATE;
    let now = std::time::Instant::now();
    direct.strategy.forget_idle(now + idle - Duration::from_secs(1));
    assert_eq!(direct.strategy.len(), sales.len(), "not idle long enough yet");
    direct.strategy.forget_idle(now + idle);
    assert!(direct.strategy.is_empty(), "{} queues left", direct.strategy.len());

    let again = direct.strategy.purchase(&*direct.sale(sales[0]).await, user, Quantity::ONE).await;
    assert_eq!(again.unwrap(), Outcome::AlreadyPurchased);
    assert_eq!(direct.strategy.len(), 1);
    assert_eq!(direct.strategy.stats(SaleId(sales[0])).batches, 1, "a new queue");
}
