//! `lock/<variant>`: the naive read-check-write ([`naive::read_check_write`])
//! run inside a lock, one variant per historical generation of the Redis lock
//! and then past them (`docs/locks.md` tells each one's failure timeline).
//!
//! | variant | lock | what still breaks |
//! |---|---|---|
//! | `lock/local` | in-process mutex per sale | a second instance |
//! | `lock/setnx` | `SETNX`, no expiry, `DEL` | a holder that dies: the sale is stuck |
//! | `lock/ttl` | `SET NX PX`, blind `DEL` | a holder past its lease: two holders, wrong deletes |
//! | `lock/token` | `SET NX PX` + owner token, Lua compare-and-delete | a holder past its lease: two holders |
//! | `lock/watchdog` | `redis_lock`, renewed, loss signalled | a whole-process pause (SIGSTOP, GC) past the lease |
//! | `lock/fenced` | `lock/watchdog` + fencing token checked by Postgres | nothing known: stale writes are refused |
//! | `lock/fair` | `lock/fenced` through the library's fair lock: waiters served in arrival order | nothing known (the fence, as `lock/fenced`) |
//! | `lock/redlock` | `redis_lock` over N nodes + the same fencing | nothing known (fencing, not Redlock, keeps it safe) |
//!
//! Every variant shares the same driver ([`Locked`]): answer `SoldOut` at once
//! when this process knows the sale is sold out; wait at most
//! `SECKILL_LOCK_WAIT_MS` for the lock (then `busy`, counted in
//! `seckill_lock_timeouts_total`); for fenced variants, claim the sale with a
//! fencing token ([`fence`]); run the critical section, for at most
//! `SECKILL_LOCK_HOLD_MS`; release; record the critical section's interval
//! ([`intervals`]) for `max_concurrency`. A write refused by the fence or by
//! a lost lock, and a critical section cut off at its bound, are answered
//! `busy` (the client retries) and counted.
//!
//! A cut-off section is dropped where it stands. Its write is one statement
//! (stock and order together), so nothing is ever half-written; but a write
//! already sent may still commit after the release, when Postgres gets to
//! it. Behind the fence that late write is refused or ordered before the
//! next holder's read (the next claim waits for its share lock on the claim
//! row); the unfenced variants have no such protection, as for any holder
//! that outlives its lock.
//!
//! The hold — acquire, critical section, release — runs in its own task, so a
//! client that hangs up mid-purchase cannot abandon a held lock.
//!
//! Returns (a cancelled or expired order's units) take no lock: they add to
//! `sales.returned_stock` in the order's claim transaction, and the next
//! holder's read counts the returns it has not folded yet and its write
//! folds them in (`migrations/20261230000001_lock_returns.sql`, `naive::ForSale`). A
//! return therefore never queues behind the sale's buyers: a cancel is
//! answered, and the expiry sweep returns a due order, whatever holds or
//! waits for the lock — within one sweep period after the window closes.
//! Taking the lock for a return, as a purchase does, made the sweep queue
//! behind every buyer of a busy sale and time out on every pass.
//!
//! Each variant registers on its own line (`REGISTRATION` in its file; the
//! library lock's file registers `lock/watchdog` and `lock/fenced`); the
//! variants of one process share one [`Shared`] — sold-out flags and the
//! critical-section recorder — and one route, `GET
//! /admin/sales/{id}/lock-stats` ([`routes`]).
//!
//! A lock is the last resort for a flash sale: a conditional `UPDATE` (`sql`),
//! an atomic Redis command or a queue avoid the critical section altogether.
//! These variants exist to measure what the lock costs and where it breaks.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::naive::{self, Attempt, WriteGuard};
use super::{
    Claim, Conditions, Deps, Expectation, Fault, Outcome, Returned, Strategy, StrategyError,
    StrategyName, StrategyRoutes, serial,
};
use crate::bounds::MAX_MS;
use crate::sale::{Quantity, Sale, SaleId, UserId};

/// `SECKILL_LOCK_REDLOCK_URLS`: the Redis nodes of `lock/redlock`.
pub const REDLOCK_URLS_ENV: &str = "SECKILL_LOCK_REDLOCK_URLS";

/// Settings of the `lock/*` strategies (`SECKILL_LOCK_*`), their part of
/// `crate::strategy::StrategySettings`.
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "Strategies lock/*")]
#[group(id = "lock/*")]
pub struct Settings {
    /// How long a `lock/*` purchase waits for its sale's lock before it is
    /// answered 503 `busy`, in milliseconds.
    #[arg(
        id = "LOCK_WAIT_MS",
        long = "lock-wait-ms",
        env = "SECKILL_LOCK_WAIT_MS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub wait_ms: u64,

