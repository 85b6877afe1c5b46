//! A `redis-server` child process on a free port that keeps nothing on disk:
//! its owner may kill it (a crash, or a partition seen from the client's
//! side) and restart it on the same port, empty. Killed, and its working
//! directory removed, when dropped; killed by the kernel when its owner
//! ends ([`crate::die_with_parent`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{die_with_parent, eventually, free_port, resume};

/// How long a starting server may take to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Ports tried before giving up, when another process takes the free port
/// between [`free_port`] and the server's bind.
const PORT_ATTEMPTS: usize = 5;

/// A `redis-server` child (see the module documentation).
pub struct RedisServer {
    /// The port it listens on (127.0.0.1), the same across restarts.
    pub port: u16,
    child: Option<Child>,
    /// Its working directory (a replica's full sync and a cluster node's
    /// configuration are written there), removed on drop.
    dir: PathBuf,
    /// Arguments added to the defaults, kept for restarts.
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`; panics when it
    /// cannot.
    pub async fn start() -> RedisServer {
        Self::start_with(&[]).await
    }

    /// The same with extra `redis-server` arguments (e.g. cluster mode:
    /// `--cluster-enabled yes`).
    pub async fn start_with(extra: &[&str]) -> RedisServer {
        Self::try_start_with(extra).await.unwrap_or_else(|err| panic!("{err}"))
    }

    /// [`start_with`](Self::start_with), answering why it could not start
    /// (`redis-server` missing, or no port of [`PORT_ATTEMPTS`] could be
    /// bound) instead of panicking.
    pub async fn try_start_with(extra: &[&str]) -> Result<RedisServer, String> {
        let dir =
            std::env::temp_dir().join(format!("owned-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("a temporary directory: {e}"))?;
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut last_err = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut server = RedisServer {
                port: free_port(),
                child: None,
                dir: dir.clone(),
                extra: extra.clone(),
            };
            match server.launch().await {
                Ok(()) => return Ok(server),
                Err(err) => {
                    // Keep the directory for the next port.
                    server.dir = PathBuf::new();
                    last_err = err;
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(format!("could not start redis-server: {last_err}"))
    }

    /// A replica of the master listening on `master_port` (possibly a proxy
    /// in front of it); returns once the replication link is up (10 s at
    /// most).
    pub async fn start_replica_of(master_port: u16) -> RedisServer {
        let replica =
            Self::start_with(&["--replicaof", "127.0.0.1", &master_port.to_string()]).await;
        let conn = replica.client().get_multiplexed_async_connection().await.expect("the replica");
        let in_sync = eventually(Duration::from_secs(10), || {
            let mut conn = conn.clone();
            async move {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                info.contains("master_link_status:up")
            }
        })
        .await;
        assert!(in_sync, "the replica on port {} is in sync", replica.port);
        replica
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a valid URL")
    }

    /// The process id while it runs (e.g. to `SIGSTOP` it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL: a crash, nothing saved). Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            resume(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills it if it runs, then starts it again on the same port, empty;
    /// panics when it does not come back.
    pub async fn restart(&mut self) {
        self.try_restart().await.unwrap_or_else(|err| panic!("{err}"));
    }

    /// [`restart`](Self::restart), answering why it did not come back
    /// instead of panicking.
    pub async fn try_restart(&mut self) -> Result<(), String> {
        self.kill();
        self.launch()
            .await
            .map_err(|err| format!("redis-server restarts on port {}: {err}", self.port))
    }

    async fn launch(&mut self) -> Result<(), String> {
        let mut command = Command::new("redis-server");
        crate::cpu_group::start_outside(&mut command);
        let child = die_with_parent(&mut command)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            // An early exit first: a port taken by another server must not
            // pass for ours.
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("exited with {status}"));
            }
            if ping(self.port).await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                self.kill();
                return Err(format!("no PONG within {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// True when a server on `port` answers `PING` within 200 ms: `PONG`, or
/// `NOAUTH` from a server that asks for a password (`--requirepass`).
async fn ping(port: u16) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut buf = [0u8; 16];
        let n = stream.read(&mut buf).await.ok()?;
        Some(buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
    };
    tokio::time::timeout(Duration::from_millis(200), attempt).await.ok().flatten().unwrap_or(false)
}
