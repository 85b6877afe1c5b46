//! `sql/buckets`: the stock over N rows sells exactly the stock, whether
//! demand is three times the stock or exactly the stock (no unit stranded in
//! a bucket), with books exact across the buckets, restocks spread over
//! them, and one order per buyer across them. A purchase of several units
//! takes them from one bucket when one has them, else from several at once,
//! and is refused only when the buckets together lack them: with one unit
//! per bucket, under concurrent multi-unit buyers on two instances, with the
//! rows held through simulated work, and after its units were returned;
//! purchases lock several buckets in bucket order, so they never deadlock,
//! and a statement that took nothing leaves no lock behind.

use std::time::Duration;

use reqwest::StatusCode;
use seckill::sale::UserId;
use seckill::strategy::sql_buckets::home_bucket;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::task::JoinHandle;

use super::{answer, assert_exact, burst, buy, orders, tally, two_instances};
use crate::support::{TestApp, assert_problem, eventually};

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

/// A `sql/buckets` sale created from `body`'s fields on top of a name and
/// the strategy.
async fn bucket_sale_with(app: &TestApp, body: Value) -> i64 {
    let mut sale = json!({ "name": "buckets", "strategy": "sql/buckets" });
    for (key, value) in body.as_object().expect("an object") {
        sale[key] = value.clone();
    }
    app.create_sale(sale).await["id"].as_i64().unwrap()
}

#[tokio::test]
async fn a_purchase_no_bucket_can_fill_takes_the_units_from_several() {
    let app = TestApp::spawn().await;
    let sale =
        bucket_sale_with(&app, json!({ "stock": 6, "buckets": 8, "per_user_limit": 4 })).await;
    assert_eq!(bucket_rows(&app.db, sale).await, [1, 1, 1, 1, 1, 1, 0, 0]);
    assert_eq!(buy(&app, sale, 1, 4).await, "201 ×4");
    assert_eq!(bucket_rows(&app.db, sale).await.iter().sum::<i64>(), 2);
    assert!(bucket_rows(&app.db, sale).await.iter().all(|&units| units <= 1));
    // Two units left: three are not there, two are.
    assert_eq!(buy(&app, sale, 2, 3).await, "409 /problems/sold-out");
    assert_eq!(buy(&app, sale, 2, 2).await, "201 ×2");
    assert_eq!(bucket_rows(&app.db, sale).await, [0; 8]);
    assert_eq!(orders(&app.db, sale).await, [(1, 4), (2, 2)].into_iter().collect());
    assert_exact(&app.audit(sale).await, 6, 6);
}

#[tokio::test]
async fn a_purchase_one_bucket_can_fill_takes_the_units_from_that_bucket_alone() {
    let app = TestApp::spawn().await;
    let sale =
        bucket_sale_with(&app, json!({ "stock": 10, "buckets": 2, "per_user_limit": 4 })).await;
    assert_eq!(buy(&app, sale, 1, 4).await, "201 ×4");
    let mut rows = bucket_rows(&app.db, sale).await;
    rows.sort();
    assert_eq!(rows, [1, 5]);
    assert_exact(&app.audit(sale).await, 10, 4);
}

/// 120 units, one in each of the first 120 of 240 buckets; 160 buyers of
/// 1, 2 or 3 units at once over two instances, without and with simulated
/// work (each purchase then holds its rows through a transaction). Every
/// answer is `201` or `sold-out` (a deadlock would be an error), a buyer
/// told `sold-out` asked for more than was left at the end, and the books
/// are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_multi_unit_buyers_take_one_unit_buckets_without_deadlock_or_stranded_units() {
    let (one, two) = two_instances().await;
    for knobs in [json!({}), json!({ "work_ms": 2 })] {
        let mut body = json!({ "stock": 120, "buckets": 240, "per_user_limit": 3 });
        body.as_object_mut().unwrap().extend(knobs.as_object().unwrap().clone());
        let sale = bucket_sale_with(&one, body).await;
        let quantity = |user: i64| 1 + user % 3;
        let mut tasks = tokio::task::JoinSet::new();
        for user in 1..=160 {
            let app = if user % 2 == 0 { &one } else { &two };
            let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
            tasks.spawn(async move {
                let body = json!({ "user_id": user, "quantity": quantity(user) });
                let response = client.post(url).json(&body).send().await;
                (user, answer(response.expect("the service answers")).await)
            });
        }
        let answers = tasks.join_all().await;
        let audit = one.audit(sale).await;
        let left = audit.remaining_stock;
        let mut sold = 0;
        for (user, answer) in &answers {
            if answer.starts_with("201") {
                assert_eq!(*answer, format!("201 ×{}", quantity(*user)), "{knobs}");
                sold += quantity(*user);
            } else {
                assert_eq!(answer, "409 /problems/sold-out", "{knobs}: buyer {user}");
                assert!(quantity(*user) > left, "{knobs}: buyer {user} refused, {left} left");
            }
        }
        assert_exact(&audit, 120, sold);
        assert!(left < 3, "{knobs}: {left} units left, {:?}", tally_of(&answers));
        assert_eq!(bucket_rows(&one.db, sale).await.iter().sum::<i64>(), left, "{knobs}");
    }
}

