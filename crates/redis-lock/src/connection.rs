//! Where the locks live: one Redis node or a Redis Cluster.
//!
//! [`RedisClient`] is parsed from a URL: `redis://…` (and the other schemes
//! `redis::Client::open` accepts) names one node; `redis+cluster://` names a
//! Redis Cluster by seed nodes, for example
//! `redis+cluster://:secret@10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000`:
//! the user and password (if any) apply to every node, then host:port pairs
//! separated by commas. The client discovers the other nodes and the slot map
//! from the seeds (redis-rs's own cluster support, `cluster-async`). The
//! scheme is this crate's: redis-rs opens a cluster from a list of node URLs,
//! not from one URL.
//!
//! [`RedisConnection`] is the command connection of either: a
//! [`ConnectionManager`] (one node, reconnects by itself) or a
//! [`ClusterConnection`] (routes each command to the master of its key's slot,
//! follows `MOVED`/`ASK`, reconnects by itself). It implements
//! [`redis::aio::ConnectionLike`], so `redis::cmd`, `Script::invoke_async`
//! and `AsyncCommands` work on both. A script is routed by its first key:
//! every key it names must share one hash slot (this crate's names put all of
//! a lock's keys under one hash tag), or the node refuses it with `CROSSSLOT`.
//!
//! Pub/sub ([`RedisClient::pubsub_clients`]) uses one node at a time: a
//! classic `PUBLISH` on a cluster is broadcast to every node over the
//! cluster bus, so a subscriber on any one node hears it. A subscriber tries
//! the seeds in turn, so that one whose node fails (a master taken down, its
//! replica promoted) subscribes again on another.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// The URL scheme of a Redis Cluster (see the module documentation).
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// One Redis node or a Redis Cluster (see the module documentation). Cheap to
/// clone; opens no connection by itself.
#[derive(Clone)]
pub enum RedisClient {
    /// One node.
    Node(redis::Client),
    /// A cluster: its client, and one client per seed node (for pub/sub).
    Cluster {
        /// The cluster client (seed nodes, discovers the rest); boxed, as it
        /// is far larger than a node's client.
        cluster: Box<ClusterClient>,
        /// A client per seed node, in the URL's order.
        seeds: Vec<redis::Client>,
    },
}

impl std::fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(client) => write!(f, "Node({})", client.get_connection_info().addr()),
            Self::Cluster { seeds, .. } => {
                let addrs: Vec<String> =
                    seeds.iter().map(|s| s.get_connection_info().addr().to_string()).collect();
                write!(f, "Cluster({})", addrs.join(","))
            }
        }
    }
}

impl From<redis::Client> for RedisClient {
    fn from(client: redis::Client) -> Self {
        Self::Node(client)
    }
}

impl RedisClient {
    /// Parses `url`: a `redis+cluster://` URL names a cluster, anything else
    /// goes to `redis::Client::open`. Opens no connection.
    ///
    /// Errors: a malformed URL, a cluster URL without a node, or seeds that
    /// disagree on credentials.
    pub fn open(url: &str) -> RedisResult<Self> {
        match cluster_seed_urls(url) {
            Some(seeds) => Self::cluster(&seeds?),
            None => Ok(Self::Node(redis::Client::open(url)?)),
        }
    }

    /// A cluster reached through `seeds` (each `redis://[user:pass@]host:port`).
    ///
    /// Errors: no seed, a malformed URL, seeds that disagree on credentials.
    pub fn cluster(seeds: &[String]) -> RedisResult<Self> {
        if seeds.is_empty() {
            return Err(invalid("a Redis Cluster URL names no node"));
        }
        let clients: RedisResult<Vec<redis::Client>> =
            seeds.iter().map(|s| redis::Client::open(s.as_str())).collect();
        let cluster = Box::new(ClusterClient::new(seeds.to_vec())?);
        Ok(Self::Cluster { cluster, seeds: clients? })
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster { .. })
    }

    /// Clients of the nodes pub/sub may subscribe on, to try in turn: the
    /// node itself, or every seed of a cluster (a cluster broadcasts
    /// `PUBLISH` to every node, so any live one serves). Never empty.
    pub fn pubsub_clients(&self) -> &[redis::Client] {
        match self {
            Self::Node(client) => std::slice::from_ref(client),
            Self::Cluster { seeds, .. } => seeds,
        }
    }

    /// A command connection that gives up connecting after
    /// `connect_timeout` and waiting for a reply after `response_timeout`.
    /// A node's connection is lazy (it connects on first use, and again after
    /// a loss, retrying `retries` times); a cluster connection connects to
    /// the seeds and reads the slot map now.
    pub async fn connection(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
        retries: usize,
    ) -> RedisResult<RedisConnection> {
        match self {
            Self::Node(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(retries);
                ConnectionManager::new_lazy_with_config(client.clone(), config)
                    .map(RedisConnection::Node)
            }
            Self::Cluster { cluster, .. } => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(response_timeout);
                let connecting = cluster.get_async_connection_with_config(config);
                match tokio::time::timeout(connect_timeout * 2, connecting).await {
                    Ok(conn) => conn.map(RedisConnection::Cluster),
                    Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no Redis Cluster connection within the connect timeout",
                    ))),
                }
            }
        }
    }
}

/// The seed URLs of a `redis+cluster://` URL; `None` for any other URL.
/// `redis+cluster://[user:pass@]h1:p1,h2:p2[/…]` gives
/// `redis://[user:pass@]h1:p1`, `redis://[user:pass@]h2:p2`.
pub fn cluster_seed_urls(url: &str) -> Option<RedisResult<Vec<String>>> {
    let rest = url.trim().strip_prefix(CLUSTER_SCHEME)?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let seeds: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("redis://{userinfo}{host}"))
        .collect();
    if seeds.is_empty() {
        return Some(Err(invalid("a Redis Cluster URL names no node")));
    }
    Some(Ok(seeds))
}

fn invalid(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, what))
}

/// The command connection of a [`RedisClient`] (see the module
/// documentation). Cheap to clone: clones share the underlying connection.
#[derive(Clone)]
pub enum RedisConnection {
    /// One node.
    Node(ConnectionManager),
    /// A cluster.
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Node(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cluster_seed_urls;

    #[test]
    fn a_cluster_url_names_its_seeds_with_the_same_credentials() {
        let seeds = cluster_seed_urls("redis+cluster://u:p@a:1,b:2/").unwrap().unwrap();
        assert_eq!(seeds, ["redis://u:p@a:1", "redis://u:p@b:2"]);
        let seeds = cluster_seed_urls("redis+cluster://127.0.0.1:7000").unwrap().unwrap();
        assert_eq!(seeds, ["redis://127.0.0.1:7000"]);
        assert!(cluster_seed_urls("redis+cluster://").unwrap().is_err());
        assert!(cluster_seed_urls("redis://127.0.0.1:6379").is_none());
    }
}
