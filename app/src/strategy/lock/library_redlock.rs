//! `lock/redlock`: the library's Redlock over N independent Redis nodes
//! (`SECKILL_LOCK_REDLOCK_URLS`), renewed by its watchdog, and fenced by Postgres exactly
//! like `lock/fenced`.
//!
//! Redlock survives the loss of a minority of nodes, which a single Redis
//! cannot. It is an efficiency lock, not a correctness guarantee: an early
//! expiry on one node (a clock jump, an eviction) or a node that restarts
//! empty can give a second client a majority while the first still works
//! (`docs/locks.md`, T4 and T5), and Redlock has no fencing token of its own.
//! The strategy therefore takes its tokens from the Postgres sequence of
//! `super::fence`, independent of the nodes, and lets Postgres refuse stale
//! writes.
//!
//! Leases too short to leave validity after the per-node timeout (50 ms) and
//! the drift allowance are raised to [`MIN_REDLOCK_LEASE`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_trait::async_trait;
use redis_lock::{CLUSTER_SCHEME, LockError, LockOptions, Redlock, RedlockConfig, RedlockGuard};

use tokio_util::sync::CancellationToken;

use super::library_lock::{lock_error, sale_lock_name};
use super::{Release, SaleLock, Shared, lease};
use crate::backends::count_redis_round_trips;
use crate::sale::Sale;
use crate::strategy::{Backend, Registration, StrategyError, StrategyName};

/// Wire name, and the `strategy` label of this variant's metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/redlock");

/// `lock/redlock` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "Redlock over the independent Redis nodes of SECKILL_LOCK_REDLOCK_URLS, renewed and fenced",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| {
        let (urls, hold) = (&deps.settings.lock.redlock_urls, deps.settings.lock.hold());
        let lock = RedlockLock::new(urls, &deps.redis.prefix, NAME, hold)?;
        Ok(Shared::of(deps).fenced(NAME, lock))
    },
    // Expected correct everywhere (the default): a quorum of nodes, renewed
    // and fenced like `lock/fenced`.
    takes_a_lock: true,
    redlock_nodes: true,
    ..Registration::DEFAULTS
};

/// The shortest lease used: twice the default per-node timeout (50 ms) plus
/// the drift allowance, so an acquisition always has validity left.
pub const MIN_REDLOCK_LEASE: Duration = Duration::from_millis(120);

pub struct RedlockLock {
    redlock: Redlock,
    prefix: String,
    strategy: StrategyName,
    max_hold: Duration,
}

impl RedlockLock {
    /// A Redlock over `urls` (each `redis://host:port`), key namespace
    /// `prefix`, counting round trips (one per node contacted) for `strategy`,
    /// renewed for at most `max_hold` (`SECKILL_LOCK_HOLD_MS`) per hold.
    ///
    /// Errors: a malformed URL, a Redis Cluster URL (`redis+cluster://`: its
    /// masters are not independent nodes, each owns only its slots), no
    /// node, or more than the library accepts. `REDIS_URL` may name a cluster
    /// all the same: this strategy does not use it.
    pub fn new(
        urls: &[String],
        prefix: &str,
        strategy: StrategyName,
        max_hold: Duration,
    ) -> anyhow::Result<Self> {
        if let Some(url) = urls.iter().find(|url| url.trim().starts_with(CLUSTER_SCHEME)) {
            anyhow::bail!(
                "SECKILL_LOCK_REDLOCK_URLS: {} names a Redis Cluster; Redlock needs independent masters, each \
                 a plain redis:// URL (a cluster's master owns only its own slots)",
                crate::backends::redacted(url)
            );
        }
        let nodes = urls
            .iter()
            .map(|url| {
                redis::Client::open(url.trim()).with_context(|| {
                    format!("SECKILL_LOCK_REDLOCK_URLS: {}", crate::backends::redacted(url))
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let config = RedlockConfig {
            on_round_trip: Some(Arc::new(move |n| count_redis_round_trips(strategy.as_str(), n))),
            ..RedlockConfig::default()
        };
        let redlock = Redlock::new(nodes, config).context("SECKILL_LOCK_REDLOCK_URLS")?;
        Ok(Self { redlock, prefix: prefix.to_owned(), strategy, max_hold })
    }

    /// The underlying Redlock (tests drive it directly).
    pub fn redlock(&self) -> &Redlock {
        &self.redlock
    }
}

#[async_trait]
impl SaleLock for RedlockLock {
    type Held = RedlockGuard;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let name = sale_lock_name(&self.prefix, sale)?;
        let lease = Duration::from_millis(lease(sale)).max(MIN_REDLOCK_LEASE);
        let options = LockOptions::new(wait, lease).with_watchdog().with_max_hold(self.max_hold);
        match self.redlock.try_lock(&name, options).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(err) => Err(lock_error(err)),
        }
    }

    fn lost<'a>(&self, held: &'a Self::Held) -> Option<&'a CancellationToken> {
        Some(held.lost())
    }

    async fn release(&self, _sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        super::count_renewals(self.strategy, held.renewals());
        let quorum = self.redlock.quorum();
        let summary = held.release().await;
        Ok(if summary.held_to_the_end(quorum) { Release::Released } else { Release::NotHeld })
    }
}
