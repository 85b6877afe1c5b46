//! The capacity model: what each strategy would sell on a described
//! deployment, from what its runs measured per unit, and which limit it
//! meets first (docs/scaling.md).
//!
//! **The model** is Amdahl's law in its bound form for a system of
//! resources (the asymptotic bounds of operational analysis: Lazowska,
//! Zahorjan, Graham and Sevcik, *Quantitative System Performance*, 1984,
//! ch. 5, `X ≤ 1 / D_max`). A resource with `N` cores busy `D` ms per unit
//! serves at most `1000 × N ÷ D` units a second; the sale's serial resource
//! (its row lock, its Redis lock, its one consumer) is one server whatever
//! the hardware, so it serves at most `1000 ÷ s` for a serial time `s` ms a
//! unit. The projection is the least of these bounds, and the limit it
//! names is the resource that sets it. Amdahl's law is the case of two
//! resources, a serial one and a parallel one.
//!
//! Why not Gunther's Universal Scalability Law: its contention and
//! coherency coefficients are fitted to a throughput curve over several
//! sizes and name no component, so they neither transfer to a deployment
//! whose tiers grow differently nor say which limit is met. Every input
//! here is measured per component, and the check across CPU budgets
//! ([`check`]) tests the model without fitting anything to it.
//!
//! The inputs are the medians over a strategy's runs of
//! `cost.cpu_ms_per_unit_by_tier` and of `cost.serial_ms_per_unit`, the
//! latter only over runs whose service side had cores to spare
//! ([`CPU_BOUND`]): a hold includes the time its holder waited for a core,
//! so in a run that kept every core busy the holds stretch with the CPU
//! shortage until the serial bound equals the rate the CPU allowed
//! (docs/scaling.md shows it at every budget) and measure the CPU, which
//! the CPU bound already counts. Without such a run the serial bound is
//! unknown, and the tables give the least hold measured as an upper bound
//! of the serial time.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

use crate::report::svg::{self, Row};
use crate::report::{Report, Run, Tiers};
use crate::stats::median;

/// A deployment to project onto: cores per tier and app instances
/// (`deploy/*.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    /// A short name, shown in the tables.
    pub name: String,
    /// One line on what it stands for.
    pub about: String,
    pub app: App,
    pub postgres: Cores,
    pub redis: Cores,
    pub rabbitmq: Cores,
}

/// The app tier: instances and the cores of each.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct App {
    pub instances: u32,
    pub cores_each: f64,
}

/// A server tier's cores.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cores {
    pub cores: f64,
}

impl Deployment {
    /// Reads a deployment file. Errors: unreadable, not TOML of this shape,
    /// or a tier without cores.
    pub fn read(path: &Path) -> anyhow::Result<Deployment> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let deployment: Deployment =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let tiers = [
            deployment.app.cores_each * f64::from(deployment.app.instances),
            deployment.postgres.cores,
            deployment.redis.cores,
            deployment.rabbitmq.cores,
        ];
        if tiers.iter().any(|cores| !(cores.is_finite() && *cores > 0.0)) {
            anyhow::bail!("{}: every tier needs cores above 0", path.display());
        }
        Ok(deployment)
    }

    /// The cores each tier gives one sale. Redis executes commands on one
    /// thread per master and a sale's keys share one hash slot, so one sale
    /// gets at most one Redis core however many the tier has.
    fn tier_cores(&self, tier: &str) -> f64 {
        match tier {
            "instances" => self.app.cores_each * f64::from(self.app.instances),
            "postgres" => self.postgres.cores,
            "redis" => self.redis.cores.min(1.0),
            _ => self.rabbitmq.cores,
        }
    }
}

/// The share of its cores a run's service side kept busy over the steady
/// window (`cpu.steady_service_cores` ÷ the budget, or the machine's CPUs)
/// from which the run counts as CPU-bound, its holds stretched by waits for
/// a core. The runs of docs/scaling.md show the two groups this separates
/// (services that kept their whole budget busy, and services held back by
/// their serial resource with a fifth of it or more idle) and a strategy
/// that meets both limits at once, around the line.
pub const CPU_BOUND: f64 = 0.9;

