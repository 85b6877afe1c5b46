//! The servers a fault run restarts, which this invocation starts for itself
//! (`owned-servers`) instead of using the shared ones: a `redis-server` that
//! persists nothing, for `redis-restart`, and a RabbitMQ node of its own, for
//! `broker-restart`. When a fault of the comparison needs one, every run of
//! the invocation (and the ceilings) uses it, so that runs with and without
//! a fault are measured against the same server. The shared Redis and
//! RabbitMQ are never restarted.

use anyhow::anyhow;
use owned_servers::{RabbitMqNode, RedisServer};
use tokio::sync::Mutex;

use super::FaultKind;

/// The servers of the invocation's faults; stopped when dropped.
#[derive(Default)]
pub struct OwnedServers {
    pub redis: Option<Mutex<RedisServer>>,
    pub broker: Option<Mutex<RabbitMqNode>>,
}

impl OwnedServers {
    /// Starts what the faults of `dimension` restart (nothing for the
    /// others).
    pub async fn start(dimension: &[Option<FaultKind>]) -> anyhow::Result<OwnedServers> {
        let wants = |kind| dimension.contains(&Some(kind));
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
        Ok(OwnedServers { redis, broker })
    }

    /// `redis://…` of the owned Redis, if one was started.
    pub async fn redis_url(&self) -> Option<String> {
        Some(self.redis.as_ref()?.lock().await.url())
    }

    /// `amqp://…` of the owned RabbitMQ node, if one was started.
    pub async fn amqp_url(&self) -> Option<String> {
        Some(self.broker.as_ref()?.lock().await.url())
    }
}
