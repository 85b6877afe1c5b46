//! `sql/buckets`: the sale's stock split over N rows (`sale_buckets`), so
//! that concurrent buyers take row locks on different rows instead of all
//! queueing on one — the other standard answer to a hot row, besides
//! batching (`sql/batched`).
//!
//! A sale is created with `buckets` (default [`DEFAULT_BUCKETS`]), and its
//! units are spread evenly over that many rows; the sale row keeps
//! `remaining_stock = 0` (migration `sale_buckets`). A buyer's home bucket
//! is a hash of the user id. A purchase is the `sql` statement aimed at the
//! home bucket ([`HOME`]): a conditional `UPDATE … WHERE remaining_stock >=
//! q` of that row chained to the order insert. A unique violation on
//! `orders_sale_user_key` aborts the statement and undoes the decrement, as
//! in `sql`: the constraint holds across buckets because it is on the
//! orders.
//!
//! When the home bucket has too few units, every statement reports what its
//! snapshot saw in the buckets (the fullest one's units and all of theirs),
//! and [`next_step`] picks the next statement from that:
//!
//! - a bucket had the `q` units: [`ELSEWHERE`] picks the first such bucket
//!   after the home one, going round, and takes the units with the same
//!   guarded update: it waits for that row's lock and re-checks the guard on
//!   the newest row version (READ COMMITTED). It holds one bucket's lock at
//!   most. (A `FOR UPDATE` pick that skips a bucket emptied under it would
//!   keep that bucket locked while it waits for the next: two such purchases
//!   deadlock, as the first version of this strategy did under the
//!   two-instance test.)
//! - only the buckets together had them (the units left spread one or two
//!   per bucket, as at the end of every sale): [`SPREAD`] takes them from
//!   several buckets in one statement, all or nothing. It locks the buckets
//!   it needs in bucket order — the one order every purchase locks several
//!   buckets in, while the single-bucket statements wait for one lock holding
//!   none — so purchases cannot deadlock on buckets.
//! - the buckets together had fewer than `q`: `sold_out`.
//!
//! If other purchases took the units meanwhile, the statement takes nothing
//! and the next step comes from its own, newer snapshot; each such retry
//! follows another purchase's units, and a purchase that keeps losing them is
//! answered `busy` after `2 × buckets` statements. So `sold_out` means that
//! the sale had fewer than `q` units in all when the last statement looked:
//! no unit is stranded, whatever the quantities, and the sale sells exactly
//! its stock whatever the demand. A one-unit purchase never needs
//! [`SPREAD`], and a purchase that one bucket can fill touches one row.
//!
//! Measured against the alternatives with pgbench (20 clients, 8 buckets,
//! docs/hot-row.md): a first pass with `FOR UPDATE SKIP LOCKED` (take any
//! free bucket, wait only when all are busy) sold no faster, because with
//! more buyers than buckets every bucket is busy and most purchases paid a
//! second pass, and it refused slower; a waiting conditional `UPDATE` of
//! each bucket in turn sold as fast but refused six to eight times slower
//! (one statement per bucket). The home bucket first, the others only when
//! it is dry, costs one statement per sale and one per refusal.
//!
//! `GET /sales/{id}` and the audit read the sale row plus its buckets (the
//! view `sale_stock`); restocking spreads the units over the buckets
//! (`bucket_share`), in the same statement that raises `total_stock`.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Connection, PgPool, Row};

use super::serial::Marks;
use super::{
    Backend, Claim, Outcome, Registration, Returned, Strategy, StrategyError, StrategyName,
    already_purchased_or,
};
use crate::sale::{InvalidInput, Quantity, Sale, UserId};

/// Wire name, and the `strategy` label of this strategy's metrics.
pub const NAME: StrategyName = StrategyName::declare("sql/buckets");

/// `sql/buckets` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the stock over N bucket rows: the sql statement on the buyer's home bucket, \
            then on the next bucket with the units, else on several buckets at once",
    needs: &[Backend::Postgres],
    build: |deps| Ok(Arc::new(SqlBuckets { db: deps.db.clone() })),
    // Expected correct everywhere (the default): the `sql` statement on one
    // of N bucket rows; a purchase that finds every bucket with stock locked
    // waits for one before it is sold out, so no unit is stranded.
    // Its units spread over several rows, each as fast as `sql_tps`.
    ceiling: super::Ceiling::Unbounded,
    ..Registration::DEFAULTS
};

