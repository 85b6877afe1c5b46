//! `loadtest`: runs the flash-sale strategies side by side under goose and
//! reports, for each, what it oversold and undersold (from a Postgres audit),
//! the throughput and latency it sustained, against this machine's own
//! ceilings measured in the same invocation.

mod admin;
mod agreement;
mod balancer;
mod bench;
mod capacity;
mod ceilings;
mod compare;
mod cost;
mod cpu;
mod descendants;
mod expectation;
mod fairness;
mod fault;
mod instances;
mod interrupt;
mod live;
mod partial;
mod port;
mod preflight;
mod profile;
mod progress;
mod report;
mod run;
mod scenario;
mod scrape;
mod series;
mod sizing;
#[cfg(test)]
mod source_names;
mod stats;
mod steady;

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use seckill::strategy::StrategyName;

use crate::fault::FaultChoice;
use crate::profile::{PlanFlags, Profile};

#[derive(Parser)]
#[command(version, about = "Compare flash-sale strategies under load (goose)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; boxing the flags would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run every strategy × profile × repeat and write report.json, report.md
    /// and report.html. Interrupted (SIGINT, SIGTERM) or on a panic, it stops
    /// every process it started, writes a report of the finished runs marked
    /// partial, and exits 130, 143 or 101.
    Compare(CompareArgs),
    /// Write report.md and report.html again from a report.json.
    Render(RenderArgs),
    /// Measure the `queue_drain_units_per_s` ceiling several times, each
    /// right after a `sql_tps` sample, and fail when any drain sample is
    /// below 5 × its `sql_tps`: the check that the drain does not collapse.
    /// Takes the flags of `compare`, of which only `--samples`, those of the
    /// instances and servers, `--ceiling-duration` and `--out` apply.
    DrainCheck(DrainCheckArgs),
    /// Check that two comparisons agree (two report.json of the same
    /// comparison): for each strategy in both, the 95 % intervals of
    /// `× sql` and of `rejections × http_rps` overlap, no strategy is
    /// `faster` than `sql` in one and `slower` in the other, and the
    /// medians differ by at most 25 %, each summary computed again from
    /// its report's runs. Prints one line per strategy and figure; exits 1
    /// when any rule fails (docs/report-format.md, "Agreement").
    Agree(AgreeArgs),
    /// Project each strategy's sell-through onto described deployments
    /// from what its runs measured per unit (serial time and CPU per tier),
    /// naming the limit each meets first; with --check, test the model on
    /// comparisons made at several `--service-cpu-budget`s: each budget's
    /// median sell-through against the projection from the other budgets'
    /// runs (docs/scaling.md). Prints the tables and writes capacity.md
    /// and capacity.html into --out.
    Project(ProjectArgs),
}

#[derive(clap::Args, Debug)]
pub struct ProjectArgs {
    /// A comparison's report.json (repeatable: their runs are pooled).
    #[arg(long, required = true)]
    pub report: Vec<PathBuf>,
    /// A deployment to project onto (TOML: `deploy/capacity/*.toml`;
    /// repeatable).
    #[arg(long)]
    pub deployment: Vec<PathBuf>,
    /// Check the model across the reports' CPU budgets (two budgets at
    /// least, each report made with `--service-cpu-budget`).
    #[arg(long)]
    pub check: bool,
    /// Where capacity.md and capacity.html are written.
    #[arg(long, default_value = "target/loadtest/capacity")]
    pub out: PathBuf,
}

/// A number of cores above 0 and at most 1024.
fn parse_cores(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(cores) if cores > 0.0 && cores <= 1024.0 => Ok(cores),
        _ => Err(format!("{text}: a number of cores above 0 and at most 1024, such as 0.5")),
    }
}

#[derive(clap::Args, Debug)]
pub struct AgreeArgs {
    /// The first comparison's report.json.
    pub first: PathBuf,
    /// The second comparison's report.json.
    pub second: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct DrainCheckArgs {
    /// Samples of each ceiling.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub samples: u32,
    /// The settings of the instances and ceilings, as for `compare`
    /// (`--strategies` and the sale flags do not apply).
    #[command(flatten)]
    pub compare: CompareArgs,
}

#[derive(clap::Args, Debug)]
pub struct RenderArgs {
    /// The report.json to render.
    pub report: PathBuf,
    /// Directory for report.md, report.html and charts/ (default: the
    /// directory of the report).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Flags of `loadtest compare`; every one is recorded in report.json's `config`.
#[derive(clap::Args, Debug, Clone, serde::Serialize)]
pub struct CompareArgs {
    /// Strategies to compare, comma-separated (default: every implemented one).
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy,
          long_help = strategies_help())]
    pub strategies: Vec<StrategyName>,

