//! [`Weighted`]: this process in a group of the cgroup v1 `cpu` controller
//! of its own, weighted above its neighbours, and [`start_outside`]: the
//! processes it starts stay where it was. [`Budget`]: other processes in a
//! group whose CPU time is capped at a number of cores.
//!
//! A load generator that must send on a schedule shares the cores with the
//! service it measures; when the service keeps them busy, the generator's
//! threads wait for a core and its arrivals leave late. The scheduler
//! divides a busy core between groups by their `cpu.shares` (1024 for a
//! group at the default, and for each session's autogroup): a generator in
//! a group of, say, 10 240 shares gets a core within its next scheduling
//! slice whenever it has work, and takes no more than the work it has.
//! That is the nearest a shared machine comes to the generator's own cores
//! (Linux, `Documentation/admin-guide/cgroup-v1/cgroups.rst` and
//! `scheduler/sched-design-CFS.rst`).
//!
//! Kept by hand rather than with a cgroup crate: it is three file writes,
//! and the one in [`start_outside`] runs between `fork` and `exec`, where a
//! library's allocations may not.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The `cgroup.procs` of the group this process left for its weighted one,
/// read by [`start_outside`] in the child between `fork` and `exec`.
static HOME_PROCS: OnceLock<CString> = OnceLock::new();

/// The weighted group while a [`Weighted`] is alive: the process leaves it
/// when the last one is dropped, so that two phases that overlap (two tests
/// of one test binary) both run weighted to their end.
static ACTIVE: Mutex<Option<Active>> = Mutex::new(None);

struct Active {
    /// The group's directory, and the one the process came from.
    dir: PathBuf,
    home: PathBuf,
    /// Its `cpu.shares` as the kernel took them.
    shares: u64,
    /// The [`Weighted`] alive.
    holders: usize,
}

/// This process inside a `cpu` group of its own; dropping the last one
/// alive moves the process back and removes the group.
#[derive(Debug)]
pub struct Weighted {
    shares: u64,
}

impl Weighted {
    /// Moves this process (every thread) into a new group
    /// `seckill-generator-<pid>` below its current `cpu` group, with
    /// `shares` (2 to 262 144; 1024 is the default weight).
    ///
    /// While another `Weighted` is alive the process is in its group
    /// already: this one shares that group and its weight ([`shares`]
    /// answers the weight in effect).
    ///
    /// Errors: no cgroup v1 `cpu` controller mounted (a cgroup v2 host, a
    /// container without it), or no permission to create a group (not
    /// root): the message says which, and the process stays where it was.
    ///
    /// [`shares`]: Self::shares
    pub fn enter(shares: u64) -> Result<Weighted, String> {
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(active) = active.as_mut() {
            active.holders += 1;
            return Ok(Weighted { shares: active.shares });
        }
        let entered = move_in(shares)?;
        let shares = entered.shares;
        *active = Some(entered);
        Ok(Weighted { shares })
    }

    /// The group's `cpu.shares`, as the kernel took them (it raises 0 and 1
    /// to 2).
    pub fn shares(&self) -> u64 {
        self.shares
    }
}

impl Drop for Weighted {
    fn drop(&mut self) {
        let mut active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entered) = active.as_mut() else { return };
        entered.holders -= 1;
        if entered.holders > 0 {
            return;
        }
        let pid = std::process::id().to_string();
        let _ = std::fs::write(entered.home.join("cgroup.procs"), pid);
        // Empty now: the children started meanwhile went home at their start.
        let _ = std::fs::remove_dir(&entered.dir);
        *active = None;
    }
}

/// Creates the group, sets its shares and moves this process into it; on a
/// failure after the group was made, removes it again.
fn move_in(shares: u64) -> Result<Active, String> {
    let home = own_cpu_group()?;
    let dir = home.join(format!("seckill-generator-{}", std::process::id()));
    let fail = |what: &str, err: std::io::Error| format!("{what} {}: {err}", dir.display());
    match std::fs::create_dir(&dir) {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(fail("creating the cpu group", err));
        }
        _ => {}
    }
    let procs = home.join("cgroup.procs");
    if let Ok(path) = CString::new(procs.as_os_str().as_encoded_bytes()) {
        let _ = HOME_PROCS.set(path);
    }
    let moved = std::fs::write(dir.join("cpu.shares"), shares.to_string())
        .and_then(|()| std::fs::read_to_string(dir.join("cpu.shares")))
        .map_err(|err| fail("setting cpu.shares of", err))
        .and_then(|taken| taken.trim().parse().map_err(|_| format!("cpu.shares {taken}")))
        .and_then(|taken| {
            std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
                .map(|()| taken)
                .map_err(|err| fail("moving this process into", err))
        });
    match moved {
        Ok(shares) => Ok(Active { dir, home, shares, holders: 1 }),
        Err(err) => {
            let _ = std::fs::remove_dir(&dir);
            Err(err)
        }
    }
}

