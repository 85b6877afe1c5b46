//! `loadtest compare`: the whole comparison, from preflight to report.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use seckill::strategy::{REFERENCE, REGISTRY, StrategyName, registration};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;

use crate::admin::Admin;
use crate::bench::{self, Drain, DrainTarget};
use crate::ceilings::{
    self, AmqpCeiling, BatchedCeiling, Ceilings, DrainCeiling, HttpCeiling, Kind, RedisCeiling,
    Round, SqlCeiling,
};
use crate::cost::PgXacts;
use crate::fault;
use crate::instances::{InstanceSettings, Instances, RedlockNodes};
use crate::interrupt::{self, Cause};
use crate::live::Live;
use crate::partial::SoFar;
use crate::preflight;
use crate::progress::Progress;
use crate::report::{self, Report, Run, html, markdown, summary};
use crate::run::{Bench, RunKey, run_one};
use crate::scenario;
use crate::sizing::{self, Pilot, Sizing};
use crate::{CompareArgs, DrainCheckArgs, RenderArgs};

/// Runs the comparison; `Ok(false)` when a run's verdict is `broke`. Cut
/// short by `SIGINT`, `SIGTERM` or a panic ([`crate::interrupt`]), it stops
/// every process it started, deletes the queues of its instances, writes a
/// report of the runs it finished marked partial ([`crate::partial`]), and
/// answers the cause.
pub async fn run(args: CompareArgs) -> Result<anyhow::Result<bool>, Cause> {
    let per_round = args.profile.len() * takes(&args.strategies, args.reference_runs) as usize;
    let planned = args.repeat * (per_round * fault::dimension(&args.faults).len()) as u64;
    let config = serde_json::to_value(&args).unwrap_or_default();
    let sofar = SoFar::new(config, planned, unmeasured_ceilings(&args));
    let ended = interrupt::supervise(run_to_end(args.clone(), planned, &sofar)).await;
    if let Err(cause) = &ended {
        if let Some((prefix, amqp_url)) = sofar.queues() {
            delete_queues(&prefix, &amqp_url).await;
        }
        write_partial(&sofar.report(cause.reason()), &args.out);
    }
    ended
}

/// Writes the report of a comparison cut short and says so on stderr, even
/// with `--quiet`.
fn write_partial(report: &Report, out: &Path) {
    let line = report.partial_line().unwrap_or_default();
    match write_reports(report, out) {
        Ok(()) => {
            eprintln!("{line}\nStopped every process it started; wrote it in {}", out.display())
        }
        Err(err) => {
            eprintln!("{line}\nStopped every process it started; could not write it: {err:#}")
        }
    }
}

/// The comparison from preflight to its reports, recording in `sofar` what
/// it measured as it goes.
async fn run_to_end(mut args: CompareArgs, total: u64, sofar: &SoFar) -> anyhow::Result<bool> {
    let dimension = fault::dimension(&args.faults);
    if !args.target.is_empty() && dimension.iter().any(Option::is_some) {
        anyhow::bail!(
            "--faults kills, stops and restarts instances the comparison started: not with --target"
        );
    }
    preflight::check(&preflight_servers(&args)).await?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let live = match args.serve_progress {
        Some(addr) => Some(Live::serve(addr, total).await?),
        None => None,
    };
    let mut progress = Progress::new(total, args.quiet, live.clone());
    let (redlock, servers) = start_servers(&mut args, &mut progress).await?;
    progress.stage("starting the instances");
    let mut settings = instance_settings(&args);
    settings.own_env = (0..args.instances as usize)
        .map(|i| servers.links.instance_env(i, &args.database_url, &args.redis_url))
        .collect::<anyhow::Result<_>>()?;
    let instances = Instances::start(&settings, redlock.as_ref()).await?;
    let budget = match args.service_cpu_budget {
        Some(cores) => {
            progress.stage(&format!("capping the service side at {cores} cores"));
            let budget = crate::cpu::budget_service(cores, &instances.pids());
            match budget {
                Ok(budget) => Some(budget),
                Err(err) => {
                    stop(instances, &args).await;
                    anyhow::bail!("--service-cpu-budget: {err}");
                }
            }
        }
        None => None,
    };
    // On a broker of its own, the queues go with the node.
    if args.target.is_empty() && servers.broker.is_none() {
        sofar.queues_declared(&instances.amqp_prefix, &args.amqp_url);
    }
    let result = compare(&args, &instances, &servers, &mut progress, sofar).await;
    stop(instances, &args).await;
    // The servers go back to their own groups before anything else runs.
    let budget_cores = budget.map(|budget| budget.cores());
    progress.finish();
    let mut report = result?;
    report.machine.service_cpu_budget_cores = budget_cores;
    write_reports(&report, &args.out)?;
    if let Some(live) = &live {
        live.done(&format!("finished: reports written in {}", args.out.display()));
        // An open page polls every second: one more poll reads the end.
        tokio::time::sleep(LAST_POLL).await;
    }
    if !args.quiet {
        print_tables(&report, &args);
    }
    Ok(report.runs.iter().all(|run| run.verdict != report::Verdict::Broke))
}

