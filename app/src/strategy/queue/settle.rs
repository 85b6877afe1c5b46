//! Settling a batch of purchase requests in one Postgres transaction.
//!
//! For each sale of the batch (in sale-id order), inside one transaction:
//! 1. Lock the sale row (`SELECT … FOR UPDATE`). Everything below reads after
//!    the lock, so two consumers that overlap during a fail-over (the old one
//!    still committing, the new one already served the redelivery) settle one
//!    after the other and the second sees the first's results.
//! 2. Requests already settled (a redelivered message) keep their result.
//!    Then what the purchase path would have refused is refused again, from
//!    the locked row, since the broker is not trusted to carry only what an
//!    instance published ([`Rules`]): a quantity above the sale's
//!    `per_user_limit`, a request outside the sale's window, a message whose
//!    request id is registered for another buyer. Each becomes
//!    `rejected` with its reason, taking nothing.
//! 3. Duplicates: a buyer who already has an order for the sale, or a second
//!    request of one buyer in the batch, becomes `already_purchased` without
//!    taking a unit; a second message of one request id gets that request's
//!    result.
//! 4. The remaining requests are granted in arrival order while stock lasts
//!    (a request larger than what is left is `sold_out`; a smaller one after
//!    it may still be granted).
//! 5. One guarded `UPDATE … SET remaining_stock = remaining_stock − granted
//!    WHERE remaining_stock >= granted` with one multi-row order `INSERT`
//!    (one statement), then one upsert of every request's result.
//!
//! Steps 1 and 5 and the read of the buyers' orders are those every batch
//! of purchases shares (`crate::strategy::batch`, also used by
//! `sql/batched`); the request ids, redeliveries and result rows are the
//! queue's own.
//!
//! Then commit; the caller acknowledges the messages only after that. With
//! `B` messages per batch the stock row is updated once per batch instead of
//! once per unit, which is what lifts the one-unit-per-transaction ceiling
//! (docs/queue.md gives the measured drain ceiling next to `sql_tps`). A sale's simulated work (`work_ms`) runs once per batch, while the
//! row is locked.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use super::PurchaseMessage;
use crate::strategy::{batch, serial};

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
    /// Refused by the consumer's own checks ([`Rules`]); stored as
    /// `rejected` with the refusal's reason.
    Refused(Refusal),
}

/// Why the consumer refuses a message whatever the stock (see [`Rules`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// More units than the sale's `per_user_limit`.
    OverLimit,
    /// Accepted before the sale's `starts_at` or at or after its `ends_at`.
    OutsideWindow,
    /// Its request id is registered for another buyer.
    NotAsRegistered,
}

impl Refusal {
    /// `purchase_requests.rejection_reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::OverLimit => {
                "refused by the consumer: quantity above the sale's per_user_limit"
            }
            Refusal::OutsideWindow => "refused by the consumer: outside the sale's window",
            Refusal::NotAsRegistered => {
                "refused by the consumer: the request id is registered for another buyer"
            }
        }
    }
}

/// What the consumer re-checks of each message before it may take stock,
/// read from the locked sale row: the checks of the purchase path
/// (`crate::purchase`), which a message published to the queue by anyone
/// but an instance never passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    pub per_user_limit: i32,
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
    /// The consumer's clock, for a message whose request is not registered.
    pub now: DateTime<Utc>,
}

impl Rules {
    /// Rules that refuse nothing (for tests of the allocation alone).
    pub fn open() -> Rules {
        Rules { per_user_limit: i32::MAX, starts_at: None, ends_at: None, now: Utc::now() }
    }

    /// Why `message` is refused, if it is. The window is checked at the time
    /// the instance accepted the request (`registered`'s `accepted_at`, set
    /// by Postgres), so that a request accepted just before the end and
    /// settled after it stands; a message without a registered request is
    /// checked at [`Rules::now`]. A quantity below 1 is left to Postgres
    /// (see [`allocate`]).
    pub fn refusal(
        &self,
        message: &PurchaseMessage,
        registered: Option<&Registration>,
    ) -> Option<Refusal> {
        // The quantity may differ: a buyer who resubmits a pending request
        // publishes it again with the quantity of the resubmission.
        if registered.is_some_and(|row| row.user_id != message.user_id) {
            return Some(Refusal::NotAsRegistered);
        }
        if message.quantity > self.per_user_limit {
            return Some(Refusal::OverLimit);
        }
        let at = registered.map_or(self.now, |row| row.accepted_at);
        let early = self.starts_at.is_some_and(|starts| at < starts);
        let late = self.ends_at.is_some_and(|ends| at >= ends);
        (early || late).then_some(Refusal::OutsideWindow)
    }
}