/// A run and the cores its service side had (its report's budget, or the
/// machine's CPUs).
#[derive(Debug, Clone, Copy)]
pub struct Measured<'a> {
    pub run: &'a Run,
    pub cores: f64,
}

impl Measured<'_> {
    /// Whether the service side kept [`CPU_BOUND`] of its cores busy.
    pub fn cpu_bound(&self) -> bool {
        let busy = self.run.cpu.as_ref().and_then(|c| c.steady_service_cores);
        busy.is_none_or(|busy| busy >= CPU_BOUND * self.cores)
    }
}

/// What a strategy's runs measured per unit: the model's inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    /// Serial milliseconds a unit, from the runs with cores to spare;
    /// `None` when there was none.
    pub serial_ms: Option<f64>,
    /// The least serial time of any run, CPU-bound ones included: an upper
    /// bound of the serial time.
    pub serial_ms_at_most: Option<f64>,
    /// Service-side CPU milliseconds a unit, per tier.
    pub tiers: Tiers,
}

impl Costs {
    /// The medians over `runs` (those with a CPU split; the serial time
    /// over those with cores to spare); `None` without a CPU split.
    pub fn of(runs: &[Measured]) -> Option<Costs> {
        let split: Vec<Tiers> =
            runs.iter().filter_map(|m| m.run.cost.cpu_ms_per_unit_by_tier).collect();
        let tier =
            |f: fn(&Tiers) -> Option<f64>| median(&split.iter().filter_map(f).collect::<Vec<_>>());
        let spare: Vec<f64> = runs
            .iter()
            .filter(|m| !m.cpu_bound())
            .filter_map(|m| m.run.cost.serial_ms_per_unit)
            .collect();
        let least = runs
            .iter()
            .filter_map(|m| m.run.cost.serial_ms_per_unit)
            .fold(None, |least: Option<f64>, s| Some(least.map_or(s, |l| l.min(s))));
        Some(Costs {
            serial_ms: median(&spare),
            serial_ms_at_most: least,
            tiers: Tiers {
                instances: tier(|t| Some(t.instances))?,
                postgres: tier(|t| t.postgres),
                redis: tier(|t| t.redis),
                rabbitmq: tier(|t| t.rabbitmq),
            },
        })
    }

    /// Every tier's CPU per unit added up.
    pub fn cpu_ms(&self) -> f64 {
        self.tiers.named().iter().map(|(_, ms)| ms).sum()
    }
}

/// The resource that sets a projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The sale's serial resource.
    Serial,
    /// The CPU of one tier (`instances`, `postgres`, `redis`, `rabbitmq`).
    Tier(&'static str),
    /// The CPU of the whole service side, under one shared budget.
    Cpu,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Serial => f.write_str("serial resource"),
            Limit::Tier(tier) => write!(f, "{tier} CPU"),
            Limit::Cpu => f.write_str("service CPU"),
        }
    }
}

/// A projected sell-through and the limit that sets it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Projection {
    pub units_per_s: f64,
    pub limit: Limit,
}

/// The least of `bounds` (units a second), with its limit; the serial bound
/// first, so that it wins a tie.
fn least(bounds: impl Iterator<Item = (f64, Limit)>) -> Option<Projection> {
    bounds.filter(|(x, _)| x.is_finite() && *x > 0.0).fold(
        None,
        |best: Option<Projection>, (units_per_s, limit)| match best {
            Some(best) if best.units_per_s <= units_per_s => Some(best),
            _ => Some(Projection { units_per_s, limit }),
        },
    )
}

/// `costs` on `deployment`: each tier's CPU bound and the serial bound.
/// `None` when no bound is finite (nothing measured).
pub fn project(costs: &Costs, deployment: &Deployment) -> Option<Projection> {
    let serial = costs.serial_ms.map(|ms| (1000.0 / ms, Limit::Serial));
    let tiers = costs
        .tiers
        .named()
        .into_iter()
        .map(|(tier, ms)| (1000.0 * deployment.tier_cores(tier) / ms, Limit::Tier(tier)));
    least(serial.into_iter().chain(tiers))
}