    /// Load profiles, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "burst")]
    pub profile: Vec<Profile>,

    /// What each profile's runs are made of: stock, sales, knobs, and the
    /// flags of single profiles.
    #[command(flatten)]
    #[serde(flatten)]
    pub plan: PlanFlags,

    /// Distinct buyers as a multiple of stock (each wants one unit).
    #[arg(long, default_value_t = 3.0)]
    pub demand: f64,

    /// Faults to inject, comma-separated: each is one more run of every
    /// strategy × profile × repeat, with that fault injected once during its
    /// sale phase. Out of: kill-instance (SIGKILL an instance — for `queue`
    /// the one whose consumer is active —, restarted after
    /// --fault-restart-ms), pause-instance (SIGSTOP an instance for
    /// --fault-duration-ms, then SIGCONT), pg-terminate (pg_terminate_backend
    /// on every Postgres connection of the instances), redis-restart and
    /// broker-restart (a redis-server, or a RabbitMQ node, that the
    /// comparison starts for itself on free ports and then uses for every
    /// run instead of --redis-url or --amqp-url: killed or stopped, down
    /// for --fault-restart-ms, started again), partition-redis (one
    /// instance's link to Redis cut for --fault-duration-ms, then healed)
    /// and slow-postgres (--fault-latency-ms added to every round trip
    /// between the instances and Postgres for --fault-duration-ms) — with
    /// either, each instance reaches that server through a relay of the
    /// comparison's own in every run; `all` for every one, `none` for a run
    /// without a fault beside them (default: none).
    #[arg(long, value_delimiter = ',', value_parser = parse_fault)]
    pub faults: Vec<FaultChoice>,

    /// Share of the run's stock (0..=1) sold when the fault hits.
    #[arg(long, default_value_t = 0.3, value_parser = parse_fraction)]
    pub fault_at: f64,

    /// kill-instance, redis-restart, broker-restart: milliseconds the
    /// instance or server stays down before it is started again on its port.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub fault_restart_ms: u64,

    /// pause-instance, partition-redis, slow-postgres: milliseconds the
    /// instance stays stopped, cut off or slowed (default: 3 × the lock
    /// lease of the run's sales, 6000 with the service's 2000).
    #[arg(long, alias = "fault-pause-ms", value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub fault_duration_ms: Option<u64>,

    /// slow-postgres: milliseconds added to each round trip between the
    /// instances and Postgres (default: the lock lease of the run's sales,
    /// so that a critical section with one round trip outlasts it).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub fault_latency_ms: Option<u64>,

    /// Longest settle period after a fault run's sale phase, seconds: it
    /// ends early once every unit is sold and no queued request is pending;
    /// meanwhile leases expire, the reconciler returns reservations (after
    /// its 15 s grace) and the queue redelivers.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub settle_s: u64,

    /// Concurrent goose users.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=5_000))]
    pub users: u64,

    /// App instances to start (ignored with --target).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub instances: u64,

    /// How often a buyer retries a `busy` (503) answer, with exponential backoff.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,

    /// Seconds of purchases against the sold-out sale, to measure rejections
    /// (counted between 10 % and 90 % of the phase).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub rejection_phase: u64,

    /// Seconds each ceiling is measured for, before every round (`http_rps`:
    /// in every run, right before its rejection phase).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub ceiling_duration: u64,

    /// Connections at which `sql_tps` is measured, for a Postgres whose peak
    /// is known. Unset: a scan before the first round tries 1, 2, 4, …
    /// connections up to the instances' pools, each for half of
    /// --ceiling-duration (at least 1 s), and measures at the peak.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub sql_tps_connections: Option<u32>,

    /// Rounds: every (strategy, profile) runs once per round, after the
    /// round's own ceilings; from 3 on, every ratio gets a 95 % confidence
    /// interval.
    #[arg(long, default_value_t = DEFAULT_REPEAT, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,

