//! The lock strategies' sold-out flags learn from Postgres, never from a
//! broadcast: an instance started after the sale sold out has no flag, so its
//! first buyer goes through the lock, reads the stock and is refused; and a
//! flag is trusted for `SOLD_OUT_TRUST` only, so a unit that comes back
//! unannounced is sold within that bound.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use seckill::strategy::lock::sold_out_epochs::SOLD_OUT_TRUST;

use super::harness::{spawn, unique_prefix};
use crate::support::assert_problem;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_after_the_sale_sold_out_refuses_and_sees_units_come_back() {
    for strategy in
        ["lock/local", "lock/setnx", "lock/token", "lock/watchdog", "lock/fenced", "lock/fair"]
    {
        let prefix = unique_prefix();
        let a = spawn(&prefix, 1000).await;
        let sale = a.sale(strategy, 1).await;
        assert_eq!(a.buy(sale, 1).await.status(), StatusCode::CREATED, "{strategy}");

        let b = spawn(&prefix, 1000).await;
        for user in 2..5 {
            assert_problem(b.buy(sale, user).await, StatusCode::CONFLICT, "sold-out").await;
        }

        // A unit comes back and nobody says so: B sells it once its flag
        // is no longer trusted.
        sqlx::query(
            "UPDATE sales SET total_stock = total_stock + 1, \
             remaining_stock = remaining_stock + 1 WHERE id = $1",
        )
        .bind(sale)
        .execute(&a.db)
        .await
        .unwrap();
        let returned = Instant::now();
        loop {
            match b.buy(sale, 5).await.status() {
                StatusCode::CREATED => break,
                StatusCode::CONFLICT => assert!(
                    returned.elapsed() < SOLD_OUT_TRUST + Duration::from_millis(500),
                    "{strategy}: still sold out {:?} after a unit came back",
                    returned.elapsed()
                ),
                other => panic!("{strategy}: {other}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let audit = a.audit(sale).await;
        assert_eq!((audit.units_sold, audit.remaining_stock, audit.oversold), (2, 0, 0));
    }
}
