//! `lock/ttl`: a plain string key, `SET NX PX <lease>` in one command,
//! released with a blind `DEL` — generation 4.
//!
//! Fixes what `lock/setnx` breaks: a dead holder's key expires after the
//! lease, so the sale recovers by itself. Breaks when a *live* holder outlives
//! its lease (slow work, a stall, a GC pause): the key expires, a second buyer
//! takes the lock and both run the read-check-write side by side (lost
//! updates, oversell). Worse, the first holder's late `DEL` deletes the
//! *second* holder's key — the lock has no idea whose key it deletes — and
//! lets a third in (docs/locks.md, generation 4). Generation 5 (`lock/token`)
//! fixes the wrong delete; only fencing fixes the side-by-side writes.

use std::time::Duration;

use async_trait::async_trait;
use redis::{AsyncCommands, ExistenceCheck, SetExpiry, SetOptions};

use super::poll::poll;
use super::{Release, SaleLock, Shared, lease};
use crate::backends::{RedisHandle, count_redis_round_trips, redis_error};
use crate::sale::Sale;
use crate::strategy::{
    Backend, Expectation, Fault, KillTarget, Registration, StrategyError, StrategyName,
};

/// Wire name, and the `strategy` label of this variant's metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/ttl");

/// `lock/ttl` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the naive steps inside a Redis SET NX PX key, released by a blind DEL",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| Ok(Shared::of(deps).locked(NAME, TtlLock::new(deps.redis.clone()))),
    // Besides the stalls of every lease lock: a holder cut off from Redis
    // finishes its section, and its blind `DEL`, held by the partition,
    // lands after the lease ran out and deletes the next holder's key.
    expect: |on| match on.fault {
        Some(Fault::PartitionRedis) => Expectation::MayBreak,
        _ => super::stalls_outlive_the_lease(on),
    },
    kill: KillTarget::LockHolder { key: KEY },
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

/// The sale's key after its hash tag (`RedisHandle::sale_key`).
const KEY: &str = "lock:ttl";

pub struct TtlLock {
    redis: RedisHandle,
}

/// Proof of having taken a `lock/ttl` key (which may have expired since).
pub struct TtlHeld {
    key: String,
}

impl TtlLock {
    pub fn new(redis: RedisHandle) -> Self {
        Self { redis }
    }

    /// The Redis key of `sale`'s lock.
    pub fn key(&self, sale: &Sale) -> String {
        self.redis.sale_key(sale.id.0, KEY)
    }
}

#[async_trait]
impl SaleLock for TtlLock {
    type Held = TtlHeld;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let key = self.key(sale);
        let conn = self.redis.conn().await?;
        let options = SetOptions::default()
            .conditional_set(ExistenceCheck::NX)
            .with_expiration(SetExpiry::PX(lease(sale)));
        poll(wait, || {
            let (key, options, mut conn) = (key.clone(), options.clone(), conn.clone());
            async move {
                count_redis_round_trips(NAME.as_str(), 1);
                let set: Option<String> =
                    conn.set_options(&key, 1, options).await.map_err(redis_error)?;
                Ok(set.map(|_| TtlHeld { key }))
            }
        })
        .await
    }

    /// Deletes the key, whoever holds it now: `Released` whenever a key was
    /// deleted — possibly the next holder's.
    async fn release(&self, _sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        let mut conn = self.redis.conn().await?;
        count_redis_round_trips(NAME.as_str(), 1);
        let deleted: i64 = conn.del(&held.key).await.map_err(redis_error)?;
        Ok(if deleted == 1 { Release::Released } else { Release::NotHeld })
    }
}