/// `costs` with every tier sharing `cores` (a CPU budget over the service
/// side): the serial bound and `1000 × cores ÷ cpu_ms`.
pub fn project_budget(costs: &Costs, cores: f64) -> Option<Projection> {
    let serial = costs.serial_ms.map(|ms| (1000.0 / ms, Limit::Serial));
    least(serial.into_iter().chain([(1000.0 * cores / costs.cpu_ms(), Limit::Cpu)]))
}

/// How far a projection may miss the measured median and still count as
/// projected: the 25 %, a miss of a factor the rounds of one
/// comparison already spread by on this machine.
pub const TOLERANCE: f64 = 0.25;

/// One strategy at one budget: measured, and projected from the other
/// budgets' runs.
#[derive(Debug, Clone)]
pub struct Checked {
    pub strategy: String,
    pub cores: f64,
    /// Median, smallest and largest sell-through of the runs at this budget.
    pub measured: [f64; 3],
    pub projected: Option<Projection>,
    /// `projected ÷ measured − 1`.
    pub miss: Option<f64>,
    /// Why a miss beyond [`TOLERANCE`] happened, from the runs' own figures.
    pub reason: Option<String>,
}

/// The runs of each budget: `(cores, runs)`, from reports made with
/// `--service-cpu-budget`. Runs under a fault or without a rate are left
/// out.
fn by_budget(reports: &[Report]) -> anyhow::Result<Vec<(f64, Vec<Measured<'_>>)>> {
    let mut budgets: Vec<(f64, Vec<Measured>)> = Vec::new();
    for report in reports {
        let Some(cores) = report.machine.service_cpu_budget_cores else {
            anyhow::bail!(
                "a report without machine.service_cpu_budget_cores: made without --service-cpu-budget"
            );
        };
        let runs = report
            .runs
            .iter()
            .filter(|r| r.fault.is_none() && r.sell_through_per_s.is_some())
            .map(|run| Measured { run, cores });
        match budgets.iter_mut().find(|(c, _)| (*c - cores).abs() < 1e-9) {
            Some((_, known)) => known.extend(runs),
            None => budgets.push((cores, runs.collect())),
        }
    }
    budgets.sort_by(|a, b| a.0.total_cmp(&b.0));
    if budgets.len() < 2 {
        anyhow::bail!("the check needs comparisons at two budgets at least");
    }
    Ok(budgets)
}

/// The strategies of `runs`, in order of first appearance.
fn strategies<'a>(runs: impl Iterator<Item = &'a Measured<'a>>) -> Vec<&'a str> {
    let mut strategies: Vec<&str> = Vec::new();
    for m in runs {
        if !strategies.contains(&m.run.strategy.as_str()) {
            strategies.push(&m.run.strategy);
        }
    }
    strategies
}

/// The runs of `strategy` among `runs`.
fn of<'a>(runs: &[Measured<'a>], strategy: &str) -> Vec<Measured<'a>> {
    runs.iter().copied().filter(|m| m.run.strategy == strategy).collect()
}

/// For every strategy and budget, the projection from the runs of the other
/// budgets against the runs of this one (the strategies in the order of the
/// first report's runs).
pub fn check(reports: &[Report]) -> anyhow::Result<Vec<Checked>> {
    let budgets = by_budget(reports)?;
    let mut checked = Vec::new();
    for strategy in strategies(budgets.iter().flat_map(|(_, runs)| runs)) {
        for (i, (cores, runs)) in budgets.iter().enumerate() {
            let here = of(runs, strategy);
            let rates: Vec<f64> = here.iter().filter_map(|m| m.run.sell_through_per_s).collect();
            let Some(mid) = median(&rates) else { continue };
            let others: Vec<Measured> = budgets
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, (_, r))| of(r, strategy))
                .collect();
            let projected = Costs::of(&others).and_then(|costs| project_budget(&costs, *cores));
            let miss = projected.map(|p| p.units_per_s / mid - 1.0);
            let reason =
                miss.filter(|m| m.abs() > TOLERANCE).map(|_| reason(&here, &others, *cores));
            let lo = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = rates.iter().copied().fold(0.0, f64::max);
            checked.push(Checked {
                strategy: strategy.to_owned(),
                cores: *cores,
                measured: [mid, lo, hi],
                projected,
                miss,
                reason,
            });
        }
    }
    Ok(checked)
}

