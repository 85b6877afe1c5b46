//! `loadtest compare`: the whole comparison, from preflight to report.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::Utc;
use seckill::audit::Audit;
use seckill::sale::SaleId;
use seckill::strategy::queue::QueueStats;
use seckill::strategy::{Backend, StrategyName, expectation};
use serde_json::{Value, json};

use crate::ceilings::{
    self, AmqpCeiling, Ceilings, DrainCeiling, HttpCeiling, RedisCeiling, SqlCeiling,
};
use crate::cost::{PgXacts, RssSampler};
use crate::instances::{Instances, RedlockNodes};
use crate::preflight;
use crate::profile::Profile;
use crate::progress::Progress;
use crate::report::{
    self, Cost, LockStats, Machine, Ratio, Report, Run, SCHEMA_VERSION, html, markdown, summary,
};
use crate::scenario::{self, per_second};
use crate::scrape::Counters;
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
    for (id, _, _, svg) in html::charts(report) {
        std::fs::write(charts.join(format!("{id}.svg")), svg)?;
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

    let mut runs = Vec::new();
    for repeat in 1..=args.repeat {
        for &profile in &args.profile {
            for &strategy in &args.strategies {
                progress.run(format!("{strategy} · {profile} · repeat {repeat}/{}", args.repeat));
                let run = run_one(
                    args, instances, &admin, &ceilings, &xacts, progress, strategy, profile, repeat,
                )
                .await
                .with_context(|| format!("{strategy} / {profile} / repeat {repeat}"))?;
                progress.run_done(&format!(
                    "{}: sold {} of {}, oversold {}, drift {}",
                    markdown::verdict(&run),
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
    let uses_redis = args.strategies.iter().any(|s| s.needs().contains(&Backend::Redis));
    let redis_ops = if uses_redis {
        Some(RedisCeiling {
            value: ceilings::redis_ops(&args.redis_url, args.users, seconds as f64).await?,
            clients: args.users,
            duration_s: seconds as f64,
        })
    } else {
        None
    };
    let uses_amqp = args.strategies.iter().any(|s| s.needs().contains(&Backend::Rabbitmq));
    let amqp_rps = if uses_amqp {
        let value = seckill::strategy::queue::ceiling::amqp_round_trips(
            &args.amqp_url,
            &instances.amqp_prefix,
            args.users,
            seconds as f64,
        )
        .await
        .context("measuring amqp_rps")?;
        Some(AmqpCeiling { value, clients: args.users, duration_s: seconds as f64 })
    } else {
        None
    };
    let queue_drain_units_per_s = if args.strategies.contains(&seckill::strategy::queue::NAME) {
        Some(queue_drain(args, instances, admin, sql).await?)
    } else {
        None
    };
    Ok(Ceilings {
        amqp_rps,
        queue_drain_units_per_s,
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

/// The audits of a run's sales, added up. Per-sale figures are summed
/// (oversell in one sale is never offset by undersell in another: each
/// audit's `oversold` is already clamped at 0), the order times are the
/// earliest and latest over the sales, and a Redis figure is `null` only
/// when it is `null` for every sale.
fn add_up(audits: &[Audit]) -> Audit {
    let sum_opt = |pick: fn(&Audit) -> Option<i64>| {
        audits.iter().filter_map(pick).fold(None, |acc: Option<i64>, v| Some(acc.unwrap_or(0) + v))
    };
    Audit {
        sale_id: audits[0].sale_id,
        strategy: audits[0].strategy.clone(),
        total_stock: audits.iter().map(|a| a.total_stock).sum(),
        remaining_stock: audits.iter().map(|a| a.remaining_stock).sum(),
        orders: audits.iter().map(|a| a.orders).sum(),
        units_sold: audits.iter().map(|a| a.units_sold).sum(),
        oversold: audits.iter().map(|a| a.oversold).sum(),
        ledger_drift: audits.iter().map(|a| a.ledger_drift).sum(),
        duplicate_orders: audits.iter().map(|a| a.duplicate_orders).sum(),
        first_order_at: audits.iter().filter_map(|a| a.first_order_at).min(),
        last_order_at: audits.iter().filter_map(|a| a.last_order_at).max(),
        redis_drift: sum_opt(|a| a.redis_drift),
        reconcile_fixes: sum_opt(|a| a.reconcile_fixes),
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_one(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    ceilings: &Ceilings,
    xacts: &PgXacts,
    progress: &mut Progress,
    strategy: StrategyName,
    profile: Profile,
    repeat: u64,
) -> anyhow::Result<Run> {
    let plan = profile.plan(args);
    let knobs = serde_json::to_value(plan.knobs)?;
    let mut sales = Vec::new();
    for (i, stock) in plan.stock_per_sale().into_iter().enumerate() {
        let mut body = json!({
            "name": format!("{strategy} / {profile} / {repeat} / sale {}", i + 1),
            "stock": stock,
            "strategy": strategy.as_str(),
        });
        if let (Some(body), Value::Object(knobs)) = (body.as_object_mut(), &knobs) {
            body.extend(knobs.clone());
        }
        sales.push(admin.create_sale(body).await?);
    }
    let sale_ids: Vec<i64> = sales.iter().map(|s| s.0).collect();
    let distinct = ((plan.stock as f64) * args.demand).round().max(1.0) as u64;
    let buyers = scenario::buyers(distinct, &sale_ids, plan.submissions, plan.resubmit);
    // Buyer i buys from sale (i − 1) mod n, so each sale's demand is
    // distinct / n, the remainder going to the first sales.
    let n = sale_ids.len() as u64;
    let demand_of = |j: usize| distinct / n + u64::from((j as u64) < distinct % n);

    let rss = RssSampler::start(instances.pids());
    progress.phase("settling statistics");
    let xacts_before = xacts.settle().await?;
    let counters_before = Counters::scrape(&admin.client, &instances.urls).await?;
    progress.phase(&format!("sale phase ({} buyers)", buyers.len()));
    let goose_report = args.out.join(format!("goose-{}-{profile}-{repeat}.html", strategy.slug()));
    let sale_phase = scenario::sale_phase(
        &instances.urls,
        &sale_ids,
        args.users,
        args.retries,
        buyers,
        goose_report,
    )
    .await?;
    let queue_stats = if strategy == seckill::strategy::queue::NAME {
        progress.phase("waiting for the queue to drain");
        Some(admin.drained(&sales, QUEUE_DRAIN_WAIT).await?)
    } else {
        None
    };
    progress.phase("settling statistics");
    let xacts_after = xacts.settle().await?;
    let counters_after = Counters::scrape(&admin.client, &instances.urls).await?;
    // Units sold in the sale phase, the divisor of its costs (a baseline may
    // go on selling in the rejection phase).
    let mut sold_in_sale_phase = 0;
    for &sale in &sales {
        sold_in_sale_phase += admin.audit(sale).await?.units_sold;
    }
    progress.phase("rejection phase");
    let rejection_phase = scenario::rejection_phase(
        &instances.urls,
        &sale_ids,
        args.users,
        distinct as i64 + 1,
        args.rejection_phase,
    )
    .await?;
    let peak_rss_mb = rss.stop().await;
    progress.phase("audit");
    let mut audits = Vec::new();
    let mut undersold = 0;
    for (j, &sale) in sales.iter().enumerate() {
        let audit = admin.audit(sale).await?;
        undersold += (audit.total_stock.min(demand_of(j) as i64) - audit.units_sold).max(0);
        audits.push(audit);
    }
    let audit = add_up(&audits);

    let per_unit = |total: f64| (sold_in_sale_phase > 0).then(|| total / sold_in_sale_phase as f64);
    let round_trips = Counters::delta(
        &counters_before,
        &counters_after,
        "seckill_redis_round_trips_total",
        "strategy",
        strategy.as_str(),
    );
    let lock_stats = if strategy.as_str().starts_with("lock/") {
        let delta = |name| {
            Counters::delta(&counters_before, &counters_after, name, "strategy", strategy.as_str())
                as u64
        };
        let mut max_concurrency = 0;
        for &sale in &sales {
            max_concurrency =
                max_concurrency.max(admin.max_concurrency(&instances.urls, sale).await?);
        }
        Some(LockStats {
            max_concurrency,
            renewals: delta("seckill_lock_renewals_total"),
            lock_timeouts: delta("seckill_lock_timeouts_total"),
            fence_rejections: delta("seckill_fence_rejections_total"),
        })
    } else {
        None
    };
    let amqp_messages = counters_after.total("seckill_amqp_messages_total")
        - counters_before.total("seckill_amqp_messages_total");
    let cost = Cost {
        redis_round_trips_per_unit: strategy
            .needs()
            .contains(&Backend::Redis)
            .then(|| per_unit(round_trips))
            .flatten(),
        pg_xacts_per_unit: per_unit(PgXacts::between(xacts_before, xacts_after) as f64),
        amqp_messages_per_unit: strategy
            .needs()
            .contains(&Backend::Rabbitmq)
            .then(|| per_unit(amqp_messages))
            .flatten(),
        peak_rss_mb,
    };

    let sell_through_per_s = match (sale_phase.first_send, audit.last_order_at) {
        (Some(first), Some(last)) if audit.units_sold > 0 => {
            let seconds = (last - first).num_microseconds().unwrap_or(0) as f64 / 1e6;
            (seconds > 0.0).then(|| audit.units_sold as f64 / seconds)
        }
        _ => None,
    };
    let rejection_rps = Some(per_second(rejection_phase.requests, rejection_phase.duration_s));
    let mut outcomes = sale_phase.outcomes;
    if let Some(stats) = &queue_stats {
        outcomes.rejected = stats.iter().map(|s| s.rejected.max(0) as u64).sum();
    }
    let queue_figures = queue_stats.as_deref().map(QueueFigures::of);
    let demanded_units = distinct;
    let mut run = Run {
        strategy: strategy.as_str().to_owned(),
        profile: profile.name().to_owned(),
        repeat,
        expected: expectation(strategy, profile.name(), instances.urls.len()),
        verdict: report::Verdict::Ok,
        instances: instances.urls.len(),
        sales: plan.sales,
        total_stock: audit.total_stock,
        buyers: distinct,
        demanded_units,
        requests: sale_phase.requests,
        duration_s: sale_phase.duration_s,
        throughput_rps: per_second(sale_phase.requests, sale_phase.duration_s),
        sell_through_per_s,
        rejection_rps,
        units_sold: audit.units_sold,
        orders: audit.orders,
        remaining_stock: audit.remaining_stock,
        oversold: audit.oversold,
        undersold,
        ledger_drift: audit.ledger_drift,
        duplicate_orders: audit.duplicate_orders,
        errors_5xx: sale_phase.errors_5xx + rejection_phase.errors_5xx,
        outcomes,
        status_counts: sale_phase.status_counts,
        latency_ms: sale_phase.latency_ms,
        ratio: Ratio {
            sell_through_vs_sql_tps: sell_through_per_s
                .map(|v| v / ceilings.sql_tps.value)
                .filter(|v| v.is_finite()),
            rejection_vs_http_rps: rejection_rps
                .map(|v| v / ceilings.http_rps.value)
                .filter(|v| v.is_finite()),
            sell_through_vs_sql_strategy: None,
        },
        redis_drift: audit.redis_drift,
        reconcile_fixes: audit.reconcile_fixes,
        lock_stats,
        accepted_unresolved: queue_figures.as_ref().map(|q| q.unresolved),
        e2e_latency_ms: queue_figures.as_ref().and_then(|q| q.e2e.clone()),
        batch_sizes: queue_figures.and_then(|q| q.batches),
        cost,
    };
    run.verdict = run.judge();
    Ok(run)
}

/// How long the sale phase of a `queue` run waits for every accepted
/// request to be resolved; what is left then counts as `accepted_unresolved`.
const QUEUE_DRAIN_WAIT: Duration = Duration::from_secs(120);

/// The queue figures of a run, over its sales: unresolved requests added up,
/// and for latency and batch sizes the largest of each figure over the sales
/// (the batch mean weighted by the batches), which is the sale's own figure
/// for a single-sale run.
struct QueueFigures {
    unresolved: i64,
    e2e: Option<scenario::Latency>,
    batches: Option<report::BatchSizes>,
}

impl QueueFigures {
    fn of(stats: &[QueueStats]) -> QueueFigures {
        let unresolved = stats.iter().map(|s| s.accepted_unresolved).sum();
        let e2e = stats.iter().filter_map(|s| s.e2e_latency_ms.as_ref()).fold(None, |acc, l| {
            let acc: scenario::Latency = acc.unwrap_or_default();
            Some(scenario::Latency {
                p50: acc.p50.max(l.p50),
                p95: acc.p95.max(l.p95),
                p99: acc.p99.max(l.p99),
                max: acc.max.max(l.max),
            })
        });
        let with_batches: Vec<(&report::BatchSizes, i64)> =
            stats.iter().filter_map(|s| s.batch_sizes.as_ref().map(|b| (b, s.batches))).collect();
        let batches = (!with_batches.is_empty()).then(|| {
            let total: i64 = with_batches.iter().map(|(_, n)| n).sum();
            let weighted: f64 = with_batches.iter().map(|(b, n)| b.mean * *n as f64).sum();
            report::BatchSizes {
                p50: with_batches.iter().map(|(b, _)| b.p50).fold(0.0, f64::max),
                max: with_batches.iter().map(|(b, _)| b.max).fold(0.0, f64::max),
                mean: if total > 0 {
                    (weighted / total as f64 * 100.0).round() / 100.0
                } else {
                    0.0
                },
            }
        });
        QueueFigures { unresolved, e2e, batches }
    }
}

/// The admin API of the first instance.
struct Admin {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Admin {
    fn new(base: &str, token: &str) -> Admin {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("a default client builds");
        Admin { client, base: base.to_owned(), token: token.to_owned() }
    }

    async fn create_sale(&self, body: Value) -> anyhow::Result<SaleId> {
        let response = self
            .client
            .post(format!("{}/admin/sales", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        if status != reqwest::StatusCode::CREATED {
            bail!("creating a sale answered {status}: {answer}");
        }
        Ok(SaleId(answer["id"].as_i64().context("sale id")?))
    }

    /// `max_concurrency` inside the critical section across all instances:
    /// each instance's `lock-stats` call first flushes its own recorded
    /// intervals, so the last answer covers every instance.
    async fn max_concurrency(&self, urls: &[String], sale: SaleId) -> anyhow::Result<i64> {
        let mut last = Value::Null;
        for url in urls {
            let response = self
                .client
                .get(format!("{url}/admin/sales/{}/lock-stats", sale.0))
                .bearer_auth(&self.token)
                .send()
                .await?;
            let status = response.status();
            last = response.json().await?;
            if !status.is_success() {
                bail!("lock-stats answered {status}: {last}");
            }
        }
        last["max_concurrency"].as_i64().context("lock-stats without max_concurrency")
    }

    /// The queue statistics of `sales` once none has an unresolved request,
    /// or as they stand after `within`.
    async fn drained(&self, sales: &[SaleId], within: Duration) -> anyhow::Result<Vec<QueueStats>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let mut all = Vec::with_capacity(sales.len());
            for &sale in sales {
                all.push(self.queue_stats(sale).await?);
            }
            if all.iter().all(|s| s.accepted_unresolved == 0)
                || tokio::time::Instant::now() >= deadline
            {
                return Ok(all);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn queue_stats(&self, sale: SaleId) -> anyhow::Result<QueueStats> {
        let response = self
            .client
            .get(format!("{}/admin/sales/{}/queue", self.base, sale.0))
            .bearer_auth(&self.token)
            .send()
            .await?;
        let status = response.status();
        if !status.is_success() {
            bail!("queue stats answered {status}: {}", response.text().await.unwrap_or_default());
        }
        Ok(response.json().await?)
    }

    async fn audit(&self, sale: SaleId) -> anyhow::Result<Audit> {
        let response = self
            .client
            .get(format!("{}/admin/sales/{}/audit", self.base, sale.0))
            .bearer_auth(&self.token)
            .send()
            .await?;
        let status = response.status();
        if !status.is_success() {
            bail!("audit answered {status}: {}", response.text().await.unwrap_or_default());
        }
        Ok(response.json().await?)
    }
}