/// A request row as its instance registered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub user_id: i64,
    /// When the instance accepted the request (Postgres' clock).
    pub accepted_at: DateTime<Utc>,
}

impl Resolution {
    /// `purchase_requests.status`.
    pub fn status(self) -> &'static str {
        match self {
            Resolution::Placed { .. } => "placed",
            Resolution::SoldOut => "sold_out",
            Resolution::AlreadyPurchased => "already_purchased",
            Resolution::Rejected | Resolution::Refused(_) => "rejected",
        }
    }

    /// `purchase_requests.rejection_reason` written with the result.
    fn reason(self) -> Option<&'static str> {
        match self {
            Resolution::Refused(refusal) => Some(refusal.reason()),
            _ => None,
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
    /// No unit of the sale is left ([`Allocation::sold_out`]).
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
struct KnownRequest {
    id: Uuid,
    sale_id: i64,
    user_id: i64,
    status: String,
    order_id: Option<i64>,
    accepted_at: DateTime<Utc>,
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
    // The partition's one active consumer settles its batches one after the
    // other: the whole transaction is the serial hold.
    let hold = serial::Hold::start(super::NAME);
    let mut sales = Vec::new();
    for (&sale_id, indices) in &by_sale {
        let after =
            settle_sale(&mut tx, sale_id, batch, indices, &mut resolutions, batch_id).await?;
        sales.extend(after);
    }
    tx.commit().await?;
    let placed = batch.iter().zip(&resolutions).filter_map(|(message, resolution)| {
        matches!(resolution, Some(Resolution::Placed { .. })).then_some(message.quantity as u64)
    });
    hold.end(placed.sum());
    Ok(Settled {
        resolutions: resolutions.into_iter().map(|r| r.unwrap_or(Resolution::Rejected)).collect(),
        sales,
    })
}

/// What Postgres already knows about the requests and buyers of one sale's
/// messages, read under the sale's row lock.
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// Requests settled by an earlier batch (their messages are redeliveries),
    /// by request id.
    pub settled: HashMap<Uuid, Resolution>,
    /// Buyer → the request id Postgres holds for them (one per buyer).
    pub owner: HashMap<i64, Uuid>,
    /// Buyers who already have an order for the sale.
    pub ordered: HashSet<i64>,
    /// The registered rows of the messages' request ids, by request id.
    pub registered: HashMap<Uuid, Registration>,
}

/// What [`allocate`] decided for one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Settled by an earlier batch: keeps that result, takes nothing, records
    /// nothing.
    Settled(Resolution),
    /// Gets its units: an order is written and the result recorded.
    Grant,
    /// Fewer units left than it asks for; recorded as `sold_out`.
    SoldOut,
    /// Refused by [`Rules`]; recorded as `rejected` with the reason.
    Refused(Refusal),
    /// The buyer already has an order, or another request (in Postgres, or
    /// earlier in this batch). `record`: whether this request's own row is
    /// written — not when Postgres holds another request of the buyer, whose
    /// row is the buyer's one.
    AlreadyPurchased { record: bool },
    /// A second message of the request at this position (of the same
    /// slice), which decides for both.
    SameAs(usize),
}

impl Decision {
    /// Whether this transaction writes the request's result row.
    pub fn records(self) -> bool {
        matches!(
            self,
            Decision::Grant
                | Decision::SoldOut
                | Decision::Refused(_)
                | Decision::AlreadyPurchased { record: true }
        )
    }
}

/// The allocation of one sale's messages of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// One per message, in arrival order.
    pub decisions: Vec<Decision>,
    /// Units left once the granted requests took theirs.
    pub left: i64,
    /// No unit is left: not even a request for one unit could be served. A
    /// request refused because it asked for more than is left does not make
    /// the sale sold out (a smaller one may still be served).
    pub sold_out: bool,
}

