//! The lock's Lua scripts and their typed replies. Each script lives in its
//! own `.lua` file whose header gives KEYS, ARGV, the replies and the race it
//! closes; this module only turns the replies into enums.
//!
//! `invoke_async` sends `EVALSHA` and falls back to `SCRIPT LOAD` + `EVALSHA`
//! once per server when the script is not cached; that fallback is counted as
//! the one round trip of the invocation it belongs to.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use super::LockName;

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));

/// A new acquisition, or a re-entry through a guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireMode {
    Acquire,
    Reenter,
}

/// Reply of `acquire.lua`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// Held by this owner `holds` times; `fence` is 0 when not fenced.
    Acquired { fence: u64, holds: u64 },
    /// Held by another owner for `pttl_ms` more ms (-1: no lease).
    Held { pttl_ms: i64 },
    /// Re-entry refused: another owner holds it.
    NotOwner,
    /// Re-entry refused: nobody holds it.
    Expired,
}

pub(crate) async fn acquire(
    conn: &mut impl ConnectionLike,
    name: &LockName,
    owner: &str,
    lease_ms: u64,
    mode: AcquireMode,
    fenced: bool,
) -> redis::RedisResult<AcquireReply> {
    let mode = match mode {
        AcquireMode::Acquire => "acquire",
        AcquireMode::Reenter => "reenter",
    };
    let reply: Vec<i64> = ACQUIRE
        .key(name.key())
        .key(name.fence_key())
        .arg(lease_ms)
        .arg(owner)
        .arg(mode)
        .arg(if fenced { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    match reply.as_slice() {
        [1, fence, holds] => Ok(AcquireReply::Acquired {
            fence: u64::try_from(*fence).unwrap_or(0),
            holds: u64::try_from(*holds).unwrap_or(0),
        }),
        [0, pttl] => Ok(AcquireReply::Held { pttl_ms: *pttl }),
        [-1, 1] => Ok(AcquireReply::NotOwner),
        [-1, 0] => Ok(AcquireReply::Expired),
        other => Err(unexpected("acquire.lua", other)),
    }
}

/// Reply of `release.lua`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    Released,
    StillHeld(u64),
    NotOwner,
    Expired,
}

/// Releases one hold (`all == false`) or every hold of `owner`.
pub(crate) async fn release(
    conn: &mut impl ConnectionLike,
    name: &LockName,
    owner: &str,
    lease_ms: u64,
    all: bool,
) -> redis::RedisResult<ReleaseReply> {
    let reply: i64 = RELEASE
        .key(name.key())
        .arg(owner)
        .arg(lease_ms)
        .arg(if all { "all" } else { "one" })
        .arg(name.channel())
        .invoke_async(conn)
        .await?;
    match reply {
        0 => Ok(ReleaseReply::Released),
        -1 => Ok(ReleaseReply::NotOwner),
        -2 => Ok(ReleaseReply::Expired),
        n if n > 0 => Ok(ReleaseReply::StillHeld(n.unsigned_abs())),
        other => Err(unexpected("release.lua", &[other])),
    }
}

/// Reply of `extend.lua`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExtendReply {
    Extended,
    NotOwner,
    Expired,
}

pub(crate) async fn extend(
    conn: &mut impl ConnectionLike,
    name: &LockName,
    owner: &str,
    lease_ms: u64,
) -> redis::RedisResult<ExtendReply> {
    let reply: i64 = EXTEND.key(name.key()).arg(lease_ms).arg(owner).invoke_async(conn).await?;
    match reply {
        1 => Ok(ExtendReply::Extended),
        -1 => Ok(ExtendReply::NotOwner),
        -2 => Ok(ExtendReply::Expired),
        other => Err(unexpected("extend.lua", &[other])),
    }
}

fn unexpected(script: &'static str, reply: &[i64]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected lock script reply",
        format!("{script} returned {reply:?}"),
    ))
}
