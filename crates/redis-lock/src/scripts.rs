//! The lock family's Lua scripts and their typed replies. Each script lives
//! in its own `.lua` file whose header gives KEYS, ARGV, the replies and the
//! race it closes; this module names the keys each primitive derives from
//! its [`LockName`] and turns the replies into enums.
//!
//! `invoke_async` sends `EVALSHA` and falls back to `SCRIPT LOAD` + `EVALSHA`
//! once per server when the script is not cached; that fallback is counted as
//! the one round trip of the invocation it belongs to.

use std::sync::LazyLock;
use std::time::Instant;

use redis::Script;
use redis::aio::ConnectionLike;

use super::{LockName, duration_ms_ceil};

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| fencing(include_str!("acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));
static FAIR: LazyLock<Script> = LazyLock::new(|| fencing(include_str!("fair.lua")));
static WRITE: LazyLock<Script> = LazyLock::new(|| fencing(include_str!("rwlock_write.lua")));
static SHARED_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("shared_acquire.lua")));
static SHARED_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("shared_release.lua")));
static SHARED_COUNT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("shared_count.lua")));
static PERIOD_CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("schedule_claim.lua")));
static PERIOD_DONE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("schedule_done.lua")));

/// A script whose `body` calls `fence(issue, fenced)`: the body after the
/// shared `fencing.lua`, which defines it.
fn fencing(body: &str) -> Script {
    Script::new(&format!("{}\n{body}", include_str!("fencing.lua")))
}

/// A key derived from a lock's name, `<name>:<suffix>`: it keeps the name's
/// hash tag, so every key of one primitive shares a Redis Cluster slot.
pub(crate) fn derived(name: &LockName, suffix: &str) -> String {
    format!("{}:{suffix}", name.key())
}

/// One acquisition being contended for: which primitive, whose owner token,
/// which lease. Owned, so that a failed acquisition can be cleaned up in the
/// background.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    pub(crate) name: LockName,
    pub(crate) owner: String,
    pub(crate) lease_ms: u64,
    pub(crate) kind: ClaimKind,
    /// Issue a fencing token (reentrant, fair and write holds): see
    /// [`LockOptions::fenced`](super::LockOptions::fenced).
    pub(crate) fenced: bool,
}

/// The primitive a [`Claim`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClaimKind {
    /// The reentrant lock (`acquire.lua`).
    Reentrant,
    /// A fair lock's turn (`fair.lua`); waits in line when `enqueue`, where
    /// a waiter is dropped `waiter_timeout_ms` after its last attempt, and
    /// is let in only if the line can serve it well before `until` (the end
    /// of its wait).
    Fair { enqueue: bool, waiter_timeout_ms: u64, until: Instant },
    /// A read-write lock's writer (`rwlock_write.lua`); a waiting writer
    /// keeps new readers out for `waiter_timeout_ms` after each attempt (0:
    /// a single attempt, readers not kept out).
    Write { waiter_timeout_ms: u64 },
    /// A read hold (`shared_acquire.lua`).
    Read,
    /// One of `permits` semaphore permits (`shared_acquire.lua`).
    Permit { permits: u32 },
}

impl Claim {
    /// The sorted set of a shared hold (a read hold or a permit).
    pub(crate) fn holders_key(&self) -> String {
        match self.kind {
            ClaimKind::Read => derived(&self.name, "readers"),
            _ => self.name.key().to_owned(),
        }
    }

    /// Who a release wakes.
    pub(crate) fn wake(&self) -> Wake {
        match self.kind {
            ClaimKind::Fair { .. } => Wake::FirstInLine,
            _ => Wake::All,
        }
    }

    /// Whether a refused attempt left a trace that the claim must clear when
    /// it gives up: a place in a fair lock's line, or a waiting writer's
    /// marker.
    pub(crate) fn queued(&self) -> bool {
        match self.kind {
            ClaimKind::Fair { enqueue, .. } => enqueue,
            ClaimKind::Write { waiter_timeout_ms } => waiter_timeout_ms > 0,
            _ => false,
        }
    }
}

/// The fair lock's line of waiters and their deadlines.
fn fair_keys(name: &LockName) -> [String; 2] {
    [derived(name, "queue"), derived(name, "waiters")]
}

/// The prefix of a fair-lock waiter's own wake-up channel: `<name>:turn:`.
pub(crate) fn turn_channel_prefix(name: &LockName) -> String {
    derived(name, "turn:")
}

