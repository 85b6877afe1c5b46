//! The audit's figures on hand-built states: sales and orders written with SQL
//! directly, so every expected figure is known in advance — including
//! duplicates, which the real `orders` table cannot hold.

use seckill::audit::{Audit, audit};
use seckill::sale::SaleId;
use sqlx::{Connection, PgConnection, PgPool};

use crate::support::{TestApp, test_database_url};

/// Inserts a `sql` sale with these stock figures, bypassing the API.
async fn insert_sale(db: &PgPool, total: i64, remaining: i64) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO sales (name, total_stock, remaining_stock, per_user_limit, strategy)
         VALUES ('audit fixture', $1, $2, 10, 'sql') RETURNING id",
    )
    .bind(total)
    .bind(remaining)
    .fetch_one(db)
    .await
    .unwrap()
}

/// Inserts one order per `(user, quantity)` into whatever `orders` resolves to
/// on `conn`.
async fn insert_orders(conn: &mut PgConnection, sale: i64, orders: &[(i64, i32)]) {
    for &(user, quantity) in orders {
        sqlx::query("INSERT INTO orders (sale_id, user_id, quantity) VALUES ($1, $2, $3)")
            .bind(sale)
            .bind(user)
            .bind(quantity)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}

/// The figures the audit computes, without the order timestamps.
fn figures(audit: &Audit) -> [i64; 7] {
    [
        audit.total_stock,
        audit.remaining_stock,
        audit.orders,
        audit.units_sold,
        audit.oversold,
        audit.ledger_drift,
        audit.duplicate_orders,
    ]
}

/// Audits `sale` through `GET /admin/sales/{id}/audit` and through
/// `seckill::audit::audit` on a fresh connection; both must agree.
async fn audit_both_ways(app: &TestApp, sale: i64) -> Audit {
    let over_http = app.audit(sale).await;
    let mut conn = PgConnection::connect(&test_database_url()).await.unwrap();
    let direct = audit(&mut conn, SaleId(sale)).await.unwrap().expect("the sale exists");
    assert_eq!(over_http, direct);
    direct
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_an_exact_ledger_shows_no_oversell_and_no_drift() {
    let app = TestApp::spawn().await;
    let sale = insert_sale(&app.db, 10, 1).await;
    let mut conn = app.db.acquire().await.unwrap();
    insert_orders(&mut conn, sale, &[(1, 4), (2, 3), (3, 2)]).await;
    drop(conn);
    let audit = audit_both_ways(&app, sale).await;
    //                          total remaining orders units oversold drift dups
    assert_eq!(figures(&audit), [10, 1, 3, 9, 0, 0, 0]);
    assert_eq!(audit.strategy, "sql");
    let (first, last) = (audit.first_order_at.unwrap(), audit.last_order_at.unwrap());
    assert!(first < last, "clock_timestamp() orders the inserts: {first} {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_shows_negative_drift_when_units_sold_exceed_what_the_stock_lost() {
    let app = TestApp::spawn().await;
    // 10 units, 3 left: the stock column lost 7, but 9 units were ordered.
    let sale = insert_sale(&app.db, 10, 3).await;
    let mut conn = app.db.acquire().await.unwrap();
    insert_orders(&mut conn, sale, &[(1, 4), (2, 3), (3, 2)]).await;
    drop(conn);
    let audit = audit_both_ways(&app, sale).await;
    assert_eq!(figures(&audit), [10, 3, 3, 9, 0, -2, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_counts_units_sold_beyond_the_total_stock_as_oversold() {
    let app = TestApp::spawn().await;
    // 5 units, 1 left, 8 units ordered: 3 units that never existed.
    let sale = insert_sale(&app.db, 5, 1).await;
    let mut conn = app.db.acquire().await.unwrap();
    insert_orders(&mut conn, sale, &[(1, 2), (2, 2), (3, 2), (4, 1), (5, 1)]).await;
    drop(conn);
    let audit = audit_both_ways(&app, sale).await;
    assert_eq!(figures(&audit), [5, 1, 5, 8, 3, -4, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_shows_positive_drift_when_stock_was_taken_without_an_order() {
    let app = TestApp::spawn().await;
    let sale = insert_sale(&app.db, 10, 4).await;
    let mut conn = app.db.acquire().await.unwrap();
    insert_orders(&mut conn, sale, &[(1, 5)]).await;
    drop(conn);
    let audit = audit_both_ways(&app, sale).await;
    assert_eq!(figures(&audit), [10, 4, 1, 5, 0, 1, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_a_sale_without_orders_is_all_zero() {
    let app = TestApp::spawn().await;
    let sale = insert_sale(&app.db, 6, 6).await;
    let audit = audit_both_ways(&app, sale).await;
    assert_eq!(figures(&audit), [6, 6, 0, 0, 0, 0, 0]);
    assert_eq!((audit.first_order_at, audit.last_order_at), (None, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_of_an_unknown_sale_is_none() {
    let mut conn = PgConnection::connect(&test_database_url()).await.unwrap();
    assert_eq!(audit(&mut conn, SaleId(i64::MAX)).await.unwrap(), None);
}

/// The real `orders` table cannot hold two orders of one user for one sale,
/// so the duplicate count runs on a temporary copy without the constraint:
/// a temporary table shadows `orders` for unqualified names on the connection
/// that created it, and the audit's query names `orders` unqualified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_counts_every_order_beyond_the_first_per_user_as_a_duplicate() {
    let app = TestApp::spawn().await;
    let sale = insert_sale(&app.db, 10, 4).await;

    let mut conn = PgConnection::connect(&test_database_url()).await.unwrap();
    sqlx::query("CREATE TEMP TABLE orders (LIKE public.orders INCLUDING DEFAULTS)")
        .execute(&mut conn)
        .await
        .unwrap();
    // User 1 three times, user 2 twice, user 3 once: 3 duplicates, 6 orders.
    let orders = [(1, 1), (1, 2), (1, 1), (2, 1), (2, 2), (3, 1)];
    insert_orders(&mut conn, sale, &orders).await;
    // The same user on another sale is not a duplicate of this one.
    let other = insert_sale(&app.db, 10, 10).await;
    insert_orders(&mut conn, other, &[(1, 1)]).await;

    let shadowed = audit(&mut conn, SaleId(sale)).await.unwrap().unwrap();
    // total 10, remaining 4, 6 orders of 8 units: drift 10 − 4 − 8 = −2.
    assert_eq!(figures(&shadowed), [10, 4, 6, 8, 0, -2, 3]);
    let other = audit(&mut conn, SaleId(other)).await.unwrap().unwrap();
    assert_eq!(figures(&other), [10, 10, 1, 1, 0, -1, 0]);

    // Other connections still see the real, empty table.
    let real = app.audit(sale).await;
    assert_eq!((real.orders, real.duplicate_orders), (0, 0));
    conn.close().await.unwrap();
}