/// Decides, in arrival order, which of one sale's `messages` get units out
/// of `remaining_stock`, which are refused by the sale's `rules`, which are
/// duplicates and which are sold out, given what Postgres already `known`s
/// (steps 2–4 of the module description).
/// No I/O: [`settle`] reads `known` and writes what this decides.
///
/// A message with a quantity below 1 is granted without taking units, so
/// that Postgres refuses its order and the whole batch fails: the consumer
/// then retries the message alone and dead-letters it, since it can never be
/// settled.
pub fn allocate(
    messages: &[PurchaseMessage],
    remaining_stock: i64,
    known: &Known,
    rules: &Rules,
) -> Allocation {
    let mut left = remaining_stock;
    // First message of each request id, and the buyers served, in this batch.
    let mut first_of: HashMap<Uuid, usize> = HashMap::new();
    let mut buyers_in_batch: HashSet<i64> = HashSet::new();
    let mut decisions = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        if let Some(&first) = first_of.get(&message.request_id) {
            decisions.push(Decision::SameAs(first));
            continue;
        }
        first_of.insert(message.request_id, i);
        if let Some(&done) = known.settled.get(&message.request_id) {
            decisions.push(Decision::Settled(done));
            continue;
        }
        if let Some(refusal) = rules.refusal(message, known.registered.get(&message.request_id)) {
            decisions.push(Decision::Refused(refusal));
            continue;
        }
        let user = message.user_id;
        let other_request = known.owner.get(&user).is_some_and(|id| *id != message.request_id);
        // Short-circuits: a buyer refused for an order or another request is
        // not counted as served in this batch.
        if known.ordered.contains(&user) || other_request || !buyers_in_batch.insert(user) {
            decisions.push(Decision::AlreadyPurchased { record: !other_request });
            continue;
        }
        let quantity = i64::from(message.quantity);
        decisions.push(if quantity < 1 {
            Decision::Grant
        } else if quantity <= left {
            left -= quantity;
            Decision::Grant
        } else {
            Decision::SoldOut
        });
    }
    Allocation { decisions, left, sold_out: left <= 0 }
}

/// The final result of each message (in order), given the order written for
/// each granted buyer (`order_of`: user id → `orders.id`).
///
/// Panics when a granted buyer has no order: the order insert returns one
/// row per granted message.
pub fn resolve(
    messages: &[PurchaseMessage],
    decisions: &[Decision],
    order_of: &HashMap<i64, i64>,
) -> Vec<Resolution> {
    let mut resolutions: Vec<Resolution> = Vec::with_capacity(decisions.len());
    for (message, decision) in messages.iter().zip(decisions) {
        let resolution = match *decision {
            Decision::Settled(done) => done,
            Decision::Grant => Resolution::Placed { order_id: order_of[&message.user_id] },
            Decision::SoldOut => Resolution::SoldOut,
            Decision::Refused(refusal) => Resolution::Refused(refusal),
            Decision::AlreadyPurchased { .. } => Resolution::AlreadyPurchased,
            Decision::SameAs(first) => resolutions[first],
        };
        resolutions.push(resolution);
    }
    resolutions
}

/// Settles the messages of one sale (`indices` into `batch`) inside `tx`,
/// filling their `resolutions`. `Ok(None)` when the sale does not exist.
async fn settle_sale(
    tx: &mut Transaction<'static, Postgres>,
    sale_id: i64,
    batch: &[PurchaseMessage],
    indices: &[usize],
    resolutions: &mut [Option<Resolution>],
    batch_id: i64,
) -> Result<Option<SaleAfter>, sqlx::Error> {
    let Some(locked) = batch::lock_sale(tx, sale_id).await? else {
        // No such sale: nothing to grant, ever. Nothing to record either
        // (a request row needs its sale).
        for &i in indices {
            resolutions[i] = Some(Resolution::Rejected);
        }
        return Ok(None);
    };
    locked.knobs.simulate_work().await;
    let messages: Vec<PurchaseMessage> = indices.iter().map(|&i| batch[i]).collect();
    let known = read_known(tx, sale_id, &messages).await?;
    let rules = Rules {
        per_user_limit: locked.per_user_limit,
        starts_at: locked.starts_at,
        ends_at: locked.ends_at,
        now: Utc::now(),
    };
    let allocation = allocate(&messages, locked.remaining_stock, &known, &rules);
    let granted: Vec<(i64, i32)> = messages
        .iter()
        .zip(&allocation.decisions)
        .filter(|(_, decision)| **decision == Decision::Grant)
        .map(|(message, _)| (message.user_id, message.quantity))
        .collect();
    // The consumer's transaction is its serial hold (`settle`): the row's
    // marks, which no one waits for here, are left unread.
    let (order_of, _) = batch::take_stock_and_order(tx, sale_id, &granted, locked.began_at).await?;
    let resolved = resolve(&messages, &allocation.decisions, &order_of);
    let recorded: Vec<(PurchaseMessage, Resolution)> = (0..messages.len())
        .filter(|&k| allocation.decisions[k].records())
        .map(|k| (messages[k], resolved[k]))
        .collect();
    let batch_size = i32::try_from(batch.len()).unwrap_or(i32::MAX);
    record_results(tx, sale_id, &recorded, batch_id, batch_size).await?;
    for (&i, resolution) in indices.iter().zip(resolved) {
        resolutions[i] = Some(resolution);
    }
    let (remaining_stock, sold_out) = (allocation.left, allocation.sold_out);
    Ok(Some(SaleAfter { sale_id, remaining_stock, sold_out }))
}