/// One attempt of `claim` (one round trip): the same reply shape for every
/// primitive.
pub(crate) async fn claim(
    conn: &mut impl ConnectionLike,
    claim: &Claim,
) -> redis::RedisResult<AcquireReply> {
    let name = &claim.name;
    let (lease, owner, fenced) = (claim.lease_ms, claim.owner.as_str(), claim.fenced);
    let invocation = match claim.kind {
        ClaimKind::Reentrant => {
            return acquire(conn, name, owner, lease, AcquireMode::Acquire, fenced).await;
        }
        ClaimKind::Fair { enqueue, waiter_timeout_ms, until } => {
            let mode = if enqueue { "wait" } else { "try" };
            let left_ms = duration_ms_ceil(until.saturating_duration_since(Instant::now()));
            fair(name, owner, lease, mode, [waiter_timeout_ms, left_ms], fenced)
        }
        ClaimKind::Write { waiter_timeout_ms } => {
            write(name, owner, lease, waiter_timeout_ms, "take", fenced)
        }
        ClaimKind::Read => {
            let mut invocation = SHARED_ACQUIRE.key(claim.holders_key());
            invocation.key(name.key()).key(derived(name, "writer-waiting"));
            invocation.arg(lease).arg(owner).arg(0).arg("take");
            invocation
        }
        ClaimKind::Permit { permits } => {
            let mut invocation = SHARED_ACQUIRE.key(claim.holders_key());
            invocation.arg(lease).arg(owner).arg(permits).arg("take");
            invocation
        }
    };
    let reply: Vec<i64> = invocation.invoke_async(conn).await?;
    acquire_reply("claim", &reply)
}

/// `rwlock_write.lua` in `mode` (`take`, `leave`).
fn write(
    name: &LockName,
    owner: &str,
    lease_ms: u64,
    waiter_timeout_ms: u64,
    mode: &str,
    fenced: bool,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = WRITE.key(name.key());
    invocation.key(name.fence_key()).key(derived(name, "readers"));
    invocation.key(derived(name, "writer-waiting")).arg(lease_ms).arg(owner);
    invocation.arg(waiter_timeout_ms).arg(mode).arg(name.channel()).arg(flag(fenced));
    invocation
}

/// `fair.lua` in `mode` (`try`, `wait`, `leave`), with the waiter timeout
/// and what is left of the caller's wait (`[timeout_ms, left_ms]`).
fn fair(
    name: &LockName,
    owner: &str,
    lease_ms: u64,
    mode: &str,
    [waiter_timeout_ms, left_ms]: [u64; 2],
    fenced: bool,
) -> redis::ScriptInvocation<'static> {
    let [line, deadlines] = fair_keys(name);
    let mut invocation = FAIR.key(name.key());
    invocation.key(name.fence_key()).key(line).key(deadlines).key(derived(name, "pace"));
    invocation.arg(lease_ms).arg(owner).arg(mode).arg(waiter_timeout_ms);
    invocation.arg(turn_channel_prefix(name)).arg(flag(fenced)).arg(left_ms);
    invocation
}

/// A script's yes/no argument.
fn flag(yes: bool) -> &'static str {
    if yes { "1" } else { "0" }
}

/// Frees whatever `claim` may hold after its acquisition gave up or failed
/// (one round trip): every hold of its owner token, and its place in line
/// or its waiting-writer marker.
pub(crate) async fn abandon(
    conn: &mut impl ConnectionLike,
    claim: &Claim,
) -> redis::RedisResult<()> {
    let (name, owner) = (&claim.name, claim.owner.as_str());
    match claim.kind {
        ClaimKind::Reentrant => release(conn, name, owner, 1, true, Wake::All).await.map(drop),
        ClaimKind::Write { waiter_timeout_ms } => {
            let leave = write(name, owner, 1, waiter_timeout_ms, "leave", false);
            leave.invoke_async::<Vec<i64>>(conn).await.map(drop)
        }
        ClaimKind::Fair { waiter_timeout_ms, .. } => {
            let leave = fair(name, owner, 1, "leave", [waiter_timeout_ms, 0], false);
            leave.invoke_async::<Vec<i64>>(conn).await.map(drop)
        }
        ClaimKind::Read | ClaimKind::Permit { .. } => {
            shared_release(conn, &claim.holders_key(), owner, name.channel()).await.map(drop)
        }
    }
}

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
    /// Fair lock: not let into a line that would take about `wait_ms` to
    /// serve the caller, more than half of what is left of its wait.
    LineFull { wait_ms: u64 },
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
        .arg(flag(fenced))
        .invoke_async(conn)
        .await?;
    acquire_reply("acquire.lua", &reply)
}