/// The servers the comparison starts for itself: the Redlock nodes of a
/// strategy that needs them (its registration's `redlock_nodes`), and those
/// of its faults and `--redis-cluster`, which `args` then names in place of
/// the shared ones.
async fn start_servers(
    args: &mut CompareArgs,
    progress: &mut Progress,
) -> anyhow::Result<(Option<RedlockNodes>, fault::OwnedServers)> {
    let needs_nodes = args.strategies.iter().any(|&s| registration(s).redlock_nodes);
    let redlock = if needs_nodes && args.target.is_empty() {
        progress.stage("starting the Redlock nodes");
        Some(RedlockNodes::start(&args.out).await?)
    } else {
        None
    };
    let dimension = fault::dimension(&args.faults);
    let owned = dimension.contains(&Some(fault::FaultKind::RedisRestart))
        || dimension.contains(&Some(fault::FaultKind::BrokerRestart));
    if owned {
        progress.stage("starting the Redis and RabbitMQ node the faults restart");
    }
    if args.redis_cluster {
        progress.stage("starting a local Redis Cluster of 3 masters");
    }
    let servers = fault::OwnedServers::start(&fault::Wanted {
        dimension: &dimension,
        cluster: args.redis_cluster,
        instances: args.instances as usize,
        database_url: &args.database_url,
        redis_url: &args.redis_url,
    })
    .await?;
    if let Some(url) = servers.redis_url().await {
        args.redis_url = url;
    }
    if let Some(url) = servers.amqp_url().await {
        args.amqp_url = url;
    }
    Ok((redlock, servers))
}

/// The servers the preflight checks, from the flags.
fn preflight_servers(args: &CompareArgs) -> preflight::Servers<'_> {
    preflight::Servers {
        strategies: &args.strategies,
        database_url: &args.database_url,
        redis_url: (!args.redis_cluster).then_some(args.redis_url.as_str()),
        amqp_url: &args.amqp_url,
    }
}

/// What the instances are started (or adopted) with, from the flags.
fn instance_settings(args: &CompareArgs) -> InstanceSettings<'_> {
    InstanceSettings {
        targets: &args.target,
        seckill_bin: args.seckill_bin.as_deref(),
        out: &args.out,
        database_url: &args.database_url,
        redis_url: &args.redis_url,
        amqp_url: &args.amqp_url,
        buyer_auth: args.buyer_auth,
        pool_size: args.pool_size,
        instances: args.instances,
        haproxy: args.haproxy,
        users: args.users,
        own_env: Vec::new(),
    }
}

/// The tables of a finished comparison on stdout.
fn print_tables(report: &Report, args: &CompareArgs) {
    println!("{}", markdown::ceilings_line(report));
    println!("{}", markdown::runs_table(report, false));
    if args.repeat > 1 {
        println!("{}", markdown::summary_table(report, false));
    }
    print!("{}", markdown::verdict_lines(report));
    print!("{}", markdown::fault_matrices(report));
    for line in markdown::warning_lines(report) {
        println!("{line}");
    }
    println!("wrote report.json, report.md and report.html in {}", args.out.display());
}

