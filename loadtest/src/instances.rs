//! The app instances under test: started as child processes on free ports
//! (or given with `--target`), waited for until `/readyz` answers, and
//! stopped when dropped — or by the kernel when this process ends without
//! dropping them ([`owned_servers::die_with_parent`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use seckill::backends;
use seckill::config::{self, BuyerAuthMode};
use seckill::http::settings as http_settings;
use seckill::strategy::{REGISTRY, lock};

use crate::balancer::Balancer;
use crate::port::free_port;

/// The instances of one invocation.
pub struct Instances {
    /// Base URLs, e.g. `http://127.0.0.1:40123`.
    pub urls: Vec<String>,
    /// Where buyers are sent: `urls`, or the balancer's one URL with
    /// `--haproxy`.
    pub buyer_urls: Vec<String>,
    /// The balancer in front of them (`--haproxy`).
    pub balancer: Option<Balancer>,
    /// Bearer token for the admin routes.
    pub admin_token: String,
    /// Postgres connections the instances hold together (for `sql_tps`).
    pub pool_connections: u32,
    /// `SECKILL_AMQP_PREFIX` of the instances: one per invocation when they
    /// were started here.
    pub amqp_prefix: String,
    /// The `HS256` key the instances verify buyer tokens with, when
    /// `--buyer-auth on`: one per invocation when they were started here.
    pub buyer_key: Option<String>,
    /// `SECKILL_REDIS_PREFIX` of the started instances (`None` with
    /// `--target`).
    pub redis_prefix: Option<String>,
    /// The started processes, instance `i` at index `i` (empty with
    /// `--target`); a fault may kill one and start it again.
    children: Mutex<Vec<Child>>,
    /// How instance `i` was started, to start it again (`None` with
    /// `--target`).
    launch: Option<Launch>,
}

/// The command line and environment of the started instances.
struct Launch {
    bin: PathBuf,
    env: Vec<(String, String)>,
    /// Instance `i`'s own variables, over `env`.
    own_env: Vec<Vec<(String, String)>>,
    out: PathBuf,
}

impl Launch {
    /// Starts instance `i` on `port`, its output written to
    /// `instance-<i>.log` (appended to it on a restart).
    fn spawn(&self, i: usize, port: u16, restart: bool) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(restart)
            .truncate(!restart)
            .open(self.out.join(format!("instance-{i}.log")))?;
        let mut command = Command::new(&self.bin);
        owned_servers::die_with_parent(command.as_std_mut());
        owned_servers::cpu_group::start_outside(command.as_std_mut());
        command
            .arg("serve")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(self.own_env.get(i).into_iter().flatten().map(|(k, v)| (k, v)))
            .env(http_settings::ADDR_ENV, format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))
    }
}

/// Redis nodes this invocation started for `lock/redlock` (killed on drop,
/// and with this process).
pub struct RedlockNodes {
    pub urls: Vec<String>,
    _children: Vec<Child>,
}

impl RedlockNodes {
    /// `SECKILL_LOCK_REDLOCK_URLS` when set; otherwise, when `redis-server` is installed,
    /// three nodes started on free ports with nothing kept on disk; otherwise
    /// an error that says what to set.
    pub async fn start(out: &Path) -> anyhow::Result<RedlockNodes> {
        if let Ok(urls) = std::env::var(lock::REDLOCK_URLS_ENV) {
            let urls = urls.split(',').map(|u| u.trim().to_owned()).collect();
            return Ok(RedlockNodes { urls, _children: vec![] });
        }
        let mut urls = Vec::new();
        let mut children = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let log = std::fs::File::create(out.join(format!("redlock-node-{i}.log")))?;
            let mut command = Command::new("redis-server");
            owned_servers::die_with_parent(command.as_std_mut());
            owned_servers::cpu_group::start_outside(command.as_std_mut());
            let child = command
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
                .args(["--appendonly", "no", "--daemonize", "no"])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| {
                    format!(
                        "{} need independent Redis nodes: set {}, or install \
                         redis-server so that the load test starts three",
                        needing_nodes(),
                        lock::REDLOCK_URLS_ENV
                    )
                })?;
            children.push(child);
            urls.push(format!("redis://127.0.0.1:{port}"));
        }
        for url in &urls {
            let port: u16 = url.rsplit(':').next().unwrap_or_default().parse()?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
                if Instant::now() >= deadline {
                    bail!("the Redlock node {url} did not start");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(RedlockNodes { urls, _children: children })
    }
}

