//! End to end: `loadtest compare` stopped in the middle by `SIGTERM` or
//! `SIGINT`. Once a run has finished, the test reads every process the
//! comparison started (its descendants in `/proc`: the instances, the
//! balancer, the Redlock nodes, the Redis and RabbitMQ nodes it owns),
//! sends the signal, and requires that the comparison exits with 128 + the
//! signal's number, leaves none of those processes alive, and writes a
//! report of the runs it finished, marked partial. Killed with `SIGKILL`,
//! which it cannot catch, it must leave none alive either.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long the comparison may take to finish its first run (it starts a
/// RabbitMQ node before that, on a machine the other tests share).
const FIRST_RUN: Duration = Duration::from_secs(300);

/// How long it may take to stop once signalled (a RabbitMQ node's clean
/// shutdown takes seconds).
const STOP: Duration = Duration::from_secs(120);

/// A process seen in `/proc`: the start time (clock ticks since boot) tells
/// it from a later process that reuses its pid.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Process {
    pid: u32,
    started: u64,
    name: String,
}

/// `(parent, process)` from `/proc/<pid>/stat`, `None` when it is gone or a
/// zombie (dead, waiting for its parent to read its status).
fn stat(pid: u32) -> Option<(u32, Process)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let name = text[open + 1..close].to_owned();
    let fields: Vec<&str> = text[close + 2..].split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    // Fields from the state on: state is 3rd, ppid 4th, starttime 22nd.
    let parent = fields.get(1)?.parse().ok()?;
    let started = fields.get(19)?.parse().ok()?;
    Some((parent, Process { pid, started, name }))
}

/// Every live process below `root`.
fn descendants(root: u32) -> BTreeSet<Process> {
    let mut children: BTreeMap<u32, Vec<Process>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let pid = entry.ok().and_then(|e| e.file_name().to_str()?.parse::<u32>().ok());
        if let Some((parent, process)) = pid.and_then(stat) {
            children.entry(parent).or_default().push(process);
        }
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

/// Those of `seen` still alive (the same pid and start time, not a zombie).
fn alive(seen: &BTreeSet<Process>) -> Vec<Process> {
    seen.iter().filter(|p| stat(p.pid).is_some_and(|(_, now)| now == **p)).cloned().collect()
}

/// Starts `loadtest compare` with `args` (not quiet: its progress lines on
/// stderr tell when a run finished), and a channel of those lines.
fn start(out: &Path, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("compare")
        .args(args)
        .args(["--users", "40", "--instances", "2", "--rejection-phase", "1"])
        .args(["--ceiling-duration", "1", "--repeat", "1", "--stock", "200"])
        .args(["--reference-runs", "1"])
        .args(["--database-url", &crate::support::test_database_url(), "--out"])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("loadtest runs");
    let stderr = child.stderr.take().expect("a piped stderr");
    let (lines, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end, listened to or not: a closed pipe would fail the
        // comparison's next line.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("loadtest: {line}");
            let _ = lines.send(line);
        }
    });
    (child, receiver)
}

/// Waits for the progress line of a finished run (`[…] 1/4 sql · burst …
/// — ok: sold 200 of 200, …`).
fn wait_for_a_finished_run(child: &mut Child, lines: &mpsc::Receiver<String>) {
    let deadline = Instant::now() + FIRST_RUN;
    while Instant::now() < deadline {
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) if line.contains(" — ") && line.contains(": sold ") => return,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("loadtest ended before a run finished: {:?}", child.wait())
            }
            _ => {}
        }
    }
    let _ = child.kill();
    panic!("no run finished within {FIRST_RUN:?}");
}

