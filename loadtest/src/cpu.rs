//! CPU seconds each group of processes used during a phase, so that a
//! reader sees how much of the machine the load generator took from the
//! services it measures.
//!
//! The groups are told apart by process id and name, read from `/proc`
//! through sysinfo (each process' user + system time, every thread
//! included): the load generator is this process, the instances are the
//! child processes it started, Postgres is every process named `postgres`
//! (the postmaster and every backend), Redis every `redis-server` (the
//! shared one and the Redlock nodes), RabbitMQ the Erlang VM and its
//! helpers (`beam.smp`, `erl_child_setup`, `epmd`, `inet_gethost`). A
//! process that ends during the phase takes its time with it; the servers'
//! pooled connections live through a run, so little is lost.
//!
//! Resolution: the kernel reports a process' time in clock ticks
//! (`USER_HZ`, 100 per second on Linux), so each process' figure is exact
//! to 10 ms, and a group that used a few milliseconds in a short phase may
//! read 0. A group with no process on this machine (a server in a container
//! or on another host) reads `null`: not measured, never 0.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};

/// A group of processes whose CPU time is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    Loadgen,
    Instances,
    Postgres,
    Redis,
    Rabbitmq,
}

/// Process names of RabbitMQ's Erlang runtime.
const RABBITMQ: &[&str] = &["beam.smp", "erl_child_setup", "epmd", "inet_gethost"];

/// The group of process `pid` named `name`, `None` for every other process.
pub fn group_of(pid: u32, name: &str, loadgen: u32, instances: &[u32]) -> Option<Group> {
    if pid == loadgen {
        Some(Group::Loadgen)
    } else if instances.contains(&pid) {
        Some(Group::Instances)
    } else if name == "postgres" {
        Some(Group::Postgres)
    } else if name == "redis-server" {
        Some(Group::Redis)
    } else if RABBITMQ.contains(&name) {
        Some(Group::Rabbitmq)
    } else {
        None
    }
}

/// CPU milliseconds of every process of a group at one moment, by pid.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    groups: BTreeMap<Group, BTreeMap<u32, u64>>,
}

/// Reads every process' CPU time; `System` keeps the process list between
/// readings.
pub struct CpuMeter {
    system: System,
    loadgen: u32,
    instances: Vec<u32>,
    cpus: usize,
}

impl CpuMeter {
    /// A meter for this process and the instances `instances` it started.
    pub fn new(instances: Vec<u32>) -> CpuMeter {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        CpuMeter { system: System::new(), loadgen: std::process::id(), instances, cpus }
    }

    /// Every grouped process' CPU time now.
    pub fn snapshot(&mut self) -> Snapshot {
        self.system.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            ProcessRefreshKind::nothing().with_cpu().without_tasks(),
        );
        let mut snapshot = Snapshot::default();
        for (pid, process) in self.system.processes() {
            if process.thread_kind().is_some() {
                continue;
            }
            let name = process.name().to_string_lossy();
            if let Some(group) = group_of(pid.as_u32(), &name, self.loadgen, &self.instances) {
                let ms = process.accumulated_cpu_time();
                snapshot.groups.entry(group).or_default().insert(pid.as_u32(), ms);
            }
        }
        snapshot
    }

    /// The CPU seconds of each group between two snapshots taken
    /// `wall_s` seconds apart.
    pub fn between(&self, before: &Snapshot, after: &Snapshot, wall_s: f64) -> Cpu {
        let seconds = |group| used_s(before, after, group);
        let loadgen_s = seconds(Group::Loadgen).unwrap_or(0.0);
        let capacity = wall_s * self.cpus as f64;
        Cpu {
            loadgen_s,
            instances_s: seconds(Group::Instances).unwrap_or(0.0),
            postgres_s: seconds(Group::Postgres),
            redis_s: seconds(Group::Redis),
            rabbitmq_s: seconds(Group::Rabbitmq),
            machine_share_loadgen: (capacity > 0.0).then(|| round(loadgen_s / capacity, 3)),
            steady_service_s: None,
            steady_service_cores: None,
        }
    }
}