/// How long the live view stays up after the comparison, for an open page
/// to read its final state (the page polls every second).
const LAST_POLL: std::time::Duration = std::time::Duration::from_millis(1500);

/// Stops the instances and deletes the queues of those started here (they
/// declare them whatever is compared; the quorum queues would otherwise
/// outlive the invocation on the broker).
async fn stop(instances: Instances, args: &CompareArgs) {
    let own_queues = args.target.is_empty().then(|| instances.amqp_prefix.clone());
    instances.stop().await;
    if let Some(prefix) = own_queues {
        delete_queues(&prefix, &args.amqp_url).await;
    }
}

/// Deletes the queues of the instances' `prefix` on `amqp_url` (those of
/// every registration that has some: each process declares them whatever
/// is compared), giving up on each after 10 s (a broker that is gone, as an
/// owned node is once stopped).
async fn delete_queues(prefix: &str, amqp_url: &str) {
    for queues in REGISTRY.iter().filter_map(|r| r.queues) {
        let deleted =
            tokio::time::timeout(Duration::from_secs(10), (queues.delete)(prefix, amqp_url));
        match deleted.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(error = %err, "could not delete the run's queues"),
            Err(_) => tracing::warn!("deleting the run's queues took more than 10 s"),
        }
    }
}

/// Least `queue_drain_units_per_s ÷ sql_tps` that `drain-check` accepts.
pub const DRAIN_CHECK_RATIO: f64 = 5.0;

/// `loadtest drain-check`: `--samples` pairs of a `sql_tps` sample and a
/// `queue_drain_units_per_s` sample, each drain printed with where its time
/// went; an error when any drain is below [`DRAIN_CHECK_RATIO`] × the
/// `sql_tps` sample just before it. Cut short by a signal or a panic, it
/// stops every process it started and answers the cause.
pub async fn drain_check(check: DrainCheckArgs) -> Result<anyhow::Result<()>, Cause> {
    let ended = interrupt::supervise(drain_check_to_end(check)).await;
    if let Err(cause) = &ended {
        eprintln!("{}: stopped every process it started", cause.reason());
    }
    ended
}

/// [`drain_check`] from preflight to its verdict.
async fn drain_check_to_end(check: DrainCheckArgs) -> anyhow::Result<()> {
    let mut args = check.compare;
    let drained = ceilings::drained(StrategyName::ALL)
        .context("no registered strategy settles from a queue: nothing to drain")?;
    args.strategies = vec![drained.0];
    preflight::check(&preflight_servers(&args)).await?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let instances = Instances::start(&instance_settings(&args), None).await?;
    let result = drain_samples(&args, &instances, check.samples).await;
    stop(instances, &args).await;
    let low = result?;
    if low > 0 {
        anyhow::bail!(
            "{low} of {} drain samples were below {DRAIN_CHECK_RATIO} × sql_tps",
            check.samples
        );
    }
    Ok(())
}

/// Measures and prints the samples; answers how many were too low.
async fn drain_samples(
    args: &CompareArgs,
    instances: &Instances,
    samples: u32,
) -> anyhow::Result<u32> {
    let admin = Admin::new(&instances.urls[0], &instances.admin_token);
    let mut low = 0;
    for i in 1..=samples {
        let sql =
            measure(args, instances, &admin, Kind::SqlTps, instances.pool_connections).await?;
        let drain = queue_drain(args, &instances.amqp_prefix, &admin).await?;
        let ratio = drain.units_per_s / sql;
        let t = drain.times;
        println!(
            "sample {i}: sql_tps {sql:.0}; queue_drain_units_per_s {:.0} = {ratio:.1} × sql_tps; \
             {} batches of {:.1} on average; seconds waiting for a batch's first delivery {:.2}, \
             collecting the rest {:.2}, settling {:.2}, acknowledging {:.2}",
            drain.units_per_s,
            t.batches,
            t.settled as f64 / t.batches.max(1) as f64,
            t.waiting_s,
            t.collecting_s,
            t.settling_s,
            t.acking_s,
        );
        if ratio < DRAIN_CHECK_RATIO {
            low += 1;
        }
    }
    Ok(low)
}