/// Waits for `child` to exit, at most [`STOP`].
fn wait(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + STOP;
    loop {
        if let Some(status) = child.try_wait().expect("loadtest's status") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("loadtest did not exit within {STOP:?} of the signal");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts a comparison of `args` and waits until a run finished; checks
/// that the processes named in `expected` (at least once each) are among
/// those it started, and answers it with them.
fn start_until_a_run_finished(
    out: &Path,
    args: &[&str],
    expected: &[&str],
) -> (Child, BTreeSet<Process>) {
    let _ = std::fs::remove_dir_all(out);
    let (mut child, lines) = start(out, args);
    wait_for_a_finished_run(&mut child, &lines);
    let started = descendants(child.id());
    let names: BTreeSet<&str> = started.iter().map(|p| p.name.as_str()).collect();
    for name in expected {
        assert!(names.contains(name), "no {name} among the processes it started: {started:?}");
    }
    (child, started)
}

/// Fails when any of `started` is still alive after `within` (each then
/// killed, so that a failure leaves nothing behind either).
fn assert_none_left(started: &BTreeSet<Process>, within: Duration) {
    let deadline = Instant::now() + within;
    let mut left = alive(started);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = alive(started);
    }
    for process in &left {
        let _ = Command::new("kill").args(["-KILL", &process.pid.to_string()]).status();
    }
    assert!(left.is_empty(), "processes of the comparison outlived it: {left:?}");
}

/// Interrupts a comparison of `args` with `signal` once a run finished;
/// checks that the processes named in `expected` were among those it
/// started, that none of them is left once it exited, and that it exits
/// with `code` and writes a report marked partial. Answers its report.json.
fn interrupt(out: &Path, args: &[&str], expected: &[&str], signal: &str, code: i32) -> Value {
    let (mut child, started) = start_until_a_run_finished(out, args, expected);
    test_support::signal(child.id(), signal);
    let status = wait(&mut child);
    assert_none_left(&started, Duration::ZERO);
    assert_eq!(status.code(), Some(code), "loadtest compare after SIG{signal}: {status}");
    let text = std::fs::read_to_string(out.join("report.json")).expect("a partial report.json");
    let report: Value = serde_json::from_str(&text).expect("report.json is JSON");
    let partial = &report["partial"];
    assert_eq!(partial["reason"], format!("interrupted by SIG{signal}"), "{partial}");
    let finished = report["runs"].as_array().expect("runs").len() as u64;
    assert!(finished >= 1, "the finished run is reported: {partial}");
    assert!(finished < partial["runs_planned"].as_u64().unwrap(), "{partial}");
    let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    let heading = md.lines().take(5).collect::<Vec<_>>().join("\n");
    assert!(heading.contains("Partial report"), "report.md says so at its top: {heading}");
    let html = std::fs::read_to_string(out.join("report.html")).expect("report.html");
    assert!(html.contains("Partial report"), "report.html says so");
    report
}

#[test]
fn a_comparison_stopped_by_sigterm_stops_its_instances_and_owned_redis_and_rabbitmq_nodes() {
    let _heavy = test_support::heavy();
    let out = std::env::temp_dir().join(format!("loadtest-sigterm-{}", std::process::id()));
    let args = [
        "--strategies",
        "sql,redis-decr",
        "--faults",
        "redis-restart,broker-restart",
        "--fault-restart-ms",
        "200",
        "--settle-s",
        "2",
    ];
    let expected = ["seckill", "redis-server", "beam.smp"];
    let report = interrupt(&out, &args, &expected, "TERM", 143);
    assert_eq!(report["partial"]["runs_planned"], 4, "2 strategies × 2 faults");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_comparison_stopped_by_sigint_stops_its_instances_balancer_and_redlock_nodes() {
    let _heavy = test_support::heavy();
    let out = std::env::temp_dir().join(format!("loadtest-sigint-{}", std::process::id()));
    let args = ["--strategies", "sql,lock/redlock", "--haproxy"];
    let report = interrupt(&out, &args, &["seckill", "haproxy", "redis-server"], "INT", 130);
    assert_eq!(report["partial"]["runs_planned"], 2);
    let _ = std::fs::remove_dir_all(&out);
}

/// Nothing runs after `SIGKILL`: the processes end because each was set to
/// die with its parent, the RabbitMQ node's Erlang VM included.
#[test]
fn a_comparison_killed_with_sigkill_leaves_no_process_either() {
    let _heavy = test_support::heavy();
    let out = std::env::temp_dir().join(format!("loadtest-sigkill-{}", std::process::id()));
    let args = [
        "--strategies",
        "sql,lock/redlock",
        "--faults",
        "redis-restart,broker-restart",
        "--fault-restart-ms",
        "200",
        "--settle-s",
        "2",
    ];
    let expected = ["seckill", "redis-server", "beam.smp"];
    let (mut child, started) = start_until_a_run_finished(&out, &args, &expected);
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // The kernel signals the children at once; they take a moment to end.
    assert_none_left(&started, Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&out);
}
