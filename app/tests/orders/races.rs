//! Races with exact books: a cancel racing a payment, two sweeps at once,
//! sweeps on two instances. Each order ends in exactly one state and its
//! units come back at most once.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use seckill::lifecycle::sweep::sweep_once;

use super::harness::{Sweeps, bought, remaining, window_sale};
use crate::support::TestApp;

/// Statuses of the orders of `sale`: status → count.
async fn statuses(db: &sqlx::PgPool, sale: i64) -> HashMap<String, i64> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM orders WHERE sale_id = $1 GROUP BY status")
            .bind(sale)
            .fetch_all(db)
            .await
            .unwrap();
    rows.into_iter().collect()
}

#[tokio::test]
async fn a_cancel_racing_a_payment_ends_each_order_paid_or_cancelled_never_both() {
    let app = TestApp::spawn().await;
    let orders = 60;
    let sale = window_sale(&app, "sql", orders, 60_000).await;
    let mut ids = Vec::new();
    for user in 0..orders {
        ids.push(bought(&app, sale, user).await);
    }
    let mut races = tokio::task::JoinSet::new();
    for id in ids {
        let (client, base) = (app.client.clone(), app.base.clone());
        races.spawn(async move {
            let pay = client.post(format!("{base}/orders/{id}/pay")).send();
            let cancel = client.post(format!("{base}/orders/{id}/cancel")).send();
            let (paid, cancelled) = tokio::join!(pay, cancel);
            (paid.unwrap().status(), cancelled.unwrap().status())
        });
    }
    let answers = races.join_all().await;
    let paid = answers.iter().filter(|(p, _)| *p == StatusCode::OK).count() as i64;
    let cancelled = answers.iter().filter(|(_, c)| *c == StatusCode::OK).count() as i64;
    // Exactly one of each pair succeeded; the other was told 409.
    for (p, c) in &answers {
        assert!((*p == StatusCode::OK) != (*c == StatusCode::OK), "{p} and {c}");
        assert!(*p == StatusCode::CONFLICT || *c == StatusCode::CONFLICT, "{p} and {c}");
    }
    assert_eq!(paid + cancelled, orders);
    let books = statuses(&app.db, sale).await;
    assert_eq!(books.get("paid").copied().unwrap_or(0), paid);
    assert_eq!(books.get("cancelled").copied().unwrap_or(0), cancelled);
    assert_eq!(remaining(&app.db, sale).await, cancelled, "each cancelled unit came back once");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.units_returned), (paid, cancelled));
    assert_eq!((audit.ledger_drift, audit.oversold, audit.duplicate_orders), (0, 0, 0));
}

/// In a database of its own: another service's sweep (the tests of one
/// binary share the test database, and several sweep it every few ms) may
/// hold one of this sale's orders, uncommitted, while the two sweeps run; they
/// skip it (`SKIP LOCKED`), and it was read still pending: 79 of 80 expired,
/// in 4 of about 80 runs of this binary on a loaded 2-core machine.
#[tokio::test]
async fn two_sweeps_at_once_expire_each_order_once() {
    let url = test_support::scratch_database("two_sweeps").await;
    let own = url.clone();
    let app = TestApp::spawn_with(move |config| {
        config.backends.database_url = own;
        config.lifecycle.expiry_sweep_interval_ms = 0;
    })
    .await;
    let db = sqlx::PgPool::connect(&url).await.unwrap();
    let orders = 80;
    let sale = window_sale(&app, "sql", orders, 1).await;
    for user in 0..orders {
        bought(&app, sale, user).await;
    }
    let sweeps = Sweeps::on(&url).await;
    let (first, second) = tokio::join!(sweep_once(sweeps.context()), sweep_once(sweeps.context()));
    assert_eq!(first.unwrap() + second.unwrap(), orders as usize, "each order once, by one");
    assert_eq!(statuses(&db, sale).await.get("expired").copied(), Some(orders));
    assert_eq!(remaining(&db, sale).await, orders);
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.units_returned, audit.ledger_drift), (0, orders, 0));
    // Nothing left for a third.
    assert_eq!(sweep_once(sweeps.context()).await.unwrap(), 0);
    assert_eq!(statuses(&db, sale).await.get("expired").copied(), Some(orders));
    assert_eq!(remaining(&db, sale).await, orders);
    drop(sweeps);
    db.close().await;
    test_support::drop_scratch_database(&url).await;
}

#[tokio::test]
async fn sweeps_on_two_instances_share_the_due_orders_and_the_books_stay_exact() {
    let sweep_fast =
        |config: &mut seckill::config::Config| config.lifecycle.expiry_sweep_interval_ms = 20;
    let one = TestApp::spawn_with(sweep_fast).await;
    let two = TestApp::spawn_with(sweep_fast).await;
    let stock = 50;
    let sale = window_sale(&one, "sql", stock, 200).await;
    // Buyers on both instances, for longer than the window: units expire and
    // sell again while the sale goes on.
    let mut sold = 0;
    let mut user = 0;
    let until = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < until {
        let app = if user % 2 == 0 { &one } else { &two };
        if app.buy(sale, user).await.status() == StatusCode::CREATED {
            sold += 1;
        }
        user += 1;
    }
    assert!(sold > stock, "units expired and sold again: {sold} sold of {stock}");
    let settled = crate::support::eventually(Duration::from_secs(5), || async {
        !statuses(&one.db, sale).await.contains_key("pending_payment")
    })
    .await;
    assert!(settled, "every order expired");
    let audit = one.audit(sale).await;
    assert_eq!(audit.units_returned, sold, "every expired unit came back once");
    assert_eq!((audit.units_sold, audit.remaining_stock), (0, stock));
    assert_eq!((audit.ledger_drift, audit.oversold, audit.duplicate_orders), (0, 0, 0));
    assert_eq!(audit.units_resold, sold - stock);
}
