//! `pg-terminate`: `pg_terminate_backend` on every Postgres connection of the
//! instances at once, as a failover or an administrator would. The
//! instances' connections are those of the comparison's database whose
//! `application_name` is `seckill` (what the service sets on its pools); the
//! load test's own connections are left alone. Every transaction in flight
//! rolls back; the pools reconnect on the next acquire.

use super::{Landed, Target};

/// Terminates the connections; the repair is the pools' own reconnection.
pub async fn inject(on: &Target<'_>) -> anyhow::Result<Landed> {
    let landed = Landed::now(None);
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'seckill' \
         AND pid <> pg_backend_pid()",
    )
    .fetch_all(on.db)
    .await?;
    tracing::debug!(connections = terminated.len(), "pg-terminate");
    Ok(landed)
}