/// CPU seconds `group` used from `before` to `after`: each process' growth
/// (a process that started meanwhile counts from 0); `None` when no process
/// of the group was running at the end.
fn used_s(before: &Snapshot, after: &Snapshot, group: Group) -> Option<f64> {
    let now = after.groups.get(&group)?;
    let then = before.groups.get(&group);
    let ms: u64 = now
        .iter()
        .map(|(pid, ms)| ms.saturating_sub(then.and_then(|t| t.get(pid)).copied().unwrap_or(0)))
        .sum();
    Some(round(ms as f64 / 1000.0, 3))
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// Caps the service side at `cores` ([`owned_servers::cpu_group::Budget`]):
/// the instances `instances` and every process of this machine that
/// [`group_of`] puts in the Postgres, Redis or RabbitMQ group — the
/// processes whose CPU the report calls the service's. The load generator
/// stays outside. Errors: the budget could not be made, or a process could
/// not be moved (one that ended meanwhile is skipped).
pub fn budget_service(
    cores: f64,
    instances: &[u32],
) -> Result<owned_servers::cpu_group::Budget, String> {
    let mut budget = owned_servers::cpu_group::Budget::create(cores)?;
    let mut system = System::new();
    system.refresh_processes_specifics(ProcessesToUpdate::All, true, ProcessRefreshKind::nothing());
    let loadgen = std::process::id();
    let servers = system.processes().iter().filter(|(_, process)| process.thread_kind().is_none());
    let servers = servers.filter_map(|(pid, process)| {
        let group = group_of(pid.as_u32(), &process.name().to_string_lossy(), loadgen, instances);
        matches!(group, Some(Group::Postgres | Group::Redis | Group::Rabbitmq))
            .then_some(pid.as_u32())
    });
    let pids: Vec<u32> = instances.iter().copied().chain(servers).collect();
    for pid in pids {
        if let Err(err) = budget.admit(pid)
            && std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            return Err(err);
        }
    }
    Ok(budget)
}

/// How often a [`Sampler`] reads every process' CPU time: a tenth of the
/// shortest steady window that ranks is 300 ms, so the window's bounds fall
/// within a fifth of that of a reading; one reading of every process costs
/// a few milliseconds of one core.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(200);

/// The service side's cumulative CPU seconds since a sampler started, at
/// one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub at: DateTime<Utc>,
    pub service_s: f64,
}

/// Reads every grouped process' CPU time on a thread of its own every
/// [`SAMPLE_PERIOD`] while a phase runs, so that the CPU of any window of
/// the phase can be read afterwards ([`service_between`]); the thread keeps
/// the readings off the load generator's runtime.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Cpu, Vec<Reading>)>,
}