/// The reply shape shared by `acquire.lua` and the scripts of [`claim`].
fn acquire_reply(script: &'static str, reply: &[i64]) -> redis::RedisResult<AcquireReply> {
    match reply {
        [1, fence, holds] => Ok(AcquireReply::Acquired {
            fence: u64::try_from(*fence).unwrap_or(0),
            holds: u64::try_from(*holds).unwrap_or(0),
        }),
        [0, pttl] => Ok(AcquireReply::Held { pttl_ms: *pttl }),
        [-1, 1] => Ok(AcquireReply::NotOwner),
        [-1, 0] => Ok(AcquireReply::Expired),
        [-2, wait] => Ok(AcquireReply::LineFull { wait_ms: u64::try_from(*wait).unwrap_or(0) }),
        other => Err(unexpected(script, other)),
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

/// Whom the release of a lock hash wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Every process waiting for the lock (its release channel).
    All,
    /// Only the first waiter in a fair lock's line (its own channel).
    FirstInLine,
}

/// Releases one hold (`all == false`) or every hold of `owner`.
pub(crate) async fn release(
    conn: &mut impl ConnectionLike,
    name: &LockName,
    owner: &str,
    lease_ms: u64,
    all: bool,
    wake: Wake,
) -> redis::RedisResult<ReleaseReply> {
    let mut invocation = RELEASE.key(name.key());
    let channel = match wake {
        Wake::All => name.channel().to_owned(),
        Wake::FirstInLine => {
            invocation.key(fair_keys(name)[0].clone());
            turn_channel_prefix(name)
        }
    };
    invocation.arg(owner).arg(lease_ms).arg(if all { "all" } else { "one" }).arg(channel);
    let reply: i64 = invocation.invoke_async(conn).await?;
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

/// Reply of `shared_release.lua`: `true` when the hold was still ours.
pub(crate) async fn shared_release(
    conn: &mut impl ConnectionLike,
    holders: &str,
    owner: &str,
    channel: &str,
) -> redis::RedisResult<bool> {
    let reply: i64 = SHARED_RELEASE.key(holders).arg(owner).arg(channel).invoke_async(conn).await?;
    match reply {
        0 => Ok(true),
        -2 => Ok(false),
        other => Err(unexpected("shared_release.lua", &[other])),
    }
}

/// The shared holds of `holders` whose lease has not ended
/// (`shared_count.lua`).
pub(crate) async fn shared_count(
    conn: &mut impl ConnectionLike,
    holders: &str,
) -> redis::RedisResult<u32> {
    SHARED_COUNT.key(holders).invoke_async(conn).await
}

/// Renews a shared hold (`shared_acquire.lua` "renew"):
/// [`ExtendReply::Extended`], or [`ExtendReply::Expired`] when its lease had
/// ended.
pub(crate) async fn shared_extend(
    conn: &mut impl ConnectionLike,
    holders: &str,
    owner: &str,
    lease_ms: u64,
) -> redis::RedisResult<ExtendReply> {
    let mut invocation = SHARED_ACQUIRE.key(holders);
    invocation.arg(lease_ms).arg(owner).arg(0).arg("renew");
    let reply: Vec<i64> = invocation.invoke_async(conn).await?;
    match reply.as_slice() {
        [1, ..] => Ok(ExtendReply::Extended),
        [-2, _] => Ok(ExtendReply::Expired),
        other => Err(unexpected("shared_acquire.lua", other)),
    }
}

/// Reply of `schedule_claim.lua`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeriodClaim {
    /// Acquired or held: the reply of a lock attempt.
    Lock(AcquireReply),
    /// The period (or a later one) is done; the last one done.
    Done(u64),
}

/// The last-period-done record of a periodic job: `<name>:done`.
pub(crate) fn period_done_key(name: &LockName) -> String {
    derived(name, "done")
}

pub(crate) async fn claim_period(
    conn: &mut impl ConnectionLike,
    name: &LockName,
    owner: &str,
    lease_ms: u64,
    period: u64,
) -> redis::RedisResult<PeriodClaim> {
    let mut invocation = PERIOD_CLAIM.key(name.key());
    invocation.key(name.fence_key()).key(period_done_key(name));
    invocation.arg(lease_ms).arg(owner).arg(period);
    let reply: Vec<i64> = invocation.invoke_async(conn).await?;
    match reply.as_slice() {
        [-1, done] => Ok(PeriodClaim::Done(u64::try_from(*done).unwrap_or(0))),
        other => acquire_reply("schedule_claim.lua", other).map(PeriodClaim::Lock),
    }
}

/// `schedule_done.lua`: [`ReleaseReply::Released`] once marked, or who holds
/// the lock instead.
pub(crate) async fn period_done(
    conn: &mut impl ConnectionLike,
    name: &LockName,
    owner: &str,
    period: u64,
) -> redis::RedisResult<ReleaseReply> {
    let mut invocation = PERIOD_DONE.key(name.key());
    invocation.key(period_done_key(name)).arg(owner).arg(period);
    let reply: i64 = invocation.invoke_async(conn).await?;
    match reply {
        0 => Ok(ReleaseReply::Released),
        -1 => Ok(ReleaseReply::NotOwner),
        -2 => Ok(ReleaseReply::Expired),
        other => Err(unexpected("schedule_done.lua", &[other])),
    }
}

fn unexpected(script: &'static str, reply: &[i64]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected lock script reply",
        format!("{script} returned {reply:?}"),
    ))
}
