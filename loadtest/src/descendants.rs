//! Every process this one started, found by parentage in `/proc` (Linux):
//! the instances, the balancer, the Redlock nodes, the Redis and RabbitMQ
//! nodes a comparison owns, and whatever they started in turn. Stopping
//! them this way does not depend on the handles that started them: a
//! comparison cut short ([`crate::interrupt`]) has dropped or unwound them,
//! and a handle may hold only the first process of a chain.
//!
//! [`stop_all`] runs at the end of every `compare` and `drain-check`,
//! however it ended; normally it finds nothing, the handles having stopped
//! their processes. What it cannot reach: a process that left the tree by
//! daemonizing (its parent exited, it was re-parented to init), such as
//! `epmd`, which a first RabbitMQ node starts for every node of the machine.
//! Processes killed with this one (`SIGKILL`) are ended by the kernel
//! instead ([`owned_servers::die_with_parent`] on each child).
//!
//! Source of the fields read: proc(5), `/proc/<pid>/stat`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long the processes get to end after `SIGTERM`, and again after
/// `SIGKILL`.
pub const GRACE: Duration = Duration::from_secs(5);

/// A process seen in `/proc`. Its start time tells it from a later process
/// that was given the same pid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Process {
    pub pid: u32,
    /// Start time, clock ticks after boot (`stat` field 22).
    started: u64,
    /// The executable's name as the kernel keeps it (`comm`, at most 15
    /// bytes), e.g. `seckill`, `beam.smp`.
    pub name: String,
}

/// `(parent pid, process)` of a `/proc/<pid>/stat` line; `None` for a
/// zombie (ended, its status not yet read: nothing left to stop) or a line
/// that does not parse.
fn parse_stat(pid: u32, line: &str) -> Option<(u32, Process)> {
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
    let (open, close) = (line.find('(')?, line.rfind(')')?);
    let name = line.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    // From the state (field 3) on: ppid is field 4, starttime field 22.
    let parent = fields.get(1)?.parse().ok()?;
    let started = fields.get(19)?.parse().ok()?;
    Some((parent, Process { pid, started, name }))
}

/// The live process `pid`, if any.
fn read(pid: u32) -> Option<(u32, Process)> {
    parse_stat(pid, &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process of `table` (`(parent, process)`) below `root`.
fn below(root: u32, table: Vec<(u32, Process)>) -> BTreeSet<Process> {
    let mut children: BTreeMap<u32, Vec<Process>> = BTreeMap::new();
    for (parent, process) in table {
        children.entry(parent).or_default().push(process);
    }
    let mut found = BTreeSet::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for child in children.remove(&pid).unwrap_or_default() {
            next.push(child.pid);
            found.insert(child);
        }
    }
    found
}

/// Every live process below `root` now.
pub fn descendants(root: u32) -> BTreeSet<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return BTreeSet::new() };
    let table = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read)
        .collect();
    below(root, table)
}

/// Whether `process` still runs: the same pid and start time, not a zombie.
fn alive(process: &Process) -> bool {
    read(process.pid).is_some_and(|(_, now)| now == *process)
}

/// Sends `signal` to `process` if it still runs.
fn send(process: &Process, signal: libc::c_int) {
    if alive(process) {
        // SAFETY: kill(2) touches no memory of ours; the pid was checked to
        // be this process just before (a reuse in between is not guarded).
        unsafe { libc::kill(process.pid as libc::pid_t, signal) };
    }
}

/// Waits up to `limit` until none of `processes` runs; answers those that
/// still do.
async fn wait_gone(processes: &BTreeSet<Process>, limit: Duration) -> BTreeSet<Process> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left: BTreeSet<Process> = processes.iter().filter(|p| alive(p)).cloned().collect();
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What [`stop_below`] found.
#[derive(Debug, Default)]
pub struct Stopped {
    /// Processes that ended on `SIGTERM`.
    pub terminated: Vec<Process>,
    /// Processes that needed `SIGKILL` (or started after the `SIGTERM`).
    pub killed: Vec<Process>,
}