/// What differed at this budget from the others, in the model's own terms:
/// the CPU per unit, the serial time, and how much of the budget the
/// service kept busy.
fn reason(here: &[Measured], others: &[Measured], cores: f64) -> String {
    let (Some(now), Some(then)) = (Costs::of(here), Costs::of(others)) else {
        return "the runs here or at the other budgets lack a CPU split".to_owned();
    };
    let busy: Vec<f64> = here
        .iter()
        .filter_map(|m| m.run.cpu.as_ref().and_then(|c| c.steady_service_cores))
        .collect();
    let mut parts = vec![format!(
        "CPU per unit {:.2} ms here against {:.2} ms at the other budgets ({:.2} ×)",
        now.cpu_ms(),
        then.cpu_ms(),
        now.cpu_ms() / then.cpu_ms()
    )];
    match (now.serial_ms_at_most, then.serial_ms) {
        (Some(here), Some(there)) => parts.push(format!(
            "serial time {here:.3} ms here against {there:.3} ms in the other budgets' runs with cores to spare"
        )),
        (Some(here), None) => parts.push(format!(
            "serial time {here:.3} ms here, and no run at the other budgets with cores to spare"
        )),
        _ => {}
    }
    if let Some(busy) = median(&busy) {
        parts.push(format!("the service kept {busy:.2} of its {cores} cores busy"));
    }
    parts.join("; ")
}

/// The cores `run`'s service side had: the budget, or without one the
/// machine's `cpus` less the load generator's share of them
/// (`cpu.machine_share_loadgen`), which the service could not use.
fn service_cores(run: &Run, budget: Option<f64>, cpus: f64) -> f64 {
    let loadgen = run.cpu.as_ref().and_then(|c| c.machine_share_loadgen).unwrap_or(0.0);
    budget.unwrap_or(cpus * (1.0 - loadgen))
}

/// One strategy's projection on each deployment.
#[derive(Debug, Clone)]
pub struct Projected {
    pub strategy: String,
    pub costs: Costs,
    /// Per deployment, in the order given: the projection from the
    /// medians, and the least and most of those from each run's own costs.
    pub on: Vec<(Option<Projection>, [f64; 2])>,
}

/// Every strategy of `reports` (pooled, runs under a fault left out)
/// projected on each of `deployments`.
pub fn project_all(reports: &[Report], deployments: &[Deployment]) -> Vec<Projected> {
    let runs: Vec<Measured> = reports
        .iter()
        .flat_map(|report| {
            let budget = report.machine.service_cpu_budget_cores;
            let cpus = report.machine.cpus as f64;
            report
                .runs
                .iter()
                .map(move |run| Measured { run, cores: service_cores(run, budget, cpus) })
        })
        .filter(|m| m.run.fault.is_none() && m.run.sell_through_per_s.is_some())
        .collect();
    strategies(runs.iter())
        .into_iter()
        .filter_map(|strategy| {
            let own = of(&runs, strategy);
            let costs = Costs::of(&own)?;
            let on = deployments
                .iter()
                .map(|d| {
                    // Runs alike in what they measured: with a serial
                    // time, only those whose own serial time counts.
                    let alike = |m: &&Measured| costs.serial_ms.is_none() || !m.cpu_bound();
                    let each = own
                        .iter()
                        .filter(alike)
                        .filter_map(|m| Costs::of(&[*m]))
                        .filter_map(|c| project(&c, d));
                    let range = each.fold([f64::INFINITY, 0.0f64], |[lo, hi], p| {
                        [lo.min(p.units_per_s), hi.max(p.units_per_s)]
                    });
                    (project(&costs, d), range)
                })
                .collect();
            Some(Projected { strategy: strategy.to_owned(), costs, on })
        })
        .collect()
}

