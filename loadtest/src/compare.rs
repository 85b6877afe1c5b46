//! `loadtest compare`: the whole comparison, from preflight to report.

use std::time::Duration;

use anyhow::{Context, bail};
use chrono::Utc;
use seckill::audit::Audit;
use seckill::sale::SaleId;
use seckill::strategy::{Backend, StrategyName, expectation};
use serde_json::{Value, json};

use crate::CompareArgs;
use crate::ceilings::{self, Ceilings, HttpCeiling, RedisCeiling, SqlCeiling};
use crate::instances::{Instances, RedlockNodes};
use crate::preflight;
use crate::report::{self, Cost, LockStats, Machine, Ratio, Report, Run, SCHEMA_VERSION, markdown};
use crate::scenario::{self, per_second};
use crate::scrape::Counters;

/// Runs the comparison; `Ok(false)` when a run's verdict is `broke`.
pub async fn run(args: CompareArgs) -> anyhow::Result<bool> {
    preflight::check(&args).await?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let redlock = if args.strategies.contains(&StrategyName::LockRedlock) && args.target.is_empty()
    {
        Some(RedlockNodes::start(&args.out).await?)
    } else {
        None
    };
    let instances = Instances::start(&args, redlock.as_ref()).await?;
    let result = compare(&args, &instances).await;
    instances.stop().await;
    let report = result?;

    let json_path = args.out.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    let md_path = args.out.join("report.md");
    std::fs::write(&md_path, markdown::render(&report))?;
    println!("{}", markdown::ceilings_line(&report));
    println!("{}", markdown::runs_table(&report, false));
    println!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(report.runs.iter().all(|run| run.verdict != report::Verdict::Broke))
}

async fn compare(args: &CompareArgs, instances: &Instances) -> anyhow::Result<Report> {
    let admin = Admin::new(&instances.urls[0], &instances.admin_token);
    let ceilings = measure_ceilings(args, instances, &admin).await?;
    tracing::info!(?ceilings, "ceilings measured");

    let mut runs = Vec::new();
    for repeat in 1..=args.repeat {
        for profile in &args.profile {
            for &strategy in &args.strategies {
                tracing::info!(%strategy, profile, repeat, "run starts");
                let run = run_one(args, instances, &admin, &ceilings, strategy, profile, repeat)
                    .await
                    .with_context(|| format!("{strategy} / {profile} / repeat {repeat}"))?;
                tracing::info!(%strategy, verdict = ?run.verdict, sold = run.units_sold, "run done");
                runs.push(run);
            }
        }
    }
    report::relate_to_sql(&mut runs);
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        generated_at: Utc::now(),
        machine: Machine::this(),
        config: serde_json::to_value(args)?,
        ceilings,
        runs,
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
    Ok(Ceilings {
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

#[allow(clippy::too_many_arguments)]
async fn run_one(
    args: &CompareArgs,
    instances: &Instances,
    admin: &Admin,
    ceilings: &Ceilings,
    strategy: StrategyName,
    profile: &str,
    repeat: u64,
) -> anyhow::Result<Run> {
    let stock = args.stock as i64;
    let sale = admin
        .create_sale(json!({
            "name": format!("{strategy} / {profile} / {repeat}"),
            "stock": stock,
            "strategy": strategy.as_str(),
        }))
        .await?;
    let distinct = ((args.stock as f64) * args.demand).round().max(1.0) as u64;
    let buyers = scenario::buyers(distinct, args.resubmit);
    let counters_before = Counters::scrape(&admin.client, &instances.urls).await?;
    let goose_report = args.out.join(format!("goose-{}-{profile}-{repeat}.html", strategy.slug()));
    let sale_phase = scenario::sale_phase(
        &instances.urls,
        sale.0,
        args.users,
        args.retries,
        buyers,
        goose_report,
    )
    .await?;
    let rejection_phase = scenario::rejection_phase(
        &instances.urls,
        sale.0,
        args.users,
        distinct as i64 + 1,
        args.rejection_phase,
    )
    .await?;
    let audit = admin.audit(sale).await?;
    let counters_after = Counters::scrape(&admin.client, &instances.urls).await?;
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
        Some(LockStats {
            max_concurrency: admin.max_concurrency(&instances.urls, sale).await?,
            renewals: delta("seckill_lock_renewals_total"),
            lock_timeouts: delta("seckill_lock_timeouts_total"),
            fence_rejections: delta("seckill_fence_rejections_total"),
        })
    } else {
        None
    };
    let uses_redis = strategy.needs().contains(&Backend::Redis);
    let cost = Cost {
        redis_round_trips_per_unit: (uses_redis && audit.units_sold > 0)
            .then(|| round_trips / audit.units_sold as f64),
    };

    let sell_through_per_s = match (sale_phase.first_send, audit.last_order_at) {
        (Some(first), Some(last)) if audit.units_sold > 0 => {
            let seconds = (last - first).num_microseconds().unwrap_or(0) as f64 / 1e6;
            (seconds > 0.0).then(|| audit.units_sold as f64 / seconds)
        }
        _ => None,
    };
    let rejection_rps = Some(per_second(rejection_phase.requests, rejection_phase.duration_s));
    let demanded_units = distinct;
    let undersold = (audit.total_stock.min(demanded_units as i64) - audit.units_sold).max(0);
    let mut run = Run {
        strategy: strategy.as_str().to_owned(),
        profile: profile.to_owned(),
        repeat,
        expected: expectation(strategy, profile, instances.urls.len()),
        verdict: report::Verdict::Ok,
        instances: instances.urls.len(),
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
        outcomes: sale_phase.outcomes,
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
        cost,
    };
    run.verdict = run.judge();
    Ok(run)
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
