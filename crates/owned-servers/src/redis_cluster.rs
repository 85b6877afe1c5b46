//! A Redis Cluster of its own: N `redis-server` masters in cluster mode on
//! free ports (each a [`RedisServer`]), joined by `redis-cli --cluster
//! create … --cluster-replicas R`, which spreads the 16384 hash slots over
//! the masters and gives each R replicas. Stopped, and its directories
//! removed, when dropped. With replicas, a master killed
//! ([`RedisCluster::kill_master_of`]) is replaced by one of its replicas
//! once the others have marked it failed (`cluster-node-timeout`).

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::{RedisServer, eventually};

/// How long the cluster may take to report `cluster_state:ok` on every node
/// once `redis-cli --cluster create` has returned.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// `cluster-node-timeout` of [`RedisCluster::try_start`]: Redis's default.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a replica may take to replace a killed master.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// The port of the master serving `slot` in a `CLUSTER SLOTS` reply: an
/// array of `[start, end, [ip, port, id, …] of the master, replicas…]`.
fn master_port(reply: &redis::Value, slot: i64) -> Option<u16> {
    let redis::Value::Array(ranges) = reply else { return None };
    ranges.iter().find_map(|range| {
        let redis::Value::Array(fields) = range else { return None };
        let [redis::Value::Int(start), redis::Value::Int(end), redis::Value::Array(master), ..] =
            fields.as_slice()
        else {
            return None;
        };
        if !(*start..=*end).contains(&slot) {
            return None;
        }
        match master.get(1)? {
            redis::Value::Int(port) => u16::try_from(*port).ok(),
            _ => None,
        }
    })
}

/// A running Redis Cluster (see the module documentation).
pub struct RedisCluster {
    /// The nodes: without replicas, the masters in the order their slots
    /// were assigned (the first holds the lowest slots); with replicas,
    /// `redis-cli` chooses which are masters (ask [`master_of`]).
    ///
    /// [`master_of`]: RedisCluster::master_of
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
        Self::try_start_replicated(masters, 0, DEFAULT_NODE_TIMEOUT).await
    }

    /// A cluster of `masters` masters with `replicas` replicas each, whose
    /// nodes mark a silent peer failed after `node_timeout`
    /// (`cluster-node-timeout`: a replica takes over its failed master
    /// about that long after the master stopped answering, plus an
    /// election); waits until every node reports `cluster_state:ok`.
    pub async fn try_start_replicated(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
    ) -> Result<RedisCluster, String> {
        if masters < 3 {
            return Err(format!("a Redis Cluster needs at least 3 masters, not {masters}"));
        }
        let timeout = node_timeout.as_millis().to_string();
        let mut nodes = Vec::with_capacity(masters * (1 + replicas));
        for _ in 0..masters * (1 + replicas) {
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                // A replica's first sync at once, not after Redis's 5 s
                // wait for more replicas to share it.
                "--repl-diskless-sync-delay",
                "0",
            ];
            nodes.push(RedisServer::try_start_with(&args).await?);
        }
        let cluster = RedisCluster { nodes };
        cluster.create(replicas).await?;
        cluster.wait_until_ok().await?;
        Ok(cluster)
    }

    /// The index in [`nodes`](Self::nodes) of the master that serves the
    /// slot of `key` (a hash tag such as `{sale:7}` names the slot of every
    /// key that carries it), asked of any live node.
    pub async fn master_of(&self, key: &str) -> Result<usize, String> {
        for node in self.nodes.iter().filter(|node| node.pid().is_some()) {
            let Ok(mut conn) = node.client().get_multiplexed_async_connection().await else {
                continue;
            };
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async(&mut conn)
                .await
                .map_err(|err| format!("CLUSTER KEYSLOT: {err}"))?;
            let shards: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await
                .map_err(|err| format!("CLUSTER SLOTS: {err}"))?;
            let port = master_port(&shards, slot).ok_or(format!("no master serves slot {slot}"))?;
            return self
                .nodes
                .iter()
                .position(|node| node.port == port)
                .ok_or(format!("the master of slot {slot} (port {port}) is not one of ours"));
        }
        Err("no node of the cluster answers".to_owned())
    }

    /// Kills (SIGKILL) the master serving `key`'s slot and waits until
    /// another node serves it and every live node reports
    /// `cluster_state:ok` again; answers the killed node's index.
    pub async fn kill_master_of(&mut self, key: &str) -> Result<usize, String> {
        let victim = self.master_of(key).await?;
        self.nodes[victim].kill();
        let took_over = eventually(FAILOVER_TIMEOUT, || async {
            self.master_of(key).await.is_ok_and(|now| now != victim)
        })
        .await;
        if !took_over {
            return Err(format!("no replica took over from node {victim} in time"));
        }
        self.wait_until_ok().await?;
        Ok(victim)
    }

    /// `redis-cli --cluster create` over the nodes, `replicas` per master.
    async fn create(&self, replicas: usize) -> Result<(), String> {
        let addrs = self.nodes.iter().map(|node| format!("127.0.0.1:{}", node.port));
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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

    /// Waits until every live node reports `cluster_state:ok` and knows
    /// every other node (a killed one stays known, as failed), and every
    /// replica's link to its master is up: a replica that never finished its
    /// first sync refuses to take over (`cluster-replica-validity-factor`).
    async fn wait_until_ok(&self) -> Result<(), String> {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        for node in self.nodes.iter().filter(|node| node.pid().is_some()) {
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
                    let replication: String = redis::cmd("INFO")
                        .arg("replication")
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_default();
                    let linked = replication.contains("role:master")
                        || replication.contains("master_link_status:up");
                    info.contains("cluster_state:ok") && info.contains(&known) && linked
                }
            })
            .await;
            if !ok {
                return Err(format!("cluster node {}: not ok, or a replica not linked", node.port));
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