/// `loadtest project`: reads the reports, prints the projections on each
/// deployment and, with `check`, the check across budgets; writes
/// capacity.md and capacity.html into `out`.
pub fn run(
    reports: &[PathBuf],
    deployments: &[PathBuf],
    check_budgets: bool,
    out: &Path,
) -> anyhow::Result<()> {
    let reports: Vec<Report> = reports
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    let deployments: Vec<Deployment> =
        deployments.iter().map(|p| Deployment::read(p)).collect::<anyhow::Result<_>>()?;
    let projected = project_all(&reports, &deployments);
    let checked = if check_budgets { Some(check(&reports)?) } else { None };
    let markdown = markdown(&projected, &deployments, checked.as_deref());
    println!("{markdown}");
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("capacity.md"), &markdown)?;
    std::fs::write(out.join("capacity.html"), html(&markdown, checked.as_deref()))?;
    Ok(())
}

/// A whole number of units a second, `–` for none.
fn rate(value: Option<f64>) -> String {
    value.map_or("–".to_owned(), |v| format!("{v:.0}"))
}

/// The tables of capacity.md.
pub fn markdown(
    projected: &[Projected],
    deployments: &[Deployment],
    checked: Option<&[Checked]>,
) -> String {
    let mut out = String::from("# Capacity\n\n");
    out.push_str("## Measured per unit\n\nMedians over the runs: CPU ms a unit per tier; serial ms a unit over the runs whose service had cores to spare, and its ceiling for one sale (`≤`/`≥`: from the least measured, when every run was CPU-bound).\n\n| strategy | app | postgres | redis | rabbitmq | serial ms | serial ceiling/s |\n|---|---|---|---|---|---|---|\n");
    let ms = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.3}"));
    for p in projected {
        let t = &p.costs.tiers;
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            p.strategy,
            ms(Some(t.instances)),
            ms(t.postgres),
            ms(t.redis),
            ms(t.rabbitmq),
            serial_cell(&p.costs),
            p.costs.serial_ms.map_or_else(
                || p.costs
                    .serial_ms_at_most
                    .map_or("–".to_owned(), |s| format!("≥ {:.0}", 1000.0 / s)),
                |s| format!("{:.0}", 1000.0 / s),
            ),
        ));
    }
    for (i, d) in deployments.iter().enumerate() {
        out.push_str(&format!(
            "\n## On `{}`\n\n{} — {} app instances × {} cores, Postgres {} cores, Redis {} cores (one sale: at most 1), RabbitMQ {} cores.\n\n| strategy | projected units/s | range over runs | first limit |\n|---|---|---|---|\n",
            d.name, d.about, d.app.instances, d.app.cores_each, d.postgres.cores, d.redis.cores, d.rabbitmq.cores
        ));
        for p in projected {
            let (projection, [lo, hi]) = &p.on[i];
            let range =
                if lo.is_finite() { format!("{lo:.0}–{hi:.0}") } else { "–".to_owned() };
            let (projected, limit) = projected_cells(&p.costs, *projection);
            out.push_str(&format!("| {} | {projected} | {range} | {limit} |\n", p.strategy));
        }
    }
    if let Some(checked) = checked {
        out.push_str(&check_markdown(checked));
    }
    out
}

/// The projected rate and its limit. Without a serial time measured with
/// cores to spare, the serial bound is known only from below (`1000 ÷` the
/// least hold): when that is below the projection, the rate lies between
/// the two and either limit may come first.
fn projected_cells(costs: &Costs, projection: Option<Projection>) -> (String, String) {
    let Some(projection) = projection else { return ("–".to_owned(), "–".to_owned()) };
    let floor = costs.serial_ms_at_most.map(|ms| 1000.0 / ms);
    match floor.filter(|floor| costs.serial_ms.is_none() && *floor < projection.units_per_s) {
        Some(floor) => (
            format!("{floor:.0}–{:.0}", projection.units_per_s),
            format!("{}, or the serial resource (unmeasured: ≥ {floor:.0}/s)", projection.limit),
        ),
        None => (format!("{:.0}", projection.units_per_s), projection.limit.to_string()),
    }
}

