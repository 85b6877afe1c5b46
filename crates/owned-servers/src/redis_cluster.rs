//! A Redis Cluster of its own: N `redis-server` masters in cluster mode on
//! free ports (each a [`RedisServer`]), joined by `redis-cli --cluster
//! create … --cluster-replicas 0`, which spreads the 16384 hash slots over
//! them. Stopped, and its directories removed, when dropped.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::{RedisServer, eventually};

/// How long the cluster may take to report `cluster_state:ok` on every node
/// once `redis-cli --cluster create` has returned.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// A running Redis Cluster (see the module documentation).
pub struct RedisCluster {
    /// The masters, in the order their slots were assigned (the first holds
    /// the lowest slots).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts a cluster of `masters` masters (at least 3, as `redis-cli`
    /// requires) and waits until every node reports `cluster_state:ok`;
    /// panics when it cannot.
    pub async fn start(masters: usize) -> RedisCluster {
        Self::try_start(masters).await.unwrap_or_else(|err| panic!("{err}"))
    }

    /// [`start`](Self::start), answering why the cluster could not start
    /// (`redis-server` or `redis-cli` missing, fewer than 3 masters, no
    /// `cluster_state:ok` within 15 s) instead of panicking.
    pub async fn try_start(masters: usize) -> Result<RedisCluster, String> {
        if masters < 3 {
            return Err(format!("a Redis Cluster needs at least 3 masters, not {masters}"));
        }
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            let args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"];
            nodes.push(RedisServer::try_start_with(&args).await?);
        }
        let cluster = RedisCluster { nodes };
        cluster.create().await?;
        cluster.wait_until_ok().await?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create` over the nodes, no replicas.
    async fn create(&self) -> Result<(), String> {
        let addrs = self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.port));
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|err| format!("redis-cli --cluster create: {err}"))?;
        if !output.status.success() {
            let stdout = String::from_utf8_lossy(&output.stdout);
            return Err(format!("redis-cli --cluster create exited {}: {stdout}", output.status));
        }
        Ok(())
    }

    /// Waits until every node reports `cluster_state:ok` and knows every
    /// other node.
    async fn wait_until_ok(&self) -> Result<(), String> {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        for node in &self.nodes {
            let conn = node
                .client()
                .get_multiplexed_async_connection()
                .await
                .map_err(|err| format!("cluster node {}: {err}", node.port))?;
            let ok = eventually(READY_TIMEOUT, || {
                let (mut conn, known) = (conn.clone(), known.clone());
                async move {
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_default();
                    info.contains("cluster_state:ok") && info.contains(&known)
                }
            })
            .await;
            if !ok {
                return Err(format!("cluster node {}: no cluster_state:ok", node.port));
            }
        }
        Ok(())
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…`: the form `REDIS_URL`
    /// takes for a cluster (every node as a seed).
    pub fn url(&self) -> String {
        let seeds: Vec<String> =
            self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.port)).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// `redis://127.0.0.1:P` of each master.
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
