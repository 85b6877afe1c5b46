//! The Redis side of one `redis-decr` sale: its keys and the Lua scripts that
//! change them.
//!
//! Keys (all share the hash tag `{sale:ID}`, so one script may touch them on
//! Redis Cluster):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `PREFIX:{sale:ID}:stock` | integer | units Redis will still hand out |
//! | `PREFIX:{sale:ID}:buyers` | set | users holding a reservation or an order |
//! | `PREFIX:{sale:ID}:reservations` | hash | open reservations: id → `user:qty:created_ms` |
//! | `PREFIX:{sale:ID}:seq` | integer | bumped by every reservation and counter change |
//! | `PREFIX:{sale:ID}:origin` | integer | the sale's `created_at` (µs), set with the counter |
//! | `PREFIX:{sale:ID}:gate` | string | present while a reconciler corrects the counter (a token, expiring) |
//! | `PREFIX:{sale:ID}:returns` | hash | units of ended orders on their way back: order id → `user:qty:created_ms` |
//!
//! Once the reconciler finds a sale ended or sold out with its books settled,
//! the keys are set to expire (`SECKILL_REDIS_DECR_KEY_TTL_MS`) and the sale
//! leaves the index ([`SaleCounter::retire`]); a restock keeps them again.
//!
//! plus two per-prefix names: the set `PREFIX:redis-decr:sales` of warmed
//! sales (what the background reconciler visits) and the pub/sub channel
//! `PREFIX:redis-decr:stock-returned`.
//!
//! Invariant kept by the scripts together with the purchase path: at any
//! instant, `stock + Σ qty(reservations without an order) =
//! sales.remaining_stock` in Postgres. A reservation lives from the
//! decrement until its order is committed (then it is confirmed, i.e.
//! deleted) or until its units are given back (compensated). This module does
//! not talk to Postgres and does not decide when to compensate; see the parent
//! module.

use std::sync::LazyLock;

use redis::Script;
use redis_lock::RedisConnection;
use serde::Serialize;

use crate::backends::RedisHandle;
use crate::sale::{Quantity, SaleId, UserId};

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reserve.lua")));
static COMPENSATE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("compensate.lua")));
static WARM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("warm.lua")));
static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("inspect.lua")));
static CORRECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("correct.lua")));
static RESTOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("restock.lua")));
static GATE_CLOSE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("gate_close.lua")));
static GATE_OPEN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("gate_open.lua")));
static RETIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("retire.lua")));
static RETURN_BEGIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("return_begin.lua")));
static RETURN_COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("return_complete.lua")));

/// The set of sale ids this prefix holds counters for.
pub fn sales_index_key(redis: &RedisHandle) -> String {
    format!("{}:redis-decr:sales", redis.prefix)
}

/// The pub/sub channel on which "stock came back for sale N" is broadcast
/// (message: the sale id in decimal).
pub fn stock_returned_channel(redis: &RedisHandle) -> String {
    format!("{}:redis-decr:stock-returned", redis.prefix)
}

/// Identifies one reservation: 128 random bits in hex. Random rather than a
/// Redis sequence so that an id issued before a Redis restart can never name
/// a reservation made after it: a late compensation of a lost reservation
/// must find nothing, not somebody else's units.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct ReservationId(String);

impl ReservationId {
    pub fn random() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether a compensated buyer may try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buyer {
    /// The buyer has no order: drop them from the buyers set.
    Release,
    /// The buyer does have an order (Postgres refused a duplicate): keep them.
    Keep,
}

/// Answer of [`SaleCounter::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// `qty` units taken; `left` units remain in the counter.
    Reserved { id: ReservationId, left: i64 },
    /// Fewer than `qty` units remain (`left`, unchanged).
    SoldOut { left: i64 },
    /// The user already holds a reservation or an order.
    AlreadyHeld,
    /// No counter in Redis: warm it from Postgres, then try again.
    NotWarmed,
    /// A reconciler is correcting the counter (its gate is closed): nothing
    /// was taken; try again shortly.
    Gated,
}