/// Two purchases that need the same buckets lock them in one order. A sale
/// of 3 units, in buckets 0, 1 and 2 of 8; the test holds bucket 1's row.
/// Buyer A (home bucket 0) asks for 3: it locks bucket 0 and waits for 1.
/// Buyer B (home bucket 2) asks for 2. Locking going round from its home, B
/// would lock 2 and wait for 0, and A, once the test lets bucket 1 go, would
/// wait for 2: a deadlock. In bucket order B waits for 0 behind A instead;
/// A gets the 3 units and B is told sold-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_over_the_same_buckets_lock_them_in_one_order_and_never_deadlock() {
    let app = TestApp::spawn().await;
    let sale =
        bucket_sale_with(&app, json!({ "stock": 3, "buckets": 8, "per_user_limit": 3 })).await;
    assert_eq!(bucket_rows(&app.db, sale).await, [1, 1, 1, 0, 0, 0, 0, 0]);
    let mut holder = app.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sale_buckets WHERE sale_id = $1 AND bucket = 1 FOR UPDATE")
        .bind(sale)
        .execute(&mut *holder)
        .await
        .unwrap();
    let holder_pid: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *holder).await.unwrap();
    let first = spawn_buy(&app, sale, at_home(0, 8), 3);
    let a_pid = waiting_behind(&app.db, holder_pid).await;
    let second = spawn_buy(&app, sale, at_home(2, 8), 2);
    waiting_behind(&app.db, a_pid).await;
    holder.commit().await.unwrap();
    assert_eq!(first.await.unwrap(), "201 ×3");
    assert_eq!(second.await.unwrap(), "409 /problems/sold-out");
    assert_exact(&app.audit(sale).await, 3, 3);
}

/// With simulated work a purchase holds its bucket's row through the work,
/// in a transaction; each of its statements has a transaction of its own.
/// A sale of 2 units in buckets 0 and 1 of 3; the test sells bucket 0's
/// unit in a transaction it keeps open. A buyer whose home bucket (2) is
/// empty picks bucket 0 and waits for it; once the test commits, its guarded
/// update finds it empty — which leaves the row locked until that
/// statement's transaction ends — and the buyer takes bucket 1's unit. While
/// it works, holding bucket 1, bucket 0 must be free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_that_found_its_bucket_emptied_leaves_no_lock_through_simulated_work() {
    let app = TestApp::spawn().await;
    let sale = bucket_sale_with(&app, json!({ "stock": 2, "buckets": 3, "work_ms": 1000 })).await;
    assert_eq!(bucket_rows(&app.db, sale).await, [1, 1, 0]);
    let mut holder = app.db.begin().await.unwrap();
    sqlx::query(
        "WITH taken AS (UPDATE sale_buckets SET remaining_stock = 0
                        WHERE sale_id = $1 AND bucket = 0 RETURNING sale_id)
         INSERT INTO orders (sale_id, user_id, quantity) SELECT sale_id, 0, 1 FROM taken",
    )
    .bind(sale)
    .execute(&mut *holder)
    .await
    .unwrap();
    let holder_pid: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *holder).await.unwrap();
    let buyer = spawn_buy(&app, sale, at_home(2, 3), 1);
    waiting_behind(&app.db, holder_pid).await;
    holder.commit().await.unwrap();
    // Bucket 1 locked: the buyer placed its order and works.
    let works = eventually(Duration::from_secs(5), || async { is_locked(&app.db, sale, 1).await });
    assert!(works.await, "the buyer took bucket 1");
    assert!(!is_locked(&app.db, sale, 0).await, "bucket 0 is still locked by the buyer");
    assert_eq!(buyer.await.unwrap(), "201 ×1");
    assert_exact(&app.audit(sale).await, 2, 2);
}

