//! `sql/buckets`: the sale's stock split over N rows (`sale_buckets`), so
//! that concurrent buyers take row locks on different rows instead of all
//! queueing on one — the other standard answer to a hot row, besides
//! batching (`sql/batched`).
//!
//! A sale is created with `buckets` (default [`DEFAULT_BUCKETS`]), and its
//! units are spread evenly over that many rows; the sale row keeps
//! `remaining_stock = 0` (migration `sale_buckets`). A purchase is one
//! statement, the `sql` statement aimed at a bucket: it picks a bucket with
//! enough units, starting at the buyer's home bucket (a hash of the user id)
//! and going round, takes the units from it under the guard
//! `remaining_stock >= q`, and inserts the order. A unique violation on
//! `orders_sale_user_key` aborts the statement and undoes the decrement, as
//! in `sql`: the constraint holds across buckets because it is on the orders.
//!
//! Picking the bucket is where the choice is: the first pass locks with
//! `FOR UPDATE SKIP LOCKED`, so a buyer whose home bucket is busy takes the
//! next free one instead of waiting. Skipping alone would strand units: a
//! buyer who finds every bucket with stock locked by others is not sold out.
//! So when the first pass finds nothing but its snapshot saw a bucket with
//! enough units, a second pass runs the same statement with a waiting
//! `FOR UPDATE`: it waits for the first such bucket, re-checks the guard on
//! the newest row version (READ COMMITTED), and moves on to the next when the
//! holder took the last units. `sold_out` therefore means that no bucket had
//! the units at some moment of the purchase, and the sale sells exactly its
//! stock whatever the demand. The alternative measured against it — a
//! waiting conditional `UPDATE` on the home bucket, then on each other
//! bucket in turn — needs up to N statements per refusal once buckets run
//! dry; docs/strategies.md gives the measurement.
//!
//! `GET /sales/{id}` and the audit read the sale row plus its buckets (the
//! view `sale_stock`); restocking spreads the units over the buckets
//! (`bucket_share`), in the same statement that raises `total_stock`.

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use sqlx::{PgExecutor, PgPool};

use super::{
    Backend, Outcome, Registration, Strategy, StrategyError, StrategyName, already_purchased_or,
};
use crate::sale::{InvalidInput, Quantity, Sale, UserId};

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("sql/buckets");

/// `sql/buckets` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the sql statement over N bucket rows of the stock: home bucket by user id, \
            SKIP LOCKED to the next, a waiting pass before sold out",
    needs: &[Backend::Postgres],
    build: |deps| Ok(Arc::new(SqlBuckets { db: deps.db.clone() })),
};

/// Buckets of a sale created without `buckets`: enough rows for the 2 × 10
/// pool connections of the default comparison to find a free one most of
/// the time, few enough that the sold-out pass stays short.
pub const DEFAULT_BUCKETS: i32 = 8;

/// Most buckets a sale may have (the `sales.buckets` check).
pub const MAX_BUCKETS: i32 = 1024;

/// `$1` sale id, `$2` user id, `$3` the home bucket, `$4` quantity; `{lock}`
/// is the locking clause of the pick. Returns one row: the order id (`NULL`
/// when no bucket was picked) and whether the statement's snapshot saw a
/// bucket with `$4` units left.
fn take_from_a_bucket(lock: &str) -> String {
    format!(
        "WITH pick AS (
             SELECT bucket FROM sale_buckets
             WHERE sale_id = $1 AND remaining_stock >= $4
             ORDER BY bucket < $3, bucket
             LIMIT 1
             {lock}
         ), taken AS (
             UPDATE sale_buckets b SET remaining_stock = b.remaining_stock - $4
             FROM pick
             WHERE b.sale_id = $1 AND b.bucket = pick.bucket AND b.remaining_stock >= $4
             RETURNING b.sale_id
         ), placed AS (
             INSERT INTO orders (sale_id, user_id, quantity)
             SELECT sale_id, $2, $4 FROM taken
             RETURNING id
         )
         SELECT (SELECT id FROM placed) AS order_id,
                EXISTS (SELECT 1 FROM sale_buckets WHERE sale_id = $1 AND remaining_stock >= $4)
                  AS units_seen"
    )
}

/// The first pass: skips buckets that other buyers hold.
static SKIPPING: LazyLock<String> = LazyLock::new(|| take_from_a_bucket("FOR UPDATE SKIP LOCKED"));

