//! A service binary as a child process of the test: started on a free port
//! with the environment the test gives it, ready once its health route
//! answers `2xx`, killed when dropped. The caller passes the binary's path
//! (e.g. `env!("CARGO_BIN_EXE_<name>")`), so this crate depends on no
//! service.

use std::ffi::OsStr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use owned_servers::{eventually, free_port, resume};

/// How to start a service: its binary, arguments and environment, the
/// variable through which it is told its listen address, and its health
/// route.
pub struct ServiceLauncher {
    command: Command,
    addr_env: String,
    health_path: String,
    ready_within: Duration,
}

impl ServiceLauncher {
    /// `binary`, told to listen on `127.0.0.1:<free port>` through the
    /// environment variable `addr_env`, and ready once `GET health_path`
    /// answers `2xx` (within 20 s unless [`ready_within`](Self::ready_within)
    /// says otherwise). Its output is discarded unless
    /// [`inherit_stderr`](Self::inherit_stderr).
    pub fn new(binary: impl AsRef<OsStr>, addr_env: &str, health_path: &str) -> Self {
        let mut command = Command::new(binary);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        Self {
            command,
            addr_env: addr_env.to_owned(),
            health_path: health_path.to_owned(),
            ready_within: Duration::from_secs(20),
        }
    }

    /// Adds a command-line argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.command.arg(arg);
        self
    }

    /// Removes from the child's environment every variable of the test's
    /// own whose name starts with `prefix` (a stray `SECKILL_…` set where the
    /// tests run); variables set on the launcher afterwards still apply.
    pub fn without_inherited(mut self, prefix: &str) -> Self {
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with(prefix) {
                self.command.env_remove(&key);
            }
        }
        self
    }

    /// Sets an environment variable (a later call for the same key wins).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    /// Sets every `(key, value)` of `vars`, in order.
    pub fn envs(mut self, vars: &[(&str, String)]) -> Self {
        for (key, value) in vars {
            self.command.env(key, value);
        }
        self
    }

    /// Lets the service's standard error through to the test's.
    pub fn inherit_stderr(mut self) -> Self {
        self.command.stderr(Stdio::inherit());
        self
    }

    /// Writes the service's standard error to `file` (to read its log).
    pub fn stderr_to(mut self, file: std::fs::File) -> Self {
        self.command.stderr(file);
        self
    }

    /// How long the service may take to answer its health route.
    pub fn ready_within(mut self, within: Duration) -> Self {
        self.ready_within = within;
        self
    }

    /// Starts the service and waits until its health route answers `2xx`;
    /// panics when it cannot be spawned, exits, or is not ready in time.
    pub async fn start(mut self) -> ChildService {
        let port = free_port();
        let child = self
            .command
            .env(&self.addr_env, format!("127.0.0.1:{port}"))
            .spawn()
            .unwrap_or_else(|e| panic!("{:?} starts: {e}", self.command.get_program()));
        let base = format!("http://127.0.0.1:{port}");
        let mut service = ChildService { child, reaped: false, port, base };
        let path = self.health_path.as_str();
        let ready =
            eventually(self.ready_within, || async move { healthy(port, path).await }).await;
        if !ready {
            let exited = service.child.try_wait().ok().flatten();
            panic!(
                "{:?} on port {port} did not answer {path} within {:?} (exit status: {exited:?})",
                self.command.get_program(),
                self.ready_within
            );
        }
        service
    }
}

/// A running service started by [`ServiceLauncher::start`]. Dropping it
/// kills the process (continuing it first, should the test have stopped it).
pub struct ChildService {
    child: Child,
    /// Set once the process was waited for: its pid may belong to another
    /// process now, so no signal is sent to it any more.
    reaped: bool,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub base: String,
}

impl ChildService {
    /// The process id (e.g. to `SIGSTOP` it with [`signal`](crate::signal)).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the process dies at once, holding whatever it held.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        resume(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// Waits (up to 10 s) for the process to end by itself; its exit code
    /// (`None` when it is still running, or was ended by a signal).
    pub async fn exit_code(&mut self) -> Option<i32> {
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                self.reaped = true;
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

impl Drop for ChildService {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True when `GET path` on `127.0.0.1:port` answers `2xx` within 1 s.
async fn healthy(port: u16, path: &str) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        // "HTTP/1.1 200"
        Some(head.starts_with(b"HTTP/1.") && head[9] == b'2')
    };
    tokio::time::timeout(Duration::from_secs(1), attempt).await.ok().flatten().unwrap_or(false)
}
