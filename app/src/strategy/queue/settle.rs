//! Settling a batch of purchase requests in one Postgres transaction.
//!
//! For each sale of the batch (in sale-id order), inside one transaction:
//! 1. Lock the sale row (`SELECT … FOR UPDATE`). Everything below reads after
//!    the lock, so two consumers that overlap during a fail-over (the old one
//!    still committing, the new one already served the redelivery) settle one
//!    after the other and the second sees the first's results.
//! 2. Requests already settled (a redelivered message) keep their result.
//! 3. Duplicates: a buyer who already has an order for the sale, or a second
//!    request of one buyer in the batch, becomes `already_purchased` without
//!    taking a unit; a second message of one request id gets that request's
//!    result.
//! 4. The remaining requests are granted in arrival order while stock lasts
//!    (a request larger than what is left is `sold_out`; a smaller one after
//!    it may still be granted).
//! 5. One guarded `UPDATE … SET remaining_stock = remaining_stock − granted
//!    WHERE remaining_stock >= granted`, one multi-row order `INSERT`, one
//!    upsert of every request's result.
//!
//! Then commit; the caller acknowledges the messages only after that. With
//! `B` messages per batch the stock row is updated once per batch instead of
//! once per unit, which is what lifts the one-unit-per-transaction ceiling
//! (docs/queue.md gives the measured drain ceiling next to `sql_tps`). A sale's simulated work (`work_ms`) runs once per batch, while the
//! row is locked.

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use super::PurchaseMessage;
use crate::sale::Knobs;

/// The final result of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Placed {
        order_id: i64,
    },
    SoldOut,
    AlreadyPurchased,
    /// Dead-lettered, or its sale does not exist.
    Rejected,
}

impl Resolution {
    /// `purchase_requests.status`.
    pub fn status(self) -> &'static str {
        match self {
            Resolution::Placed { .. } => "placed",
            Resolution::SoldOut => "sold_out",
            Resolution::AlreadyPurchased => "already_purchased",
            Resolution::Rejected => "rejected",
        }
    }

    fn order_id(self) -> Option<i64> {
        match self {
            Resolution::Placed { order_id } => Some(order_id),
            _ => None,
        }
    }
}

/// What a settled batch did to one sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleAfter {
    pub sale_id: i64,
    /// Units left after the batch.
    pub remaining_stock: i64,
    /// Some request of the sale found no stock, or none is left.
    pub sold_out: bool,
}

/// The outcome of [`settle`]: one resolution per message, in input order,
/// and the state of each sale touched.
#[derive(Debug, Clone, Default)]
pub struct Settled {
    pub resolutions: Vec<Resolution>,
    pub sales: Vec<SaleAfter>,
}

#[derive(sqlx::FromRow)]
struct LockedSale {
    remaining_stock: i64,
    #[sqlx(flatten)]
    knobs: Knobs,
}

#[derive(sqlx::FromRow)]
struct KnownRequest {
    id: Uuid,
    user_id: i64,
    status: String,
    order_id: Option<i64>,
}

/// Settles `batch` (messages in arrival order) in one transaction, tagging
/// the rows with `batch_id` and the batch's size.
///
/// Errors: any Postgres error; the transaction is rolled back and nothing is
/// settled.
pub async fn settle(
    db: &PgPool,
    batch: &[PurchaseMessage],
    batch_id: i64,
) -> Result<Settled, sqlx::Error> {
    let mut resolutions: Vec<Option<Resolution>> = vec![None; batch.len()];
    let mut by_sale: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (i, message) in batch.iter().enumerate() {
        by_sale.entry(message.sale_id).or_default().push(i);
    }
    let mut tx = db.begin().await?;
    let mut sales = Vec::new();
    for (&sale_id, indices) in &by_sale {
        let after =
            settle_sale(&mut tx, sale_id, batch, indices, &mut resolutions, batch_id).await?;
        sales.extend(after);
    }
    tx.commit().await?;
    Ok(Settled {
        resolutions: resolutions.into_iter().map(|r| r.unwrap_or(Resolution::Rejected)).collect(),
        sales,
    })
}