/// The serial time of `costs`: measured with cores to spare, or at most the
/// least measured.
fn serial_cell(costs: &Costs) -> String {
    match (costs.serial_ms, costs.serial_ms_at_most) {
        (Some(ms), _) => format!("{ms:.3}"),
        (None, Some(ms)) => format!("≤ {ms:.3}"),
        (None, None) => "–".to_owned(),
    }
}

/// The check across budgets as a table, the count within [`TOLERANCE`] and
/// the misses with their reasons.
fn check_markdown(checked: &[Checked]) -> String {
    let mut out = String::from(
        "\n## Checked across CPU budgets\n\nEach budget's median sell-through against the model's projection from the runs at the other budgets.\n\n| strategy | cores | measured units/s (min–max) | projected | limit | miss |\n|---|---|---|---|---|---|\n",
    );
    for c in checked {
        let [mid, lo, hi] = c.measured;
        out.push_str(&format!(
            "| {} | {} | {mid:.0} ({lo:.0}–{hi:.0}) | {} | {} | {} |\n",
            c.strategy,
            c.cores,
            rate(c.projected.map(|p| p.units_per_s)),
            c.projected.map_or("–".to_owned(), |p| p.limit.to_string()),
            c.miss.map_or("–".to_owned(), |m| format!("{:+.0} %", m * 100.0)),
        ));
    }
    let mut strategies: Vec<&str> = checked.iter().map(|c| c.strategy.as_str()).collect();
    strategies.dedup();
    let within = strategies
        .iter()
        .filter(|s| {
            checked
                .iter()
                .filter(|c| c.strategy == **s)
                .all(|c| c.miss.is_some_and(|m| m.abs() <= TOLERANCE))
        })
        .count();
    out.push_str(&format!(
        "\nProjected within {:.0} % at every budget: {within} of {} strategies.\n",
        TOLERANCE * 100.0,
        strategies.len()
    ));
    for c in checked.iter().filter(|c| c.reason.is_some()) {
        out.push_str(&format!(
            "\n- `{}` at {} cores missed by {:+.0} %: {}.",
            c.strategy,
            c.cores,
            c.miss.unwrap_or(0.0) * 100.0,
            c.reason.as_deref().unwrap_or("")
        ));
    }
    out.push('\n');
    out
}

/// capacity.html: the tables as preformatted text, and the chart of
/// measured against projected sell-through over the budgets.
fn html(markdown: &str, checked: Option<&[Checked]>) -> String {
    let chart = checked.map(chart).unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Capacity</title></head><body>{chart}<pre>{}</pre></body></html>",
        svg::escape(markdown)
    )
}

