//! The ceiling of `sql/batched` without HTTP (the load test's
//! `sql_batched_units_per_s`): the strategy's own batch transaction
//! ([`super::settle::settle`]) driven directly against Postgres, at a given
//! batch size, by as many concurrent drivers as there are processes (each
//! process settles one batch of a sale at a time).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::settle::{self, Purchase};
use crate::outcome::Outcome;
use crate::sale::{Quantity, SaleId, UserId};

/// `drivers` concurrent tasks each settle batches of `batch_size` one-unit
/// purchases of `sale` by fresh buyers (ids from `first_user` on) for
/// `seconds`; returns units sold per second. The sale must have far more
/// stock than can sell in that time; its stock is really taken.
///
/// Errors: a batch failed, or a purchase was not placed (the sale ran out,
/// a buyer had an order already).
pub async fn units_per_s(
    db: &PgPool,
    sale: SaleId,
    first_user: i64,
    batch_size: usize,
    drivers: usize,
    seconds: f64,
) -> anyhow::Result<f64> {
    let next_user = Arc::new(AtomicI64::new(first_user));
    let sold = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..drivers.max(1) {
        let (db, next_user, sold) = (db.clone(), next_user.clone(), sold.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let first = next_user.fetch_add(batch_size as i64, Relaxed);
                let purchases = (first..first + batch_size as i64)
                    .map(|user| {
                        Ok(Purchase { user: UserId::parse(user)?, quantity: Quantity::ONE })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                for answer in settle::settle(&db, sale, &purchases).await? {
                    match answer? {
                        Outcome::Placed { .. } => sold.fetch_add(1, Relaxed),
                        other => anyhow::bail!("the ceiling sale answered {other:?}"),
                    };
                }
            }
            Ok(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    Ok(sold.load(Relaxed) as f64 / start.elapsed().as_secs_f64())
}
