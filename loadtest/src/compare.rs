//! `loadtest compare`: the whole comparison, from preflight to report.

use std::path::Path;

use anyhow::Context;
use chrono::Utc;
use seckill::strategy::Backend;
use serde_json::json;

use crate::admin::Admin;
use crate::ceilings::{
    self, AmqpCeiling, BatchedCeiling, Ceilings, DrainCeiling, HttpCeiling, RedisCeiling,
    SqlCeiling,
};
use crate::cost::PgXacts;
use crate::instances::{Instances, RedlockNodes};
use crate::preflight;
use crate::progress::Progress;
use crate::report::{self, Machine, Report, Run, SCHEMA_VERSION, html, markdown, summary};
use crate::run::{Bench, RunKey, run_one};
use crate::scenario;
use crate::{CompareArgs, RenderArgs};

/// Runs the comparison; `Ok(false)` when a run's verdict is `broke`.
pub async fn run(args: CompareArgs) -> anyhow::Result<bool> {
    preflight::check(&args).await?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let total = args.repeat * (args.profile.len() * args.strategies.len()) as u64;
    let mut progress = Progress::new(total, args.quiet);
    let redlock = if args.strategies.contains(&seckill::strategy::lock::library_redlock::NAME)
        && args.target.is_empty()
    {
        progress.stage("starting the Redlock nodes");
        Some(RedlockNodes::start(&args.out).await?)
    } else {
        None
    };
    progress.stage("starting the instances");
    let instances = Instances::start(&args, redlock.as_ref()).await?;
    let result = compare(&args, &instances, &mut progress).await;
    // Instances started here declare their queues whatever is compared.
    let own_queues = args.target.is_empty().then(|| instances.amqp_prefix.clone());
    instances.stop().await;
    if let Some(prefix) = own_queues {
        // The run's quorum queues would otherwise outlive it on the broker.
        let defaults = seckill::config::Config::from_env();
        let topology = seckill::strategy::queue::Topology::new(
            &prefix,
            defaults.queue_partitions,
            defaults.queue_max_length,
            defaults.queue_delivery_limit,
        );
        if let Err(err) = topology.delete_at(&args.amqp_url).await {
            tracing::warn!(error = %err, "could not delete the run's queues");
        }
    }
    progress.finish();
    let report = result?;

    write_reports(&report, &args.out)?;
    if !args.quiet {
        println!("{}", markdown::ceilings_line(&report));
        println!("{}", markdown::runs_table(&report, false));
        if args.repeat > 1 {
            println!("{}", markdown::summary_table(&report, false));
        }
        print!("{}", markdown::verdict_lines(&report));
        println!("wrote report.json, report.md and report.html in {}", args.out.display());
    }
    Ok(report.runs.iter().all(|run| run.verdict != report::Verdict::Broke))
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
    progress: &mut Progress,
) -> anyhow::Result<Report> {
    let admin = Admin::new(&instances.urls[0], &instances.admin_token);
    progress.stage("measuring the ceilings");
    let ceilings = measure_ceilings(args, instances, &admin).await?;
    tracing::debug!(?ceilings, "ceilings measured");
    let xacts = PgXacts::connect(&args.database_url, &instances.urls, args.pool_size).await?;

    let bench = Bench { args, instances, admin: &admin, ceilings: &ceilings, xacts: &xacts };
    let mut runs = Vec::new();
    for repeat in 1..=args.repeat {
        for &profile in &args.profile {
            for &strategy in &args.strategies {
                progress.run(format!("{strategy} · {profile} · repeat {repeat}/{}", args.repeat));
                let key = RunKey { strategy, profile, repeat };
                let run = run_one(&bench, key, progress)
                    .await
                    .with_context(|| format!("{strategy} / {profile} / repeat {repeat}"))?;
                progress.run_done(&format!(
                    "{}: sold {} of {}, oversold {}, drift {}",
                    run.verdict.label(),
                    run.units_sold,
                    run.total_stock,
                    run.oversold,
                    run.ledger_drift
                ));
                runs.push(run);
            }
        }
    }
    report::relate_to_sql(&mut runs);
    let mut ceilings = ceilings;
    if args.strategies.contains(&seckill::strategy::sql_batched::NAME) {
        progress.stage("measuring the sql/batched ceiling");
        let batched = batched_ceiling(args, instances, &admin, &runs, ceilings.sql_tps.value)
            .await
            .context("measuring sql_batched_units_per_s")?;
        report::relate_to_batched_ceiling(&mut runs, batched.value);
        ceilings.sql_batched_units_per_s = Some(batched);
    }
    let summary = summary::summarize(&runs);
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        generated_at: Utc::now(),
        machine: Machine::this(),
        config: serde_json::to_value(args)?,
        ceilings,
        runs,
        summary,
    })
}

