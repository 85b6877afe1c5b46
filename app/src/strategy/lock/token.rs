//! `lock/token`: a plain string key holding a random owner token,
//! `SET NX PX <lease>`, released by a Lua compare-and-delete — generation 5.
//!
//! Fixes the wrong delete of `lock/ttl`: a holder that outlived its lease finds
//! someone else's token (or nothing) and leaves the key alone. Still breaks
//! like `lock/ttl` while the late holder works: after the lease, two holders
//! run the read-check-write side by side. Knowing the token does not help the
//! late holder, who does not check it before writing — and any check would
//! race the write anyway; only the store can refuse it (fencing).

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{AsyncCommands, ExistenceCheck, Script, SetExpiry, SetOptions};

use super::poll::poll;
use super::{Release, SaleLock, Shared, lease};
use crate::backends::{RedisHandle, count_redis_round_trips, redis_error};
use crate::sale::Sale;
use crate::strategy::{Backend, KillTarget, Registration, StrategyError, StrategyName};

/// Wire name, and the `strategy` label of this variant's metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/token");

/// `lock/token` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the naive steps inside SET NX PX with an owner token and a Lua compare-and-delete",
    needs: &[Backend::Postgres, Backend::Redis],
    build: |deps| Ok(Shared::of(deps).locked(NAME, TokenLock::new(deps.redis.clone()))),
    expect: super::stalls_outlive_the_lease,
    kill: KillTarget::LockHolder { key: KEY },
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

/// The sale's key after its hash tag (`RedisHandle::sale_key`).
const KEY: &str = "lock:token";

/// See `token_release.lua` for KEYS, ARGV and results.
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("token_release.lua")));

pub struct TokenLock {
    redis: RedisHandle,
}

/// Proof of having taken a `lock/token` key with `token`.
pub struct TokenHeld {
    key: String,
    /// 128 random bits, hex: unique to this acquisition.
    token: String,
}

impl TokenLock {
    pub fn new(redis: RedisHandle) -> Self {
        Self { redis }
    }

    /// The Redis key of `sale`'s lock.
    pub fn key(&self, sale: &Sale) -> String {
        self.redis.sale_key(sale.id.0, KEY)
    }
}

#[async_trait]
impl SaleLock for TokenLock {
    type Held = TokenHeld;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let key = self.key(sale);
        let token = format!("{:032x}", rand::random::<u128>());
        let conn = self.redis.conn().await?;
        let options = SetOptions::default()
            .conditional_set(ExistenceCheck::NX)
            .with_expiration(SetExpiry::PX(lease(sale)));
        poll(wait, || {
            let (key, token, options, mut conn) =
                (key.clone(), token.clone(), options.clone(), conn.clone());
            async move {
                count_redis_round_trips(NAME.as_str(), 1);
                let set: Option<String> =
                    conn.set_options(&key, &token, options).await.map_err(redis_error)?;
                Ok(set.map(|_| TokenHeld { key, token }))
            }
        })
        .await
    }

    /// `Released` when the key still held our token; `NotHeld` when the lease
    /// had run out (the key is then left to whoever holds it).
    async fn release(&self, _sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        let mut conn = self.redis.conn().await?;
        count_redis_round_trips(NAME.as_str(), 1);
        let deleted: i64 = RELEASE
            .key(&held.key)
            .arg(&held.token)
            .invoke_async(&mut conn)
            .await
            .map_err(redis_error)?;
        Ok(if deleted == 1 { Release::Released } else { Release::NotHeld })
    }
}