    /// How long a `lock/*` purchase may hold its sale's lock, in
    /// milliseconds: its critical section is cut off after this and answered
    /// 503 `busy`, and the library locks' watchdog stops renewing there
    /// (`max_hold`). The default is the default pool wait: a section that
    /// spent that long is hung or overloaded either way, and with the
    /// default lock wait (1 s) and release (at most 1 s) the purchase is
    /// answered well within the request timeout (10 s), by the lock's `busy`
    /// rather than a `504`. Keep wait + hold + 1 s under the request
    /// timeout.
    #[arg(
        id = "LOCK_HOLD_MS",
        long = "lock-hold-ms",
        env = "SECKILL_LOCK_HOLD_MS",
        default_value_t = 5_000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub hold_ms: u64,

    /// Milliseconds a critical section stays in `lock_intervals` (what
    /// `GET /admin/sales/{id}/lock-stats` reads) after it ended; older ones
    /// are deleted about once a minute, so the table does not grow forever.
    /// Default: 1 day; from 1 minute to 365 days.
    #[arg(
        id = "LOCK_INTERVALS_RETENTION_MS",
        long = "lock-intervals-retention-ms",
        env = "SECKILL_LOCK_INTERVALS_RETENTION_MS",
        default_value_t = 86_400_000,
        value_parser = clap::value_parser!(u64).range(60_000..=31_536_000_000)
    )]
    pub intervals_retention_ms: u64,

    /// `lock/redlock`: independent Redis nodes, comma-separated
    /// (quorum = N/2 + 1): plain `redis://` masters, never a cluster (a
    /// `redis+cluster://` URL is refused; `REDIS_URL` may still be one).
    #[arg(
        id = "LOCK_REDLOCK_URLS",
        long = "lock-redlock-urls",
        env = REDLOCK_URLS_ENV,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:6380,redis://127.0.0.1:6381,redis://127.0.0.1:6382",
        hide_env_values = true
    )]
    pub redlock_urls: Vec<String>,
}

impl Settings {
    /// `SECKILL_LOCK_WAIT_MS`.
    pub fn wait(&self) -> Duration {
        Duration::from_millis(self.wait_ms)
    }

    /// `SECKILL_LOCK_HOLD_MS`.
    pub fn hold(&self) -> Duration {
        Duration::from_millis(self.hold_ms)
    }
}

impl std::fmt::Debug for Settings {
    /// Leaves the Redlock URLs out (they may hold passwords).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("lock::Settings")
            .field("wait_ms", &self.wait_ms)
            .field("hold_ms", &self.hold_ms)
            .field("intervals_retention_ms", &self.intervals_retention_ms)
            .finish_non_exhaustive()
    }
}

pub mod fence;
pub mod intervals;
pub mod library_fair;
pub mod library_lock;
pub mod library_redlock;
mod poll;
pub mod process_mutex;
mod routes;
pub mod setnx;
pub mod sold_out_epochs;
pub mod token;
pub mod ttl;

use intervals::Intervals;
use sold_out_epochs::SoldOutFlags;

/// `Retry-After` of a `busy` answer from a lock strategy.
pub const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The lock of one variant, as [`Locked`] drives it.
#[async_trait]
pub trait SaleLock: Send + Sync + 'static {
    /// Proof of holding the lock of one sale.
    type Held: Send + Sync + 'static;

    /// Takes the lock of `sale` (lease `sale.knobs.lock_lease_ms` where the
    /// variant has one), waiting at most `wait`. `Ok(None)` when the wait ran
    /// out. Errors: the lock's server is unavailable.
    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError>;

    /// The holder's loss signal, for the variants that have one: cancelled
    /// once a watchdog failed to renew, or found another owner. `None`: the
    /// variant cannot tell.
    fn lost<'a>(&self, _held: &'a Self::Held) -> Option<&'a CancellationToken> {
        None
    }

    /// Whether the holder still holds the lock as far as it can tell
    /// ([`lost`](Self::lost) has not fired); variants without a loss signal
    /// say yes.
    fn still_held(&self, held: &Self::Held) -> bool {
        self.lost(held).is_none_or(|lost| !lost.is_cancelled())
    }

    /// Gives the lock back.
    async fn release(&self, sale: &Sale, held: Self::Held) -> Result<Release, StrategyError>;
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// A lock was released (for `lock/ttl`'s blind `DEL`: *a* key was deleted,
    /// perhaps the next holder's).
    Released,
    /// The lock was no longer ours: the lease ran out first.
    NotHeld,
}