/// What starting (or adopting) the instances needs of the invocation.
pub struct InstanceSettings<'a> {
    /// Running services to adopt instead of starting any (`--target`).
    pub targets: &'a [String],
    /// The service binary (`--seckill-bin`; default: `seckill` next to this
    /// executable).
    pub seckill_bin: Option<&'a Path>,
    /// Where each instance writes its log (`instance-<i>.log`).
    pub out: &'a Path,
    pub database_url: &'a str,
    pub redis_url: &'a str,
    pub amqp_url: &'a str,
    pub buyer_auth: BuyerAuthMode,
    /// Postgres connections of each instance (`SECKILL_DB_POOL_SIZE`).
    pub pool_size: u32,
    /// Instances to start.
    pub instances: u64,
    /// Whether buyers go through an HAProxy in front of the instances.
    pub haproxy: bool,
    /// Concurrent buyers (the balancer's connection limit).
    pub users: u64,
    /// Instance `i`'s own variables, over the others (its own route to a
    /// server, for the faults on one instance's link); empty: none.
    pub own_env: Vec<Vec<(String, String)>>,
}

impl Instances {
    /// Starts `args.instances` processes (or adopts the targets); `redlock`
    /// is passed as their `SECKILL_LOCK_REDLOCK_URLS`.
    pub async fn start(
        args: &InstanceSettings<'_>,
        redlock: Option<&RedlockNodes>,
    ) -> anyhow::Result<Instances> {
        if !args.targets.is_empty() {
            return Instances::adopt(args).await;
        }
        let bin = seckill_binary(args.seckill_bin)?;
        std::fs::create_dir_all(args.out)?;
        let admin_token = format!("loadtest-{:032x}", rand::random::<u128>());
        // One Redis namespace for all instances of this invocation, and none
        // shared with any other service or test on the same Redis.
        let redis_prefix = format!("loadtest-{:016x}", rand::random::<u64>());
        // Likewise for queue and exchange names on RabbitMQ.
        let amqp_prefix = format!("loadtest-{:016x}", rand::random::<u64>());
        declare_queues(&amqp_prefix, args.amqp_url).await;
        let buyer_auth = args.buyer_auth == BuyerAuthMode::On;
        let buyer_key = buyer_auth
            .then(|| format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>()));
        let mut env: Vec<(String, String)> = vec![
            (backends::DATABASE_URL_ENV.into(), args.database_url.to_owned()),
            (backends::REDIS_URL_ENV.into(), args.redis_url.to_owned()),
            (backends::AMQP_URL_ENV.into(), args.amqp_url.to_owned()),
            (config::ADMIN_TOKEN_ENV.into(), admin_token.clone()),
            (backends::REDIS_PREFIX_ENV.into(), redis_prefix.clone()),
            (backends::AMQP_PREFIX_ENV.into(), amqp_prefix.clone()),
            (backends::DB_POOL_SIZE_ENV.into(), args.pool_size.to_string()),
            ("RUST_LOG".into(), std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())),
        ];
        env.push((config::BUYER_AUTH_ENV.into(), if buyer_auth { "on" } else { "off" }.into()));
        env.extend(buyer_key.iter().map(|key| (config::BUYER_JWT_KEY_ENV.to_owned(), key.clone())));
        env.extend(redlock.map(|nodes| (lock::REDLOCK_URLS_ENV.to_owned(), nodes.urls.join(","))));
        let own_env = args.own_env.clone();
        let launch = Launch { bin, env, own_env, out: args.out.to_owned() };
        let mut urls = Vec::new();
        let mut children = Vec::new();
        for i in 0..args.instances as usize {
            let port = free_port()?;
            children.push(launch.spawn(i, port, false)?);
            urls.push(format!("http://127.0.0.1:{port}"));
        }
        for (i, url) in urls.iter().enumerate() {
            wait_ready(url, Duration::from_secs(60)).await.with_context(|| {
                format!(
                    "instance {i} did not become ready; see {}",
                    args.out.join(format!("instance-{i}.log")).display()
                )
            })?;
        }
        let pool_connections = args.pool_size * args.instances as u32;
        let balancer = match args.haproxy {
            true => Some(Balancer::start(&urls, args.users, args.out).await?),
            false => None,
        };
        let buyer_urls = balancer.as_ref().map_or_else(|| urls.clone(), |b| vec![b.url.clone()]);
        Ok(Instances {
            urls,
            buyer_urls,
            balancer,
            admin_token,
            pool_connections,
            amqp_prefix,
            buyer_key,
            redis_prefix: Some(redis_prefix),
            children: Mutex::new(children),
            launch: Some(launch),
        })
    }

    /// The running services of the targets, once each answers `/readyz`; the
    /// admin token and AMQP prefix are the environment's (else the service's
    /// defaults), and so is the buyer token key with `--buyer-auth on`
    /// (`SECKILL_BUYER_JWT_KEY`, required then).
    async fn adopt(args: &InstanceSettings<'_>) -> anyhow::Result<Instances> {
        let urls: Vec<String> =
            args.targets.iter().map(|u| u.trim_end_matches('/').to_owned()).collect();
        let admin_token = std::env::var(config::ADMIN_TOKEN_ENV)
            .unwrap_or_else(|_| seckill::config::DEV_ADMIN_TOKEN.to_owned());
        for url in &urls {
            wait_ready(url, Duration::from_secs(10)).await?;
        }
        let pool_connections = args.pool_size * urls.len() as u32;
        let amqp_prefix =
            std::env::var(backends::AMQP_PREFIX_ENV).unwrap_or_else(|_| "seckill".to_owned());
        let buyer_key = match args.buyer_auth {
            BuyerAuthMode::Off => None,
            BuyerAuthMode::On => Some(std::env::var(config::BUYER_JWT_KEY_ENV).context(
                "--buyer-auth on with --target signs buyer tokens with SECKILL_BUYER_JWT_KEY \
                 (the services' HS256 key): set it",
            )?),
        };
        Ok(Instances {
            buyer_urls: urls.clone(),
            urls,
            balancer: None,
            admin_token,
            pool_connections,
            amqp_prefix,
            buyer_key,
            redis_prefix: None,
            children: Mutex::new(vec![]),
            launch: None,
        })
    }

    /// Process ids of the started instances (empty with `--target`).
    pub fn pids(&self) -> Vec<u32> {
        self.children.lock().map(|c| c.iter().filter_map(Child::id).collect()).unwrap_or_default()
    }

    /// Process id of started instance `i`; `None` with `--target` or once
    /// it has exited.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children.lock().ok()?.get(i).and_then(Child::id)
    }

    /// Sends `signal` (a `kill` name: `KILL`, `STOP`, `CONT`) to started
    /// instance `i`. Errors with `--target` (no process of ours).
    pub async fn signal(&self, i: usize, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid(i).with_context(|| format!("instance {i} is not a running child"))?;
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
        anyhow::ensure!(status.await?.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    /// Starts instance `i` again on its port, after it was killed (a killed
    /// process holds no socket, so the port is free), reaps the killed
    /// process, and returns once the new one answers `/readyz`.
    pub async fn restart(&self, i: usize) -> anyhow::Result<()> {
        let launch = self.launch.as_ref().context("--target instances are not restarted")?;
        let port: u16 = self.urls[i].rsplit(':').next().unwrap_or_default().parse()?;
        let old = {
            let mut children = self.children.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            let fresh = launch.spawn(i, port, true)?;
            std::mem::replace(&mut children[i], fresh)
        };
        let mut old = old;
        let _ = old.wait().await;
        wait_ready(&self.urls[i], Duration::from_secs(60))
            .await
            .with_context(|| format!("instance {i} did not come back after a restart"))
    }

    /// Stops the started instances with SIGTERM, waiting briefly for each
    /// (a stopped one is continued first).
    pub async fn stop(self) {
        let mut children = self.children.into_inner().unwrap_or_default();
        for child in &mut children {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill").arg("-CONT").arg(pid.to_string()).status().await;
                let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await;
            }
        }
        for child in &mut children {
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
    }
}

/// Declares the queues of the instances' `prefix` (those of every
/// registration that has some) before they start, so that they find them
/// ready instead of racing to create them (RabbitMQ 3.10 closes a
/// connection that subscribes to a quorum queue another is still creating).
/// Best effort: a comparison of strategies without a queue needs no broker,
/// and the instances declare what is missing themselves.
async fn declare_queues(prefix: &str, amqp_url: &str) {
    for queues in REGISTRY.iter().filter_map(|r| r.queues) {
        let declared =
            tokio::time::timeout(Duration::from_secs(10), (queues.declare)(prefix, amqp_url));
        match declared.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::debug!(error = %err, "could not declare the run's queues"),
            Err(_) => tracing::debug!("declaring the run's queues took more than 10 s"),
        }
    }
}

/// The strategies whose registration asks for Redlock nodes, e.g.
/// `lock/redlock`.
fn needing_nodes() -> String {
    let names: Vec<&str> =
        REGISTRY.iter().filter(|r| r.redlock_nodes).map(|r| r.name.as_str()).collect();
    names.join(", ")
}

/// `--seckill-bin`, else `seckill` next to the running executable.
fn seckill_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_owned(),
        None => std::env::current_exe()?
            .with_file_name(format!("seckill{}", std::env::consts::EXE_SUFFIX)),
    };
    if !path.exists() {
        bail!(
            "the service binary {} does not exist; build it with `cargo build --release --workspace` \
             (or pass --seckill-bin)",
            path.display()
        );
    }
    Ok(path)
}

async fn wait_ready(url: &str, limit: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + limit;
    loop {
        let answer =
            client.get(format!("{url}/readyz")).timeout(Duration::from_secs(2)).send().await;
        match answer {
            Ok(response) if response.status().is_success() => return Ok(()),
            _ if Instant::now() >= deadline => {
                bail!("{url}/readyz did not answer 200 within {limit:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