/// Whether another transaction holds a lock on `bucket` of `sale` (a
/// `NOWAIT` lock attempt, released at once when it succeeds).
async fn is_locked(db: &PgPool, sale: i64, bucket: i32) -> bool {
    sqlx::query("SELECT 1 FROM sale_buckets WHERE sale_id = $1 AND bucket = $2 FOR UPDATE NOWAIT")
        .bind(sale)
        .bind(bucket)
        .execute(db)
        .await
        .is_err()
}

/// The first user whose home bucket among `buckets` is `bucket`.
fn at_home(bucket: i32, buckets: i32) -> i64 {
    (1..).find(|&user| home_bucket(UserId::parse(user).unwrap(), buckets) == bucket).unwrap()
}

/// `user` buys `quantity` units of `sale` in a task of its own; its answer
/// as [`answer`] writes it.
fn spawn_buy(app: &TestApp, sale: i64, user: i64, quantity: i64) -> JoinHandle<String> {
    let (client, url) = (app.client.clone(), app.url(&format!("/sales/{sale}/orders")));
    tokio::spawn(async move {
        let body = json!({ "user_id": user, "quantity": quantity });
        answer(client.post(url).json(&body).send().await.unwrap()).await
    })
}

/// The backend that waits for a lock backend `holder` holds, once there is
/// one (within 10 s).
async fn waiting_behind(db: &PgPool, holder: i32) -> i32 {
    let query = "SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))";
    let waiting = || async {
        sqlx::query_scalar::<_, i32>(query).bind(holder).fetch_optional(db).await.unwrap()
    };
    assert!(eventually(Duration::from_secs(10), || async { waiting().await.is_some() }).await);
    waiting().await.expect("still waiting")
}

/// The tally of (user, answer) pairs.
fn tally_of(answers: &[(i64, String)]) -> std::collections::BTreeMap<String, usize> {
    tally(&answers.iter().map(|(_, answer)| answer.clone()).collect::<Vec<_>>())
        .into_iter()
        .map(|(answer, count)| (answer.to_owned(), count))
        .collect()
}

#[tokio::test]
async fn units_of_a_multi_unit_order_come_back_and_sell_again_as_several_units() {
    let app = TestApp::spawn().await;
    let body = json!({ "stock": 4, "buckets": 8, "per_user_limit": 3,
                       "payment_window_ms": 60_000 });
    let sale = bucket_sale_with(&app, body).await;
    let order = app.order(sale, json!({ "user_id": 1, "quantity": 3 })).await;
    assert_eq!(order.status(), StatusCode::CREATED);
    let order = order.json::<Value>().await.unwrap()["order_id"].as_i64().unwrap();
    assert_eq!(buy(&app, sale, 2, 2).await, "409 /problems/sold-out");
    let cancel = app.client.post(app.url(&format!("/orders/{order}/cancel"))).send().await;
    assert_eq!(cancel.unwrap().status(), StatusCode::OK);
    // The three units went back to the buyer's home bucket.
    assert_eq!(bucket_rows(&app.db, sale).await.iter().max(), Some(&3));
    assert_eq!(buy(&app, sale, 2, 2).await, "201 ×2");
    assert_eq!(buy(&app, sale, 3, 2).await, "201 ×2");
    assert_eq!(buy(&app, sale, 4, 1).await, "409 /problems/sold-out");
    // A restock spreads one unit over each of five buckets: four of them
    // make one purchase.
    assert_eq!(app.restock(sale, json!({ "units": 5 })).await.status(), StatusCode::OK);
    assert_eq!(buy(&app, sale, 4, 3).await, "201 ×3");
    assert_eq!(buy(&app, sale, 5, 3).await, "409 /problems/sold-out");
    assert_eq!(buy(&app, sale, 5, 2).await, "201 ×2");
    let audit = app.audit(sale).await;
    assert_eq!(
        (audit.total_stock, audit.remaining_stock, audit.units_returned, audit.oversold),
        (9, 0, 3, 0),
        "{audit:?}"
    );
    assert_eq!(audit.ledger_drift, 0, "{audit:?}");
    for order in sqlx::query_scalar::<_, i64>(
        "SELECT id FROM orders WHERE sale_id = $1 AND status = 'pending_payment'",
    )
    .bind(sale)
    .fetch_all(&app.db)
    .await
    .unwrap()
    {
        let paid = app.client.post(app.url(&format!("/orders/{order}/pay"))).send().await;
        assert_eq!(paid.unwrap().status(), StatusCode::OK);
    }
}