/// Buckets of a sale created without `buckets`: 8 row locks where `sql` has
/// one; a sale that wants more asks for them, up to [`MAX_BUCKETS`].
pub const DEFAULT_BUCKETS: i32 = 8;

/// Most buckets a sale may have (the `sales.buckets` check).
pub const MAX_BUCKETS: i32 = 1024;

/// The end of every purchase statement ([`HOME`], [`ELSEWHERE`],
/// [`SPREAD`]), whose data-modifying steps end in `placed`: one row, the
/// order id, or `NULL` when none was placed; and then, only when none was,
/// the units of the fullest bucket and of all the buckets in the statement's
/// snapshot (what [`next_step`] decides from); then the bucket row's serial
/// marks and when the statement began (`super::serial::Marks`), `NULL` for
/// a statement that takes several rows.
macro_rules! order_or_units_seen {
    ($held_before:literal, $units_before:literal, $held_at:literal) => {
        concat!(
            "
SELECT (SELECT id FROM placed) AS order_id, seen.most, seen.total,
       ",
            $held_before,
            " AS held_before, ",
            $units_before,
            " AS units_before, ",
            $held_at,
            " AS held_at, statement_timestamp() AS began_at
FROM (SELECT max(remaining_stock) AS most, sum(remaining_stock)::bigint AS total
      FROM sale_buckets
      WHERE sale_id = $1 AND NOT EXISTS (SELECT 1 FROM placed)) seen"
        )
    };
}

/// `$1` sale id, `$2` user id, `$3` the home bucket, `$4` quantity. The
/// `sql` statement on the home bucket: takes `$4` units if it has them.
/// Returns the row of `order_or_units_seen!`.
pub const HOME: &str = concat!(
    "\
WITH taken AS (
    UPDATE sale_buckets SET remaining_stock = remaining_stock - $4,
                            held_before = held_at, held_at = clock_timestamp(),
                            held_units_before = held_units, held_units = $4
    WHERE sale_id = $1 AND bucket = $3 AND remaining_stock >= $4
    RETURNING sale_id, held_before, held_units_before, held_at
), placed AS (
    INSERT INTO orders (sale_id, user_id, quantity)
    SELECT sale_id, $2, $4 FROM taken
    RETURNING id
)",
    order_or_units_seen!(
        "(SELECT held_before FROM taken)",
        "(SELECT held_units_before FROM taken)",
        "(SELECT held_at FROM taken)"
    )
);

/// The same parameters. Picks the first bucket after the home one, going
/// round, that has `$4` units in the statement's snapshot, and takes them
/// with the guarded `UPDATE` (which waits for that one row lock and re-checks
/// the guard on the newest row version). Returns the row of
/// `order_or_units_seen!`.
pub const ELSEWHERE: &str = concat!(
    "\
WITH pick AS (
    SELECT bucket FROM sale_buckets
    WHERE sale_id = $1 AND remaining_stock >= $4
    ORDER BY bucket < $3, bucket
    LIMIT 1
), taken AS (
    UPDATE sale_buckets b SET remaining_stock = b.remaining_stock - $4,
                              held_before = b.held_at, held_at = clock_timestamp(),
                              held_units_before = b.held_units, held_units = $4
    FROM pick
    WHERE b.sale_id = $1 AND b.bucket = pick.bucket AND b.remaining_stock >= $4
    RETURNING b.sale_id, b.held_before, b.held_units_before, b.held_at
), placed AS (
    INSERT INTO orders (sale_id, user_id, quantity)
    SELECT sale_id, $2, $4 FROM taken
    RETURNING id
)",
    order_or_units_seen!(
        "(SELECT held_before FROM taken)",
        "(SELECT held_units_before FROM taken)",
        "(SELECT held_at FROM taken)"
    )
);

