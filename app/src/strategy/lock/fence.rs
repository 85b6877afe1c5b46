//! Fencing tokens checked by Postgres across the whole read-modify-write
//! (Kleppmann, "How to do distributed locking", 2016; `docs/locks.md`).
//!
//! A lease lock cannot stop a holder that was paused past its lease from
//! writing afterwards: when it resumes it does not know it lost the lock. So
//! the stock itself refuses stale writers:
//!
//! 1. [`claim`]: right after acquiring the lock, the holder takes a fresh
//!    token from the Postgres sequence `lock_fencing_tokens` and records it in
//!    `sale_fences` — unless a higher token has already claimed the sale
//!    (then the holder is stale before it even starts). The claim commits at
//!    once, so every later writer sees it.
//! 2. The holder reads the stock (after its claim).
//! 3. The write statement itself (`naive::read_check_write` with a
//!    [`FenceGuard`]) applies only while the sale is still claimed by *its*
//!    token, and keeps a share lock on the claim row until it commits.
//!
//! Tokens only grow, so "still claimed by my token" means no one claimed the
//! sale between my claim and my commit — hence no one wrote it between my
//! read and my write, whatever the lock did. A claim that races a write waits
//! for the writer's share lock, then reads after the writer's commit. The lock
//! only keeps the rejections rare; the safety is Postgres's.
//!
//! Why a Postgres sequence, not the lock's own Redis counter: a Redis that
//! keeps nothing on disk forgets its counter when it restarts and would hand
//! out tokens below the one already claimed, freezing the sale until the
//! counter caught up. The sequence is as durable as the stock it guards, and
//! reading it inside the claim costs no extra round trip. It is also
//! independent of the Redis nodes, which Redlock (no token facility) needs.

use async_trait::async_trait;
use sqlx::PgPool;

use crate::sale::SaleId;
use crate::strategy::StrategyError;
use crate::strategy::naive::WriteGuard;

/// A fencing token: strictly greater than every token issued before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FenceToken(pub i64);

/// Claims `sale` with a fresh token. `Ok(None)` when a higher token has
/// already claimed it (a concurrent holder that took its token later but
/// claimed first). Errors are Postgres errors.
pub async fn claim(db: &PgPool, sale: SaleId) -> Result<Option<FenceToken>, StrategyError> {
    let token = sqlx::query_scalar::<_, i64>(
        "INSERT INTO sale_fences (sale_id, token) VALUES ($1, nextval('lock_fencing_tokens'))
         ON CONFLICT (sale_id) DO UPDATE
             SET token = excluded.token, claimed_at = clock_timestamp()
             WHERE sale_fences.token < excluded.token
         RETURNING token",
    )
    .bind(sale.0)
    .fetch_optional(db)
    .await?;
    Ok(token.map(FenceToken))
}

/// A [`WriteGuard`] whose write applies only while `token`'s claim on the
/// sale still stands (checked by Postgres in the write statement).
pub struct FenceGuard {
    pub token: FenceToken,
}

#[async_trait]
impl WriteGuard for FenceGuard {
    async fn admits(&self) -> bool {
        true
    }

    fn fence(&self) -> Option<FenceToken> {
        Some(self.token)
    }
}
