//! Checks that the backing servers the chosen strategies need answer, before
//! any instance starts, with a message that names the variable to fix.

use std::time::Duration;

use anyhow::bail;
use seckill::strategy::{Backend, StrategyName};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tokio::net::TcpStream;

const HINT: &str = "start them with `scripts/services.sh up` (see README, Quick start)";

/// The servers a comparison would use.
pub struct Servers<'a> {
    /// The compared strategies: their registrations name the servers they
    /// need.
    pub strategies: &'a [StrategyName],
    pub database_url: &'a str,
    /// `None` when the comparison starts its own Redis (`--redis-cluster`).
    pub redis_url: Option<&'a str>,
    pub amqp_url: &'a str,
}

/// Checks each server the strategies need (Postgres always). Errors: one
/// does not answer, with what to set or start.
pub async fn check(args: &Servers<'_>) -> anyhow::Result<()> {
    let mut needed: Vec<Backend> =
        args.strategies.iter().flat_map(|s: &StrategyName| s.needs().iter().copied()).collect();
    needed.push(Backend::Postgres); // the sql_tps ceiling talks to Postgres directly
    needed.sort_by_key(|b| *b as u8);
    needed.dedup();
    for backend in needed {
        match backend {
            Backend::Postgres => postgres(args.database_url).await?,
            // Without a URL (--redis-cluster) the comparison starts its own.
            Backend::Redis => {
                if let Some(url) = args.redis_url {
                    redis(url).await?
                }
            }
            Backend::Rabbitmq => tcp("RabbitMQ", "AMQP_URL", args.amqp_url, 5672).await?,
        }
    }
    Ok(())
}

/// Connects to the server's `postgres` database: the comparison's own
/// database may not exist yet (the instances create it).
async fn postgres(url: &str) -> anyhow::Result<()> {
    let options: PgConnectOptions = url.parse()?;
    let options = options.database("postgres");
    match tokio::time::timeout(Duration::from_secs(5), options.connect()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => bail!("Postgres is not answering at --database-url ({err}); {HINT}"),
        Err(_) => bail!("Postgres did not answer within 5 s at --database-url; {HINT}"),
    }
}

/// Every seed of a `redis+cluster://` URL, else the one node.
async fn redis(url: &str) -> anyhow::Result<()> {
    match redis_lock::cluster_seed_urls(url) {
        Some(seeds) => {
            for seed in seeds.map_err(|err| anyhow::anyhow!("REDIS_URL: {err}"))? {
                tcp("Redis", "REDIS_URL", &seed, 6379).await?;
            }
            Ok(())
        }
        None => tcp("Redis", "REDIS_URL", url, 6379).await,
    }
}

async fn tcp(name: &str, var: &str, url: &str, default_port: u16) -> anyhow::Result<()> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|err| anyhow::anyhow!("{var} is not a valid URL ({err})"))?;
    let host = parsed.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = parsed.port().unwrap_or(default_port);
    match tokio::time::timeout(Duration::from_secs(3), TcpStream::connect((host.as_str(), port)))
        .await
    {
        Ok(Ok(_)) => Ok(()),
        _ => bail!("{name} is not answering at {host}:{port} ({var}); {HINT}"),
    }
}