    /// `sql` runs in each round when `sql` is compared, spread evenly
    /// through it; each ratio to `sql` divides by the geometric mean of its
    /// round's `sql` runs, so the reference's own run-to-run noise weighs
    /// less in every ratio (docs/report-format.md, "Rounds").
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub reference_runs: u64,

    /// The shortest steady window (10 % → 90 % of a run's units) whose rate
    /// is ranked, seconds; without --stock, each strategy's stock is sized
    /// from a pilot sale and the rounds before so that its window lasts 5/3
    /// of this (docs/report-format.md, "Steady windows").
    #[arg(long, default_value_t = steady::MIN_WINDOW_S, value_parser = parse_window)]
    pub steady_window_s: f64,

    /// A first answer in about five minutes: `sql`, `sql/batched`,
    /// `redis-decr`, `queue` and `lock/fenced`, 3 rounds, one `sql` run a
    /// round, 1 s per ceiling and per rejection phase, demand 2 — each only
    /// where its flag is not given —, with the same sizing, audit and
    /// ranking rules as the full comparison (README, "Quick start").
    #[arg(long)]
    pub quick: bool,

    /// Send the buyers through an HAProxy this run starts in front of its
    /// instances (round robin, each checked on `/readyz` every second), as
    /// replicas behind a load balancer are; the `http_rps` ceiling too.
    /// Admin reads and `/metrics` still go to each instance. Needs the
    /// `haproxy` program; not with --target.
    #[arg(long, conflicts_with = "target")]
    pub haproxy: bool,

    /// Cap the service side — the instances and every Postgres, Redis and
    /// RabbitMQ process on this machine, the processes the CPU figures call
    /// the service — at this many cores for the whole comparison, with a
    /// cgroup v1 `cpu` quota (needs root), while the load generator keeps
    /// the rest; they are moved back when it ends. Recorded as
    /// `machine.service_cpu_budget_cores`; `loadtest project --check` reads
    /// comparisons at several budgets. Not with --target or --faults (a
    /// restarted process would start outside the budget).
    #[arg(long, value_name = "CORES", conflicts_with_all = ["target", "faults"],
          value_parser = parse_cores)]
    pub service_cpu_budget: Option<f64>,

    /// Use running services at these base URLs instead of starting instances
    /// (repeatable). Their admin token is read from `SECKILL_ADMIN_TOKEN`
    /// (default: the development token), and their database is
    /// `--database-url`, which then defaults to `DATABASE_URL` (the database
    /// the services run on: the comparison's sales are created there).
    #[arg(long)]
    pub target: Vec<String>,

    /// Buyer identity of the instances (`SECKILL_BUYER_AUTH`): `off`, every
    /// purchase names its buyer in the body; `on`, the instances verify buyer
    /// tokens (`HS256`, a key generated per invocation) and every purchase
    /// carries its buyer's token, signed before the sale phase starts — what
    /// verifying costs shows in the figures (report.json: `config.buyer_auth`).
    /// With `--target`, `on` signs with `SECKILL_BUYER_JWT_KEY`.
    #[arg(long, value_enum, default_value = "off")]
    pub buyer_auth: seckill::config::BuyerAuthMode,

    /// Postgres pool size of each started instance (also sizes the `sql_tps` ceiling).
    #[arg(long, default_value_t = 10)]
    pub pool_size: u32,

    /// Postgres database of the comparison: the instances it starts create
    /// it if it is missing and write their sales there; the `sql_tps` ceiling
    /// and the cost figures read it. A database of its own, so that a
    /// comparison never writes into the database a service runs on (with
    /// `--target`, see there).
    #[arg(long, env = "LOADTEST_DATABASE_URL", default_value = LOADTEST_DATABASE_URL,
          hide_env_values = true)]
    #[serde(serialize_with = "password_hidden")]
    pub database_url: String,

    /// Redis URL passed to the instances: one node (`redis://host:port`) or
    /// a Redis Cluster (`redis+cluster://h1:p1,h2:p2,…`).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    #[serde(serialize_with = "password_hidden")]
    pub redis_url: String,

    /// Start a local Redis Cluster of 3 masters for this invocation
    /// (`redis-server --cluster-enabled yes` on free ports, joined with
    /// `redis-cli --cluster create`) and point the instances at it instead of
    /// --redis-url; report.json's `redis_cluster` names its masters and the
    /// keys each held at the end. Needs `redis-server` and `redis-cli`; not
    /// with --target or the redis-restart fault. `lock/redlock` keeps its own
    /// independent nodes.
    #[arg(long, conflicts_with = "target")]
    pub redis_cluster: bool,

    /// RabbitMQ URL passed to the instances.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true
    )]
    #[serde(serialize_with = "password_hidden")]
    pub amqp_url: String,

    /// The `seckill` binary to start (default: next to this executable).
    #[arg(long)]
    pub seckill_bin: Option<PathBuf>,

    /// Directory for report.json, report.md, report.html, charts/, goose
    /// reports and instance logs.
    #[arg(long, default_value = "target/loadtest")]
    pub out: PathBuf,

    /// No progress and no tables on the terminal (for scripts); errors and
    /// the exit status still tell the outcome.
    #[arg(long)]
    pub quiet: bool,

    /// Serve a live view of the comparison on this address (e.g.
    /// 127.0.0.1:8090) while it runs: open http://ADDR/ in a browser. It
    /// shows the run in progress (units sold and rejected per second, stock
    /// left, oversell as the books show it) and the finished runs with their
    /// verdicts.
    #[arg(long, value_name = "ADDR")]
    pub serve_progress: Option<std::net::SocketAddr>,
}