/// Stops every live process below `root`: `SIGCONT` (a stopped process
/// cannot act on the next signal) and `SIGTERM` to each, up to `grace` for
/// them to end, then `SIGKILL` to those left and to any started meanwhile,
/// and up to `grace` again for them to be gone.
pub async fn stop_below(root: u32, grace: Duration) -> Stopped {
    let first = descendants(root);
    if first.is_empty() {
        return Stopped::default();
    }
    for process in &first {
        send(process, libc::SIGCONT);
        send(process, libc::SIGTERM);
    }
    let mut left = wait_gone(&first, grace).await;
    left.extend(descendants(root));
    for process in &left {
        send(process, libc::SIGCONT);
        send(process, libc::SIGKILL);
    }
    let stuck = wait_gone(&left, grace).await;
    if !stuck.is_empty() {
        tracing::warn!(?stuck, "processes of this invocation outlived SIGKILL");
    }
    let terminated = first.difference(&left).cloned().collect();
    Stopped { terminated, killed: left.into_iter().collect() }
}

/// [`stop_below`] this process, with [`GRACE`]; says what it had to stop.
pub async fn stop_all() -> Stopped {
    let stopped = stop_below(std::process::id(), GRACE).await;
    let names = |list: &[Process]| list.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    if !stopped.terminated.is_empty() || !stopped.killed.is_empty() {
        tracing::info!(
            terminated = ?names(&stopped.terminated),
            killed = ?names(&stopped.killed),
            "stopped the processes left of this invocation"
        );
    }
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, name: &str) -> Process {
        Process { pid, started: pid as u64 * 10, name: name.to_owned() }
    }

    #[test]
    fn a_stat_line_gives_the_parent_start_time_and_name_and_a_zombie_nothing() {
        let rest = "0 0 0 0 4194560 0 0 0 0 0 0 0 0 20 0 1 0 7351 8192 0 18446744073709551615";
        let line = format!("4242 (beam.smp (x)) S 4200 {rest}");
        let (parent, process) = parse_stat(4242, &line).unwrap();
        assert_eq!(parent, 4200);
        assert_eq!((process.started, process.name.as_str()), (7351, "beam.smp (x)"));
        assert!(parse_stat(4242, &format!("4242 (seckill) Z 4200 {rest}")).is_none());
        assert!(parse_stat(4242, "4242 (seckill) S").is_none(), "cut short");
    }

    #[test]
    fn the_descendants_are_the_children_and_theirs_and_no_one_else() {
        let table = vec![
            (1, process(10, "loadtest")),
            (10, process(11, "seckill")),
            (10, process(12, "su")),
            (12, process(13, "sh")),
            (13, process(14, "beam.smp")),
            (1, process(20, "redis-server")),
            (20, process(21, "child-of-another")),
        ];
        let found: Vec<u32> = below(10, table).into_iter().map(|p| p.pid).collect();
        assert_eq!(found, [11, 12, 13, 14]);
    }

    #[tokio::test]
    async fn every_process_below_is_stopped_the_one_ignoring_sigterm_by_sigkill() {
        // A shell of this test whose two children outlive it unless
        // stopped: one ends on SIGTERM, one ignores it.
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & (trap '' TERM; exec sleep 61) & wait"])
            .spawn()
            .unwrap();
        let root = shell.id();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while descendants(root).len() < 2 {
            assert!(std::time::Instant::now() < deadline, "the shell started its children");
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = descendants(root);
        let stopped = stop_below(root, Duration::from_millis(500)).await;
        assert!(before.iter().all(|p| !alive(p)), "none left: {before:?}");
        assert_eq!(stopped.terminated.len(), 1, "{stopped:?}");
        assert_eq!(stopped.killed.len(), 1, "the one ignoring SIGTERM: {stopped:?}");
        assert!(descendants(root).is_empty());
        let _ = shell.kill();
        let _ = shell.wait();
    }
}