/// `loadtest render`: report.md, report.html and charts/ again from a
/// report.json (the summary is recomputed from its runs).
pub fn render(args: &RenderArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.report)
        .with_context(|| format!("reading {}", args.report.display()))?;
    let mut report: Report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a report.json", args.report.display()))?;
    report.summary = summary::summarize(&report.runs);
    let out = match &args.out {
        Some(out) => out.clone(),
        None => args.report.parent().map(Path::to_path_buf).unwrap_or_default(),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    write_views(&report, &out)
}

fn write_reports(report: &Report, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(report)?)?;
    write_views(report, out)
}

/// report.md, report.html, and each chart as `charts/<id>.svg` (for
/// documents that embed them as images).
fn write_views(report: &Report, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out.join("report.md"), markdown::render(report))?;
    std::fs::write(out.join("report.html"), html::render(report))?;
    let charts = out.join("charts");
    std::fs::create_dir_all(&charts)?;
    for chart in html::charts(report) {
        std::fs::write(charts.join(format!("{}.svg", chart.id)), chart.svg)?;
    }
    Ok(())
}

async fn compare(
    args: &CompareArgs,
    instances: &Instances,
    servers: &fault::OwnedServers,
    progress: &mut Progress,
    sofar: &SoFar,
) -> anyhow::Result<Report> {
    let admin = Admin::new(&instances.urls[0], &instances.admin_token);
    let xacts = PgXacts::connect(&args.database_url, &instances.urls, args.pool_size).await?;
    let db = PgPoolOptions::new().max_connections(2).connect(&args.database_url).await?;
    let mut ceilings = unmeasured_ceilings(args);
    let mut runs = Vec::new();
    let faults = args.fault_settings();
    let (mut sizing, pilots) = {
        let empty = Round::default();
        let bench = Bench {
            args,
            instances,
            admin: &admin,
            round: &empty,
            xacts: &xacts,
            db: &db,
            faults,
            servers,
        };
        size_sales(&bench, progress).await?
    };
    scan_sql_tps(args, instances, &admin, &mut ceilings.sql_tps, progress).await?;
    // `http_rps` is measured by each run, right before its rejection phase;
    // the round's sample is their median.
    let before: Vec<Kind> = ceilings.kinds().into_iter().filter(|k| *k != Kind::HttpRps).collect();
    for repeat in 1..=args.repeat {
        progress.stage(&format!("measuring the ceilings of round {repeat}/{}", args.repeat));
        let connections = ceilings.sql_tps.connections;
        let mut round = measure_round(args, instances, &admin, &before, connections).await?;
        tracing::debug!(?round, "ceilings measured");
        sofar.round_started(repeat, &round);
        let bench = Bench {
            args,
            instances,
            admin: &admin,
            round: &round,
            xacts: &xacts,
            db: &db,
            faults,
            servers,
        };
        let round_runs = run_round(&bench, repeat, &mut sizing, progress, sofar).await?;
        round.set(Kind::HttpRps, ceilings::http_sample(round_runs.iter().map(|r| r.http_rps)));
        ceilings.record(&round);
        sofar.round_finished(&ceilings);
        runs.extend(round_runs);
    }
    db.close().await;
    report::relate_to_sql(&mut runs);
    if let Some((strategy, _)) = ceilings::batched(&args.strategies) {
        progress.stage(&format!("measuring the {strategy} ceiling"));
        let batched = batched_ceiling(args, instances, &admin, &runs, ceilings.sql_tps.value)
            .await
            .context("measuring sql_batched_units_per_s")?;
        report::relate_to_batched_ceiling(&mut runs, strategy, batched.value);
        ceilings.sql_batched_units_per_s = Some(batched);
    }
    let balancer = match &instances.balancer {
        Some(balancer) => Some(balancer.report().await.context("reading HAProxy's statistics")?),
        None => None,
    };
    let redis_cluster = match &servers.cluster {
        Some(cluster) => Some(
            report::RedisClusterReport::read(cluster).await.context("reading the Redis Cluster")?,
        ),
        None => None,
    };
    let mut report = Report::new(serde_json::to_value(args)?, ceilings, runs);
    report.pilots = pilots;
    report.balancer = balancer;
    report.redis_cluster = redis_cluster;
    Ok(report)
}