/// The requests of `$1` (request ids), one primary-key lookup each.
const REQUESTS_BY_ID: &str = "\
SELECT r.id, r.sale_id, r.user_id, r.status, r.order_id, r.accepted_at
FROM unnest($1::uuid[]) AS m(id)
CROSS JOIN LATERAL (
    SELECT id, sale_id, user_id, status, order_id, accepted_at
    FROM purchase_requests WHERE id = m.id LIMIT 1
) r";

/// The requests of sale `$1` by the buyers `$2`, one `(sale_id, user_id)`
/// lookup each.
const REQUESTS_BY_BUYER: &str = "\
SELECT r.id, r.sale_id, r.user_id, r.status, r.order_id, r.accepted_at
FROM unnest($2::bigint[]) AS m(user_id)
CROSS JOIN LATERAL (
    SELECT id, sale_id, user_id, status, order_id, accepted_at FROM purchase_requests
    WHERE sale_id = $1 AND user_id = m.user_id AND status <> 'returned' LIMIT 1
) r";

/// What Postgres holds about the requests and buyers of `messages`.
///
/// Every lookup is one key per message, joined laterally: the `LIMIT 1`
/// keeps each subquery from being merged into a join, so each is planned
/// alone as an equality on every column of a unique index — one index probe
/// per key, whatever the table's statistics say. Written as one statement
/// per table (`sale_id = $1 AND (id = ANY(…) OR user_id = ANY(…))`), the
/// planner, whenever its statistics were stale or missing (a young
/// database, a server without autovacuum), read every request of the sale
/// through the `sale_id` prefix of `(sale_id, user_id)` and filtered them: a
/// batch then cost time in proportion to the requests the sale already had,
/// and a drain of 100 000 requests slowed to about one `sql` transaction's
/// rate (docs/queue.md, "The drain that collapsed").
async fn read_known(
    tx: &mut Transaction<'static, Postgres>,
    sale_id: i64,
    messages: &[PurchaseMessage],
) -> Result<Known, sqlx::Error> {
    let ids: Vec<Uuid> = messages.iter().map(|m| m.request_id).collect();
    let users: Vec<i64> = messages.iter().map(|m| m.user_id).collect();
    let mut rows: Vec<KnownRequest> =
        sqlx::query_as(REQUESTS_BY_ID).bind(&ids).fetch_all(&mut **tx).await?;
    // A request id is unique across sales; one of another sale is not this
    // sale's business.
    rows.retain(|row| row.sale_id == sale_id);
    rows.extend(
        sqlx::query_as::<_, KnownRequest>(REQUESTS_BY_BUYER)
            .bind(sale_id)
            .bind(&users)
            .fetch_all(&mut **tx)
            .await?,
    );
    let ordered = batch::ordered_buyers(tx, sale_id, &users).await?;
    let settled = rows
        .iter()
        .filter_map(|row| resolution_of(&row.status, row.order_id).map(|r| (row.id, r)))
        .collect();
    let owner = rows.iter().map(|row| (row.user_id, row.id)).collect();
    let registered = rows
        .iter()
        .map(|row| (row.id, Registration { user_id: row.user_id, accepted_at: row.accepted_at }))
        .collect();
    Ok(Known { settled, owner, ordered, registered })
}