/// Has the process `command` starts begin in the `cpu` group its owner was
/// in before [`Weighted::enter`] (nothing when the owner never entered
/// one): a server or an instance the owner starts is weighed as before,
/// not with the generator's weight.
///
/// The hook runs after the child has taken a `Command::uid` of its own, and
/// a user other than root may not move itself: such a child is moved by its
/// owner instead, right after the start ([`move_outside`]).
pub fn start_outside(command: &mut Command) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: between fork and exec the closure reads a `OnceLock` (an
        // atomic load) and calls only open, write and close, which are
        // async-signal-safe; it allocates nothing.
        unsafe {
            command.pre_exec(|| {
                if let Some(procs) = HOME_PROCS.get() {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd >= 0 {
                        // "0": the writing process itself.
                        let _ = libc::write(fd, c"0".as_ptr().cast(), 1);
                        libc::close(fd);
                    }
                }
                Ok(())
            })
        };
    }
    command
}

/// Moves the started process `pid` (every thread) to the group its owner was
/// in before [`Weighted::enter`], while one is alive; nothing otherwise. For
/// a child started as another user, whose own [`start_outside`] could not.
pub fn move_outside(pid: u32) {
    let active = ACTIVE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(active) = active.as_ref() {
        let _ = std::fs::write(active.home.join("cgroup.procs"), pid.to_string());
    }
}

/// The period of a [`Budget`]'s CFS quota, microseconds: the kernel's
/// default (`cpu.cfs_period_us`, 100 ms).
pub const BUDGET_PERIOD_US: u64 = 100_000;

/// Processes in a `cpu` group of their own whose CPU time is capped by the
/// CFS bandwidth controller at `cores` × the period per period
/// (`cpu.cfs_quota_us`; Linux, `Documentation/scheduler/sched-bwc.rst`):
/// together they run on at most that many cores' worth of time, whatever
/// the machine has, while processes outside keep the rest.
///
/// Children a member forks later (a Postgres backend forked by the
/// postmaster) start inside, as every child starts in its parent's group.
/// Dropping the budget moves every process still inside back — each to the
/// group it came from, a child born inside to the group the budget was made
/// in — and removes the group. A budget whose owner died without dropping
/// it (killed) is emptied the same way and removed by the next
/// [`Budget::create`] on the machine, so that no server stays capped.
#[derive(Debug)]
pub struct Budget {
    dir: PathBuf,
    /// The group the budget was made in.
    parent: PathBuf,
    /// Each admitted process and the group it came from.
    homes: Vec<(u32, PathBuf)>,
    cores: f64,
}

impl Budget {
    /// A new group `seckill-budget-<pid>` below this process's `cpu` group,
    /// capped at `cores` (above 0; a quota below the kernel's 1 ms minimum
    /// is refused). The cores the kernel took are [`Budget::cores`].
    ///
    /// Errors: as [`Weighted::enter`] (no cgroup v1 `cpu` controller, not
    /// root), or a quota the kernel refused.
    pub fn create(cores: f64) -> Result<Budget, String> {
        if !(cores.is_finite() && cores > 0.0) {
            return Err(format!("a CPU budget of {cores} cores: give a number above 0"));
        }
        let parent = own_cpu_group()?;
        remove_orphans(&parent);
        let dir = parent.join(format!("seckill-budget-{}", std::process::id()));
        let fail = |what: &str, err: std::io::Error| format!("{what} {}: {err}", dir.display());
        match std::fs::create_dir(&dir) {
            Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(fail("creating the cpu group", err));
            }
            _ => {}
        }
        let quota = (cores * BUDGET_PERIOD_US as f64).round() as u64;
        let written = std::fs::write(dir.join("cpu.cfs_period_us"), BUDGET_PERIOD_US.to_string())
            .and_then(|()| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
            .and_then(|()| read_u64(&dir.join("cpu.cfs_quota_us")))
            .and_then(|q| Ok((q, read_u64(&dir.join("cpu.cfs_period_us"))?)));
        match written {
            Ok((quota, period)) if period > 0 => {
                let cores = quota as f64 / period as f64;
                Ok(Budget { dir, parent, homes: Vec::new(), cores })
            }
            Ok(_) => Err(format!("{} has no CFS period", dir.display())),
            Err(err) => {
                let _ = std::fs::remove_dir(&dir);
                Err(fail("setting the CPU quota of", err))
            }
        }
    }

    /// The cores the budget allows, as the kernel took them (quota ÷
    /// period).
    pub fn cores(&self) -> f64 {
        self.cores
    }