/// Default of `--repeat`: rounds of the default comparison.
const DEFAULT_REPEAT: u64 = 3;

/// Rounds of `--quick` when `--repeat` is not given.
const QUICK_REPEAT: u64 = 3;

/// `--ceiling-duration` and `--rejection-phase` of `--quick`, seconds: 1 s
/// each put the preset under five minutes with the same verdicts, rankings
/// and rejection figures as 2 s (README, "Quick start").
const QUICK_PHASE_S: u64 = 1;

/// `--demand` of `--quick`: fewer refusals after the sell-out, which
/// every run pays for.
const QUICK_DEMAND: f64 = 2.0;

/// Default of `--database-url`: the comparison's own database.
const LOADTEST_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/seckill_loadtest";

/// Default database of `--target` services: the service's own default.
const SERVICE_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/seckill";

/// The long help of `--strategies`: every registered name, in report order.
fn strategies_help() -> String {
    let names: Vec<&str> = StrategyName::ALL.iter().map(|name| name.as_str()).collect();
    format!(
        "Strategies to compare, comma-separated, out of: {} (default: every one, in this order)",
        names.join(", ")
    )
}

fn parse_fault(s: &str) -> Result<FaultChoice, String> {
    s.parse()
}

impl CompareArgs {
    /// The fault settings of the flags.
    pub fn fault_settings(&self) -> fault::Settings {
        fault::Settings {
            at: self.fault_at,
            restart_after: std::time::Duration::from_millis(self.fault_restart_ms),
            duration: self.fault_duration_ms.map(std::time::Duration::from_millis),
            latency: self.fault_latency_ms.map(std::time::Duration::from_millis),
            settle: std::time::Duration::from_secs(self.settle_s),
        }
    }
}

fn parse_strategy(s: &str) -> Result<StrategyName, String> {
    s.parse().map_err(|err: seckill::strategy::UnknownStrategy| err.to_string())
}

/// A steady window: a number of seconds above 0 and at most 600.
fn parse_window(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 600.0 => Ok(x),
        _ => Err(format!("`{s}` is not a number of seconds above 0 and at most 600")),
    }
}

