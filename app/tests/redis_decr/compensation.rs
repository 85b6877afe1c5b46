//! The Lua scripts on their own: compensation is idempotent and keyed by the
//! reservation's id, warming never resets a running counter, a closed
//! correction gate refuses reservations, a restock raises only a running
//! counter and is broadcast.

use seckill::backends::RedisHandle;
use seckill::sale::{Quantity, SaleId, UserId};
use seckill::strategy::redis_decr::counter::{Buyer, ReservationId, Reserve, SaleCounter};

use super::{RedisView, SHARED_REDIS, unique_prefix};

/// A sale id for script-level tests: nothing in Postgres refers to it, and
/// the unique prefix keeps its keys apart.
const SALE: i64 = 1;
/// Its made-up `created_at`, microseconds.
const ORIGIN: i64 = 1_700_000_000_000_000;

async fn warmed_counter(prefix: &str, units: i64) -> RedisView {
    warmed_counter_on(&SHARED_REDIS, prefix, units).await
}

async fn warmed_counter_on(url: &str, prefix: &str, units: i64) -> RedisView {
    let mut view = RedisView::new(url, prefix, SALE).await;
    let (created, counter) = view.counter.warm(&mut view.conn, units, ORIGIN).await.unwrap();
    assert_eq!((created, counter), (true, units));
    view
}

#[tokio::test]
async fn the_compensation_script_run_twice_returns_the_units_once() {
    the_compensation_script_run_twice_returns_the_units_once_on(&SHARED_REDIS).await;
}

/// The body of the test of that name on the Redis at `url` (one node or a cluster).
pub async fn the_compensation_script_run_twice_returns_the_units_once_on(url: &str) {
    let prefix = unique_prefix();
    let mut view = warmed_counter_on(url, &prefix, 5).await;
    let user = UserId::parse(9).unwrap();
    let two = Quantity::parse(2, 2).unwrap();
    let Reserve::Reserved { id, left } =
        view.counter.reserve(&mut view.conn, user, two, ReservationId::random()).await.unwrap()
    else {
        panic!("a unit is available");
    };
    assert_eq!(left, 3);

    // Two compensations at once (say, the purchase path and a reconciler).
    let (mut first, mut second) = (view.conn.clone(), view.conn.clone());
    let (a, b) = tokio::join!(
        view.counter.compensate(&mut first, &id, Buyer::Release),
        view.counter.compensate(&mut second, &id, Buyer::Release),
    );
    let mut returned = [a.unwrap(), b.unwrap()];
    returned.sort();
    assert_eq!(returned, [0, 2], "exactly one of them returns the two units");
    // And once more, later (a retry after a timeout).
    assert_eq!(view.counter.compensate(&mut view.conn, &id, Buyer::Release).await.unwrap(), 0);

    assert_eq!(view.stock().await, Some(5));
    assert_eq!(view.open_reservations().await, 0);
    assert!(!view.is_buyer(9).await);
}

#[tokio::test]
async fn a_compensation_of_an_unknown_reservation_returns_nothing() {
    let prefix = unique_prefix();
    let mut view = warmed_counter(&prefix, 1).await;
    let stranger = ReservationId::random();
    assert_eq!(
        view.counter.compensate(&mut view.conn, &stranger, Buyer::Release).await.unwrap(),
        0
    );
    assert_eq!(view.stock().await, Some(1));
}

#[tokio::test]
async fn warming_never_resets_a_running_counter() {
    let prefix = unique_prefix();
    let mut view = warmed_counter(&prefix, 5).await;
    let user = UserId::parse(1).unwrap();
    let reserved =
        view.counter.reserve(&mut view.conn, user, Quantity::ONE, ReservationId::random()).await;
    assert!(matches!(reserved.unwrap(), Reserve::Reserved { left: 4, .. }));

    // A second instance (or a restarted one) warms the same sale from a
    // stale reading of Postgres: the running counter is left alone.
    let other = RedisHandle::new(&SHARED_REDIS, prefix.as_str()).unwrap();
    let mut conn = other.conn().await.unwrap();
    let counter = SaleCounter::new(&other, SaleId(SALE));
    assert_eq!(counter.warm(&mut conn, 5, ORIGIN).await.unwrap(), (false, 4));
    assert_eq!(view.stock().await, Some(4));
}