/// An open reservation, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub id: ReservationId,
    pub user: i64,
    pub quantity: i64,
    /// Redis server time of the decrement, milliseconds since the Unix epoch.
    pub created_ms: i64,
}

/// The units of an ended order on their way back to the counter
/// (`return_begin.lua` recorded it; `return_complete.lua` finishes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReturn {
    /// `orders.id`.
    pub order: i64,
    pub user: i64,
    pub quantity: i64,
    /// Redis server time of the record, milliseconds since the Unix epoch.
    pub created_ms: i64,
}

/// One consistent view of a sale's Redis state ([`SaleCounter::snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The counter, units; `None` when Redis holds none for the sale.
    pub counter: Option<i64>,
    /// The sequence number at the snapshot (see `correct.lua`).
    pub seq: i64,
    /// Redis server time, milliseconds since the Unix epoch.
    pub now_ms: i64,
    /// The origin stored by the warm-up (the sale's `created_at`,
    /// microseconds since the Unix epoch); `None` if none is stored.
    pub origin: Option<i64>,
    pub reservations: Vec<Reservation>,
    /// Returns begun and not completed.
    pub returns: Vec<PendingReturn>,
}

/// The keys of one sale and the operations on them. Cheap to build.
#[derive(Debug, Clone)]
pub struct SaleCounter {
    sale: SaleId,
    pub stock_key: String,
    pub buyers_key: String,
    pub reservations_key: String,
    pub seq_key: String,
    pub origin_key: String,
    pub gate_key: String,
    pub returns_key: String,
    channel: String,
}

impl SaleCounter {
    pub fn new(redis: &RedisHandle, sale: SaleId) -> Self {
        Self {
            sale,
            stock_key: redis.sale_key(sale.0, "stock"),
            buyers_key: redis.sale_key(sale.0, "buyers"),
            reservations_key: redis.sale_key(sale.0, "reservations"),
            seq_key: redis.sale_key(sale.0, "seq"),
            origin_key: redis.sale_key(sale.0, "origin"),
            gate_key: redis.sale_key(sale.0, "gate"),
            returns_key: redis.sale_key(sale.0, "returns"),
            channel: stock_returned_channel(redis),
        }
    }

    /// Sets the counter to `remaining` (Postgres `remaining_stock`) minus
    /// the units of open reservations, unless a counter exists
    /// (`warm.lua`), and records `origin` (the sale's `created_at`,
    /// microseconds since the Unix epoch). Returns `(created, counter)`.
    pub async fn warm(
        &self,
        conn: &mut RedisConnection,
        remaining: i64,
        origin: i64,
    ) -> redis::RedisResult<(bool, i64)> {
        let (created, counter): (i64, i64) = WARM
            .key(&self.stock_key)
            .key(&self.reservations_key)
            .key(&self.seq_key)
            .key(&self.origin_key)
            .arg(remaining)
            .arg(&self.channel)
            .arg(self.sale.0)
            .arg(origin)
            .invoke_async(conn)
            .await?;
        Ok((created == 1, counter))
    }

    /// De-duplicates `user` and takes `qty` units in one step (`reserve.lua`).
    pub async fn reserve(
        &self,
        conn: &mut RedisConnection,
        user: UserId,
        qty: Quantity,
        id: ReservationId,
    ) -> redis::RedisResult<Reserve> {
        let (status, counter): (i64, i64) = RESERVE
            .key(&self.stock_key)
            .key(&self.buyers_key)
            .key(&self.reservations_key)
            .key(&self.seq_key)
            .key(&self.gate_key)
            .arg(user.get())
            .arg(qty.get())
            .arg(id.as_str())
            .invoke_async(conn)
            .await?;
        Ok(match status {
            1 => Reserve::Reserved { id, left: counter },
            0 => Reserve::SoldOut { left: counter },
            -1 => Reserve::AlreadyHeld,
            -3 => Reserve::Gated,
            _ => Reserve::NotWarmed,
        })
    }