/// A number between 0 and 1 inclusive.
pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{s}` is not a number between 0 and 1")),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    seckill::telemetry::init_tracing_or("warn,goose=error,loadtest=info");
    let matches = Cli::command().get_matches();
    let given = |flag: &str| {
        matches.subcommand_matches("compare").is_some_and(|m| {
            m.value_source(flag).is_some_and(|source| source != ValueSource::DefaultValue)
        })
    };
    let database_given = given("database_url");
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    let result = match cli.command {
        Command::Compare(mut args) => {
            if args.quick {
                quick(&mut args, &given);
            }
            if args.strategies.is_empty() {
                args.strategies = StrategyName::ALL.to_vec();
            }
            if args.plan.waiting_room().is_some()
                && args.profile.iter().any(|p| *p != Profile::Arrival)
            {
                eprintln!(
                    "error: --waiting-room-rate and --waiting-room-concurrency apply to \
                     `--profile arrival` only (its buyers wait in line and buy when admitted)"
                );
                return std::process::ExitCode::from(2);
            }
            if args.plan.sale_window_s * 1000 <= args.plan.payment_window_ms as u64 {
                eprintln!("error: --sale-window-s must outlast --payment-window-ms");
                return std::process::ExitCode::from(2);
            }
            if !args.target.is_empty() && !database_given {
                args.database_url = std::env::var("DATABASE_URL")
                    .unwrap_or_else(|_| SERVICE_DATABASE_URL.to_owned());
            }
            compare::run(args).await
        }
        Command::Render(args) => Ok(compare::render(&args).map(|()| true)),
        Command::DrainCheck(args) => {
            compare::drain_check(args).await.map(|checked| checked.map(|()| true))
        }
        Command::Agree(args) => return agreement::run(&args.first, &args.second),
        Command::Project(args) => {
            return match capacity::run(&args.report, &args.deployment, args.check, &args.out) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err:#}");
                    std::process::ExitCode::FAILURE
                }
            };
        }
    };
    let result = match result {
        Ok(result) => result,
        Err(cut_short) => return std::process::ExitCode::from(cut_short.exit_code()),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("at least one run that was expected to be correct broke (verdict `broke`)");
            std::process::ExitCode::from(1)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// `--quick`: its settings for every flag that was not `given`.
fn quick(args: &mut CompareArgs, given: &dyn Fn(&str) -> bool) {
    if args.strategies.is_empty() {
        args.strategies = seckill::strategy::QUICK.to_vec();
    }
    if !given("repeat") {
        args.repeat = QUICK_REPEAT;
    }
    if !given("reference_runs") {
        args.reference_runs = 1;
    }
    if !given("ceiling_duration") {
        args.ceiling_duration = QUICK_PHASE_S;
    }
    if !given("rejection_phase") {
        args.rejection_phase = QUICK_PHASE_S;
    }
    if !given("demand") {
        args.demand = QUICK_DEMAND;
    }
}

/// Serializes a server URL with its password (the user information) hidden,
/// for report.json's `config`: a report is shared, a password must not be.
fn password_hidden<S: serde::Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&seckill::config::redacted(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_sets_only_what_was_not_given() {
        let parse = |flags: &[&str]| {
            let matches = Cli::command().get_matches_from(flags);
            let given = |flag: &str| {
                matches.subcommand_matches("compare").is_some_and(|m| {
                    m.value_source(flag).is_some_and(|s| s != ValueSource::DefaultValue)
                })
            };
            let Command::Compare(mut args) = Cli::from_arg_matches(&matches).unwrap().command
            else {
                panic!("a comparison")
            };
            quick(&mut args, &given);
            args
        };
        let args = parse(&["loadtest", "compare", "--quick"]);
        assert_eq!(args.strategies, seckill::strategy::QUICK);
        assert_eq!((args.repeat, args.reference_runs, args.demand), (3, 1, 2.0));
        assert_eq!((args.ceiling_duration, args.rejection_phase), (1, 1));
        let args =
            parse(&["loadtest", "compare", "--quick", "--repeat", "5", "--strategies", "sql"]);
        assert_eq!((args.repeat, args.strategies.len(), args.reference_runs), (5, 1, 1));
    }

    #[test]
    fn report_json_config_hides_the_passwords_of_server_urls() {
        let cli = Cli::try_parse_from([
            "loadtest",
            "compare",
            "--database-url",
            "postgres://seckill:pg-secret@127.0.0.1:5432/seckill_loadtest",
            "--redis-url",
            "redis://seckill:redis-secret@127.0.0.1:6379",
            "--amqp-url",
            "amqp://seckill:amqp-secret@127.0.0.1:5672/seckill",
        ])
        .unwrap();
        let Command::Compare(args) = cli.command else { panic!("a comparison") };
        let config = serde_json::to_value(&args).unwrap().to_string();
        assert!(!config.contains("secret"), "{config}");
        assert!(config.contains("amqp://***@127.0.0.1:5672/seckill"), "{config}");
    }
}