/// The second pass: waits for a bucket that others hold.
static WAITING: LazyLock<String> = LazyLock::new(|| take_from_a_bucket("FOR UPDATE"));

/// The buyer's home bucket among `buckets`: Fibonacci hashing of the user
/// id (Knuth, TAOCP vol. 3, 6.4), so that consecutive or patterned ids
/// spread evenly.
pub fn home_bucket(user: UserId, buckets: i32) -> i32 {
    let mixed = (user.get() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (mixed % buckets.max(1) as u64) as i32
}

pub struct SqlBuckets {
    db: PgPool,
}

/// One pass of the purchase on `executor`: `Ok(Ok(order id))`, or
/// `Ok(Err(units_seen))` when no bucket was picked.
async fn pass<'e>(
    executor: impl PgExecutor<'e>,
    statement: &'static str,
    sale: &Sale,
    user: UserId,
    quantity: Quantity,
) -> Result<Result<i64, bool>, sqlx::Error> {
    let home = home_bucket(user, sale.buckets.unwrap_or(DEFAULT_BUCKETS));
    let (order_id, units_seen): (Option<i64>, bool) =
        sqlx::query_as(sqlx::AssertSqlSafe(statement))
            .bind(sale.id.0)
            .bind(user.get())
            .bind(home)
            .bind(quantity.get())
            .fetch_one(executor)
            .await?;
    Ok(order_id.ok_or(units_seen))
}

impl SqlBuckets {
    /// Both passes on `conn` (a transaction when the sale simulates work).
    async fn take(
        conn: &mut sqlx::PgConnection,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let first = pass(&mut *conn, SKIPPING.as_str(), sale, user, quantity).await;
        let taken = match first {
            Ok(Err(true)) => pass(&mut *conn, WAITING.as_str(), sale, user, quantity).await,
            first => first,
        };
        match taken {
            Ok(Ok(order_id)) => Ok(Outcome::Placed { order_id, quantity: quantity.get() }),
            Ok(Err(_)) => Ok(Outcome::SoldOut),
            Err(err) => already_purchased_or(err),
        }
    }
}

#[async_trait]
impl Strategy for SqlBuckets {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        if !sale.knobs.simulates_work() {
            let mut conn = self.db.acquire().await?;
            return Self::take(&mut conn, sale, user, quantity).await;
        }
        let mut tx = self.db.begin().await?;
        let outcome = Self::take(&mut tx, sale, user, quantity).await?;
        if let Outcome::Placed { .. } = outcome {
            sale.knobs.simulate_work().await;
            tx.commit().await?;
        }
        Ok(outcome)
    }

    /// [`DEFAULT_BUCKETS`] when absent; `1..=MAX_BUCKETS`.
    fn buckets(&self, requested: Option<i32>) -> Result<Option<i32>, InvalidInput> {
        bucket_count(requested).map(Some)
    }
}

/// The buckets of a new sale: `requested`, or [`DEFAULT_BUCKETS`] when
/// absent. Errors: outside `1..=MAX_BUCKETS`.
fn bucket_count(requested: Option<i32>) -> Result<i32, InvalidInput> {
    let buckets = requested.unwrap_or(DEFAULT_BUCKETS);
    if !(1..=MAX_BUCKETS).contains(&buckets) {
        return Err(InvalidInput::new("buckets", format!("must be between 1 and {MAX_BUCKETS}")));
    }
    Ok(buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_buckets_spread_consecutive_users_evenly() {
        for buckets in [1, 3, 8, 1024] {
            let mut count = vec![0; buckets as usize];
            let users = 1000 * buckets as i64;
            for user in 1..=users {
                let home = home_bucket(UserId::parse(user).unwrap(), buckets);
                assert!((0..buckets).contains(&home));
                count[home as usize] += 1;
            }
            let (least, most) = (count.iter().min().unwrap(), count.iter().max().unwrap());
            assert!(*least >= 900 && *most <= 1100, "{buckets} buckets: {least}..{most}");
        }
    }

    #[test]
    fn a_sale_gets_eight_buckets_by_default_and_at_most_the_maximum() {
        assert_eq!(bucket_count(None).unwrap(), DEFAULT_BUCKETS);
        assert_eq!(bucket_count(Some(1)).unwrap(), 1);
        assert_eq!(bucket_count(Some(MAX_BUCKETS)).unwrap(), MAX_BUCKETS);
        for refused in [0, -1, MAX_BUCKETS + 1] {
            assert_eq!(bucket_count(Some(refused)).unwrap_err().field, "buckets");
        }
    }
}
