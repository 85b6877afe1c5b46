//! A load balancer in front of the instances (`--haproxy`): an HAProxy the
//! load test starts on a free port, which spreads the buyers' requests over
//! the instances round robin and takes an instance out of rotation while
//! its `/readyz` fails. The buyers (sale and rejection phases) and the
//! `http_rps` ceiling go through it, so that ceiling and runs are measured
//! under the same conditions; the admin reads and `/metrics` still go to
//! each instance, because they are per-instance figures.
//!
//! HAProxy's own statistics page (CSV, `req_tot` per server) tells how many
//! requests each instance was given: `balancer.requests_per_instance` in
//! report.json.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::port::free_port;

/// Name of the backend of the instances in the configuration and the
/// statistics.
const BACKEND: &str = "instances";

/// A running HAProxy (killed on drop, and with this process).
pub struct Balancer {
    /// Base URL buyers are sent to, e.g. `http://127.0.0.1:40125`.
    pub url: String,
    stats_url: String,
    servers: usize,
    _child: Child,
}

/// What report.json says of the balancer (`balancer`; `null` without one).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BalancerReport {
    /// `haproxy` and its version line.
    pub kind: String,
    /// Requests HAProxy passed to each instance over the whole invocation,
    /// in the order of the instances.
    pub requests_per_instance: Vec<u64>,
}

impl Balancer {
    /// Starts HAProxy in front of `instances` (base URLs on 127.0.0.1) for
    /// `users` concurrent clients, its configuration and log in `out`, and
    /// waits until it sends requests on to every instance.
    pub async fn start(instances: &[String], users: u64, out: &Path) -> anyhow::Result<Balancer> {
        let (port, stats_port) = (free_port()?, free_port()?);
        let config = configuration(instances, users, port, stats_port)?;
        let path: PathBuf = out.join("haproxy.cfg");
        std::fs::write(&path, config)?;
        let log = std::fs::File::create(out.join("haproxy.log"))?;
        let mut command = Command::new("haproxy");
        owned_servers::die_with_parent(command.as_std_mut());
        owned_servers::cpu_group::start_outside(command.as_std_mut());
        let child = command
            .arg("-db") // in the foreground: it ends with this process
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context(
                "--haproxy needs HAProxy: install the distribution's `haproxy` package \
                 (e.g. `apt-get install haproxy`)",
            )?;
        let balancer = Balancer {
            url: format!("http://127.0.0.1:{port}"),
            stats_url: format!("http://127.0.0.1:{stats_port}/stats;csv"),
            servers: instances.len(),
            _child: child,
        };
        balancer.wait_until_every_server_is_up(out).await?;
        Ok(balancer)
    }

    /// What report.json records: the version and the requests per instance.
    pub async fn report(&self) -> anyhow::Result<BalancerReport> {
        let version = Command::new("haproxy").arg("-v").output().await?;
        let version = String::from_utf8_lossy(&version.stdout);
        let kind = version.lines().next().unwrap_or("HAProxy").trim().to_owned();
        let stats = self.stats().await?;
        let requests_per_instance = stats.iter().map(|server| server.requests).collect();
        Ok(BalancerReport { kind, requests_per_instance })
    }

    async fn stats(&self) -> anyhow::Result<Vec<ServerStats>> {
        let text = reqwest::get(&self.stats_url).await?.error_for_status()?.text().await?;
        parse_stats(&text)
    }