    /// The reservation became an order: forget it (its units stay taken, the
    /// buyer stays in the buyers set). Idempotent.
    pub async fn confirm(
        &self,
        conn: &mut RedisConnection,
        ids: &[&ReservationId],
    ) -> redis::RedisResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(&self.reservations_key);
        for id in ids {
            cmd.arg(id.as_str());
        }
        cmd.query_async::<i64>(conn).await.map(drop)
    }

    /// Gives the reservation's units back, at most once (`compensate.lua`).
    /// Returns the units returned: 0 when the reservation is unknown.
    pub async fn compensate(
        &self,
        conn: &mut RedisConnection,
        id: &ReservationId,
        buyer: Buyer,
    ) -> redis::RedisResult<i64> {
        COMPENSATE
            .key(&self.stock_key)
            .key(&self.buyers_key)
            .key(&self.reservations_key)
            .arg(id.as_str())
            .arg(match buyer {
                Buyer::Release => "release",
                Buyer::Keep => "keep",
            })
            .arg(&self.channel)
            .arg(self.sale.0)
            .invoke_async(conn)
            .await
    }

    /// Counter, sequence, server time and open reservations at one instant
    /// (`inspect.lua`).
    pub async fn snapshot(&self, conn: &mut RedisConnection) -> redis::RedisResult<Snapshot> {
        let (head, pairs, returning): (Vec<i64>, Vec<String>, Vec<String>) = INSPECT
            .key(&self.stock_key)
            .key(&self.reservations_key)
            .key(&self.seq_key)
            .key(&self.origin_key)
            .key(&self.returns_key)
            .invoke_async(conn)
            .await?;
        let [has_counter, counter, seq, now_ms, origin] = head[..] else {
            return Err(unexpected("inspect.lua returned a malformed head"));
        };
        let reservations = pairs
            .chunks_exact(2)
            .map(|pair| parse_reservation(&pair[0], &pair[1]))
            .collect::<Result<Vec<_>, _>>()?;
        let returns = returning
            .chunks_exact(2)
            .map(|pair| parse_return(&pair[0], &pair[1]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Snapshot {
            counter: (has_counter == 1).then_some(counter),
            seq,
            now_ms,
            origin: (origin != 0).then_some(origin),
            reservations,
            returns,
        })
    }

    /// Moves the counter by `delta` units if the sequence is still `seq`
    /// (`correct.lua`). Returns the change applied (clamped so the counter
    /// stays ≥ 0), or `None` when the sequence moved on.
    pub async fn correct(
        &self,
        conn: &mut RedisConnection,
        seq: i64,
        delta: i64,
    ) -> redis::RedisResult<Option<i64>> {
        let (applied, change): (i64, i64) = CORRECT
            .key(&self.stock_key)
            .key(&self.seq_key)
            .arg(seq)
            .arg(delta)
            .arg(&self.channel)
            .arg(self.sale.0)
            .invoke_async(conn)
            .await?;
        Ok((applied == 1).then_some(change))
    }

    /// Adds `units` to an existing counter and broadcasts (`restock.lua`).
    /// Returns false when there is no counter.
    pub async fn restock(
        &self,
        conn: &mut RedisConnection,
        units: i64,
    ) -> redis::RedisResult<bool> {
        let raised: i64 = RESTOCK
            .key(&self.stock_key)
            .key(&self.seq_key)
            .key(&self.buyers_key)
            .key(&self.reservations_key)
            .key(&self.origin_key)
            .arg(units)
            .arg(&self.channel)
            .arg(self.sale.0)
            .invoke_async(conn)
            .await?;
        Ok(raised == 1)
    }
}

