//! A RabbitMQ cluster of its own: N [`RabbitMqNode`]s (each its own node
//! name, AMQP and distribution ports, directories), started side by side,
//! then each of the others joined to the first (`rabbitmqctl stop_app`,
//! `reset`, `join_cluster`, `start_app`). Killed (`SIGKILL`), and its
//! directories removed, when dropped.
//!
//! The nodes share one Erlang cookie without being given one: each runs as
//! the `rabbitmq` user in its home (see [`RabbitMqNode`]), where the VM
//! reads `.erlang.cookie`, as does `rabbitmqctl`. Every node runs with no
//! plugin and a quorum-queue write-ahead log capped at 64 MiB instead of
//! 512 MiB, so that three of them stay small on a small machine.
//!
//! Nothing here chooses where a quorum queue's leader lives: RabbitMQ
//! puts it on the node the declaring client is connected to
//! (`queue_leader_locator` `client-local`, the default), with its replicas
//! on the other nodes; [`RabbitMqCluster::placement_of`] tells where it is.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::RabbitMqNode;

/// What a cluster node adds to its `rabbitmq.conf`: the write-ahead log of
/// the quorum queues (held in memory until flushed) capped at 64 MiB.
const NODE_CONF: &str = "raft.wal_max_size_bytes = 67108864\n";

/// How long the nodes may take to report one another running, after the
/// joins, or to stop reporting a killed node.
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running RabbitMQ cluster (see the module documentation).
pub struct RabbitMqCluster {
    /// The nodes; node 0 is the one the others joined. A node
    /// [`kill`](Self::kill)ed stays in the list, not running.
    pub nodes: Vec<RabbitMqNode>,
}

impl RabbitMqCluster {
    /// Starts a cluster of `n` nodes; panics when it does not form.
    pub async fn start(n: usize) -> RabbitMqCluster {
        Self::try_start(n).await.unwrap_or_else(|err| panic!("{err}"))
    }