/// Every ceiling the compared strategies need, measured now: `http_rps` and
/// `sql_tps` always, `redis_ops` and `amqp_rps` when a compared strategy uses
/// that server, `queue_drain_units_per_s` when `queue` is compared.
async fn measure_ceilings(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
) -> anyhow::Result<Ceilings> {
    let seconds = args.ceiling_duration;
    let http = scenario::http_ceiling(&instances.urls, args.users, seconds).await?;
    let sale = admin
        .create_sale(
            json!({ "name": "sql_tps ceiling", "stock": 1_000_000_000_i64, "strategy": "sql" }),
        )
        .await?;
    let sql =
        ceilings::sql_tps(&args.database_url, sale, instances.pool_connections, seconds as f64)
            .await?;
    let redis_ops = redis_ceiling(args).await?;
    let amqp_rps = amqp_ceiling(args, instances).await?;
    let queue_drain_units_per_s = if args.strategies.contains(&seckill::strategy::queue::NAME) {
        Some(queue_drain(args, instances, admin, sql).await?)
    } else {
        None
    };
    Ok(Ceilings {
        amqp_rps,
        queue_drain_units_per_s,
        sql_batched_units_per_s: None,
        http_rps: HttpCeiling {
            value: http,
            users: args.users,
            instances: instances.urls.len(),
            duration_s: seconds as f64,
        },
        sql_tps: SqlCeiling {
            value: sql,
            connections: instances.pool_connections,
            duration_s: seconds as f64,
        },
        redis_ops,
    })
}

/// Whether any compared strategy uses `backend`.
fn any_uses(args: &CompareArgs, backend: Backend) -> bool {
    args.strategies.iter().any(|s| s.needs().contains(&backend))
}

/// `redis_ops`, when a compared strategy uses Redis.
async fn redis_ceiling(args: &CompareArgs) -> anyhow::Result<Option<RedisCeiling>> {
    if !any_uses(args, Backend::Redis) {
        return Ok(None);
    }
    let seconds = args.ceiling_duration as f64;
    Ok(Some(RedisCeiling {
        value: ceilings::redis_ops(&args.redis_url, args.users, seconds).await?,
        clients: args.users,
        duration_s: seconds,
    }))
}

/// `amqp_rps`, when a compared strategy uses RabbitMQ.
async fn amqp_ceiling(
    args: &CompareArgs,
    instances: &Instances,
) -> anyhow::Result<Option<AmqpCeiling>> {
    if !any_uses(args, Backend::Rabbitmq) {
        return Ok(None);
    }
    let seconds = args.ceiling_duration as f64;
    let value = seckill::strategy::queue::ceiling::amqp_round_trips(
        &args.amqp_url,
        &instances.amqp_prefix,
        args.users,
        seconds,
    )
    .await
    .context("measuring amqp_rps")?;
    Ok(Some(AmqpCeiling { value, clients: args.users, duration_s: seconds }))
}

/// `queue_drain_units_per_s`: a pre-filled queue of one-unit purchases of a
/// large `queue` sale, settled by the strategy's own batch transaction with
/// the instances' batch settings. `ceiling_duration × 20 000` purchases, at
/// most 200 000 (a few seconds of draining on a 2-core machine).
async fn queue_drain(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    sql_tps: f64,
) -> anyhow::Result<DrainCeiling> {
    let units = (args.ceiling_duration * 20_000).min(200_000);
    let sale = admin
        .create_sale(json!({
            "name": "queue_drain ceiling", "stock": 1_000_000_000_i64, "strategy": "queue"
        }))
        .await?;
    let db =
        sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&args.database_url).await?;
    let defaults = seckill::config::Config::from_env();
    let settings = seckill::strategy::queue::consumer::ConsumerSettings::from_config(&defaults);
    let drain = seckill::strategy::queue::ceiling::drain(
        &db,
        &args.amqp_url,
        &instances.amqp_prefix,
        sale,
        1,
        units,
        settings,
    )
    .await
    .context("measuring queue_drain_units_per_s")?;
    db.close().await;
    Ok(DrainCeiling {
        value: drain.units_per_s,
        units: drain.units,
        batch_size: settings.batch_size,
        ratio_vs_sql_tps: Some(drain.units_per_s / sql_tps).filter(|v| v.is_finite()),
    })
}

/// `sql_batched_units_per_s`, after the runs: the `sql/batched` batch
/// transaction (`seckill::strategy::sql_batched::ceiling`) on a large sale,
/// at the mean batch size the strategy's runs reached (1 when none sold), by
/// one driver per instance, for `ceiling_duration` seconds.
async fn batched_ceiling(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    runs: &[Run],
    sql_tps: f64,
) -> anyhow::Result<BatchedCeiling> {
    let name = seckill::strategy::sql_batched::NAME.as_str();
    let means: Vec<f64> = runs
        .iter()
        .filter(|run| run.strategy == name)
        .filter_map(|run| run.batch_sizes.as_ref().map(|sizes| sizes.mean))
        .collect();
    let batch_size = if means.is_empty() {
        1
    } else {
        (means.iter().sum::<f64>() / means.len() as f64).round().max(1.0) as usize
    };
    let connections = instances.urls.len().max(1);
    let seconds = args.ceiling_duration as f64;
    let sale = admin
        .create_sale(json!({
            "name": "sql_batched ceiling", "stock": 1_000_000_000_i64, "strategy": name
        }))
        .await?;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections as u32)
        .min_connections(connections as u32)
        .connect(&args.database_url)
        .await?;
    let value = seckill::strategy::sql_batched::ceiling::units_per_s(
        &db,
        sale,
        1,
        batch_size,
        connections,
        seconds,
    )
    .await;
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