/// The expectation of a lease lock without renewal (`lock/ttl`, and
/// `lock/token`, whose owner token makes the release safe but not a write
/// after the lease): a stall past the lease lets a second holder enter while
/// the first still writes. A stopped instance is such a stall when it stops
/// inside the critical section, a slow Postgres makes every section one
/// while it lasts, and a Redis restarted empty forgets every lock: each may
/// let a second holder in. A killed holder's lease expires; a holder cut
/// off from Redis needs only Postgres to finish its section.
pub(crate) fn stalls_outlive_the_lease(on: &Conditions) -> Expectation {
    if on.stalls_past_lease {
        return Expectation::Breaks;
    }
    match on.fault {
        Some(Fault::PauseInstance | Fault::RedisRestart | Fault::SlowPostgres) => {
            Expectation::MayBreak
        }
        _ => Expectation::Correct,
    }
}

/// The lease of `sale`'s lock, milliseconds (`sales.lock_lease_ms`, > 0).
pub(crate) fn lease(sale: &Sale) -> u64 {
    u64::try_from(sale.knobs.lock_lease_ms).unwrap_or(1).max(1)
}

/// State shared by every lock strategy of one process.
pub struct Shared {
    db: PgPool,
    wait: Duration,
    hold: Duration,
    sold_out: SoldOutFlags,
    intervals: Arc<Intervals>,
}

impl Shared {
    /// `wait`: how long a purchase waits for a lock (`SECKILL_LOCK_WAIT_MS`);
    /// `hold`: how long its critical section may run (`SECKILL_LOCK_HOLD_MS`);
    /// `retention`: how long critical sections stay in `lock_intervals`.
    pub fn new(db: PgPool, wait: Duration, hold: Duration, retention: Duration) -> Arc<Self> {
        // The strategies register their counters at zero when built, which
        // only sticks once the process's recorder exists.
        crate::telemetry::metrics_handle();
        Arc::new(Self {
            intervals: Intervals::new(db.clone(), retention),
            db,
            wait,
            hold,
            sold_out: SoldOutFlags::default(),
        })
    }

    /// The `Shared` of the process `deps` belong to, made for the first
    /// variant built.
    pub fn of(deps: &Deps) -> Arc<Self> {
        let settings = &deps.settings.lock;
        deps.shared(|| {
            let retention = Duration::from_millis(settings.intervals_retention_ms);
            Shared::new(deps.db.clone(), settings.wait(), settings.hold(), retention)
        })
    }

    /// The strategy `name`: the naive steps inside `lock`, unfenced.
    pub fn locked<L: SaleLock>(self: &Arc<Self>, name: StrategyName, lock: L) -> Arc<Locked<L>> {
        Arc::new(Locked::new(name, lock, false, self.clone()))
    }

    /// The strategy `name`: the naive steps inside `lock`, behind the fence.
    pub fn fenced<L: SaleLock>(self: &Arc<Self>, name: StrategyName, lock: L) -> Arc<Locked<L>> {
        Arc::new(Locked::new(name, lock, true, self.clone()))
    }

    /// The critical-section recorder of this process.
    pub fn intervals(&self) -> &Intervals {
        &self.intervals
    }
}

/// A lock strategy: the naive steps inside `L`, optionally fenced.
pub struct Locked<L> {
    inner: Arc<Inner<L>>,
}

struct Inner<L> {
    name: StrategyName,
    lock: L,
    /// Claim the sale with a fencing token and let Postgres refuse stale writes.
    fenced: bool,
    shared: Arc<Shared>,
}

impl<L: SaleLock> Locked<L> {
    pub fn new(name: StrategyName, lock: L, fenced: bool, shared: Arc<Shared>) -> Self {
        // Registered at zero so that /metrics lists them before the first event.
        for counter in [TIMEOUTS, FENCE_REJECTIONS, LOSSES, HOLD_TIMEOUTS, RENEWALS] {
            metrics::counter!(counter, "strategy" => name.as_str()).increment(0);
        }
        crate::backends::count_redis_round_trips(name.as_str(), 0);
        Self { inner: Arc::new(Inner { name, lock, fenced, shared }) }
    }

    /// The variant's lock, for tests that drive it directly.
    pub fn lock(&self) -> &L {
        &self.inner.lock
    }
}

