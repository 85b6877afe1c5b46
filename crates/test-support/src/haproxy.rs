//! HAProxy as a child process of the test: the configuration the test gives
//! it (typically a shipped file with its addresses replaced by free loopback
//! ports), checked with `haproxy -c` first so that a refusal reads as one,
//! run in the foreground, killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use owned_servers::eventually;

/// A running HAProxy (killed on drop, its configuration file removed).
pub struct Haproxy {
    child: Child,
    config: PathBuf,
}

impl Haproxy {
    /// Writes `config` to a file of its own, checks it, starts HAProxy on it
    /// and waits (up to 10 s) until `127.0.0.1:ready_port`, one of its
    /// frontends, accepts connections. Panics when the `haproxy` program is
    /// missing (Debian's package `haproxy`), refuses the configuration, or
    /// does not listen in time.
    pub async fn start(config: &str, ready_port: u16) -> Haproxy {
        let path = std::env::temp_dir().join(format!(
            "test-haproxy-{}-{}.cfg",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::write(&path, config).expect("writing the HAProxy configuration");
        let check = Command::new("haproxy").arg("-c").arg("-f").arg(&path).output();
        let check = check.expect("HAProxy is installed (the distribution's `haproxy` package)");
        assert!(
            check.status.success(),
            "haproxy -c refused the configuration:\n{}{}\n{config}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new("haproxy")
            .arg("-db") // in the foreground: killed with the handle
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("haproxy starts");
        let haproxy = Haproxy { child, config: path };
        let listening = eventually(Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", ready_port)).await.is_ok()
        })
        .await;
        assert!(listening, "HAProxy did not listen on 127.0.0.1:{ready_port} within 10 s");
        haproxy
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}
