//! `lock/setnx`: a plain string key, `SETNX` with no expiry, `DEL` to
//! release — generation 3.
//!
//! Fixes what `lock/local` breaks: the lock lives in Redis, so every instance
//! sees it. Breaks when a holder dies inside the critical section (a crash, a
//! kill, a deploy): nothing ever deletes its key, so the sale is stuck — every
//! later buyer times out and the remaining stock is never sold (undersell).
//! Adding `EXPIRE` in a second command does not help: a crash between the two
//! leaves the same immortal key (docs/locks.md, generation 3); that is what
//! generation 4 (`SET NX PX`, one command) fixes.

use std::time::Duration;

use async_trait::async_trait;
use redis::AsyncCommands;

use super::poll::poll;
use super::{Release, SaleLock, Shared};
use crate::backends::{RedisHandle, count_redis_round_trips, redis_error};
use crate::sale::Sale;
use crate::strategy::{
    Backend, Conditions, Expectation, Fault, KillTarget, Registration, StrategyError, StrategyName,
};

/// Wire name, and the `strategy` label of this variant's metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/setnx");

/// `lock/setnx` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the naive steps inside a Redis SETNX key with no expiry, DEL to release",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| Ok(Shared::of(deps).locked(NAME, SetnxLock::new(deps.redis.clone()))),
    expect,
    kill: KillTarget::LockHolder { key: KEY },
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

/// The sale's key after its hash tag (`RedisHandle::sale_key`).
const KEY: &str = "lock:setnx";

/// No expiry: exclusive while holders live. A killed holder's key stays
/// forever and the sale is stuck (undersold): with one instance the kill
/// waits for a moment it holds the lock ([`KillTarget::LockHolder`]), with
/// several the killed one holds it only by chance. A stopped holder resumes
/// and releases: a stall, not a break. A Redis restarted empty forgets the
/// key while its holder may still write. Cut off from Redis, an instance's
/// `SETNX` that its buyer gave up on can land after the partition heals and
/// take the key for nobody, forever.
fn expect(on: &Conditions) -> Expectation {
    match on.fault {
        Some(Fault::KillInstance) if on.instances > 1 => Expectation::MayBreak,
        Some(Fault::KillInstance) => Expectation::Breaks,
        Some(Fault::RedisRestart | Fault::PartitionRedis) => Expectation::MayBreak,
        _ => Expectation::Correct,
    }
}

pub struct SetnxLock {
    redis: RedisHandle,
}

/// Proof of holding a `lock/setnx` key.
pub struct SetnxHeld {
    key: String,
}

impl SetnxLock {
    pub fn new(redis: RedisHandle) -> Self {
        Self { redis }
    }

    /// The Redis key of `sale`'s lock.
    pub fn key(&self, sale: &Sale) -> String {
        self.redis.sale_key(sale.id.0, KEY)
    }
}

#[async_trait]
impl SaleLock for SetnxLock {
    type Held = SetnxHeld;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let key = self.key(sale);
        let conn = self.redis.conn().await?;
        poll(wait, || {
            let (key, mut conn) = (key.clone(), conn.clone());
            async move {
                count_redis_round_trips(NAME.as_str(), 1);
                let won: bool = conn.set_nx(&key, 1).await.map_err(redis_error)?;
                Ok(won.then_some(SetnxHeld { key }))
            }
        })
        .await
    }

    async fn release(&self, _sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        let mut conn = self.redis.conn().await?;
        count_redis_round_trips(NAME.as_str(), 1);
        let deleted: i64 = conn.del(&held.key).await.map_err(redis_error)?;
        Ok(if deleted == 1 { Release::Released } else { Release::NotHeld })
    }
}