/// `seckill_lock_timeouts_total{strategy}`: lock waits that ran out (`busy`).
pub const TIMEOUTS: &str = crate::metric_names::LOCK_TIMEOUTS_TOTAL;
/// `seckill_fence_rejections_total{strategy}`: claims and writes refused by the
/// fence (`busy`).
pub const FENCE_REJECTIONS: &str = crate::metric_names::FENCE_REJECTIONS_TOTAL;
/// `seckill_lock_losses_total{strategy}`: writes abandoned because the holder
/// learnt (from its watchdog) that it had lost the lock (`busy`).
pub const LOSSES: &str = crate::metric_names::LOCK_LOSSES_TOTAL;
/// `seckill_lock_hold_timeouts_total{strategy}`: critical sections cut off at
/// `SECKILL_LOCK_HOLD_MS` (`busy`).
pub const HOLD_TIMEOUTS: &str = crate::metric_names::LOCK_HOLD_TIMEOUTS_TOTAL;
/// `seckill_lock_renewals_total{strategy}`: successful watchdog renewals,
/// counted when the lock is released.
pub const RENEWALS: &str = crate::metric_names::LOCK_RENEWALS_TOTAL;

/// Adds `renewals` to [`RENEWALS`] for `strategy`.
pub(crate) fn count_renewals(strategy: StrategyName, renewals: u64) {
    metrics::counter!(RENEWALS, "strategy" => strategy.as_str()).increment(renewals);
}

/// Why the critical section wrote nothing (or, cut off, may not have).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The fence: a higher token claimed the sale.
    Fenced,
    /// The watchdog reported the lock lost.
    Lost,
    /// It ran for `SECKILL_LOCK_HOLD_MS` and was cut off.
    TooLong,
}

impl Refusal {
    /// Its counter, and the reason given with `busy`.
    fn told(self) -> (&'static str, &'static str) {
        match self {
            Refusal::Fenced => (FENCE_REJECTIONS, "a newer lock holder fenced this one off"),
            Refusal::Lost => (LOSSES, "the sale's lock was lost before the write"),
            Refusal::TooLong => {
                (HOLD_TIMEOUTS, "the purchase held the sale's lock for SECKILL_LOCK_HOLD_MS")
            }
        }
    }
}

#[async_trait]
impl<L: SaleLock> Strategy for Locked<L> {
    async fn purchase(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let Some(epoch) = self.inner.shared.sold_out.open(sale.id) else {
            return Ok(Outcome::SoldOut);
        };
        let inner = self.inner.clone();
        let sale = sale.clone();
        let outcome = tokio::spawn(async move {
            let outcome = inner.hold(&sale, user, quantity).await?;
            if outcome == Outcome::SoldOut && quantity == Quantity::ONE {
                inner.shared.sold_out.mark(sale.id, epoch);
            }
            Ok(outcome)
        });
        outcome.await.map_err(|err| StrategyError::Internal(err.into()))?
    }

    async fn restocked(&self, sale: &Sale, _units: i64) -> Result<(), StrategyError> {
        self.inner.shared.sold_out.clear(sale.id);
        Ok(())
    }

    fn returns_units(&self) -> bool {
        true
    }

    /// The units go onto `sales.returned_stock`, in the claim's transaction
    /// and without the sale's lock ([`RETURN`]); the next holder's read
    /// counts them and its write folds them in (`naive::ForSale`). A return
    /// never waits for the lock, so it does not queue behind the sale's
    /// buyers: it waits at most for the one write in progress on the sale row.
    /// Like a restock, the return clears this process's sold-out flag; other
    /// instances re-check theirs within `SOLD_OUT_TRUST`.
    async fn return_units(&self, sale: &Sale, mut claim: Claim) -> Result<Returned, StrategyError> {
        sqlx::query(RETURN).bind(sale.id.0).bind(claim.units()).execute(claim.conn()).await?;
        let returned = claim.end().await?;
        self.inner.shared.sold_out.clear(sale.id);
        Ok(returned)
    }

    /// `lock-stats`, the same route for every variant (mounted once).
    fn routes(self: Arc<Self>, deps: &Deps) -> Option<StrategyRoutes> {
        Some(routes::routes(self.inner.shared.clone(), deps.catalog.clone()))
    }
}

