//! The moments the purchase path and the reconciler must get right, each
//! produced on purpose: a buyer Redis admitted and Postgres refused (or
//! failed) gets its place back; a reservation whose reply was lost with the
//! connection is compensated at once; a reconcile pass whose measurement a
//! purchase overtook corrects nothing, or, when the counter really was off,
//! corrects it behind the sale's gate by what a second measurement finds.

use reqwest::StatusCode;
use seckill::failpoints::{self, REDIS_DECR_AFTER_SNAPSHOT};
use test_support::CutProxy;

use super::{
    ALREADY_PURCHASED, RedisView, SHARED_REDIS, SOLD_OUT, UNAVAILABLE, buy, reconcile, restock,
    spawn_app, status_and_problem, unique_prefix,
};

/// The SHA1 of `reserve.lua`, as `EVALSHA` sends it.
fn reserve_script_sha() -> String {
    redis::Script::new(include_str!("../../src/strategy/redis_decr/reserve.lua"))
        .get_hash()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_postgres_refused_after_redis_admitted_them_may_buy_once_restocked() {
    let prefix = unique_prefix();
    let app = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 1).await;
    let mut view = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    view.set_stock(2).await; // the counter one above the truth

    assert_eq!(buy(&app, sale, 1).await.0, StatusCode::CREATED);
    // Redis admits buyer 2 (its counter says 1 is left); Postgres refuses.
    let refused = buy(&app, sale, 2).await;
    assert_eq!(status_and_problem(&refused), (StatusCode::CONFLICT, Some(SOLD_OUT)));
    assert!(!view.is_buyer(2).await, "Redis forgets a buyer without an order");
    assert_eq!(view.open_reservations().await, 0);

    restock(&app, sale, 1).await;
    let again = buy(&app, sale, 2).await;
    assert_eq!(
        again.0,
        StatusCode::CREATED,
        "the refused buyer buys the restocked unit: {again:?}"
    );
    let audit = app.audit(sale).await;
    // The counter still stands one above the truth (no reconciler runs here).
    assert_eq!((audit.units_sold, audit.oversold, audit.redis_drift), (2, 0, Some(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_whose_purchase_failed_after_the_reservation_may_retry_at_once() {
    let prefix = unique_prefix();
    crate::support::provoking("a Postgres failure after the decrement (an armed failpoint, 503)");
    let failing = spawn_app(&SHARED_REDIS, &prefix, |config| {
        config.failpoints = Some("redis-decr-after-reserve=error".into());
    })
    .await;
    let healthy = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = healthy.sale("redis-decr", 1).await;
    let mut view = RedisView::new(&SHARED_REDIS, &prefix, sale).await;

    assert_eq!(
        status_and_problem(&buy(&failing, sale, 1).await),
        (StatusCode::SERVICE_UNAVAILABLE, Some(UNAVAILABLE))
    );
    assert!(!view.is_buyer(1).await, "Redis forgets a buyer whose purchase failed");
    assert_eq!(view.stock().await, Some(1), "the unit came back");

    let retried = buy(&healthy, sale, 1).await;
    assert_eq!(retried.0, StatusCode::CREATED, "{retried:?}");
    assert_ne!(retried.1["type"].as_str(), Some(ALREADY_PURCHASED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_reply_was_lost_with_the_connection_is_returned_at_once() {
    let prefix = unique_prefix();
    let proxy = CutProxy::start(test_support::redis_addr()).await;
    let url = format!("redis://{}", proxy.addr());
    crate::support::provoking("a Redis connection cut right after the reserve script ran");
    let app = spawn_app(&url, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 1).await;
    let mut view = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    assert_eq!(view.stock().await, Some(1), "warmed at creation");

    proxy.cut_after(reserve_script_sha().as_bytes());
    let cut = buy(&app, sale, 1).await;
    proxy.cut().await; // the script ran on Redis; its reply never arrived
    assert_eq!(status_and_problem(&cut), (StatusCode::SERVICE_UNAVAILABLE, Some(UNAVAILABLE)));
    // No reconciler runs here: only the purchase path's compensation can
    // have returned the unit.
    assert_eq!(view.open_reservations().await, 0, "the reservation of unknown outcome is returned");
    assert_eq!(view.stock().await, Some(1));
    assert!(!view.is_buyer(1).await);

    assert_eq!(buy(&app, sale, 1).await.0, StatusCode::CREATED, "the buyer retries at once");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.redis_drift), (1, Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pass_overtaken_by_a_purchase_corrects_nothing() {
    let prefix = unique_prefix();
    let app = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 10).await;
    let mut view = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    let mut stalled = failpoints::arm::<()>(&REDIS_DECR_AFTER_SNAPSHOT, sale);

    let pass = reconcile_in_background(&app, sale);
    stalled.reached().await; // Redis read: counter 10, nothing reserved
    // A purchase reserves, commits and confirms between the two reads: the
    // Postgres read will say 9 against the snapshot's 10.
    assert_eq!(buy(&app, sale, 1).await.0, StatusCode::CREATED);
    stalled.resume(());

    let report = pass.await.unwrap();
    // The stale snapshot's correction is refused by the sequence check; the
    // pass then either defers or measures again behind the sale's gate
    // (`correct_behind_gate`) and finds nothing to correct. Either way no
    // unit is corrected: without the check the counter would drop to 8.
    assert_eq!(report.corrected_units, 0, "{report:?}");
    assert_eq!(view.stock().await, Some(9), "nothing was corrected");
    assert_eq!(app.audit(sale).await.redis_drift, Some(0));
    let again = reconcile(&app, sale).await;
    assert_eq!((again.redis_drift, again.corrected_units), (Some(0), 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pass_overtaken_by_a_purchase_corrects_a_real_drift_behind_the_gate() {
    crate::support::provoking("a Redis counter two units above Postgres (a correction)");
    let prefix = unique_prefix();
    let app = spawn_app(&SHARED_REDIS, &prefix, |_| {}).await;
    let sale = app.sale("redis-decr", 10).await;
    let mut view = RedisView::new(&SHARED_REDIS, &prefix, sale).await;
    view.set_stock(12).await; // two units above the truth
    let mut stalled = failpoints::arm::<()>(&REDIS_DECR_AFTER_SNAPSHOT, sale);

    let pass = reconcile_in_background(&app, sale);
    stalled.reached().await; // Redis read: counter 12
    // Between the two reads: Redis 11, Postgres 9. The first measurement
    // (12 against 9) says 3; its correction is refused by the sequence.
    assert_eq!(buy(&app, sale, 1).await.0, StatusCode::CREATED);
    stalled.resume(());

    let report = pass.await.unwrap();
    // Behind the gate, measured again (11 against 9): down by 2.
    assert_eq!((report.redis_drift, report.corrected_units), (Some(3), 2), "{report:?}");
    assert_eq!(view.stock().await, Some(9));
    assert_eq!(app.audit(sale).await.redis_drift, Some(0));
}

/// `POST /admin/sales/{sale}/reconcile` in a task of its own (to be stalled
/// at a failpoint while the test acts); its report.
fn reconcile_in_background(
    app: &crate::support::TestApp,
    sale: i64,
) -> tokio::task::JoinHandle<seckill::strategy::Reconciliation> {
    let (client, url) = (app.client.clone(), app.url(&format!("/admin/sales/{sale}/reconcile")));
    tokio::spawn(async move {
        let response =
            client.post(url).bearer_auth(crate::support::ADMIN_TOKEN).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json::<seckill::strategy::Reconciliation>().await.unwrap()
    })
}
