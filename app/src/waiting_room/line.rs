//! The line's keys and scripts in Redis. Every key of a sale's room carries
//! the sale's hash tag `{sale:ID}`, so each script touches one cluster slot.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis_lock::RedisConnection;

use crate::backends::{RedisHandle, count_redis_round_trips, redis_error};
use crate::outcome::StrategyError;
use crate::sale::{Sale, SaleId, UserId};
use crate::strategy::StrategyName;

static PLACE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("place.lua")));
static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("admit.lua")));
static CONSUME: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("consume.lua")));
static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("leave.lua")));

/// How long a room's keys outlive their last write: a line nobody joins for
/// a day is gone.
pub const KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The window over which the admission pace is measured.
pub const PACE_WINDOW: Duration = Duration::from_secs(10);

/// How long a buyer who has not looked at their place has left the line: 20
/// missed looks of the storefront (it looks every 500 ms).
pub const LEFT_AFTER: Duration = Duration::from_secs(10);

/// The keys of one sale's room, and the strategy its round trips are
/// counted under (each function here sends one).
pub struct Keys {
    strategy: StrategyName,
    line: String,
    tickets: String,
    seen: String,
    admitted: String,
    sold_out: String,
    admissions: String,
    fence: String,
}

impl Keys {
    pub fn new(redis: &RedisHandle, sale: &Sale) -> Self {
        Self::of(redis, sale.id, sale.strategy)
    }

    pub fn of(redis: &RedisHandle, sale: SaleId, strategy: StrategyName) -> Self {
        let key = |suffix| redis.sale_key(sale.0, suffix);
        Self {
            strategy,
            line: key("room:line"),
            tickets: key("room:tickets"),
            seen: key("room:seen"),
            admitted: key("room:admitted"),
            sold_out: key("room:sold-out"),
            admissions: key("room:admissions"),
            fence: key("room:fence"),
        }
    }

    /// Counts the round trip a function here is about to send.
    fn sent(&self) {
        count_redis_round_trips(self.strategy.as_str(), 1);
    }
}

/// A buyer's place as `place.lua` reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    SoldOut,
    /// Admitted: the permit's owner token and the admission's end (server ms).
    Admitted {
        permit: String,
        ends_ms: u64,
    },
    /// In line behind `ahead` buyers; `recent` admissions in the last
    /// `window_ms`.
    Waiting {
        ahead: u64,
        recent: u64,
        window_ms: u64,
    },
    Absent,
}

/// What `admit.lua` did with a permit.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted {
    Buyer {
        buyer: i64,
        ends_ms: u64,
    },
    Empty,
    Closed,
    /// A newer leader admitted since this one took the lead.
    Fenced,
}

/// What `consume.lua` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Used {
    /// Used; the entry, to put back if the purchase was not attempted.
    Now(String),
    Unknown,
    Lapsed,
}

fn ms(duration: Duration) -> u64 {
    duration.as_millis() as u64
}

fn number(field: Option<&String>) -> Result<u64, StrategyError> {
    field.and_then(|raw| raw.parse().ok()).ok_or_else(|| unexpected("a number"))
}

fn unexpected(what: &str) -> StrategyError {
    StrategyError::Internal(anyhow::anyhow!("a waiting-room script answered without {what}"))
}

/// Joins the line (`join`) or looks at the place.
pub async fn place(
    conn: &mut RedisConnection,
    keys: &Keys,
    buyer: UserId,
    join: bool,
) -> Result<Seen, StrategyError> {
    keys.sent();
    let reply: Vec<String> = PLACE
        .key(&keys.line)
        .key(&keys.tickets)
        .key(&keys.seen)
        .key(&keys.admitted)
        .key(&keys.sold_out)
        .key(&keys.admissions)
        .arg(buyer.get())
        .arg(if join { "join" } else { "look" })
        .arg(ms(KEY_LIFETIME))
        .arg(ms(PACE_WINDOW))
        .invoke_async(conn)
        .await
        .map_err(redis_error)?;
    Ok(match reply.first().map(String::as_str) {
        Some("sold_out") => Seen::SoldOut,
        Some("admitted") => Seen::Admitted {
            permit: reply.get(1).cloned().ok_or_else(|| unexpected("a permit"))?,
            ends_ms: number(reply.get(2))?,
        },
        Some("waiting") => Seen::Waiting {
            ahead: number(reply.get(1))?,
            recent: number(reply.get(2))?,
            window_ms: number(reply.get(3))?,
        },
        Some("absent") => Seen::Absent,
        _ => return Err(unexpected("a place")),
    })
}