/// Every run of round `repeat`, in the order of [`round_keys`], each with
/// the stock `sizing` gives it (the profile's own without a rate), whose
/// rates it then records.
async fn run_round(
    bench: &Bench<'_>,
    repeat: u64,
    sizing: &mut Sizing,
    progress: &mut Progress,
    sofar: &SoFar,
) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for key in round_keys(bench.args, repeat) {
        let under = key.fault.map(|f| format!(" · {f}")).unwrap_or_default();
        let label = format!("{} · {}{under} · repeat {repeat}", key.strategy, key.profile);
        progress.run(format!("{label}/{}", bench.args.repeat));
        let stock = sizing.stock(key.strategy, key.profile);
        let run = run_one(bench, key, stock, progress).await.with_context(|| label)?;
        if key.fault.is_none() {
            let rate = run
                .sell_through_per_s
                .filter(|_| run.steady_window_s.is_some_and(|s| s >= sizing::PILOT_MIN_WINDOW_S));
            sizing.record(key.strategy, key.profile, rate);
        }
        progress.run_done(&run);
        sofar.run_finished(&run);
        runs.push(run);
    }
    Ok(runs)
}

/// The pilot sales of every strategy in every sized profile (none with
/// `--stock`: the stock is the user's), and the sizing they give. A pilot
/// whose window is too short to read a rate from is followed by a larger
/// one, up to [`sizing::PILOT_TRIES`].
async fn size_sales(
    bench: &Bench<'_>,
    progress: &mut Progress,
) -> anyhow::Result<(Sizing, Vec<Pilot>)> {
    let args = bench.args;
    let mut sizing = Sizing::new(args.steady_window_s);
    let mut pilots = Vec::new();
    if args.plan.stock.is_some() {
        return Ok((sizing, pilots));
    }
    for &profile in args.profile.iter().filter(|p| sizing::sized(**p)) {
        for &strategy in &args.strategies {
            let mut stock = sizing::PILOT_STOCK;
            for take in 1..=sizing::PILOT_TRIES as u64 {
                let target = sizing.target_s();
                progress.stage(&format!(
                    "pilot sale of {strategy} · {profile}: {stock} units (sizing for {target:.1} s \
                     steady windows)"
                ));
                let key = RunKey { strategy, profile, fault: None, repeat: 0, take };
                let pilot = crate::run::pilot(bench, key, stock)
                    .await
                    .with_context(|| format!("the pilot sale of {strategy} · {profile}"))?;
                let window = pilot.steady_window_s;
                let rate = pilot.sell_through_per_s;
                pilots.push(pilot);
                // Every try's rate counts: a short window's is still a rate.
                sizing.pilot(strategy, profile, rate);
                if window.is_some_and(|s| s >= sizing::PILOT_MIN_WINDOW_S) {
                    break;
                }
                stock = sizing::next_pilot_stock(stock, window);
            }
        }
    }
    Ok((sizing, pilots))
}

