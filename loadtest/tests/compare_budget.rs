//! End to end: `--service-cpu-budget` caps the instances and the servers
//! for the whole comparison, records the budget, and puts every process
//! back where it was (docs/report-format.md, "CPU budgets").

use std::path::Path;

/// The budget of the test, cores: a quarter of this 2-core machine.
const BUDGET: f64 = 0.5;

/// Where process `pid` is in the cgroup v1 `cpu` hierarchy.
fn cpu_group(pid: &str) -> Option<String> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "cpu").then(|| path.to_owned())
    })
}

/// The pid of the oldest process named `postgres` (the postmaster).
fn postmaster() -> Option<String> {
    let out = std::process::Command::new("pgrep").args(["-o", "-x", "postgres"]).output().ok()?;
    let pid = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!pid.is_empty()).then_some(pid)
}

#[test]
fn a_budgeted_comparison_records_its_budget_stays_within_it_and_gives_the_cores_back() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let cgroup_v1 = Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists();
    if !(root && cgroup_v1) {
        return eprintln!("needs root and the cgroup v1 cpu controller: nothing to test");
    }
    let postgres = postmaster().expect("Postgres runs on this machine");
    let home = cpu_group(&postgres);
    let out = std::env::temp_dir().join(format!("loadtest-budget-{}", std::process::id()));
    let budget = BUDGET.to_string();
    let args = [
        "--strategies",
        "sql",
        "--repeat",
        "1",
        "--steady-window-s",
        "1",
        "--service-cpu-budget",
        &budget,
    ];
    let report = crate::support::compare(&out, &args);
    assert_eq!(report["machine"]["service_cpu_budget_cores"], BUDGET, "recorded");
    for run in report["runs"].as_array().unwrap() {
        assert_eq!(run["verdict"], "ok", "{run}");
        let busy = run["cpu"]["steady_service_cores"].as_f64().unwrap();
        // The kernel caps the group; the readings every 200 ms interpolate
        // the window's ends, which may add a little.
        assert!(busy <= BUDGET * 1.15, "the service kept {busy} cores busy under {BUDGET}");
        assert!(run["cost"]["serial_ms_per_unit"].as_f64().unwrap() > 0.0, "{run}");
        let tiers = &run["cost"]["cpu_ms_per_unit_by_tier"];
        assert!(tiers["postgres"].as_f64().unwrap() > 0.0, "{tiers}");
    }
    assert_eq!(cpu_group(&postgres), home, "Postgres is back in its own group");
    let _ = std::fs::remove_dir_all(&out);
}