/// How many buyers the line holds, those who left but are not yet dropped
/// included.
pub async fn waiting(conn: &mut RedisConnection, keys: &Keys) -> Result<u64, StrategyError> {
    keys.sent();
    redis::cmd("ZCARD").arg(&keys.line).query_async(conn).await.map_err(redis_error)
}

/// Admits the first buyer still in line with `permit`, for `ttl`, as the
/// leader of fencing token `token`.
pub async fn admit(
    conn: &mut RedisConnection,
    keys: &Keys,
    permit: &str,
    ttl: Duration,
    token: u64,
) -> Result<Admitted, StrategyError> {
    keys.sent();
    let reply: Vec<String> = ADMIT
        .key(&keys.line)
        .key(&keys.seen)
        .key(&keys.admitted)
        .key(&keys.admissions)
        .key(&keys.sold_out)
        .key(&keys.fence)
        .arg(permit)
        .arg(ms(ttl))
        .arg(ms(LEFT_AFTER))
        .arg(ms(KEY_LIFETIME))
        .arg(ms(PACE_WINDOW))
        .arg(token)
        .invoke_async(conn)
        .await
        .map_err(redis_error)?;
    Ok(match reply.first().map(String::as_str) {
        Some("admitted") => {
            Admitted::Buyer { buyer: number(reply.get(1))? as i64, ends_ms: number(reply.get(2))? }
        }
        Some("empty") => Admitted::Empty,
        Some("closed") => Admitted::Closed,
        Some("fenced") => Admitted::Fenced,
        _ => return Err(unexpected("an admission")),
    })
}

/// Uses `buyer`'s admission of `permit`.
pub async fn consume(
    conn: &mut RedisConnection,
    keys: &Keys,
    buyer: UserId,
    permit: &str,
) -> Result<Used, StrategyError> {
    keys.sent();
    let reply: Vec<String> = CONSUME
        .key(&keys.admitted)
        .arg(buyer.get())
        .arg(permit)
        .invoke_async(conn)
        .await
        .map_err(redis_error)?;
    Ok(match reply.first().map(String::as_str) {
        Some("used") => Used::Now(reply.get(1).cloned().ok_or_else(|| unexpected("an entry"))?),
        Some("unknown") => Used::Unknown,
        Some("lapsed") => Used::Lapsed,
        _ => return Err(unexpected("a verdict")),
    })
}

/// Puts back an admission used by a purchase that could not be attempted
/// (a backing server failed): unless the buyer has another one by now.
pub async fn restore(
    conn: &mut RedisConnection,
    keys: &Keys,
    buyer: UserId,
    entry: &str,
) -> Result<(), StrategyError> {
    keys.sent();
    redis::cmd("HSETNX")
        .arg(&keys.admitted)
        .arg(buyer.get())
        .arg(entry)
        .query_async::<i64>(conn)
        .await
        .map(drop)
        .map_err(redis_error)
}

/// Takes `buyer` out of the line; the permit of an admission they held.
pub async fn leave(
    conn: &mut RedisConnection,
    keys: &Keys,
    buyer: UserId,
) -> Result<Option<String>, StrategyError> {
    keys.sent();
    LEAVE
        .key(&keys.line)
        .key(&keys.seen)
        .key(&keys.admitted)
        .arg(buyer.get())
        .invoke_async(conn)
        .await
        .map_err(redis_error)
}

/// Marks the sale sold out for `hold`: renewed by every sign of it, gone
/// `hold` after the last (units that come back reopen the line).
pub async fn mark_sold_out(
    conn: &mut RedisConnection,
    keys: &Keys,
    hold: Duration,
) -> Result<(), StrategyError> {
    keys.sent();
    redis::cmd("SET")
        .arg(&keys.sold_out)
        .arg(1)
        .arg("PX")
        .arg(ms(hold))
        .query_async::<()>(conn)
        .await
        .map_err(redis_error)
}