/// `sql_tps` at each of [`ceilings::scan_counts`] connections, for half of
/// `--ceiling-duration` each (at least a second), kept as `ceiling.scan`;
/// `ceiling.connections` becomes its peak, where the rounds measure. With
/// `--sql-tps-connections`, no scan: the rounds measure there.
async fn scan_sql_tps(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    ceiling: &mut SqlCeiling,
    progress: &mut Progress,
) -> anyhow::Result<()> {
    if let Some(connections) = args.sql_tps_connections {
        ceiling.connections = connections;
        return Ok(());
    }
    progress.stage("scanning sql_tps over the number of connections");
    let seconds = (args.ceiling_duration as f64 / 2.0).max(1.0);
    let mut scan = Vec::new();
    for connections in ceilings::scan_counts(instances.pool_connections) {
        let sale = admin.create_sale(ceiling_sale(Kind::SqlTps.name(), REFERENCE)).await?;
        let per_s = ceilings::sql_tps(&args.database_url, sale, connections, seconds)
            .await
            .with_context(|| format!("scanning sql_tps at {connections} connections"))?;
        scan.push(ceilings::ScanPoint { connections, per_s });
    }
    ceiling.connections = ceilings::peak(&scan).unwrap_or(ceiling.connections);
    ceiling.scan = scan;
    Ok(())
}

/// Runs of each profile and fault in a round: one per strategy, and
/// `reference_runs` for the reference strategy when it is compared.
fn takes(strategies: &[StrategyName], reference_runs: u64) -> u64 {
    let reference = strategies.contains(&REFERENCE);
    strategies.len() as u64 + if reference { reference_runs.saturating_sub(1) } else { 0 }
}

/// The runs of round `repeat`: every profile, under every fault, of every
/// strategy in [`round_with_references`] order.
fn round_keys(args: &CompareArgs, repeat: u64) -> Vec<RunKey> {
    let mut keys = Vec::new();
    for &profile in &args.profile {
        for fault in fault::dimension(&args.faults) {
            let order = round_order(&args.strategies, repeat);
            for (strategy, take) in round_with_references(&order, args.reference_runs) {
                keys.push(RunKey { strategy, profile, fault, repeat, take });
            }
        }
    }
    keys
}

/// A round's runs with the reference strategy's `reference_runs` takes
/// spread evenly through it: the other strategies of `order` cut into that
/// many consecutive groups, a reference run in the middle of each, so that
/// every run is at most half a group away from one. A reference run never
/// opens the round: the run right after the round's ceilings (a drain of
/// tens of thousands of orders among them) starts on a busier Postgres, and
/// that falls on each of the others in turn as the order rotates. Without
/// the reference in `order`, `order` itself, one take each.
fn round_with_references(order: &[StrategyName], reference_runs: u64) -> Vec<(StrategyName, u64)> {
    if !order.contains(&REFERENCE) {
        return order.iter().map(|&s| (s, 1)).collect();
    }
    let others: Vec<StrategyName> = order.iter().copied().filter(|s| *s != REFERENCE).collect();
    let groups = reference_runs.max(1) as usize;
    let mut out = Vec::new();
    for take in 0..groups {
        let (from, to) = (others.len() * take / groups, others.len() * (take + 1) / groups);
        let middle = from + (to - from).div_ceil(2);
        out.extend(others[from..middle].iter().map(|&s| (s, 1)));
        out.push((REFERENCE, take as u64 + 1));
        out.extend(others[middle..to].iter().map(|&s| (s, 1)));
    }
    out
}

/// The strategies in the order round `repeat` (from 1) runs them: the order
/// given, rotated left by `repeat - 1` places, so that over the rounds no
/// strategy always runs first or last. Whatever changes along a round (a
/// growing orders table with autovacuum off, a warming cache, a background
/// job) then falls on each strategy in turn instead of biasing one of them.
fn round_order<T: Copy>(strategies: &[T], repeat: u64) -> Vec<T> {
    let mut order = strategies.to_vec();
    if !order.is_empty() {
        let shift = (repeat.saturating_sub(1) % order.len() as u64) as usize;
        order.rotate_left(shift);
    }
    order
}

