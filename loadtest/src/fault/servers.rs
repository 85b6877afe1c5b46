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

use anyhow::anyhow;
use owned_servers::{RabbitMqNode, RedisCluster, RedisServer};
use tokio::sync::Mutex;

use super::FaultKind;

/// The servers of the invocation's faults; stopped when dropped.
#[derive(Default)]
pub struct OwnedServers {
    pub redis: Option<Mutex<RedisServer>>,
    pub broker: Option<Mutex<RabbitMqNode>>,
    /// The Redis Cluster of `--redis-cluster`.
    pub cluster: Option<RedisCluster>,
}

/// Masters of the cluster `--redis-cluster` starts.
pub const CLUSTER_MASTERS: usize = 3;

impl OwnedServers {
    /// Starts what the faults of `dimension` restart (nothing for the
    /// others), and a Redis Cluster of [`CLUSTER_MASTERS`] masters when
    /// `cluster` (`--redis-cluster`).
    pub async fn start(
        dimension: &[Option<FaultKind>],
        cluster: bool,
    ) -> anyhow::Result<OwnedServers> {
        let wants = |kind| dimension.contains(&Some(kind));
        if cluster && wants(FaultKind::RedisRestart) {
            anyhow::bail!(
                "--redis-cluster: the redis-restart fault restarts one node, not a cluster"
            );
        }
        let cluster = if cluster {
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
        Ok(OwnedServers { redis, broker, cluster })
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