impl<L: SaleLock> Inner<L> {
    /// Acquire, critical section, release, record.
    async fn hold(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
    ) -> Result<Outcome, StrategyError> {
        let strategy = self.name.as_str();
        let Some(held) = self.lock.acquire(sale, self.shared.wait).await? else {
            metrics::counter!(TIMEOUTS, "strategy" => strategy).increment(1);
            return Err(StrategyError::Busy {
                reason: "timed out waiting for the sale's lock",
                retry_after: BUSY_RETRY_AFTER,
            });
        };
        let started_at = Utc::now();
        let hold = serial::Hold::start(self.name);
        let section = self.critical_section(sale, user, quantity, &held);
        let attempt = tokio::time::timeout(self.shared.hold, section)
            .await
            .unwrap_or(Ok(Err(Refusal::TooLong)));
        let ended_at = Utc::now();
        let released = self.lock.release(sale, held).await;
        let sold = match &attempt {
            Ok(Ok(Outcome::Placed { quantity, .. })) => *quantity as u64,
            _ => 0,
        };
        hold.end(sold);
        self.shared.intervals.record(sale.id, started_at, ended_at);
        match released {
            Ok(Release::Released) => {}
            Ok(Release::NotHeld) => {
                tracing::debug!(strategy, sale_id = sale.id.0, "released a lock that had expired")
            }
            // The lease (if any) frees it; the purchase's outcome stands.
            Err(err) => tracing::warn!(strategy, error = %err, "releasing a lock failed"),
        }
        match attempt? {
            Ok(outcome) => Ok(outcome),
            Err(refusal) => {
                let (counter, reason) = refusal.told();
                metrics::counter!(counter, "strategy" => strategy).increment(1);
                Err(StrategyError::Busy { reason, retry_after: BUSY_RETRY_AFTER })
            }
        }
    }

    /// The naive steps, behind the fence when the variant is fenced.
    async fn critical_section(
        &self,
        sale: &Sale,
        user: UserId,
        quantity: Quantity,
        held: &L::Held,
    ) -> Result<Result<Outcome, Refusal>, StrategyError> {
        let claim = if self.fenced {
            match fence::claim(&self.shared.db, sale.id).await? {
                Some(token) => Some(token),
                None => return Ok(Err(Refusal::Fenced)),
            }
        } else {
            None
        };
        let guard =
            HolderGuard { lock: &self.lock, held, sale: sale.id, claim, refusal: OnceLock::new() };
        match naive::read_check_write(&self.shared.db, sale, user, quantity, &guard).await? {
            Attempt::Done(outcome) => Ok(Ok(outcome)),
            // Not refused by the holder itself: the write statement's fence.
            Attempt::Refused => Ok(Err(guard.refusal.get().copied().unwrap_or(Refusal::Fenced))),
        }
    }
}

/// `$1` sale id, `$2` units. The units of an ended order, added to the
/// returns the next holder folds in: a relative update of a column no holder
/// writes absolutely, so neither a holder that read before it nor a stale
/// holder (unfenced variants) can undo it. No fence: a return is not a
/// decision taken from a read.
const RETURN: &str = "UPDATE sales SET returned_stock = returned_stock + $2 WHERE id = $1";

/// How a holder stopped at the failpoint `lock/before-write`
/// ([`crate::failpoints::LOCK_BEFORE_WRITE`]) goes on.
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeWrite {
    /// Checks its loss signal as usual.
    Check,
    /// Skips that check, as a holder that has not heard of its loss yet:
    /// only the fence can refuse its write.
    AsIfStillHeld,
    /// Waits for its loss signal first (no wait for a variant without one).
    OnceLost,
}

/// The last check before the write: the holder still believes it holds the
/// lock, and (fenced variants) its claim still stands, which the write
/// statement checks.
struct HolderGuard<'a, L: SaleLock> {
    lock: &'a L,
    held: &'a L::Held,
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    sale: SaleId,
    claim: Option<fence::FenceToken>,
    refusal: OnceLock<Refusal>,
}

#[async_trait]
impl<L: SaleLock> WriteGuard for HolderGuard<'_, L> {
    async fn admits(&self) -> bool {
        #[cfg(feature = "failpoints")]
        match crate::failpoints::reached(&crate::failpoints::LOCK_BEFORE_WRITE, self.sale.0).await {
            Some(BeforeWrite::AsIfStillHeld) => return true,
            Some(BeforeWrite::OnceLost) => {
                if let Some(lost) = self.lock.lost(self.held) {
                    lost.cancelled().await;
                }
            }
            Some(BeforeWrite::Check) | None => {}
        }
        let still_held = self.lock.still_held(self.held);
        if !still_held {
            let _ = self.refusal.set(Refusal::Lost);
        }
        still_held
    }

    fn fence(&self) -> Option<fence::FenceToken> {
        self.claim
    }
}