impl Sampler {
    /// Starts sampling this process and the instances `instances` it
    /// started, with a first reading now.
    pub fn start(instances: Vec<u32>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut meter = CpuMeter::new(instances);
            let (started, before) = (Instant::now(), meter.snapshot());
            let mut readings = vec![Reading { at: Utc::now(), service_s: 0.0 }];
            let mut last = before.clone();
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(SAMPLE_PERIOD);
                last = meter.snapshot();
                let service_s = meter.between(&before, &last, 0.0).service_s();
                readings.push(Reading { at: Utc::now(), service_s });
            }
            (meter.between(&before, &last, started.elapsed().as_secs_f64()), readings)
        });
        Sampler { stop, thread }
    }

    /// Stops sampling (within one period) and answers the CPU of each group
    /// from the start to the last reading, and every reading.
    pub fn stop(self) -> (Cpu, Vec<Reading>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Service-side CPU seconds between `from` and `to`, each end interpolated
/// linearly between the readings around it; `None` when the readings do
/// not cover both ends or `to` is before `from`.
pub fn service_between(
    readings: &[Reading],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Option<f64> {
    if to < from {
        return None;
    }
    Some(cumulative_at(readings, to)? - cumulative_at(readings, from)?)
}

/// The cumulative service CPU at `at`, interpolated between the readings
/// around it (readings in time order).
fn cumulative_at(readings: &[Reading], at: DateTime<Utc>) -> Option<f64> {
    let after = readings.iter().position(|r| r.at >= at)?;
    let next = readings[after];
    if next.at == at {
        return Some(next.service_s);
    }
    let prev = readings[..after].last()?;
    let span = (next.at - prev.at).num_microseconds()? as f64;
    let into = (at - prev.at).num_microseconds()? as f64;
    Some(prev.service_s + (next.service_s - prev.service_s) * into / span)
}

/// CPU seconds each group used during a run's sale phase (`runs[].cpu`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    /// This process: goose and the readings.
    pub loadgen_s: f64,
    /// The app instances, together.
    pub instances_s: f64,
    /// Every `postgres` process; `None` when none runs on this machine.
    pub postgres_s: Option<f64>,
    /// Every `redis-server` process; `None` when none runs on this machine.
    pub redis_s: Option<f64>,
    /// RabbitMQ's Erlang runtime; `None` when it does not run on this
    /// machine.
    pub rabbitmq_s: Option<f64>,
    /// `loadgen_s ÷ (phase seconds × CPUs)`: the share of the whole machine
    /// the load generator took.
    pub machine_share_loadgen: Option<f64>,
    /// Service-side CPU seconds (instances and servers) within the run's
    /// steady window, interpolated between readings every 200 ms: the
    /// numerator of `cost.cpu_ms_per_unit`; `null` without a window and in
    /// reports before it.
    #[serde(default)]
    pub steady_service_s: Option<f64>,
    /// `steady_service_s ÷ the window's seconds`: the cores the service side
    /// kept busy while the run's sell-through was measured; above the
    /// machine's CPUs only through a measurement error (flagged
    /// `cpu_over_cores`).
    #[serde(default)]
    pub steady_service_cores: Option<f64>,
}

impl Cpu {
    /// CPU seconds of the service side: instances and the backing servers
    /// measured on this machine (one that was not measured adds nothing).
    pub fn service_s(&self) -> f64 {
        let servers = [self.postgres_s, self.redis_s, self.rabbitmq_s];
        self.instances_s + servers.iter().flatten().sum::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_grouped_by_pid_first_then_by_name() {
        let group = |pid, name| group_of(pid, name, 100, &[200, 201]);
        assert_eq!(group(100, "loadtest"), Some(Group::Loadgen));
        assert_eq!(group(201, "seckill"), Some(Group::Instances));
        assert_eq!(group(300, "seckill"), None, "an instance this process did not start");
        assert_eq!(group(301, "postgres"), Some(Group::Postgres));
        assert_eq!(group(302, "redis-server"), Some(Group::Redis));
        for name in ["beam.smp", "erl_child_setup", "epmd", "inet_gethost"] {
            assert_eq!(group(303, name), Some(Group::Rabbitmq), "{name}");
        }
        assert_eq!(group(304, "cargo"), None);
        assert_eq!(group(305, "postgresql-helper"), None);
    }

    fn snapshot(entries: &[(Group, u32, u64)]) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for &(group, pid, ms) in entries {
            snapshot.groups.entry(group).or_default().insert(pid, ms);
        }
        snapshot
    }

    #[test]
    fn a_phase_counts_each_process_growth_and_the_loadgen_share() {
        let before = snapshot(&[(Group::Loadgen, 1, 1_000), (Group::Postgres, 7, 500)]);
        let after = snapshot(&[
            (Group::Loadgen, 1, 3_000),
            (Group::Postgres, 7, 900),
            (Group::Postgres, 8, 250),
            (Group::Redis, 9, 100),
        ]);
        let meter = CpuMeter { system: System::new(), loadgen: 1, instances: vec![], cpus: 2 };
        let cpu = meter.between(&before, &after, 4.0);
        assert_eq!((cpu.loadgen_s, cpu.postgres_s, cpu.redis_s), (2.0, Some(0.65), Some(0.1)));
        assert_eq!(cpu.instances_s, 0.0);
        assert_eq!(cpu.rabbitmq_s, None, "no RabbitMQ process: not measured, not 0");
        assert_eq!(cpu.machine_share_loadgen, Some(0.25), "2 s of 4 s × 2 CPUs");
        assert!((cpu.service_s() - 0.75).abs() < 1e-9);
    }

    #[test]
    fn the_cpu_of_a_window_is_interpolated_between_readings() {
        use chrono::TimeZone;
        let at = |ms: i64| Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap();
        let reading = |ms, service_s| Reading { at: at(ms), service_s };
        // 2 CPU-seconds per second for the first second, then 1.
        let readings =
            [reading(0, 0.0), reading(200, 0.4), reading(1_000, 2.0), reading(2_000, 3.0)];
        let between = |from, to| service_between(&readings, at(from), at(to)).unwrap();
        assert!((between(100, 1_500) - (2.5 - 0.2)).abs() < 1e-9);
        assert!((between(200, 1_000) - 1.6).abs() < 1e-9, "on readings");
        assert_eq!(service_between(&readings, at(-1), at(500)), None, "before the first");
        assert_eq!(service_between(&readings, at(500), at(2_001)), None, "after the last");
        assert_eq!(service_between(&readings, at(900), at(800)), None);
    }

    #[test]
    fn a_sampler_reads_until_it_is_stopped() {
        let sampler = Sampler::start(vec![]);
        std::thread::sleep(SAMPLE_PERIOD * 3);
        let (cpu, readings) = sampler.stop();
        assert!(readings.len() >= 2, "{readings:?}");
        // In time order. The service's CPU may fall between two readings: a
        // server process that ends (a Postgres backend of another test's
        // connection) takes its time with it.
        assert!(readings.windows(2).all(|w| w[0].at <= w[1].at), "{readings:?}");
        assert!(readings.iter().all(|r| r.service_s.is_finite() && r.service_s >= 0.0));
        assert!(cpu.machine_share_loadgen.is_some(), "{cpu:?}");
    }

    #[test]
    fn this_process_is_found_and_its_cpu_time_grows() {
        let mut meter = CpuMeter::new(vec![]);
        let before = meter.snapshot();
        assert!(before.groups[&Group::Loadgen].contains_key(&std::process::id()));
        // Spin until the meter sees 50 ms of this process' CPU time (on a
        // busy machine that may take several times as long in wall time).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut x = 0u64;
        loop {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            let now = meter.snapshot();
            let cpu = meter.between(&before, &now, 1.0);
            if cpu.loadgen_s >= 0.05 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no CPU time seen: {cpu:?}");
        }
        std::hint::black_box(x);
    }
}
