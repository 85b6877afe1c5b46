//! Processes a test owns: a `redis-server` it may kill and restart (nothing
//! persisted, so a restart comes back empty), and a `seckill` child process
//! it may watch die. Both are killed when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free TCP port on the loopback interface (bound, read, released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `redis-server` child on its own port.
pub struct OwnedRedis {
    pub port: u16,
    child: Option<Child>,
}

impl OwnedRedis {
    pub async fn start() -> OwnedRedis {
        let mut redis = OwnedRedis { port: free_port(), child: None };
        redis.launch().await;
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no shutdown, no save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a fresh, empty server on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        self.launch().await;
    }

    async fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        let ready = crate::eventually(Duration::from_secs(5), || async {
            match client.get_multiplexed_async_connection().await {
                Ok(mut conn) => redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
        assert!(ready, "redis-server on port {} answers PING", self.port);
    }
}

impl Drop for OwnedRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `seckill serve` child process.
pub struct ChildService {
    pub base: String,
    child: Child,
}

impl ChildService {
    /// Starts the service binary with the test database and `env`, and waits
    /// until `/healthz` answers.
    pub async fn start(env: &[(&str, String)]) -> ChildService {
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_seckill"));
        command
            .arg("serve")
            .env("DATABASE_URL", crate::support::test_database_url())
            .env("SECKILL_ADDR", format!("127.0.0.1:{port}"))
            .env("SECKILL_ADMIN_TOKEN", crate::support::ADMIN_TOKEN)
            .env("RUST_LOG", "error")
            // No `queue` consumers (their quorum queues would outlive the
            // test) unless a test's `env` turns them on.
            .env("SECKILL_QUEUE_CONSUME", "false")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().expect("seckill starts");
        let service = ChildService { base: format!("http://127.0.0.1:{port}"), child };
        let client = reqwest::Client::new();
        let healthz = format!("{}/healthz", service.base);
        let up = crate::eventually(Duration::from_secs(20), || async {
            client.get(&healthz).send().await.is_ok_and(|r| r.status().is_success())
        })
        .await;
        assert!(up, "the child service answers /healthz");
        service
    }

    /// Waits (up to 10 s) for the process to end; its exit code.
    pub async fn exit_code(&mut self) -> Option<i32> {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for ChildService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