/// Upserts the result row of each `recorded` request (in arrival order),
/// tagged with the batch; a row that is no longer `pending` keeps its result.
async fn record_results(
    tx: &mut Transaction<'static, Postgres>,
    sale_id: i64,
    recorded: &[(PurchaseMessage, Resolution)],
    batch_id: i64,
    batch_size: i32,
) -> Result<(), sqlx::Error> {
    if recorded.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = recorded.iter().map(|(m, _)| m.request_id).collect();
    let users: Vec<i64> = recorded.iter().map(|(m, _)| m.user_id).collect();
    let quantities: Vec<i32> = recorded.iter().map(|(m, _)| m.quantity).collect();
    let statuses: Vec<&str> = recorded.iter().map(|(_, r)| r.status()).collect();
    let orders: Vec<Option<i64>> = recorded.iter().map(|(_, r)| r.order_id()).collect();
    let reasons: Vec<Option<&str>> = recorded.iter().map(|(_, r)| r.reason()).collect();
    // A refused message's own buyer and quantity are not written over a
    // registered row's (ON CONFLICT keeps them): the row stays the request
    // its instance accepted.
    sqlx::query(
        "INSERT INTO purchase_requests
             (id, sale_id, user_id, quantity, status, order_id, resolved_at, batch_id, batch_size,
              rejection_reason)
         SELECT id, $1, u, q, s, o, clock_timestamp(), $7, $8, r
         FROM unnest($2::uuid[], $3::bigint[], $4::int[], $5::text[], $6::bigint[], $9::text[])
              AS t(id, u, q, s, o, r)
         ON CONFLICT (id) DO UPDATE
         SET status = excluded.status, order_id = excluded.order_id,
             resolved_at = excluded.resolved_at, batch_id = excluded.batch_id,
             batch_size = excluded.batch_size, rejection_reason = excluded.rejection_reason
         WHERE purchase_requests.status = 'pending'",
    )
    .bind(sale_id)
    .bind(&ids)
    .bind(&users)
    .bind(&quantities)
    .bind(&statuses)
    .bind(&orders)
    .bind(batch_id)
    .bind(batch_size)
    .bind(&reasons)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn resolution_of(status: &str, order_id: Option<i64>) -> Option<Resolution> {
    match (status, order_id) {
        // `returned`: placed, and its order has since ended unpaid.
        ("placed" | "returned", Some(order_id)) => Some(Resolution::Placed { order_id }),
        ("sold_out", _) => Some(Resolution::SoldOut),
        ("already_purchased", _) => Some(Resolution::AlreadyPurchased),
        ("rejected", _) => Some(Resolution::Rejected),
        _ => None,
    }
}

/// Records `message` as `rejected` for `reason`, unless it is settled
/// already (a request keeps its first final result). Nothing is recorded
/// when the sale does not exist (a request row needs its sale).
///
/// Errors: Postgres errors.
pub async fn mark_rejected(
    db: &PgPool,
    message: &PurchaseMessage,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO purchase_requests
             (id, sale_id, user_id, quantity, status, resolved_at, batch_size, rejection_reason)
         SELECT $1, s.id, $3, greatest($4, 1), 'rejected', clock_timestamp(), 1, $5
         FROM sales s WHERE s.id = $2
         ON CONFLICT (id) DO UPDATE
         SET status = 'rejected', resolved_at = excluded.resolved_at,
             rejection_reason = excluded.rejection_reason
         WHERE purchase_requests.status = 'pending'",
    )
    .bind(message.request_id)
    .bind(message.sale_id)
    .bind(message.user_id.max(0))
    .bind(message.quantity)
    .bind(reason)
    .execute(db)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Request `n` of buyer `user` for `quantity` units (ids are readable in
    /// failures: `…0001`, `…0002`).
    fn message(n: u128, user: i64, quantity: i32) -> PurchaseMessage {
        PurchaseMessage { request_id: Uuid::from_u128(n), sale_id: 1, user_id: user, quantity }
    }

    fn decisions(messages: &[PurchaseMessage], stock: i64, known: &Known) -> Vec<Decision> {
        allocate(messages, stock, known, &Rules::open()).decisions
    }

    use Decision::{AlreadyPurchased, Grant, SameAs, SoldOut};

    #[test]
    fn stock_goes_in_arrival_order_and_a_smaller_request_may_pass_a_larger_one() {
        let batch = [message(1, 10, 2), message(2, 11, 2), message(3, 12, 1), message(4, 13, 1)];
        let allocation = allocate(&batch, 3, &Known::default(), &Rules::open());
        assert_eq!(allocation.decisions, [Grant, SoldOut, Grant, SoldOut]);
        assert_eq!((allocation.left, allocation.sold_out), (0, true));
    }

    #[test]
    fn a_sale_is_sold_out_only_when_no_unit_is_left() {
        let exact = allocate(&[message(1, 10, 2)], 2, &Known::default(), &Rules::open());
        assert_eq!(
            (exact.decisions.as_slice(), exact.left, exact.sold_out),
            (&[Grant][..], 0, true)
        );
        // Too large for what is left: refused, but one unit could still sell.
        let refused = allocate(&[message(1, 10, 3)], 2, &Known::default(), &Rules::open());
        assert_eq!(
            (refused.decisions.as_slice(), refused.left, refused.sold_out),
            (&[SoldOut][..], 2, false)
        );
        let empty = allocate(&[message(1, 10, 1)], 0, &Known::default(), &Rules::open());
        assert_eq!((empty.decisions.as_slice(), empty.sold_out), (&[SoldOut][..], true));
        let some_left = allocate(&[message(1, 10, 1)], 2, &Known::default(), &Rules::open());
        assert_eq!((some_left.left, some_left.sold_out), (1, false));
        let nobody = allocate(&[], 5, &Known::default(), &Rules::open());
        assert_eq!((nobody.decisions.len(), nobody.left, nobody.sold_out), (0, 5, false));
    }

    #[test]
    fn a_second_request_of_one_buyer_in_a_batch_is_already_purchased_and_recorded() {
        let batch = [message(1, 10, 1), message(2, 10, 1), message(3, 11, 1)];
        let allocation = allocate(&batch, 5, &Known::default(), &Rules::open());
        assert_eq!(allocation.decisions, [Grant, AlreadyPurchased { record: true }, Grant]);
        assert_eq!(allocation.left, 3);
    }

    #[test]
    fn a_buyer_with_an_order_takes_nothing() {
        let known = Known { ordered: HashSet::from([10]), ..Known::default() };
        let batch = [message(1, 10, 1), message(2, 11, 1)];
        assert_eq!(decisions(&batch, 1, &known), [AlreadyPurchased { record: true }, Grant]);
    }

    #[test]
    fn a_buyer_whose_request_postgres_holds_under_another_id_is_refused_without_a_row() {
        // Postgres holds request 2 for buyer 10: request 1 is the duplicate,
        // and it does not count the buyer as served, so request 2 is granted.
        let known = Known { owner: HashMap::from([(10, Uuid::from_u128(2))]), ..Known::default() };
        let batch = [message(1, 10, 1), message(2, 10, 1)];
        let allocation = allocate(&batch, 1, &known, &Rules::open());
        assert_eq!(allocation.decisions, [AlreadyPurchased { record: false }, Grant]);
        assert!(!allocation.decisions[0].records() && allocation.decisions[1].records());
    }

    #[test]
    fn a_redelivered_request_keeps_its_result_and_takes_nothing() {
        let placed = Resolution::Placed { order_id: 77 };
        let known = Known {
            settled: HashMap::from([(Uuid::from_u128(1), placed)]),
            owner: HashMap::from([(10, Uuid::from_u128(1))]),
            ordered: HashSet::from([10]),
            ..Known::default()
        };
        let batch = [message(1, 10, 1), message(2, 11, 1)];
        let allocation = allocate(&batch, 1, &known, &Rules::open());
        assert_eq!(allocation.decisions, [Decision::Settled(placed), Grant]);
        assert!(!allocation.decisions[0].records());
        assert_eq!(allocation.left, 0);
    }

    #[test]
    fn a_second_message_of_one_request_takes_the_first_ones_result() {
        let batch = [message(1, 10, 1), message(2, 11, 1), message(1, 10, 1), message(2, 11, 1)];
        let allocation = allocate(&batch, 1, &Known::default(), &Rules::open());
        assert_eq!(allocation.decisions, [Grant, SoldOut, SameAs(0), SameAs(1)]);
        assert_eq!(allocation.left, 0);
        let resolved = resolve(&batch, &allocation.decisions, &HashMap::from([(10, 500)]));
        let placed = Resolution::Placed { order_id: 500 };
        assert_eq!(resolved, [placed, Resolution::SoldOut, placed, Resolution::SoldOut]);
        let recorded: Vec<bool> = allocation.decisions.iter().map(|d| d.records()).collect();
        assert_eq!(recorded, [true, true, false, false]);
    }

    #[test]
    fn a_quantity_below_one_is_granted_without_units_so_that_postgres_refuses_the_batch() {
        let batch = [message(1, 10, 0), message(2, 11, -3), message(3, 12, 1)];
        let allocation = allocate(&batch, 1, &Known::default(), &Rules::open());
        assert_eq!(allocation.decisions, [Grant, Grant, Grant]);
        assert_eq!((allocation.left, allocation.sold_out), (0, true));
    }

    #[test]
    fn a_message_over_the_per_user_limit_is_refused_and_takes_nothing() {
        let rules = Rules { per_user_limit: 2, ..Rules::open() };
        let batch = [message(1, 10, 3), message(2, 11, 2), message(3, 10, 1)];
        let allocation = allocate(&batch, 5, &Known::default(), &rules);
        // The refused buyer is not counted as served: their next request
        // within the limit is granted.
        assert_eq!(allocation.decisions, [Decision::Refused(Refusal::OverLimit), Grant, Grant]);
        assert_eq!(allocation.left, 2);
        assert!(allocation.decisions[0].records());
        let resolved = resolve(&batch, &allocation.decisions, &HashMap::from([(10, 1), (11, 2)]));
        assert_eq!(resolved[0].status(), "rejected");
        assert_eq!(resolved[0].reason(), Some(Refusal::OverLimit.reason()));
    }

    #[test]
    fn the_window_is_checked_at_acceptance_for_a_registered_request_else_now() {
        let at = |s: i64| DateTime::from_timestamp(s, 0).unwrap();
        let rules = Rules {
            starts_at: Some(at(100)),
            ends_at: Some(at(200)),
            now: at(250),
            ..Rules::open()
        };
        let registered = |accepted: i64| Registration { user_id: 10, accepted_at: at(accepted) };
        let m = message(1, 10, 1);
        // The window is [start, end), as `Sale::phase` has it.
        for inside in [100, 150, 199] {
            assert_eq!(rules.refusal(&m, Some(&registered(inside))), None, "accepted at {inside}");
        }
        for outside in [99, 200, 201] {
            assert_eq!(rules.refusal(&m, Some(&registered(outside))), Some(Refusal::OutsideWindow));
        }
        assert_eq!(rules.refusal(&m, None), Some(Refusal::OutsideWindow), "unregistered: now");
        let open_now = Rules { now: at(150), ..rules };
        assert_eq!(open_now.refusal(&m, None), None);
        let before = Rules { now: at(50), ..rules };
        assert_eq!(before.refusal(&m, None), Some(Refusal::OutsideWindow));
    }

    #[test]
    fn a_message_naming_a_request_of_another_buyer_is_refused() {
        let other = Registration { user_id: 11, accepted_at: Utc::now() };
        let refusal = Rules::open().refusal(&message(1, 10, 1), Some(&other));
        assert_eq!(refusal, Some(Refusal::NotAsRegistered));
    }

    #[test]
    fn each_decision_resolves_to_its_result() {
        let batch = [message(1, 10, 1), message(2, 11, 1), message(3, 12, 1), message(4, 13, 1)];
        let decisions = [
            Grant,
            SoldOut,
            AlreadyPurchased { record: true },
            Decision::Settled(Resolution::Rejected),
        ];
        let resolved = resolve(&batch, &decisions, &HashMap::from([(10, 9)]));
        assert_eq!(
            resolved,
            [
                Resolution::Placed { order_id: 9 },
                Resolution::SoldOut,
                Resolution::AlreadyPurchased,
                Resolution::Rejected
            ]
        );
    }

    #[test]
    fn stored_statuses_read_back_as_resolutions() {
        for resolution in [
            Resolution::Placed { order_id: 3 },
            Resolution::SoldOut,
            Resolution::AlreadyPurchased,
            Resolution::Rejected,
        ] {
            let read = resolution_of(resolution.status(), resolution.order_id());
            assert_eq!(read, Some(resolution));
        }
        assert_eq!(resolution_of("pending", None), None);
        assert_eq!(resolution_of("placed", None), None, "a placed row names its order");
    }
}