/// Measured (median) and projected sell-through of each strategy at each
/// budget, one bar each.
pub fn chart(checked: &[Checked]) -> String {
    let rows: Vec<Row> = checked
        .iter()
        .flat_map(|c| {
            let [mid, lo, hi] = c.measured;
            let key = format!("{}|{}", c.strategy, c.cores);
            [
                Row {
                    run: key.clone(),
                    label: format!("{} · {} cores · measured", c.strategy, c.cores),
                    value: Some(mid),
                    colour: "#4c78a8",
                    detail: format!("runs {lo:.0}–{hi:.0} units/s"),
                },
                Row {
                    run: key,
                    label: format!("{} · {} cores · projected", c.strategy, c.cores),
                    value: c.projected.map(|p| p.units_per_s),
                    colour: "#f58518",
                    detail: c.projected.map_or(String::new(), |p| format!("limit: {}", p.limit)),
                },
            ]
        })
        .collect();
    svg::bars(
        "capacity",
        "Sell-through under each CPU budget: measured, and projected from the other budgets",
        "units/s",
        &rows,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(serial_ms: Option<f64>, app: f64, pg: f64) -> Costs {
        Costs {
            serial_ms,
            serial_ms_at_most: serial_ms,
            tiers: Tiers { instances: app, postgres: Some(pg), redis: None, rabbitmq: None },
        }
    }

    fn deployment(app_cores: f64, pg_cores: f64) -> Deployment {
        Deployment {
            name: "t".to_owned(),
            about: "test".to_owned(),
            app: App { instances: 2, cores_each: app_cores / 2.0 },
            postgres: Cores { cores: pg_cores },
            redis: Cores { cores: 4.0 },
            rabbitmq: Cores { cores: 4.0 },
        }
    }

    #[test]
    fn a_purely_serial_strategy_gains_nothing_from_cores() {
        // 2 ms held a unit, and CPU that costs next to nothing.
        let serial = costs(Some(2.0), 0.001, 0.001);
        for cores in [1.0, 16.0, 256.0] {
            let p = project(&serial, &deployment(cores, cores)).unwrap();
            assert_eq!((p.units_per_s, p.limit), (500.0, Limit::Serial));
        }
        assert_eq!(project_budget(&serial, 0.5).unwrap().units_per_s, 500.0);
    }

    #[test]
    fn a_purely_parallel_strategy_grows_with_its_busiest_tiers_cores() {
        // No serial part: 1 ms of app CPU and 3 ms of Postgres CPU a unit.
        let parallel = costs(None, 1.0, 3.0);
        let small = project(&parallel, &deployment(4.0, 3.0)).unwrap();
        assert_eq!((small.units_per_s, small.limit), (1000.0, Limit::Tier("postgres")));
        let big = project(&parallel, &deployment(4.0, 30.0)).unwrap();
        assert_eq!((big.units_per_s, big.limit), (4000.0, Limit::Tier("instances")));
        // Under one shared budget the tiers' CPU adds up: 4 ms a unit.
        let shared = project_budget(&parallel, 2.0).unwrap();
        assert_eq!((shared.units_per_s, shared.limit), (500.0, Limit::Cpu));
    }

    #[test]
    fn a_mixed_strategy_meets_cpu_first_then_its_serial_part() {
        // 0.25 ms serial (4000/s at most) and 2 ms of CPU a unit.
        let mixed = costs(Some(0.25), 1.0, 1.0);
        let budgets: Vec<Projection> =
            [0.5, 1.0, 8.0, 16.0].iter().map(|&c| project_budget(&mixed, c).unwrap()).collect();
        let rates: Vec<f64> = budgets.iter().map(|p| p.units_per_s).collect();
        assert_eq!(rates, [250.0, 500.0, 4000.0, 4000.0]);
        assert_eq!(budgets[1].limit, Limit::Cpu);
        assert_eq!(budgets[3].limit, Limit::Serial, "past 8 cores the serial part decides");
        // Redis gives one sale one core however many it has.
        let redis = Costs {
            serial_ms: None,
            serial_ms_at_most: None,
            tiers: Tiers { instances: 0.1, postgres: None, redis: Some(0.5), rabbitmq: None },
        };
        let p = project(&redis, &deployment(64.0, 64.0)).unwrap();
        assert_eq!((p.units_per_s, p.limit), (2000.0, Limit::Tier("redis")));
    }

    #[test]
    fn a_serial_time_known_only_from_below_gives_a_range_and_both_limits() {
        // Every run CPU-bound: the least hold, 1 ms, says the serial bound
        // is 1000/s or more; the CPU bound on this deployment is 4000/s.
        let unknown =
            Costs { serial_ms: None, serial_ms_at_most: Some(1.0), ..costs(None, 0.5, 0.5) };
        let p = project(&unknown, &deployment(2.0, 2.0));
        let (rate, limit) = projected_cells(&unknown, p);
        assert_eq!(rate, "1000–4000");
        assert_eq!(limit, "instances CPU, or the serial resource (unmeasured: ≥ 1000/s)");
        // A least hold whose bound lies above the projection changes nothing.
        let fast = Costs { serial_ms_at_most: Some(0.1), ..unknown.clone() };
        assert_eq!(projected_cells(&fast, p), ("4000".to_owned(), "instances CPU".to_owned()));
        // Measured with cores to spare, the serial bound is the projection's own.
        let known = costs(Some(1.0), 0.5, 0.5);
        let p = project(&known, &deployment(2.0, 2.0));
        assert_eq!(projected_cells(&known, p), ("1000".to_owned(), "serial resource".to_owned()));
    }

    /// A fixture run of `strategy` with these CPU and serial figures, its
    /// service keeping `busy` cores busy.
    fn run(strategy: &str, cpu_ms: f64, serial_ms: f64, busy: f64, rate: f64) -> Run {
        let mut run = crate::report::fixture::report().runs.remove(0);
        run.strategy = strategy.to_owned();
        run.fault = None;
        run.sell_through_per_s = Some(rate);
        run.cost.serial_ms_per_unit = Some(serial_ms);
        run.cost.cpu_ms_per_unit_by_tier = Some(Tiers {
            instances: cpu_ms / 2.0,
            postgres: Some(cpu_ms / 2.0),
            redis: None,
            rabbitmq: None,
        });
        run.cpu = Some(crate::cpu::Cpu { steady_service_cores: Some(busy), ..Default::default() });
        run
    }

    #[test]
    fn a_run_that_kept_every_core_busy_gives_no_serial_bound() {
        // Under 0.5 cores the holds stretched to 2.6 ms; with cores to spare
        // (0.7 of 1.5 busy) the hold was 0.5 ms.
        let starved = run("sql", 1.0, 2.6, 0.49, 450.0);
        let spare = run("sql", 1.0, 0.5, 0.7, 1400.0);
        let measured = |run, cores| Measured { run, cores };
        let costs = Costs::of(&[measured(&starved, 0.5), measured(&spare, 1.5)]).unwrap();
        assert_eq!((costs.serial_ms, costs.serial_ms_at_most), (Some(0.5), Some(0.5)));
        let only_starved = Costs::of(&[measured(&starved, 0.5)]).unwrap();
        assert_eq!((only_starved.serial_ms, only_starved.serial_ms_at_most), (None, Some(2.6)));
        assert_eq!(only_starved.cpu_ms(), 1.0);
    }

    #[test]
    fn each_budget_is_projected_from_the_others_and_a_miss_says_why() {
        let report = |cores: f64, runs: Vec<Run>| {
            let mut report = crate::report::fixture::report();
            report.machine.service_cpu_budget_cores = Some(cores);
            report.runs = runs;
            report
        };
        // 1 ms of CPU a unit at every budget: 500, 1000 and 1500 units a
        // second, but at 0.5 cores it sold 300 at 1.6 ms a unit.
        let reports = [
            report(0.5, vec![run("sql", 1.6, 3.0, 0.5, 300.0)]),
            report(1.0, vec![run("sql", 1.0, 1.0, 1.0, 1000.0)]),
            report(1.5, vec![run("sql", 1.0, 0.66, 1.5, 1500.0)]),
        ];
        let checked = check(&reports).unwrap();
        let at = |cores: f64| checked.iter().find(|c| c.cores == cores).unwrap();
        // 1.5 from 0.5 and 1: 1.5 ÷ the median 1.3 ms = 1154/s, −23 %.
        assert!((at(1.5).projected.unwrap().units_per_s - 1500.0 / 1.3).abs() < 1e-6);
        assert!(at(1.5).reason.is_none(), "within 25 %");
        // 0.5 from 1 and 1.5: 500/s against 300 measured: named, with why.
        assert_eq!(at(0.5).projected.unwrap().limit, Limit::Cpu);
        let why = at(0.5).reason.as_deref().unwrap();
        assert!(why.contains("CPU per unit 1.60 ms here against 1.00 ms"), "{why}");
        assert!(check(&reports[..1]).is_err(), "one budget is no check");
    }

    #[test]
    fn the_example_deployments_read() {
        for name in ["mid-size.toml", "large.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/capacity").join(name);
            let d = Deployment::read(&path).unwrap();
            assert!(d.app.instances > 0 && d.postgres.cores > 0.0, "{name}");
        }
    }
}