/// The same parameters, for `$4` units that no single bucket has. `chosen`:
/// the buckets with units in the statement's snapshot, from the home one
/// going round, as far as the first whose units make `$4`. `locked`: those
/// rows locked in bucket order — every purchase locks its buckets in that
/// one order, so no two wait for each other — and read at their newest
/// version (`FOR UPDATE` in READ COMMITTED; a row emptied meanwhile drops
/// out). Only if the locked rows hold `$4` units together are the units
/// taken, from each in the same going-round order, and the order inserted
/// (after the updates, which it reads): all or nothing. Returns
/// `order_or_units_seen!`'s row.
pub const SPREAD: &str = concat!(
    "\
WITH chosen AS (
    SELECT bucket FROM (
        SELECT bucket,
               (sum(remaining_stock) OVER (ORDER BY bucket < $3, bucket))::bigint
                 - remaining_stock AS before
        FROM sale_buckets
        WHERE sale_id = $1 AND remaining_stock > 0
    ) going_round
    WHERE before < $4
), locked AS (
    SELECT bucket, remaining_stock FROM sale_buckets
    WHERE sale_id = $1 AND bucket IN (SELECT bucket FROM chosen) AND remaining_stock > 0
    ORDER BY bucket
    FOR UPDATE
), plan AS (
    SELECT bucket,
           least(remaining_stock,
                 $4 - ((sum(remaining_stock) OVER (ORDER BY bucket < $3, bucket))::bigint
                       - remaining_stock)) AS units
    FROM locked
    WHERE (SELECT sum(remaining_stock) FROM locked) >= $4
), taken AS (
    UPDATE sale_buckets b SET remaining_stock = b.remaining_stock - plan.units
    FROM plan
    WHERE b.sale_id = $1 AND b.bucket = plan.bucket AND plan.units > 0
    RETURNING plan.units
), placed AS (
    INSERT INTO orders (sale_id, user_id, quantity)
    SELECT $1, $2, $4 WHERE (SELECT sum(units) FROM taken) = $4
    RETURNING id
)",
    order_or_units_seen!("NULL::timestamptz", "NULL::integer", "NULL::timestamptz")
);

/// A purchase statement: [`HOME`], [`ELSEWHERE`] or [`SPREAD`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Home,
    Elsewhere,
    Spread,
}

impl Step {
    fn statement(self) -> &'static str {
        match self {
            Step::Home => HOME,
            Step::Elsewhere => ELSEWHERE,
            Step::Spread => SPREAD,
        }
    }
}

/// The units a statement that placed no order saw in the sale's buckets
/// (its snapshot): the fullest bucket's and all of them together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    most: i64,
    total: i64,
}

/// The step after a statement that placed no order of `quantity` units:
/// [`Step::Elsewhere`] when its snapshot had a bucket with the units,
/// [`Step::Spread`] when only the buckets together had them, and `None` —
/// sold out — when the sale had fewer than `quantity` units in all.
fn next_step(quantity: i64, seen: Seen) -> Option<Step> {
    if seen.most >= quantity {
        Some(Step::Elsewhere)
    } else if seen.total >= quantity {
        Some(Step::Spread)
    } else {
        None
    }
}

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

/// `step`'s statement for one purchase from bucket `home`: the order id if
/// one was placed (the bucket's serial hold recorded, `super::serial`),
/// else what the statement's snapshot saw. When the sale simulates work,
/// the statement runs in a transaction of its own that does the work and
/// commits if it placed the order, and otherwise ends at once: a guarded
/// update (or `FOR UPDATE`) that waited for a row and found it emptied keeps
/// that row locked until its transaction ends, and a purchase that carried
/// such locks into its next statement would lock buckets out of order.
async fn attempt(
    conn: &mut sqlx::PgConnection,
    step: Step,
    sale: &Sale,
    user: UserId,
    home: i32,
    quantity: Quantity,
) -> Result<Result<i64, Seen>, sqlx::Error> {
    let lanes = sale.buckets.unwrap_or(DEFAULT_BUCKETS);
    if !sale.knobs.simulates_work() {
        let result = run(conn, step, sale, user, home, quantity).await?;
        if let Ok((_, Some(marks))) = result {
            marks.record(NAME, lanes);
        }
        return Ok(result.map(|(order_id, _)| order_id));
    }
    let mut tx = conn.begin().await?;
    let result = run(&mut tx, step, sale, user, home, quantity).await?;
    if let Ok((_, marks)) = result {
        sale.knobs.simulate_work().await;
        tx.commit().await?;
        if let Some(marks) = marks {
            marks.record(NAME, lanes);
        }
    }
    Ok(result.map(|(order_id, _)| order_id))
}