/// The ceilings the compared strategies need (see [`ceilings::wanted`]),
/// with their settings and no sample yet: over the instances the
/// comparison starts, or the `--target`s (their Postgres connections as
/// [`Instances`] counts them).
fn unmeasured_ceilings(args: &CompareArgs) -> Ceilings {
    let seconds = args.ceiling_duration as f64;
    let instances = match args.target.len() {
        0 => args.instances as usize,
        targets => targets,
    };
    let wanted = |kind| ceilings::wanted(&args.strategies, kind);
    Ceilings {
        sql_batched_units_per_s: None,
        http_rps: HttpCeiling {
            value: 0.0,
            samples: vec![],
            users: args.users,
            instances,
            duration_s: seconds,
        },
        sql_tps: SqlCeiling {
            value: 0.0,
            samples: vec![],
            connections: args.pool_size * instances as u32,
            duration_s: seconds,
            scan: Vec::new(),
        },
        redis_ops: wanted(Kind::RedisOps).then(|| RedisCeiling {
            value: 0.0,
            samples: vec![],
            clients: args.users,
            duration_s: seconds,
        }),
        amqp_rps: wanted(Kind::AmqpRps).then(|| AmqpCeiling {
            value: 0.0,
            samples: vec![],
            clients: args.users,
            duration_s: seconds,
        }),
        queue_drain_units_per_s: wanted(Kind::QueueDrain).then(|| DrainCeiling {
            value: 0.0,
            samples: vec![],
            units: drain_units(args),
            batch_size: ceilings::drained(&args.strategies)
                .map_or(0, |(_, bench)| (bench.batching)().batch_size),
            ratio_vs_sql_tps: None,
        }),
    }
}

/// Measures `kinds` now, in their order (`sql_tps` over
/// `sql_connections`).
async fn measure_round(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    kinds: &[Kind],
    sql_connections: u32,
) -> anyhow::Result<Round> {
    let mut round = Round::default();
    for &kind in kinds {
        let value = measure(args, instances, admin, kind, sql_connections)
            .await
            .with_context(|| format!("measuring {}", kind.name()))?;
        round.set(kind, value);
    }
    Ok(round)
}

/// One sample of `kind` (see docs/report-format.md, "Ceilings"); `sql_tps`
/// over `sql_connections`.
async fn measure(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    kind: Kind,
    sql_connections: u32,
) -> anyhow::Result<f64> {
    let seconds = args.ceiling_duration;
    match kind {
        Kind::HttpRps => scenario::http_ceiling(&instances.buyer_urls, args.users, seconds).await,
        Kind::SqlTps => {
            let sale = admin.create_sale(ceiling_sale(kind.name(), REFERENCE)).await?;
            ceilings::sql_tps(&args.database_url, sale, sql_connections, seconds as f64).await
        }
        Kind::RedisOps => ceilings::redis_ops(&args.redis_url, args.users, seconds as f64).await,
        Kind::AmqpRps => {
            let prefix = &instances.amqp_prefix;
            bench::amqp_round_trips(&args.amqp_url, prefix, args.users, seconds as f64).await
        }
        Kind::QueueDrain => Ok(queue_drain(args, &instances.amqp_prefix, admin).await?.units_per_s),
    }
}

/// A sale for the ceiling `name` of `strategy`, with far more stock than
/// can sell while it is measured.
fn ceiling_sale(name: &str, strategy: StrategyName) -> serde_json::Value {
    json!({ "name": format!("{name} ceiling"), "stock": 1_000_000_000_i64, "strategy": strategy })
}

/// Purchases in the drain ceiling's queue: `ceiling_duration × 20 000`, at
/// most 200 000 (a few seconds of draining on a 2-core machine).
pub fn drain_units(args: &CompareArgs) -> u64 {
    (args.ceiling_duration * 20_000).min(200_000)
}

/// One sample of `queue_drain_units_per_s`: a pre-filled queue of one-unit
/// purchases of a large sale of the compared strategy that settles from a
/// queue, settled by that strategy's own consumer with the instances' batch
/// settings (`crate::bench::drain`).
pub async fn queue_drain(
    args: &CompareArgs,
    amqp_prefix: &str,
    admin: &Admin,
) -> anyhow::Result<Drain> {
    let (strategy, hooks) =
        ceilings::drained(&args.strategies).context("no compared strategy settles from a queue")?;
    let sale = admin.create_sale(ceiling_sale(Kind::QueueDrain.name(), strategy)).await?;
    let db = PgPoolOptions::new().max_connections(1).connect(&args.database_url).await?;
    let target = DrainTarget { db: &db, amqp_url: &args.amqp_url, prefix: amqp_prefix, sale };
    let drain = bench::drain(target, hooks, (hooks.batching)(), 1, drain_units(args)).await;
    db.close().await;
    drain
}