    /// Moves process `pid` (every thread) into the budget, remembering the
    /// group it was in. Errors: the process has ended, or the move was
    /// refused.
    pub fn admit(&mut self, pid: u32) -> Result<(), String> {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map_err(|err| format!("process {pid}: {err}"))?;
        let home = self.group_dir(cpu_path(&cgroup).unwrap_or("/"));
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .map_err(|err| format!("moving process {pid} into {}: {err}", self.dir.display()))?;
        self.homes.push((pid, home));
        Ok(())
    }

    /// Microseconds the kernel held the budget's processes back because
    /// they had used their quota (`cpu.stat`'s `throttled_time`, in
    /// nanoseconds there), since the budget was made.
    pub fn throttled_us(&self) -> u64 {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let ns = stat.lines().find_map(|line| line.strip_prefix("throttled_time "));
        ns.and_then(|ns| ns.trim().parse::<u64>().ok()).unwrap_or(0) / 1_000
    }

    /// The directory of the group at `path` of the `cpu` hierarchy.
    fn group_dir(&self, path: &str) -> PathBuf {
        let mount = self.parent.ancestors().find(|a| a.join("cgroup.sane_behavior").exists());
        let mount = mount.unwrap_or(&self.parent);
        mount.join(path.trim_start_matches('/'))
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        for pid in procs(&self.dir) {
            let home = self.homes.iter().find(|(p, _)| *p == pid).map(|(_, h)| h);
            let home = home.filter(|h| h.is_dir()).unwrap_or(&self.parent);
            let _ = std::fs::write(home.join("cgroup.procs"), pid.to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Empties and removes the budgets below `parent` whose owner has ended.
fn remove_orphans(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(|n| n.strip_prefix("seckill-budget-")) else {
            continue;
        };
        if Path::new("/proc").join(owner).exists() {
            continue;
        }
        for pid in procs(&entry.path()) {
            let _ = std::fs::write(parent.join("cgroup.procs"), pid.to_string());
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

/// The processes of the group at `dir`.
fn procs(dir: &Path) -> Vec<u32> {
    let listed = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    listed.lines().filter_map(|line| line.trim().parse().ok()).collect()
}

fn read_u64(path: &Path) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim().parse().map_err(|_| std::io::Error::other(format!("{}: {text}", path.display())))
}

/// The directory of this process's `cpu` group: the mount point of the
/// cgroup v1 hierarchy with the `cpu` controller (`/proc/self/mountinfo`)
/// joined with the process's path in it (`/proc/self/cgroup`).
fn own_cpu_group() -> Result<PathBuf, String> {
    let read = |path: &str| std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"));
    let (mountinfo, cgroup) = (read("/proc/self/mountinfo")?, read("/proc/self/cgroup")?);
    let (mount, root) =
        cpu_mount(&mountinfo).ok_or("no cgroup v1 hierarchy with the cpu controller is mounted")?;
    let path = cpu_path(&cgroup).ok_or("this process is in no cgroup v1 cpu group")?;
    let inside = path.strip_prefix(root).unwrap_or(path).trim_start_matches('/');
    let dir = Path::new(mount).join(inside);
    if dir.join("cpu.shares").exists() {
        Ok(dir)
    } else {
        Err(format!("{} has no cpu.shares", dir.display()))
    }
}

/// The mount point and root of the cgroup v1 hierarchy that carries the
/// `cpu` controller, from `/proc/self/mountinfo` (`proc(5)`: fields 4 and 5
/// are the root and the mount point; after ` - `, the type and the source,
/// then the super options, which name the controllers).
fn cpu_mount(mountinfo: &str) -> Option<(&str, &str)> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (kind, _source, options) = (fs.next()?, fs.next()?, fs.next()?);
        let controls_cpu = options.split(',').any(|option| option == "cpu");
        if kind != "cgroup" || !controls_cpu {
            return None;
        }
        let fields: Vec<&str> = mount.split(' ').collect();
        Some((*fields.get(4)?, *fields.get(3)?))
    })
}

/// The process's path in the `cpu` hierarchy, from `/proc/self/cgroup`
/// (`id:controllers:path` lines).
fn cpu_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "cpu").then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taken by the tests that move this process or its children between
    /// groups: a child one spawns while the other has the process in its
    /// weighted group starts there, and keeps that group from being removed.
    static GROUPS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    const MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
33 26 0:28 / /sys/fs/cgroup/cpuset rw,nosuid shared:9 - cgroup cgroup rw,cpuset
34 26 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup cgroup rw,cpu,cpuacct
35 26 0:30 / /sys/fs/cgroup/cpuacct rw,nosuid shared:11 - cgroup cgroup rw,cpuacct";

