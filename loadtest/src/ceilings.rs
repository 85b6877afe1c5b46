//! Ceilings of this machine, measured in the same invocation as the runs so
//! that each strategy is judged as a ratio to what the hardware allowed right
//! then (figures on a shared 2-core machine move by ±20 % between runs).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use seckill::sale::{Quantity, SaleId, UserId};
use seckill::strategy::{Outcome, sql::take_and_order};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;

/// `http_rps`: a trivial endpoint under the same goose settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HttpCeiling {
    pub value: f64,
    pub users: u64,
    pub instances: usize,
    pub duration_s: f64,
}

/// `sql_tps`: the `sql` strategy's transaction issued directly through sqlx.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SqlCeiling {
    pub value: f64,
    pub connections: u32,
    pub duration_s: f64,
}

/// `redis_ops`: `DECR` on one key, at the same concurrency as the goose users.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RedisCeiling {
    pub value: f64,
    pub clients: u64,
    pub duration_s: f64,
}

/// `amqp_rps`: persistent publishes with confirms into a quorum queue, at
/// the goose users' concurrency, consumed and acknowledged meanwhile.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AmqpCeiling {
    /// Messages consumed per second.
    pub value: f64,
    pub clients: u64,
    pub duration_s: f64,
}

/// `queue_drain_units_per_s`: the `queue` consumer settling a pre-filled
/// queue of one-unit purchases, with no HTTP in front.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainCeiling {
    /// Units settled per second.
    pub value: f64,
    /// Purchases in the queue.
    pub units: u64,
    /// The consumer's largest batch (`SECKILL_QUEUE_BATCH_SIZE` of the
    /// instances).
    pub batch_size: u16,
    /// `value ÷ sql_tps.value`: how far batching lifts the
    /// one-unit-per-transaction ceiling.
    pub ratio_vs_sql_tps: Option<f64>,
}

/// `sql_batched_units_per_s`: the `sql/batched` strategy's batch
/// transaction driven directly against Postgres, with no HTTP in front, at
/// the batch size the strategy reached in the runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchedCeiling {
    /// Units settled per second.
    pub value: f64,
    /// Purchases per batch: the mean batch size of the `sql/batched` runs,
    /// rounded.
    pub batch_size: usize,
    /// Concurrent batches: one per instance, as each instance settles one
    /// batch of a sale at a time.
    pub connections: usize,
    pub duration_s: f64,
    /// `value ÷ sql_tps.value`.
    pub ratio_vs_sql_tps: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ceilings {
    pub http_rps: HttpCeiling,
    pub sql_tps: SqlCeiling,
    /// `null` when no compared strategy uses Redis.
    pub redis_ops: Option<RedisCeiling>,
    /// `null` when no compared strategy uses RabbitMQ.
    #[serde(default)]
    pub amqp_rps: Option<AmqpCeiling>,
    /// `null` when `queue` is not compared.
    #[serde(default)]
    pub queue_drain_units_per_s: Option<DrainCeiling>,
    /// `null` when `sql/batched` is not compared (measured after its runs).
    #[serde(default)]
    pub sql_batched_units_per_s: Option<BatchedCeiling>,
}

/// `clients` concurrent tasks sending `DECR` on one scratch key over one
/// multiplexed connection (as the service does) for `seconds`; operations
/// per second. The key is deleted afterwards.
pub async fn redis_ops(redis_url: &str, clients: u64, seconds: f64) -> anyhow::Result<f64> {
    let client = redis::Client::open(redis_url)?;
    let conn = client.get_multiplexed_async_connection().await?;
    let key = format!("loadtest-ceiling:{:016x}", rand::random::<u64>());
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (mut conn, key, done) = (conn.clone(), key.clone(), done.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                redis::cmd("DECR").arg(&key).query_async::<i64>(&mut conn).await?;
                done.fetch_add(1, Relaxed);
            }
            Ok::<_, redis::RedisError>(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut conn = conn;
    redis::cmd("DEL").arg(&key).query_async::<i64>(&mut conn).await?;
    Ok(done.load(Relaxed) as f64 / elapsed)
}

/// Sells units of `sale` (which must have far more stock than can sell in
/// `seconds`) one per transaction, exactly as the `sql` strategy does, over
/// `connections` connections, and returns committed transactions per second.
pub async fn sql_tps(
    database_url: &str,
    sale: SaleId,
    connections: u32,
    seconds: f64,
) -> anyhow::Result<f64> {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .min_connections(connections)
        .connect(database_url)
        .await?;
    // Open every connection before the clock starts.
    let mut warm = Vec::new();
    for _ in 0..connections {
        warm.push(pool.acquire().await?);
    }
    drop(warm);
    let next_user = Arc::new(AtomicI64::new(1));
    let committed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (pool, next_user, committed) = (pool.clone(), next_user.clone(), committed.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                let user = UserId::parse(next_user.fetch_add(1, Relaxed)).expect("positive");
                match take_and_order(&pool, sale, user, Quantity::ONE).await {
                    Ok(Outcome::Placed { .. }) => {
                        committed.fetch_add(1, Relaxed);
                    }
                    Ok(other) => anyhow::bail!("the ceiling sale answered {other:?}"),
                    Err(err) => anyhow::bail!("the ceiling transaction failed: {err}"),
                }
            }
            Ok(())
        });
    }
    for result in tasks.join_all().await {
        result?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    pool.close().await;
    Ok(committed.load(Relaxed) as f64 / elapsed)
}
