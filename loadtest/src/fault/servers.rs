//! The servers a fault run restarts, which this invocation starts for itself
//! (`owned-servers`) instead of using the shared ones: a `redis-server` that
//! persists nothing, for `redis-restart`, and a RabbitMQ node of its own, for
//! `broker-restart`. When a fault of the comparison needs one, every run of
//! the invocation (and the ceilings) uses it, so that runs with and without
//! a fault are measured against the same server. The shared Redis and
//! RabbitMQ are never restarted.
//!
//! With `--redis-cluster`, a local Redis Cluster of 3 masters is started the
//! same way and every run uses it (it is never restarted: `redis-restart` is
//! refused with it).
//!
//! The faults on a link (`partition-redis`, `slow-postgres`) start no server
//! but the relays of [`super::link`]: each instance then reaches Redis, or
//! Postgres, through a link of its own, in every run of the invocation.

use anyhow::anyhow;
use owned_servers::{RabbitMqNode, RedisCluster, RedisServer};
use tokio::sync::Mutex;

use super::FaultKind;
use super::link::{self, Link};

/// The servers of the invocation's faults; stopped when dropped.
#[derive(Default)]
pub struct OwnedServers {
    pub redis: Option<Mutex<RedisServer>>,
    pub broker: Option<Mutex<RabbitMqNode>>,
    /// The Redis Cluster of `--redis-cluster`.
    pub cluster: Option<RedisCluster>,
    /// The instances' links to the servers.
    pub links: Links,
}

/// The links of the instances, indexed by instance: to Redis when
/// `partition-redis` is compared, to Postgres when `slow-postgres` is (else
/// empty: the instances connect directly).
#[derive(Default)]
pub struct Links {
    pub redis: Vec<Link>,
    pub postgres: Vec<Link>,
}

impl Links {
    /// One link per instance to the server of `url`.
    async fn each(instances: usize, url: &str) -> anyhow::Result<Vec<Link>> {
        let upstream = link::address_of(url)?;
        let mut links = Vec::with_capacity(instances);
        for _ in 0..instances {
            links.push(Link::start(upstream.clone()).await?);
        }
        Ok(links)
    }

    /// The environment that points instance `i` at its links: its
    /// `DATABASE_URL` and `REDIS_URL` through them, for the
    /// servers that have links (nothing for the others).
    pub fn instance_env(
        &self,
        i: usize,
        database_url: &str,
        redis_url: &str,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut env = Vec::new();
        if let Some(link) = self.postgres.get(i) {
            let url = link.url_through(database_url)?;
            env.push((seckill::backends::DATABASE_URL_ENV.to_owned(), url));
        }
        if let Some(link) = self.redis.get(i) {
            env.push((seckill::backends::REDIS_URL_ENV.to_owned(), link.url_through(redis_url)?));
        }
        Ok(env)
    }
}

/// What the invocation's servers are started for.
pub struct Wanted<'a> {
    /// The runs' faults.
    pub dimension: &'a [Option<FaultKind>],
    /// `--redis-cluster`.
    pub cluster: bool,
    /// App instances (each gets its own links).
    pub instances: usize,
    /// The servers the instances would otherwise reach directly.
    pub database_url: &'a str,
    pub redis_url: &'a str,
}

/// Masters of the cluster `--redis-cluster` starts.
pub const CLUSTER_MASTERS: usize = 3;

impl OwnedServers {
    /// Starts what the faults of the dimension restart (nothing for the
    /// others), a Redis Cluster of [`CLUSTER_MASTERS`] masters with
    /// `--redis-cluster`, and the links the faults on a link act on.
    pub async fn start(wanted: &Wanted<'_>) -> anyhow::Result<OwnedServers> {
        let wants = |kind| wanted.dimension.contains(&Some(kind));
        if wanted.cluster {
            for kind in [FaultKind::RedisRestart, FaultKind::PartitionRedis] {
                anyhow::ensure!(
                    !wants(kind),
                    "--redis-cluster: the {kind} fault acts on one Redis server, not a cluster"
                );
            }
        }
        let cluster = if wanted.cluster {
            Some(RedisCluster::try_start(CLUSTER_MASTERS).await.map_err(|e| anyhow!(e))?)
        } else {
            None
        };
        let redis = if wants(FaultKind::RedisRestart) {
            Some(Mutex::new(RedisServer::try_start_with(&[]).await.map_err(|e| anyhow!(e))?))
        } else {
            None
        };
        let broker = if wants(FaultKind::BrokerRestart) {
            Some(Mutex::new(RabbitMqNode::try_start().await.map_err(|e| anyhow!(e))?))
        } else {
            None
        };
        let mut servers = OwnedServers { redis, broker, cluster, links: Links::default() };
        if wants(FaultKind::PartitionRedis) {
            let redis_url = servers.redis_url().await.unwrap_or_else(|| wanted.redis_url.into());
            servers.links.redis = Links::each(wanted.instances, &redis_url).await?;
        }
        if wants(FaultKind::SlowPostgres) {
            servers.links.postgres = Links::each(wanted.instances, wanted.database_url).await?;
        }
        Ok(servers)
    }

    /// `redis://…` of the owned Redis, or `redis+cluster://…` of the owned
    /// cluster, if one was started.
    pub async fn redis_url(&self) -> Option<String> {
        if let Some(cluster) = &self.cluster {
            return Some(cluster.url());
        }
        Some(self.redis.as_ref()?.lock().await.url())
    }

    /// `amqp://…` of the owned RabbitMQ node, if one was started.
    pub async fn amqp_url(&self) -> Option<String> {
        Some(self.broker.as_ref()?.lock().await.url())
    }
}
