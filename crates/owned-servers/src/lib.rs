//! Servers a process starts for itself, beside the shared ones, so that it
//! may kill, stop or restart them without touching anyone else's:
//!
//! - [`RedisServer`]: a `redis-server` child on a free port that persists
//!   nothing, so a restart comes back empty; optionally a replica or a
//!   cluster node;
//! - [`RedisCluster`]: a Redis Cluster of N masters made of such servers
//!   (`redis-cli --cluster create`);
//! - [`RabbitMqNode`]: a RabbitMQ node of its own (name, ports, directories);
//! - [`RabbitMqCluster`]: a RabbitMQ cluster of N such nodes (`rabbitmqctl
//!   join_cluster`), one of which may be killed ([`QueuePlacement`] says
//!   which node leads a quorum queue);
//! - [`free_port`], [`eventually`], [`resume`]: what starting them needs;
//! - [`die_with_parent`]: what keeps them from outliving their owner;
//! - [`cpu_group`]: an owner weighted above its neighbours on the CPU (a
//!   load generator keeping a schedule), whose servers start outside its
//!   weight ([`cpu_group::start_outside`]).
//!
//! The tests use them through `test-support` (which re-exports them), and the
//! load test's fault runs restart them (`loadtest compare --faults`). Each
//! start and restart comes in two forms: `try_*` answers an error message,
//! the plain form panics with it (the form tests want). Both servers are
//! stopped, and their directories removed, when dropped; and each server
//! process is the owner's own child, killed by the kernel when the owner's
//! thread that started it ends ([`die_with_parent`]), so that an owner
//! killed with `SIGKILL`, whose destructors never run, leaves none behind.

pub mod cpu_group;
mod rabbitmq;
mod rabbitmq_cluster;
mod redis_cluster;
mod redis_server;

use std::future::Future;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use rabbitmq::RabbitMqNode;
pub use rabbitmq_cluster::{QueuePlacement, RabbitMqCluster};
pub use redis_cluster::RedisCluster;
pub use redis_server::RedisServer;

/// A free TCP port on the loopback interface: bound, read, released.
///
/// Another process may take it before the caller binds it; the servers of
/// this crate retry on another port when that happens.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Polls `check` every 10 ms until it holds (`true`) or `within` has passed
/// (`false`). `check` runs at least once.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Has the kernel send `SIGKILL` to the process `command` starts as soon as
/// its parent ends (`PR_SET_PDEATHSIG`, Linux; elsewhere nothing): the last
/// line of defence when the parent dies without stopping it, killed itself or
/// ended before its destructors ran.
///
/// The parent, to the kernel, is the *thread* that started the process: one
/// started from a thread that ends before the process (a blocking-pool
/// thread, an ad-hoc `std::thread`) dies with that thread. The servers of
/// this crate and the load test's children are started from the threads of
/// an async runtime, which live as long as the runtime.
///
/// The setting survives `exec` of an ordinary program and is set after the
/// child's own `setuid` (`Command::uid`), which would clear it; it does not
/// survive `exec` of a set-user-ID program such as `su`, nor pass to the
/// child's own children. If the parent has already ended when the child
/// sets it, the child exits before `exec`.
pub fn die_with_parent(command: &mut Command) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec the closure calls only
        // async-signal-safe functions (prctl, getppid) and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the parent ended before the exec"));
                }
                Ok(())
            })
        };
    }
    command
}

/// Sends SIGCONT to `pid`, ignoring failures: a stopped process must be
/// continued before it can be killed and reaped.
pub fn resume(pid: u32) {
    let _ = Command::new("kill")
        .arg("-CONT")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