async fn settle_sale(
    tx: &mut Transaction<'static, Postgres>,
    sale_id: i64,
    batch: &[PurchaseMessage],
    indices: &[usize],
    resolutions: &mut [Option<Resolution>],
    batch_id: i64,
) -> Result<Option<SaleAfter>, sqlx::Error> {
    let locked: Option<LockedSale> = sqlx::query_as(
        "SELECT remaining_stock, lock_lease_ms, work_ms, pause_ms, pause_ratio
         FROM sales WHERE id = $1 FOR UPDATE",
    )
    .bind(sale_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(locked) = locked else {
        // No such sale: nothing to grant, ever. Nothing to record either
        // (a request row needs its sale).
        for &i in indices {
            resolutions[i] = Some(Resolution::Rejected);
        }
        return Ok(None);
    };
    locked.knobs.simulate_work().await;

    let ids: Vec<Uuid> = indices.iter().map(|&i| batch[i].request_id).collect();
    let users: Vec<i64> = indices.iter().map(|&i| batch[i].user_id).collect();
    let known: Vec<KnownRequest> = sqlx::query_as(
        "SELECT id, user_id, status, order_id FROM purchase_requests
         WHERE sale_id = $1 AND (id = ANY($2) OR user_id = ANY($3))",
    )
    .bind(sale_id)
    .bind(&ids)
    .bind(&users)
    .fetch_all(&mut **tx)
    .await?;
    let ordered: HashSet<i64> =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE sale_id = $1 AND user_id = ANY($2)")
            .bind(sale_id)
            .bind(&users)
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .collect();
    let settled: HashMap<Uuid, Resolution> = known
        .iter()
        .filter_map(|row| resolution_of(&row.status, row.order_id).map(|r| (row.id, r)))
        .collect();
    // Buyer → the request id Postgres holds for them (one per buyer).
    let owner: HashMap<i64, Uuid> = known.iter().map(|row| (row.user_id, row.id)).collect();

    let mut left = locked.remaining_stock;
    let mut found_none_left = false;
    // First message of each request id in this batch, and buyers served.
    let mut first_of: HashMap<Uuid, usize> = HashMap::new();
    let mut buyers_in_batch: HashSet<i64> = HashSet::new();
    // (second message, first message) of one request id in this batch.
    let mut same_as = Vec::new();
    // Indices whose result this transaction records, and those granted.
    let mut record = Vec::new();
    let mut granted = Vec::new();
    for &i in indices {
        let message = &batch[i];
        if let Some(&first) = first_of.get(&message.request_id) {
            // Same request twice in one batch: decided with the first one.
            same_as.push((i, first));
            continue;
        }
        first_of.insert(message.request_id, i);
        if let Some(&done) = settled.get(&message.request_id) {
            resolutions[i] = Some(done);
            continue;
        }
        let other_request = owner.get(&message.user_id).is_some_and(|id| *id != message.request_id);
        if ordered.contains(&message.user_id)
            || other_request
            || !buyers_in_batch.insert(message.user_id)
        {
            resolutions[i] = Some(Resolution::AlreadyPurchased);
            if !other_request {
                record.push(i);
            }
            continue;
        }
        if i64::from(message.quantity) <= left && message.quantity >= 1 {
            left -= i64::from(message.quantity);
            granted.push(i);
        } else if message.quantity < 1 {
            // Let Postgres refuse it below, so that the batch fails and the
            // message is retried alone and dead-lettered: it can never be
            // settled.
            granted.push(i);
        } else {
            found_none_left = true;
            resolutions[i] = Some(Resolution::SoldOut);
            record.push(i);
        }
    }

    if !granted.is_empty() {
        let units: i64 = granted.iter().map(|&i| i64::from(batch[i].quantity)).sum();
        let updated = sqlx::query(
            "UPDATE sales SET remaining_stock = remaining_stock - $2
             WHERE id = $1 AND remaining_stock >= $2",
        )
        .bind(sale_id)
        .bind(units)
        .execute(&mut **tx)
        .await?;
        if updated.rows_affected() != 1 {
            // Cannot happen under the row lock; refuse the batch rather than
            // write orders the stock does not cover.
            return Err(sqlx::Error::Protocol(format!(
                "sale {sale_id}: the guarded update refused {units} units under the row lock"
            )));
        }
        let g_users: Vec<i64> = granted.iter().map(|&i| batch[i].user_id).collect();
        let g_quantities: Vec<i32> = granted.iter().map(|&i| batch[i].quantity).collect();
        let orders: Vec<(i64, i64)> = sqlx::query_as(
            "INSERT INTO orders (sale_id, user_id, quantity)
             SELECT $1, u, q FROM unnest($2::bigint[], $3::int[]) AS t(u, q)
             RETURNING user_id, id",
        )
        .bind(sale_id)
        .bind(&g_users)
        .bind(&g_quantities)
        .fetch_all(&mut **tx)
        .await?;
        let order_of: HashMap<i64, i64> = orders.into_iter().collect();
        for &i in &granted {
            let order_id = order_of[&batch[i].user_id];
            resolutions[i] = Some(Resolution::Placed { order_id });
            record.push(i);
        }
    }

    // Second messages of one request id take the first one's result.
    for (second, first) in same_as {
        resolutions[second] = resolutions[first];
    }

    if !record.is_empty() {
        record.sort_unstable();
        let r_ids: Vec<Uuid> = record.iter().map(|&i| batch[i].request_id).collect();
        let r_users: Vec<i64> = record.iter().map(|&i| batch[i].user_id).collect();
        let r_quantities: Vec<i32> = record.iter().map(|&i| batch[i].quantity).collect();
        let r_status: Vec<&str> =
            record.iter().map(|&i| resolutions[i].expect("decided").status()).collect();
        let r_orders: Vec<Option<i64>> =
            record.iter().map(|&i| resolutions[i].expect("decided").order_id()).collect();
        sqlx::query(
            "INSERT INTO purchase_requests
                 (id, sale_id, user_id, quantity, status, order_id, resolved_at, batch_id, batch_size)
             SELECT id, $1, u, q, s, o, clock_timestamp(), $7, $8
             FROM unnest($2::uuid[], $3::bigint[], $4::int[], $5::text[], $6::bigint[])
                  AS t(id, u, q, s, o)
             ON CONFLICT (id) DO UPDATE
             SET status = excluded.status, order_id = excluded.order_id,
                 resolved_at = excluded.resolved_at, batch_id = excluded.batch_id,
                 batch_size = excluded.batch_size
             WHERE purchase_requests.status = 'pending'",
        )
        .bind(sale_id)
        .bind(&r_ids)
        .bind(&r_users)
        .bind(&r_quantities)
        .bind(&r_status)
        .bind(&r_orders)
        .bind(batch_id)
        .bind(i32::try_from(batch.len()).unwrap_or(i32::MAX))
        .execute(&mut **tx)
        .await?;
    }
    Ok(Some(SaleAfter { sale_id, remaining_stock: left, sold_out: found_none_left || left == 0 }))
}

fn resolution_of(status: &str, order_id: Option<i64>) -> Option<Resolution> {
    match (status, order_id) {
        ("placed", Some(order_id)) => Some(Resolution::Placed { order_id }),
        ("sold_out", _) => Some(Resolution::SoldOut),
        ("already_purchased", _) => Some(Resolution::AlreadyPurchased),
        ("rejected", _) => Some(Resolution::Rejected),
        _ => None,
    }
}

/// Records `message` as `rejected` (it is being dead-lettered), unless it is
/// settled already. Best effort: errors are returned for logging only.
pub async fn mark_rejected(db: &PgPool, message: &PurchaseMessage) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO purchase_requests (id, sale_id, user_id, quantity, status, resolved_at, batch_size)
         SELECT $1, s.id, $3, greatest($4, 1), 'rejected', clock_timestamp(), 1
         FROM sales s WHERE s.id = $2
         ON CONFLICT (id) DO UPDATE SET status = 'rejected', resolved_at = excluded.resolved_at
         WHERE purchase_requests.status = 'pending'",
    )
    .bind(message.request_id)
    .bind(message.sale_id)
    .bind(message.user_id.max(0))
    .bind(message.quantity)
    .execute(db)
    .await?;
    Ok(())
}
