//! A RabbitMQ node a process owns: its own node name, AMQP and distribution
//! ports, and directories under a temporary directory, beside the shared
//! broker. Stopped (and its directories removed) when dropped.
//!
//! The node's Erlang VM is the owner's own child process, so that it can be
//! killed for sure and dies with its owner ([`crate::die_with_parent`]):
//! the server script is told to `exec` the VM (`RUNNING_UNDER_SYSTEMD`, the
//! script's switch for a supervisor that needs no shell in between), and
//! Debian's `rabbitmq-server` wrapper is bypassed when it would go through
//! `su rabbitmq` (as root): `su` starts a session of its own and would leave
//! the VM a grandchild, out of reach of both. The server script then runs
//! directly as the `rabbitmq` user, in its home, as the wrapper would run it
//! (`rabbitmqctl`, still through the wrapper, finds the same Erlang cookie
//! there). Not stopped: `epmd`, the Erlang port mapper, which a first node
//! starts as a daemon that every node of the machine shares.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{die_with_parent, free_port};

/// The longest one readiness try (an AMQP connection and its close) may take.
const CONNECT_TRY: Duration = Duration::from_secs(5);

/// A `rabbitmq-server` child (see the module documentation). Stopping and
/// restarting it keeps its messages: it is the same node, on the same ports
/// and directories.
pub struct RabbitMqNode {
    /// The AMQP port (127.0.0.1).
    pub port: u16,
    dist_port: u16,
    name: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl RabbitMqNode {
    /// Starts the node and waits (up to 60 s) until it accepts AMQP; panics
    /// when it does not.
    pub async fn start() -> RabbitMqNode {
        Self::try_start().await.unwrap_or_else(|err| panic!("{err}"))
    }

    /// [`start`](Self::start), answering why the node did not start instead
    /// of panicking.
    pub async fn try_start() -> Result<RabbitMqNode, String> {
        Self::try_start_configured("").await
    }

    /// [`try_start`](Self::try_start) with `extra` appended to the node's
    /// `rabbitmq.conf` (lines of `key = value`).
    pub(crate) async fn try_start_configured(extra: &str) -> Result<RabbitMqNode, String> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("owned-rabbit-{id}"));
        let io = |e: std::io::Error| format!("the RabbitMQ node's directory: {e}");
        for sub in ["mnesia", "log"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io)?;
        }
        std::fs::write(dir.join("plugins"), "[].\n").map_err(io)?;
        // Started as root, the Debian server drops to the `rabbitmq` user,
        // which must own its directories.
        let _ = Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status();
        let port = free_port();
        // Its own configuration: the machine's may pin the listener to 5672.
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\n{extra}"),
        )
        .map_err(io)?;
        let mut broker = RabbitMqNode {
            port,
            dist_port: free_port(),
            name: format!("owned-{}", &id[..12]),
            dir,
            child: None,
        };
        broker.launch().await?;
        Ok(broker)
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Runs `rabbitmqctl` on this node with `args`, `stdin` on its standard
    /// input (e.g. a password for `add_user NAME`, which then shows in no
    /// command line); answers its standard output, or why it failed.
    pub fn ctl(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        use std::io::Write as _;
        let mut child = Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node()])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("rabbitmqctl: {e}"))?;
        let mut input = child.stdin.take().expect("a piped stdin");
        input.write_all(stdin.as_bytes()).map_err(|e| format!("rabbitmqctl's stdin: {e}"))?;
        drop(input);
        let out = child.wait_with_output().map_err(|e| format!("rabbitmqctl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "rabbitmqctl {}: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// The node's Erlang name, `NAME@HOST` (`HOST` the short host name), as
    /// `rabbitmqctl -n` and `join_cluster` take it and `cluster_status`
    /// reports it.
    pub fn node(&self) -> String {
        let host = Command::new("hostname").arg("-s").output();
        let host = host.map(|out| out.stdout).unwrap_or_default();
        format!("{}@{}", self.name, String::from_utf8_lossy(&host).trim())
    }

    /// [`ctl`](Self::ctl) without blocking the caller's thread (and with
    /// nothing on `rabbitmqctl`'s standard input): its standard output, or
    /// why it failed.
    pub async fn ctl_async(&self, args: &[&str]) -> Result<String, String> {
        let out = tokio::process::Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("rabbitmqctl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "rabbitmqctl {} on {}: {}",
                args.first().unwrap_or(&""),
                self.node(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// The process id of the node's Erlang VM, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the node's Erlang VM (`SIGKILL`: no shutdown, no goodbye to its
    /// peers, whose links to it simply break) and reaps it. Its directories
    /// stay, so that [`restart`](Self::restart) brings back what it had
    /// written. Nothing happens when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the node (`rabbitmqctl stop`: a clean shutdown, messages kept).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("rabbitmqctl")
                .args(["-n", &self.node(), "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the node again on the same ports and directories; panics when
    /// it does not come back.
    pub async fn restart(&mut self) {
        self.try_restart().await.unwrap_or_else(|err| panic!("{err}"));
    }

    /// [`restart`](Self::restart), answering why the node did not come back
    /// instead of panicking.
    pub async fn try_restart(&mut self) -> Result<(), String> {
        self.stop();
        self.launch().await
    }

    /// Starts the node and waits (up to 60 s) until it accepts AMQP.
    async fn launch(&mut self) -> Result<(), String> {
        let mut command = server_command();
        crate::cpu_group::start_outside(&mut command);
        let child = die_with_parent(&mut command)
            .env("RUNNING_UNDER_SYSTEMD", "true")
            .env_remove("NOTIFY_SOCKET")
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", self.dir.join("plugins"))
            .env("RABBITMQ_FEATURE_FLAGS_FILE", self.dir.join("feature_flags"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting rabbitmq-server: {e}"))?;
        // Started as the `rabbitmq` user, it could not leave a weighted
        // group of its owner by itself.
        crate::cpu_group::move_outside(child.id());
        self.child = Some(child);
        let url = self.url();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let props = lapin::ConnectionProperties::default();
            // Each try is bounded too: a starting node can accept the TCP
            // connection and never finish the AMQP handshake, which held a
            // comparison for over 300 s once.
            let attempt = lapin::Connection::connect(&url, props);
            if let Ok(Ok(conn)) = tokio::time::timeout(CONNECT_TRY, attempt).await {
                let _ = tokio::time::timeout(CONNECT_TRY, conn.close(200, "ready".into())).await;
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the RabbitMQ node on port {} did not start in 60 s",
                    self.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// `rabbitmq-server`, or, when that is Debian's wrapper and this process is
/// root, the server script behind it run as the `rabbitmq` user in its home
/// (see the module documentation).
fn server_command() -> Command {
    let script = find_in_path("rabbitmq-server")
        .and_then(|path| path.canonicalize().ok())
        .filter(|path| path.file_name().is_some_and(|name| name == "rabbitmq-script-wrapper"))
        .map(|wrapper| wrapper.with_file_name("rabbitmq-server"))
        .filter(|script| script.exists());
    // SAFETY: getuid cannot fail and touches no memory.
    let root = unsafe { libc::getuid() } == 0;
    match (script, root.then(|| account("rabbitmq")).flatten()) {
        (Some(script), Some(user)) => {
            use std::os::unix::process::CommandExt as _;
            let mut command = Command::new(script);
            command.uid(user.uid).gid(user.gid).current_dir(&user.home);
            command.env("HOME", &user.home).env("USER", "rabbitmq").env("LOGNAME", "rabbitmq");
            command
        }
        _ => Command::new("rabbitmq-server"),
    }
}

/// `name` in the directories of `PATH`, if there.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|file| file.is_file())
}

/// A local account of `/etc/passwd`.
struct Account {
    uid: u32,
    gid: u32,
    home: PathBuf,
}

/// The account `name` of `/etc/passwd` (`name:x:uid:gid:gecos:home:shell`).
fn account(name: &str) -> Option<Account> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let fields: Vec<&str> = passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() >= 6 && fields[0] == name)?;
    Some(Account {
        uid: fields[2].parse().ok()?,
        gid: fields[3].parse().ok()?,
        home: Path::new(fields[5]).to_owned(),
    })
}

impl Drop for RabbitMqNode {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