/// `sql_batched_units_per_s`, after the runs: the batch transaction of the
/// compared strategy whose ceiling it is (`crate::bench::batch_units_per_s`)
/// on a large sale, at the mean batch size that strategy's runs reached (1
/// when none sold), by one driver per instance, for `ceiling_duration`
/// seconds.
async fn batched_ceiling(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    runs: &[Run],
    sql_tps: f64,
) -> anyhow::Result<BatchedCeiling> {
    let (strategy, settle) =
        ceilings::batched(&args.strategies).context("no compared strategy settles in batches")?;
    let means: Vec<f64> = runs
        .iter()
        .filter(|run| run.strategy == strategy.as_str())
        .filter_map(|run| run.batch_sizes.as_ref().map(|sizes| sizes.mean))
        .collect();
    let batch_size = if means.is_empty() {
        1
    } else {
        (means.iter().sum::<f64>() / means.len() as f64).round().max(1.0) as usize
    };
    let connections = instances.urls.len().max(1);
    let seconds = args.ceiling_duration as f64;
    let sale = admin.create_sale(ceiling_sale("batch transaction", strategy)).await?;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections as u32)
        .min_connections(connections as u32)
        .connect(&args.database_url)
        .await?;
    let value =
        bench::batch_units_per_s(&db, settle, sale, 1, batch_size, connections, seconds).await;
    db.close().await;
    let value = value?;
    Ok(BatchedCeiling {
        value,
        batch_size,
        connections,
        duration_s: seconds,
        ratio_vs_sql_tps: Some(value / sql_tps).filter(|v| v.is_finite()),
    })
}

#[cfg(test)]
mod tests {
    use super::{REFERENCE, StrategyName, round_order, round_with_references, takes};

    fn names(names: &[&str]) -> Vec<StrategyName> {
        names.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn the_reference_runs_are_spread_through_the_round() {
        let order = names(&["queue", "sql", "naive", "redis-decr", "lock/fenced"]);
        let round = round_with_references(&order, 2);
        let shown: Vec<String> = round.iter().map(|(s, take)| format!("{s}#{take}")).collect();
        assert_eq!(
            shown,
            ["queue#1", "sql#1", "naive#1", "redis-decr#1", "sql#2", "lock/fenced#1"]
        );
        let once: Vec<(StrategyName, u64)> = round_with_references(&order, 1);
        assert_eq!(once[2], (REFERENCE, 1), "in the middle of the round");
        assert_eq!(once.len(), order.len());
        let without = names(&["queue", "naive"]);
        assert_eq!(round_with_references(&without, 2), [(without[0], 1), (without[1], 1)]);
        assert_eq!(takes(&order, 2), 6);
        assert_eq!(takes(&order, 1), 5);
        assert_eq!(takes(&without, 3), 2);
        // More references than other strategies: each still runs.
        let two = names(&["sql", "queue"]);
        let round = round_with_references(&two, 3);
        assert_eq!(round.iter().filter(|(s, _)| *s == REFERENCE).count(), 3);
        assert_eq!(round.len(), 4);
    }

    #[test]
    fn each_round_starts_one_strategy_later() {
        let given = ["sql", "redis-decr", "queue"];
        assert_eq!(round_order(&given, 1), given);
        assert_eq!(round_order(&given, 2), ["redis-decr", "queue", "sql"]);
        assert_eq!(round_order(&given, 3), ["queue", "sql", "redis-decr"]);
        assert_eq!(round_order(&given, 4), given);
        assert!(round_order::<&str>(&[], 2).is_empty());
    }
}