    #[test]
    fn the_cpu_hierarchy_is_found_by_its_controller_not_its_name() {
        assert_eq!(cpu_mount(MOUNTINFO), Some(("/sys/fs/cgroup/cpu,cpuacct", "/")));
        // cpuset and cpuacct are not cpu.
        assert_eq!(cpu_mount(&MOUNTINFO.lines().take(2).collect::<Vec<_>>().join("\n")), None);
    }

    #[test]
    fn the_path_comes_from_the_line_that_names_cpu() {
        let cgroup = "3:cpuset:/\n2:cpuacct:/other\n1:cpu,cpuacct:/user.slice/x\n0::/v2";
        assert_eq!(cpu_path(cgroup), Some("/user.slice/x"));
        assert_eq!(cpu_path("0::/only-v2"), None);
    }

    /// Where `pid` is in the `cpu` hierarchy.
    fn group_of(pid: u32) -> String {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        cpu_path(&cgroup).unwrap().to_owned()
    }

    /// Moves the whole test process: the one test here that does.
    #[test]
    fn a_weighted_process_starts_its_children_outside_and_comes_back_home() {
        let _groups = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        let home = match cpu_path(&std::fs::read_to_string("/proc/self/cgroup").unwrap()) {
            Some(path) => path.to_owned(),
            None => return eprintln!("no cgroup v1 cpu controller here: nothing to test"),
        };
        let weighted = match Weighted::enter(4096) {
            Ok(weighted) => weighted,
            // Not root: the error must say what failed.
            Err(err) => return assert!(err.contains("cpu group"), "{err}"),
        };
        let me = std::process::id();
        assert!(group_of(me).ends_with(&format!("seckill-generator-{me}")), "{}", group_of(me));
        let dir = ACTIVE.lock().unwrap().as_ref().unwrap().dir.clone();
        let shares = std::fs::read_to_string(dir.join("cpu.shares")).unwrap();
        assert_eq!((shares.trim(), weighted.shares()), ("4096", 4096));
        let mut child = start_outside(Command::new("sleep").arg("5")).spawn().unwrap();
        let mut plain = Command::new("sleep").arg("5").spawn().unwrap();
        assert_eq!(group_of(child.id()), home, "a child started outside");
        assert_eq!(group_of(plain.id()), group_of(me), "a child started plainly inherits");
        move_outside(plain.id());
        assert_eq!(group_of(plain.id()), home, "moved out by its owner");
        plain.kill().unwrap();
        plain.wait().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // A second phase that overlaps the first shares its group and weight,
        // and the process stays in it until both have ended.
        let second = Weighted::enter(8192).unwrap();
        assert_eq!(second.shares(), 4096);
        drop(weighted);
        assert!(group_of(me).ends_with(&format!("seckill-generator-{me}")), "still weighted");
        drop(second);
        assert_eq!(group_of(me), home);
        assert!(!dir.exists(), "the group is removed");
        // The weight recorded is the one the kernel took: it raises 1 to 2.
        let least = Weighted::enter(1).unwrap();
        assert_eq!(least.shares(), 2);
        drop(least);
        assert_eq!(group_of(me), home);
    }

    /// CPU seconds process `pid` has used (`/proc/<pid>/stat` fields 14
    /// and 15, in clock ticks of 1/100 s).
    fn cpu_s(pid: u32) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        ticks as f64 / 100.0
    }

    #[test]
    fn a_budget_caps_its_processes_and_sends_them_home() {
        let _groups = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
        if cpu_path(&std::fs::read_to_string("/proc/self/cgroup").unwrap()).is_none() {
            return eprintln!("no cgroup v1 cpu controller here: nothing to test");
        }
        assert!(Budget::create(0.0).unwrap_err().contains("above 0"));
        let mut budget = match Budget::create(0.25) {
            Ok(budget) => budget,
            Err(err) => return assert!(err.contains("cpu group"), "{err}"),
        };
        assert_eq!(budget.cores(), 0.25);
        let mut spinner = Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        let home = group_of(spinner.id());
        budget.admit(spinner.id()).unwrap();
        assert!(group_of(spinner.id()).contains("seckill-budget-"), "{}", group_of(spinner.id()));
        let before = cpu_s(spinner.id());
        std::thread::sleep(std::time::Duration::from_secs(2));
        let used = (cpu_s(spinner.id()) - before) / 2.0;
        // A spinning process takes a whole core when it may; capped, a
        // quarter (and a tick of rounding).
        assert!(used <= 0.25 + 0.06, "used {used} cores under a budget of 0.25");
        assert!(budget.throttled_us() > 0, "the kernel held it back");
        let dir = budget.dir.clone();
        drop(budget);
        assert_eq!(group_of(spinner.id()), home, "back where it was");
        assert!(!dir.exists(), "the group is removed");
        spinner.kill().unwrap();
        spinner.wait().unwrap();
    }
}