    /// Starts `n` nodes at once (each up to 60 s, until it accepts AMQP),
    /// joins nodes 1…n−1 to node 0 one after the other, and waits (up to
    /// 30 s) until every node reports all `n` running. Answers why not
    /// instead of panicking: fewer than 2 nodes, a node that did not
    /// start, a join `rabbitmqctl` refused, a cluster that did not form in
    /// time.
    pub async fn try_start(n: usize) -> Result<RabbitMqCluster, String> {
        if n < 2 {
            return Err(format!("a RabbitMQ cluster needs at least 2 nodes, not {n}"));
        }
        let mut starting = tokio::task::JoinSet::new();
        for i in 0..n {
            starting.spawn(async move { (i, RabbitMqNode::try_start_configured(NODE_CONF).await) });
        }
        let mut started = Vec::with_capacity(n);
        for (i, node) in starting.join_all().await {
            started.push((i, node?));
        }
        started.sort_by_key(|(i, _)| *i);
        let cluster =
            RabbitMqCluster { nodes: started.into_iter().map(|(_, node)| node).collect() };
        let seed = cluster.nodes[0].node();
        for node in &cluster.nodes[1..] {
            for args in [&["stop_app"][..], &["reset"], &["join_cluster", &seed], &["start_app"]] {
                node.ctl_async(args).await?;
            }
        }
        cluster.wait_until_running(&(0..n).collect::<Vec<_>>()).await?;
        Ok(cluster)
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f` of each node, in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RabbitMqNode::url).collect()
    }

    /// The indices of the nodes whose VM runs (not killed, not stopped).
    pub fn live(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].pid().is_some()).collect()
    }

    /// Kills node `index` (`SIGKILL` of its VM: [`RabbitMqNode::kill`]) and
    /// waits (up to 30 s) until every other live node reports only the live
    /// ones running. Errors: no such node, or the others still count it
    /// running at the deadline.
    pub async fn kill(&mut self, index: usize) -> Result<(), String> {
        let node = self.nodes.get_mut(index).ok_or(format!("no node {index}"))?;
        node.kill();
        self.wait_until_running(&self.live()).await
    }

    /// Waits until each live node's `cluster_status` lists exactly the
    /// nodes `expected` (indices) as running.
    async fn wait_until_running(&self, expected: &[usize]) -> Result<(), String> {
        let expected: BTreeSet<String> = expected.iter().map(|&i| self.nodes[i].node()).collect();
        for i in self.live() {
            let deadline = tokio::time::Instant::now() + MEMBERSHIP_TIMEOUT;
            loop {
                let last = match self.running_nodes(i).await {
                    Ok(running) if running == expected => break,
                    Ok(running) => format!("running: {running:?}"),
                    Err(err) => err,
                };
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "node {i} did not report {expected:?} running within \
                         {MEMBERSHIP_TIMEOUT:?}; {last}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The `running_nodes` of node `index`'s `cluster_status`.
    async fn running_nodes(&self, index: usize) -> Result<BTreeSet<String>, String> {
        let out = self.nodes[index].ctl_async(&["cluster_status", "--formatter", "json"]).await?;
        let status: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("cluster_status: {e}: {out}"))?;
        let running = status["running_nodes"].as_array().ok_or(format!("cluster_status: {out}"))?;
        Ok(running.iter().filter_map(|node| node.as_str().map(str::to_owned)).collect())
    }

    /// Where quorum queue `queue` (on the virtual host `/`) lives, asked of
    /// a live node: its leader and its members, as indices of
    /// [`nodes`](Self::nodes), and the members online (live and in the
    /// queue's Raft cluster). Errors: no live node answers, no such queue,
    /// or a node that is none of this cluster's.
    pub async fn placement_of(&self, queue: &str) -> Result<QueuePlacement, String> {
        let args = ["list_queues", "name", "leader", "members", "online", "--formatter", "json"];
        let mut last = "no node of the cluster runs".to_owned();
        for i in self.live() {
            match self.nodes[i].ctl_async(&args).await {
                Ok(out) => return self.parse_placement(queue, &out),
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    /// The number of AMQP client connections each node holds (indices of
    /// [`nodes`](Self::nodes); 0 for a node not running), asked of a live
    /// node (`list_connections port`: the port a connection came in on
    /// names its node). Errors: no live node answers.
    pub async fn connections_per_node(&self) -> Result<Vec<usize>, String> {
        let args = ["list_connections", "port", "--formatter", "json"];
        let mut last = "no node of the cluster runs".to_owned();
        for i in self.live() {
            match self.nodes[i].ctl_async(&args).await {
                Ok(out) => {
                    let listed: serde_json::Value = serde_json::from_str(&out)
                        .map_err(|e| format!("list_connections: {e}: {out}"))?;
                    let ports: Vec<u64> = listed
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|conn| conn["port"].as_u64())
                        .collect();
                    let on = |node: &RabbitMqNode| {
                        ports.iter().filter(|&&port| port == u64::from(node.port)).count()
                    };
                    return Ok(self.nodes.iter().map(on).collect());
                }
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    /// `queue`'s placement in `list_queues name leader members online`'s
    /// JSON (an array of objects with those four keys).
    fn parse_placement(&self, queue: &str, out: &str) -> Result<QueuePlacement, String> {
        let queues: serde_json::Value =
            serde_json::from_str(out).map_err(|e| format!("list_queues: {e}: {out}"))?;
        let entry = queues
            .as_array()
            .and_then(|all| all.iter().find(|q| q["name"] == queue))
            .ok_or(format!("no queue {queue} in {out}"))?;
        let index = |name: &serde_json::Value| {
            let name = name.as_str().unwrap_or_default();
            (0..self.nodes.len())
                .find(|&i| self.nodes[i].node() == name)
                .ok_or(format!("{queue}: node {name:?} is none of this cluster's"))
        };
        let indices = |key: &str| -> Result<Vec<usize>, String> {
            let listed = entry[key].as_array().map(Vec::as_slice).unwrap_or_default();
            let mut indices = listed.iter().map(index).collect::<Result<Vec<_>, _>>()?;
            indices.sort_unstable();
            Ok(indices)
        };
        Ok(QueuePlacement {
            leader: index(&entry["leader"])?,
            members: indices("members")?,
            online: indices("online")?,
        })
    }
}

/// Where a quorum queue lives in a [`RabbitMqCluster`]: indices of its
/// nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePlacement {
    /// The node of the queue's Raft leader, which takes its publishes.
    pub leader: usize,
    /// The nodes holding a replica (the leader's included), in increasing
    /// order.
    pub members: Vec<usize>,
    /// Of `members`, those online, in increasing order.
    pub online: Vec<usize>,
}

impl Drop for RabbitMqCluster {
    /// Kills every node (a clean `rabbitmqctl stop` of each, one after the
    /// other, would take seconds for directories about to be removed); each
    /// node's own drop then removes its directories.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}