/// [`attempt`]'s statement on `conn`: the order id and the bucket row's
/// serial marks (none for a statement over several rows), or what the
/// snapshot saw.
async fn run(
    conn: &mut sqlx::PgConnection,
    step: Step,
    sale: &Sale,
    user: UserId,
    home: i32,
    quantity: Quantity,
) -> Result<Result<(i64, Option<Marks>), Seen>, sqlx::Error> {
    let row = sqlx::query(step.statement())
        .bind(sale.id.0)
        .bind(user.get())
        .bind(home)
        .bind(quantity.get())
        .fetch_one(conn)
        .await?;
    let marks = row.get::<Option<DateTime<Utc>>, _>(5).map(|held_at| Marks {
        held_before: row.get(3),
        units_before: row.get(4),
        held_at,
        began_at: row.get(6),
    });
    Ok(match row.get::<Option<i64>, _>(0) {
        Some(order_id) => Ok((order_id, marks)),
        None => Err(Seen {
            most: row.get::<Option<i64>, _>(1).unwrap_or(0),
            total: row.get::<Option<i64>, _>(2).unwrap_or(0),
        }),
    })
}

#[async_trait]
impl Strategy for SqlBuckets {
    /// The home bucket, then whatever [`next_step`] says while the sale has
    /// the units.
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let mut conn = self.db.acquire().await?;
        let buckets = sale.buckets.unwrap_or(DEFAULT_BUCKETS);
        let home = home_bucket(user, buckets);
        let mut step = Step::Home;
        // Each further statement follows units that another purchase took
        // while this one waited for them.
        for _ in 0..=2 * buckets {
            match attempt(&mut conn, step, sale, user, home, quantity).await {
                Ok(Ok(order_id)) => {
                    return Ok(Outcome::Placed { order_id, quantity: quantity.get() });
                }
                Ok(Err(seen)) => match next_step(i64::from(quantity.get()), seen) {
                    Some(next) => step = next,
                    None => return Ok(Outcome::SoldOut),
                },
                Err(err) => return already_purchased_or(err),
            }
        }
        Err(StrategyError::Busy {
            reason: "the buckets kept running dry under this purchase",
            retry_after: std::time::Duration::from_millis(100),
        })
    }

    /// [`DEFAULT_BUCKETS`] when absent; `1..=MAX_BUCKETS`.
    fn buckets(&self, requested: Option<i32>) -> Result<Option<i32>, InvalidInput> {
        bucket_count(requested).map(Some)
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go back to the home bucket of the claim's first buyer
    /// (relative update, in the claim's transaction; the sweep's claims of
    /// several orders too, so that a return locks one bucket row), where that
    /// buyer's next purchase looks first; any buyer whose home is dry finds
    /// them through the [`ELSEWHERE`] or [`SPREAD`] step.
    async fn return_units(&self, sale: &Sale, claim: Claim) -> Result<Returned, StrategyError> {
        let mut claim = claim;
        let home = home_bucket(claim.orders()[0].user, sale.buckets.unwrap_or(DEFAULT_BUCKETS));
        let updated = sqlx::query(RETURN_TO_BUCKET)
            .bind(sale.id.0)
            .bind(home)
            .bind(claim.units())
            .execute(claim.conn())
            .await?
            .rows_affected();
        if updated != 1 {
            // Dropping the claim rolls back: the order stays pending.
            return Err(StrategyError::Internal(anyhow::anyhow!(
                "sale {} has no bucket {home} to return units to",
                sale.id.0
            )));
        }
        claim.end().await
    }
}

/// `$1` sale id, `$2` bucket, `$3` units: an ended order's units back in a
/// bucket.
const RETURN_TO_BUCKET: &str = "\
UPDATE sale_buckets SET remaining_stock = remaining_stock + $3
WHERE sale_id = $1 AND bucket = $2";

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
    fn a_purchase_goes_to_a_bucket_with_the_units_else_to_several_else_is_sold_out() {
        let seen = |most, total| Seen { most, total };
        assert_eq!(next_step(1, seen(1, 1)), Some(Step::Elsewhere));
        assert_eq!(next_step(2, seen(5, 9)), Some(Step::Elsewhere));
        assert_eq!(next_step(3, seen(3, 3)), Some(Step::Elsewhere));
        assert_eq!(next_step(3, seen(1, 3)), Some(Step::Spread));
        assert_eq!(next_step(4, seen(2, 17)), Some(Step::Spread));
        assert_eq!(next_step(3, seen(1, 2)), None);
        assert_eq!(next_step(3, seen(2, 2)), None);
        assert_eq!(next_step(1, seen(0, 0)), None);
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