    async fn wait_until_every_server_is_up(&self, out: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(stats) = self.stats().await
                && stats.len() == self.servers
                && stats.iter().all(|server| server.status.starts_with("UP"))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "HAProxy did not report every instance up within 15 s; see {}",
                    out.join("haproxy.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The configuration: a frontend on `port`, the instances round robin with
/// a `/readyz` check every second, and the statistics on `stats_port`.
/// Timeouts are those the load test itself allows a request (60 s). A
/// request whose connection to an instance failed never reached it, so it
/// is sent to another (`retry-on conn-failure`, `redispatch`).
/// `maxconn` is the goose users with room for the checks and statistics:
/// HAProxy needs two descriptors per connection and refuses to start when
/// the process may not open that many.
fn configuration(
    instances: &[String],
    users: u64,
    port: u16,
    stats_port: u16,
) -> anyhow::Result<String> {
    let maxconn = users + 100;
    let mut servers = String::new();
    for (i, url) in instances.iter().enumerate() {
        let addr = url.strip_prefix("http://").context("an instance URL is http://host:port")?;
        servers.push_str(&format!("    server instance-{i} {addr} check inter 1s\n"));
    }
    Ok(format!(
        "global\n    maxconn {maxconn}\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 60s\n    \
         timeout server 60s\n    option http-keep-alive\n    retries 2\n    \
         option redispatch 1\n    retry-on conn-failure\n\n\
         frontend buyers\n    bind 127.0.0.1:{port}\n    default_backend {BACKEND}\n\n\
         backend {BACKEND}\n    balance roundrobin\n    option httpchk\n    \
         http-check send meth GET uri /readyz\n{servers}\n\
         frontend stats\n    bind 127.0.0.1:{stats_port}\n    stats enable\n    \
         stats uri /stats\n"
    ))
}

/// One instance's line of the statistics.
#[derive(Debug, PartialEq)]
struct ServerStats {
    status: String,
    requests: u64,
}

/// The servers of [`BACKEND`] in HAProxy's CSV statistics (a header line
/// `# pxname,svname,…`, then one line per proxy and server).
fn parse_stats(csv: &str) -> anyhow::Result<Vec<ServerStats>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines
        .next()
        .and_then(|line| line.strip_prefix("# "))
        .context("HAProxy's statistics start with a header line")?
        .split(',')
        .collect();
    let column = |name: &str| {
        header.iter().position(|h| *h == name).with_context(|| format!("no `{name}` column"))
    };
    let (proxy, server, status, requests) =
        (column("pxname")?, column("svname")?, column("status")?, column("req_tot")?);
    let mut servers = Vec::new();
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        let field = |i: usize| fields.get(i).copied().unwrap_or("");
        if field(proxy) != BACKEND || matches!(field(server), "FRONTEND" | "BACKEND") {
            continue;
        }
        servers.push(ServerStats {
            status: field(status).to_owned(),
            requests: field(requests).parse().unwrap_or(0),
        });
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_names_every_instance_with_its_health_check() {
        let urls = ["http://127.0.0.1:4001".to_owned(), "http://127.0.0.1:4002".to_owned()];
        let config = configuration(&urls, 200, 5000, 5001).unwrap();
        assert!(config.contains("maxconn 300"), "room for every goose user");
        assert!(config.contains("bind 127.0.0.1:5000") && config.contains("bind 127.0.0.1:5001"));
        assert!(config.contains("server instance-0 127.0.0.1:4001 check"));
        assert!(config.contains("server instance-1 127.0.0.1:4002 check"));
        assert!(config.contains("balance roundrobin") && config.contains("uri /readyz"));
        assert!(config.contains("retry-on conn-failure"), "a refused connection goes elsewhere");
        assert!(configuration(&["127.0.0.1:4001".to_owned()], 1, 1, 2).is_err(), "not a URL");
    }

    #[test]
    fn the_statistics_give_each_server_of_the_backend() {
        let csv = "# pxname,svname,qcur,status,req_tot,\n\
                   buyers,FRONTEND,0,OPEN,300,\n\
                   instances,instance-0,0,UP,120,\n\
                   instances,instance-1,0,UP 1/2,180,\n\
                   instances,BACKEND,0,UP,300,\n\
                   stats,FRONTEND,0,OPEN,2,\n";
        let servers = parse_stats(csv).unwrap();
        assert_eq!(
            servers,
            [
                ServerStats { status: "UP".into(), requests: 120 },
                ServerStats { status: "UP 1/2".into(), requests: 180 },
            ]
        );
        assert!(parse_stats("pxname,svname\n").is_err(), "no header");
    }
}