impl SaleCounter {
    /// Closes the correction gate with `token` for at most `hold`
    /// (`gate_close.lua`): reservations are refused ([`Reserve::Gated`])
    /// until [`Self::open_gate`] or the expiry. False when another
    /// reconciler holds it.
    pub async fn close_gate(
        &self,
        conn: &mut RedisConnection,
        token: &str,
        hold: std::time::Duration,
    ) -> redis::RedisResult<bool> {
        let hold_ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX).max(1);
        let closed: i64 =
            GATE_CLOSE.key(&self.gate_key).arg(token).arg(hold_ms).invoke_async(conn).await?;
        Ok(closed == 1)
    }

    /// Opens the gate closed with `token` (`gate_open.lua`); a gate closed
    /// by another token is left alone.
    pub async fn open_gate(
        &self,
        conn: &mut RedisConnection,
        token: &str,
    ) -> redis::RedisResult<()> {
        GATE_OPEN.key(&self.gate_key).arg(token).invoke_async::<i64>(conn).await.map(drop)
    }

    /// Sets every key of the sale to expire in `ttl` if the sequence is still
    /// `seq` and no reservation is open (`retire.lua`). Returns whether it
    /// did.
    pub async fn retire(
        &self,
        conn: &mut RedisConnection,
        seq: i64,
        ttl: std::time::Duration,
    ) -> redis::RedisResult<bool> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let retired: i64 = RETIRE
            .key(&self.stock_key)
            .key(&self.buyers_key)
            .key(&self.reservations_key)
            .key(&self.seq_key)
            .key(&self.origin_key)
            .arg(seq)
            .arg(ttl_ms)
            .invoke_async(conn)
            .await?;
        Ok(retired == 1)
    }
}

impl SaleCounter {
    /// Records that `qty` units of `order` (bought by `user`) are coming
    /// back, before Postgres commits their return (`return_begin.lua`).
    pub async fn begin_return(
        &self,
        conn: &mut RedisConnection,
        order: i64,
        user: UserId,
        qty: i32,
    ) -> redis::RedisResult<()> {
        RETURN_BEGIN
            .key(&self.returns_key)
            .key(&self.seq_key)
            .arg(order)
            .arg(user.get())
            .arg(qty)
            .invoke_async::<i64>(conn)
            .await
            .map(drop)
    }

    /// Gives the units of `order`'s return back to the counter and its buyer
    /// back to the sale, at most once (`return_complete.lua`); only once
    /// Postgres committed the order's end. Returns the units: 0 when there
    /// was no such return in progress.
    pub async fn complete_return(
        &self,
        conn: &mut RedisConnection,
        order: i64,
    ) -> redis::RedisResult<i64> {
        RETURN_COMPLETE
            .key(&self.stock_key)
            .key(&self.buyers_key)
            .key(&self.returns_key)
            .key(&self.seq_key)
            .key(&self.reservations_key)
            .key(&self.origin_key)
            .arg(order)
            .arg(&self.channel)
            .arg(self.sale.0)
            .invoke_async(conn)
            .await
    }

    /// Forgets the return of `order` without raising the counter: Postgres
    /// did not commit it (`HDEL`).
    pub async fn abort_return(
        &self,
        conn: &mut RedisConnection,
        order: i64,
    ) -> redis::RedisResult<()> {
        redis::cmd("HDEL")
            .arg(&self.returns_key)
            .arg(order)
            .query_async::<i64>(conn)
            .await
            .map(drop)
    }
}

fn parse_return(order: &str, value: &str) -> redis::RedisResult<PendingReturn> {
    let order = order.parse::<i64>().map_err(|_| unexpected("malformed return id"))?;
    let Reservation { user, quantity, created_ms, .. } = parse_reservation("", value)?;
    Ok(PendingReturn { order, user, quantity, created_ms })
}

fn parse_reservation(id: &str, value: &str) -> redis::RedisResult<Reservation> {
    let mut fields = value.split(':').map(str::parse::<i64>);
    match (fields.next(), fields.next(), fields.next(), fields.next()) {
        (Some(Ok(user)), Some(Ok(quantity)), Some(Ok(created_ms)), None) => {
            Ok(Reservation { id: ReservationId(id.to_owned()), user, quantity, created_ms })
        }
        _ => Err(unexpected("malformed reservation")),
    }
}

fn unexpected(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Parse, what))
}