#[tokio::test]
async fn reservations_below_zero_are_undone_and_answered_sold_out() {
    let prefix = unique_prefix();
    let mut view = warmed_counter(&prefix, 1).await;
    let three = Quantity::parse(3, 3).unwrap();
    let user = UserId::parse(4).unwrap();
    let answer =
        view.counter.reserve(&mut view.conn, user, three, ReservationId::random()).await.unwrap();
    assert_eq!(answer, Reserve::SoldOut { left: 1 });
    assert_eq!(view.stock().await, Some(1), "the counter never stays below zero");
    assert!(!view.is_buyer(4).await);
}

#[tokio::test]
async fn each_reservation_is_compensated_by_its_own_id_alone() {
    let prefix = unique_prefix();
    let mut view = warmed_counter(&prefix, 5).await;
    let (first, second) = (ReservationId::random(), ReservationId::random());
    let two = Quantity::parse(2, 2).unwrap();
    for (user, id) in [(1, &first), (2, &second)] {
        let user = UserId::parse(user).unwrap();
        let answer = view.counter.reserve(&mut view.conn, user, two, id.clone()).await.unwrap();
        assert!(matches!(answer, Reserve::Reserved { .. }), "{answer:?}");
    }
    assert_eq!(view.stock().await, Some(1));

    assert_eq!(view.counter.compensate(&mut view.conn, &first, Buyer::Release).await.unwrap(), 2);
    let snapshot = view.counter.snapshot(&mut view.conn).await.unwrap();
    let open: Vec<_> = snapshot.reservations.iter().map(|r| (&r.id, r.user, r.quantity)).collect();
    assert_eq!(open, [(&second, 2, 2)], "the other reservation is still open, under its id");
    assert_eq!(view.stock().await, Some(3));
    assert!(!view.is_buyer(1).await);
    assert!(view.is_buyer(2).await);
}

#[tokio::test]
async fn a_closed_gate_refuses_reservations_until_it_opens() {
    let prefix = unique_prefix();
    let mut view = warmed_counter(&prefix, 3).await;
    let hold = std::time::Duration::from_secs(30);
    assert!(view.counter.close_gate(&mut view.conn, "reconciler", hold).await.unwrap());
    let user = UserId::parse(1).unwrap();
    let gated =
        view.counter.reserve(&mut view.conn, user, Quantity::ONE, ReservationId::random()).await;
    assert_eq!(gated.unwrap(), Reserve::Gated);
    assert_eq!(view.stock().await, Some(3), "nothing taken behind the gate");

    view.counter.open_gate(&mut view.conn, "reconciler").await.unwrap();
    let answer =
        view.counter.reserve(&mut view.conn, user, Quantity::ONE, ReservationId::random()).await;
    assert!(matches!(answer.unwrap(), Reserve::Reserved { left: 2, .. }));
}

/// A restock raises a running counter and says so on
/// `{prefix}:redis-decr:stock-returned` (the sale id), where every instance
/// of this prefix listens; without a counter it does nothing.
#[tokio::test]
async fn a_restock_raises_a_running_counter_and_is_broadcast_on_the_prefixs_channel() {
    use futures_util::StreamExt;

    let prefix = unique_prefix();
    let client = redis::Client::open(SHARED_REDIS.as_str()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(format!("{prefix}:redis-decr:stock-returned")).await.unwrap();
    let mut cold = RedisView::new(&SHARED_REDIS, &prefix, SALE + 1).await;
    assert!(!cold.counter.restock(&mut cold.conn, 2).await.unwrap(), "no counter: nothing");
    assert_eq!(cold.stock().await, None);

    let mut view = warmed_counter(&prefix, 1).await;
    assert!(view.counter.restock(&mut view.conn, 2).await.unwrap());
    assert_eq!(view.stock().await, Some(3));
    let mut messages = pubsub.on_message();
    let told = tokio::time::timeout(std::time::Duration::from_secs(5), messages.next()).await;
    let payload: String = told.expect("told within 5 s").unwrap().get_payload().unwrap();
    assert_eq!(payload, SALE.to_string());
}
