//! One run of the comparison (one strategy × profile × repeat), in steps:
//! prepare its sales and buyers, run the sale and rejection phases with the
//! readings around the sale phase, audit the sales in Postgres, read the
//! counters the instances exported, and assemble the run record.
//!
//! The steps that talk to the instances only gather inputs; every figure of
//! the record (undersold, sell-through, costs per unit, ratios, the queue
//! figures, the verdict) is a pure function of those inputs, tested below.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use seckill::audit::Audit;
use seckill::sale::SaleId;
use seckill::strategy::descriptor::{BatchStats, QueueStats};
use seckill::strategy::{Settles, StrategyName, registration};
use serde_json::{Value, json};

use owned_servers::cpu_group::Weighted;

use crate::CompareArgs;
use crate::admin::Admin;
use crate::ceilings::{Kind, Round};
use crate::cost::{PgXacts, RssSampler, Xacts};
use crate::cpu::{self, Cpu};
use crate::expectation::{Conditions, Expectation, expected};
use crate::fairness::{self, Fairness};
use crate::fault::{self, FaultKind, FaultRecord, Hit};
use crate::instances::Instances;
use crate::profile::{Plan, Profile};
use crate::progress::Progress;
use crate::report::{self, BatchSizes, Cost, LockStats, Ratio, Run, Tiers};
use crate::scenario::arrival::{self, ArrivalPhase, ArrivalRecord};
use crate::scenario::payment;
use crate::scenario::{self, Answer, AnswerLog, Latency, OutcomeCounters, PhaseResult, per_second};
use crate::scrape::{self, Counters, Figure};
use crate::series;
use crate::sizing::Pilot;
use crate::steady::{self, Window};

/// How long the sale phase of a run whose strategy settles after its answer
/// waits for every accepted request to be resolved; what is left then
/// counts as `accepted_unresolved`.
const QUEUE_DRAIN_WAIT: Duration = Duration::from_secs(120);

/// What the runs of one comparison share.
pub struct Bench<'a> {
    pub args: &'a CompareArgs,
    pub instances: &'a Instances,
    /// The admin API of the first instance.
    pub admin: &'a Admin,
    /// The ceilings of this round.
    pub round: &'a Round,
    pub xacts: &'a PgXacts,
    /// The comparison's database, to read the orders' commit times.
    pub db: &'a sqlx::PgPool,
    /// The fault settings (`--fault-at`, `--settle-s`, ...).
    pub faults: fault::Settings,
    /// The servers the invocation started for its faults.
    pub servers: &'a fault::OwnedServers,
}

/// Which run: its strategy, profile, fault (if any), repeat (1-based; 0
/// for a pilot sale) and take (1-based: the reference strategy runs
/// `--reference-runs` times a round, every other strategy once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunKey {
    pub strategy: StrategyName,
    pub profile: Profile,
    pub fault: Option<FaultKind>,
    pub repeat: u64,
    pub take: u64,
}

/// The sales and buyers of a run, created before its phases.
struct Prepared {
    plan: Plan,
    sales: Vec<SaleId>,
    /// Distinct buyers, ids `1..=buyers`, each wanting one unit.
    buyers: u64,
}

/// What the phases measured, with the readings around the sale phase.
struct Phases {
    sale: PhaseResult,
    /// The `http_rps` ceiling measured right before the rejection phase.
    http_rps: f64,
    rejection: PhaseResult,
    /// The statistics of the run's sales once settled, for a strategy that
    /// settles after its answer.
    queue_stats: Option<Vec<QueueStats>>,
    /// The batches of a `sql/batched` run's sales, over every instance.
    group_commit: Option<BatchStats>,
    /// Postgres transactions before and after the sale phase.
    xacts: [Xacts; 2],
    /// The instances' counters before and after the sale phase.
    counters: [Counters; 2],
    /// Units sold when the sale phase ended, the divisor of its costs (a
    /// baseline may go on selling in the rejection phase).
    sold_in_sale_phase: i64,
    /// The steady window of the orders written in the sale phase.
    window: Option<Window>,
    /// Units sold in each second of the sale phase.
    sold_per_second: Option<Vec<i64>>,
    /// CPU seconds by process group over the sale phase; `None` with
    /// `--target` (the instances are not this process' children).
    cpu: Option<Cpu>,
    peak_rss_mb: Option<f64>,
    /// What the fault did, when the run had one.
    fault: Option<FaultPhase>,
    /// The buyers' payments and arrivals (`payment` profile).
    payment: Option<PaymentPhase>,
    /// The generator's schedule and the latency from intended arrival
    /// (`arrival` profile).
    arrival: Option<ArrivalRecord>,
    /// Who got the units.
    fairness: Fairness,
}

/// What a `payment` run's sale phase did besides selling.
struct PaymentPhase {
    outcome: payment::Outcome,
    /// Seconds from the phase's start until every unit was paid; `None`
    /// when that did not happen within the phase.
    settled_s: Option<f64>,
}

/// The readings of a fault run's phases.
struct FaultPhase {
    kind: FaultKind,
    /// `None`: the sale phase ended before the fault point.
    hit: Option<Hit>,
    /// Every answer of the sale phase.
    answers: Vec<Answer>,
    /// When the sale phase's first purchase was sent.
    first_send: Option<DateTime<Utc>>,
    undersold_after_phase: i64,
    settle: Duration,
}

/// Figures the instances counted over the sale phase; `None` where a figure
/// does not apply to the strategy.
#[derive(Debug, Default, PartialEq)]
struct Counted {
    redis_round_trips: Option<f64>,
    amqp_messages: Option<f64>,
    /// Seconds the sale's serial resource was held, in the holds the
    /// service recorded.
    serial_hold_s: Option<f64>,
    /// Units those holds sold.
    serial_units: Option<f64>,
    /// `max_concurrency` is read from the instances afterwards.
    lock: Option<LockStats>,
}

/// Everything a run measured: the input of [`assemble`].
struct Measured {
    key: RunKey,
    conditions: Conditions,
    expected: Expectation,
    prepared: Prepared,
    phases: Phases,
    /// The run's sales' audits, added up.
    audit: Audit,
    undersold: i64,
    counted: Counted,
    fault: Option<FaultRecord>,
    /// The returns' and resales' delays (`payment`; empty otherwise).
    delays: LifecycleDelays,
}

/// The delays of a `payment` run's returned units, milliseconds, from the
/// orders in Postgres.
#[derive(Debug, Default)]
struct LifecycleDelays {
    /// Expiry → resale of every resold unit.
    resale_ms: Vec<f64>,
    /// The part of each resale beyond the sale's line
    /// (`seckill::audit::resale_waits_ms`).
    resale_wait_ms: Vec<f64>,
    /// Expiry → return of every expired order.
    return_ms: Vec<f64>,
}

/// Runs `key` on the bench with `stock` units (`None`: the profile's plan)
/// and answers its record, verdict included.
pub async fn run_one(
    bench: &Bench<'_>,
    key: RunKey,
    stock: Option<u64>,
    progress: &mut Progress,
) -> anyhow::Result<Run> {
    let instances = bench.instances.urls.len();
    let conditions = Conditions { profile: key.profile, instances, fault: key.fault };
    let expected = expected(registration(key.strategy), &conditions);
    let prepared = prepare(bench, key, stock).await?;
    let phases = run_phases(bench, key, &prepared, progress).await?;
    progress.phase("audit");
    if let Some(window) = prepared.plan.knobs.payment_window_ms {
        pending_ended(bench, &prepared.sales, window).await?;
    }
    let audits = audit_all(bench, &prepared.sales).await?;
    let demand = demand(&prepared, phases.payment.as_ref());
    let undersold = undersold(&audits, &split_demand(demand, prepared.sales.len()));
    // The pairing of returns with resales assumes exact books: with an
    // oversell or drift, placements beyond the stock are not resales.
    let exact = audits.iter().all(|a| a.oversold == 0 && a.ledger_drift == 0);
    let delays = match &phases.payment {
        Some(_) => lifecycle_delays(bench.db, &audits, exact).await?,
        None => LifecycleDelays::default(),
    };
    let room = prepared.plan.knobs.waiting_room.is_some();
    let mut counted = Counted::of(key.strategy, room, &phases.counters)?;
    if let Some(lock) = &mut counted.lock {
        lock.max_concurrency = max_concurrency(bench, &prepared.sales).await?;
    }
    let audit = add_up(&audits);
    let fault = match &phases.fault {
        Some(phase) => Some(fault_record(bench, phase, &prepared, undersold).await?),
        None => None,
    };
    let measured = Measured {
        key,
        conditions,
        expected,
        prepared,
        phases,
        audit,
        undersold,
        counted,
        fault,
        delays,
    };
    let cores = bench.args.service_cpu_budget.unwrap_or(cpus() as f64);
    Ok(assemble(measured, bench.round, bench.args.steady_window_s, cores))
}

/// A pilot sale of `key`'s strategy and profile with `stock` units (see
/// [`crate::sizing`]): the sale phase alone — no readings, no rejection
/// phase —, the wait for a strategy that settles after its answer, then the
/// steady window of its orders and its audit.
pub async fn pilot(bench: &Bench<'_>, key: RunKey, stock: u64) -> anyhow::Result<Pilot> {
    let prepared = prepare(bench, key, Some(stock)).await?;
    let ids: Vec<i64> = prepared.sales.iter().map(|s| s.0).collect();
    let plan = &prepared.plan;
    let buyers = scenario::buyers(prepared.buyers, &ids, plan.submissions, plan.resubmit);
    let buyers = scenario::with_flood(buyers, plan.flood);
    let buyer_key = bench.instances.buyer_key.as_deref();
    let tokens = buyer_key.map(|k| scenario::Tokens::new(k, buyers.iter().map(|b| b.user)));
    let (urls, args) = (&bench.instances.buyer_urls, bench.args);
    let tally = Arc::new(OutcomeCounters::default());
    let report = goose_report_path(&args.out, key);
    let phase = scenario::sale_phase(
        urls,
        &ids,
        args.users,
        args.retries,
        buyers,
        report,
        tally,
        tokens,
        None,
    );
    phase.await?;
    if registration(key.strategy).settles == Settles::AfterTheAnswer {
        bench.admin.drained(&prepared.sales, QUEUE_DRAIN_WAIT).await?;
    }
    let window = steady::sale_window(&order_times(bench.db, &ids).await?);
    let audit = add_up(&audit_all(bench, &prepared.sales).await?);
    Ok(Pilot {
        strategy: key.strategy.as_str().to_owned(),
        profile: key.profile.name().to_owned(),
        stock,
        units_sold: audit.units_sold,
        oversold: audit.oversold,
        steady_window_s: window.map(|w| w.seconds),
        sell_through_per_s: window.and_then(|w| w.rate()),
    })
}

/// The fault record of a run, once its final audit is in: the receipts of
/// the sale phase checked against Postgres, and the next sale after the hit.
async fn fault_record(
    bench: &Bench<'_>,
    phase: &FaultPhase,
    prepared: &Prepared,
    undersold_after_settle: i64,
) -> anyhow::Result<FaultRecord> {
    let settle_bound = bench.faults.settle;
    let Some(hit) = phase.hit else {
        let mut record = FaultRecord::missed(phase.kind, settle_bound);
        record.undersold_after_phase = phase.undersold_after_phase;
        record.undersold_after_settle = undersold_after_settle;
        record.settle_s = round_ms(phase.settle);
        return Ok(record);
    };
    let found = fault::find(bench.db, &phase.answers).await?;
    let ids: Vec<i64> = prepared.sales.iter().map(|s| s.0).collect();
    let orders: Vec<DateTime<Utc>> =
        order_times(bench.db, &ids).await?.into_iter().map(|(at, _)| at).collect();
    Ok(FaultRecord {
        kind: phase.kind.name().to_owned(),
        hit: true,
        instance: hit.instance,
        hit_s: phase.first_send.map(|first| seconds(hit.at_wall - first)),
        sold_at_hit: Some(hit.sold),
        duration_s: Some(round_ms(hit.cleared - hit.at)),
        undersold_after_phase: phase.undersold_after_phase,
        undersold_after_settle,
        settle_s: round_ms(phase.settle),
        settle_bound_s: settle_bound.as_secs_f64(),
        accepted_lost: fault::accepted_lost(&phase.answers, &found),
        answers_in_window: fault::answers_in_window(&phase.answers, &hit),
        recovery_s: fault::recovery_s(hit.at_wall, &orders).map(|s| (s * 1000.0).round() / 1000.0),
    })
}

/// Seconds of a signed interval, to the millisecond.
fn seconds(interval: chrono::TimeDelta) -> f64 {
    (interval.num_milliseconds() as f64 / 1000.0).max(0.0)
}

/// Seconds of a duration, to the millisecond.
fn round_ms(duration: Duration) -> f64 {
    duration.as_millis() as f64 / 1000.0
}

/// Units the buyers wanted: one each, of the paying buyers only in a
/// `payment` run (first and later ones: a buyer who never pays wants no
/// unit for good).
fn demand(prepared: &Prepared, payment: Option<&PaymentPhase>) -> u64 {
    payment.map_or(prepared.buyers, |p| p.outcome.paying_buyers)
}

/// Expiry → resale of every resold unit of the run's sales, the part of it
/// beyond the sale's line, and expiry → return of every expired order,
/// milliseconds (`seckill::audit::resale_delays_ms`, `resale_waits_ms` and
/// `return_delays_ms` over each sale's orders). The resales only on `exact`
/// books: with an oversell or drift, placements beyond the stock are not
/// resales.
async fn lifecycle_delays(
    db: &sqlx::PgPool,
    audits: &[Audit],
    exact: bool,
) -> anyhow::Result<LifecycleDelays> {
    let mut conn = db.acquire().await?;
    let mut delays = LifecycleDelays::default();
    for audit in audits {
        let orders = seckill::audit::order_times(&mut conn, audit.sale_id).await?;
        if exact {
            delays.resale_ms.extend(seckill::audit::resale_delays_ms(audit.total_stock, &orders));
            let waits = seckill::audit::resale_waits_ms(audit.total_stock, &orders);
            delays.resale_wait_ms.extend(waits);
        }
        delays.return_ms.extend(seckill::audit::return_delays_ms(&orders));
    }
    Ok(delays)
}

/// How often a `payment` run looks at the books while it waits.
const PAYMENT_POLL: Duration = Duration::from_millis(200);

/// Margin past the payment window for the last pending orders to be swept:
/// the sweep's period (500 ms) many times over.
const SWEEP_MARGIN: Duration = Duration::from_secs(10);

/// Waits until no order of `sales` is pending payment any more — each
/// expired by the sweep and its units returned — or until the payment
/// window and [`SWEEP_MARGIN`] have passed (the audit then counts what is
/// left as live units, and the run's `payment.units_pending` shows them).
async fn pending_ended(bench: &Bench<'_>, sales: &[SaleId], window_ms: i32) -> anyhow::Result<()> {
    let bound = Duration::from_millis(window_ms.max(0) as u64) + SWEEP_MARGIN;
    let start = std::time::Instant::now();
    loop {
        let mut pending = 0;
        for &sale in sales {
            pending += bench.admin.audit(sale).await?.units_pending;
        }
        if pending == 0 || start.elapsed() >= bound {
            return Ok(());
        }
        tokio::time::sleep(PAYMENT_POLL).await;
    }
}

/// Watches the books of `sales` until every unit is paid (nothing left, no
/// order pending) or `done` is set; sets `settled` then and answers how
/// long it took, `None` if it did not happen.
async fn watch_settled(
    admin: &Admin,
    sales: &[SaleId],
    settled: &AtomicBool,
    done: &AtomicBool,
) -> anyhow::Result<Option<f64>> {
    let start = std::time::Instant::now();
    while !done.load(Ordering::Relaxed) {
        let mut paid_out = true;
        for &sale in sales {
            let audit = admin.audit(sale).await?;
            paid_out &= audit.remaining_stock <= 0 && audit.units_pending == 0;
        }
        if paid_out {
            settled.store(true, Ordering::Relaxed);
            return Ok(Some(round_ms(start.elapsed())));
        }
        tokio::time::sleep(PAYMENT_POLL).await;
    }
    Ok(None)
}

/// Creates the run's sales with the profile's plan and knobs, and `stock`
/// units in place of the plan's when given (never more sales than units).
async fn prepare(bench: &Bench<'_>, key: RunKey, stock: Option<u64>) -> anyhow::Result<Prepared> {
    let mut plan = key.profile.plan(&bench.args.plan);
    if let Some(stock) = stock {
        plan.stock = stock.max(1);
        plan.sales = plan.sales.min(u32::try_from(plan.stock).unwrap_or(u32::MAX));
    }
    let knobs = serde_json::to_value(plan.knobs)?;
    let mut sales = Vec::new();
    for (i, stock) in plan.stock_per_sale().into_iter().enumerate() {
        let mut body = sale_body(key, i, stock, &knobs);
        if let Some(payment) = plan.payment {
            let ends_at = Utc::now() + chrono::Duration::seconds(payment.sale_window_s as i64);
            body["ends_at"] = json!(ends_at);
        }
        sales.push(bench.admin.create_sale(body).await?);
    }
    let buyers = ((plan.stock as f64) * bench.args.demand).round().max(1.0) as u64;
    Ok(Prepared { plan, sales, buyers })
}

/// `POST /admin/sales` body of the run's sale `i` (0-based): its name says
/// which run it belongs to, and the profile's knobs are merged in.
fn sale_body(key: RunKey, i: usize, stock: u64, knobs: &Value) -> Value {
    let RunKey { strategy, profile, fault, .. } = key;
    let fault = fault.map(|f| format!(" / {f}")).unwrap_or_default();
    let mut body = json!({
        "name": format!("{strategy} / {profile}{fault} / {} / sale {}", run_label(key), i + 1),
        "stock": stock,
        "strategy": strategy.as_str(),
    });
    if let (Some(body), Value::Object(knobs)) = (body.as_object_mut(), knobs) {
        body.extend(knobs.clone());
    }
    body
}

/// The sale phase (with the settling of a strategy that settles after its
/// answer), the readings around
/// it, and the rejection phase; the RSS sampler covers all of it.
async fn run_phases(
    bench: &Bench<'_>,
    key: RunKey,
    prepared: &Prepared,
    progress: &mut Progress,
) -> anyhow::Result<Phases> {
    let ids: Vec<i64> = prepared.sales.iter().map(|s| s.0).collect();
    let plan = &prepared.plan;
    let buyers = scenario::buyers(prepared.buyers, &ids, plan.submissions, plan.resubmit);
    let buyers = scenario::with_flood(buyers, plan.flood);
    // Buyers are sent in this order (and an `arrival` run schedules them in
    // it): the arrival order of the fairness figures.
    let arrivals: Vec<Vec<i64>> = ids
        .iter()
        .map(|&sale| buyers.iter().filter(|b| b.sale == sale).map(|b| b.user).collect())
        .collect();
    let rss = RssSampler::start(bench.instances.pids());
    let tally = Arc::new(OutcomeCounters::default());
    progress.phase("settling statistics");
    let (xacts_before, counters_before) = readings(bench).await?;
    let sent = buyers.len() as u64;
    progress.phase(&sale_phase_label(prepared.buyers, sent, plan.flood, plan.payment.is_some()));
    let cpu_watch =
        bench.args.target.is_empty().then(|| cpu::Sampler::start(bench.instances.pids()));
    let sampler = progress.live().map(|live| {
        live.sample_sale(bench.db.clone(), ids.clone(), plan.stock as i64, tally.clone())
    });
    let buyer_key = bench.instances.buyer_key.as_deref();
    let tokens = buyer_key.map(|k| scenario::Tokens::new(k, buyers.iter().map(|b| b.user)));
    let SalePhase { result: sale, fault: injected, payment, arrival } =
        sale_phase(bench, key, prepared, buyers, tally, tokens.clone()).await?;
    let (queue_stats, group_commit) = finish_sale_phase(bench, key, prepared, progress).await?;
    let arrival = match arrival {
        Some(phase) => Some(phase.record(&bench.instances.buyer_urls).await?),
        None => None,
    };
    let fairness = fairness_of(bench, prepared, &arrivals).await?;
    let cpu = cpu_watch.map(cpu::Sampler::stop);
    if let Some(sampler) = sampler {
        sampler.stop().await;
    }
    let orders = order_times(bench.db, &ids).await?;
    let window = steady::sale_window(&orders);
    let cpu = cpu.map(|(cpu, readings)| steady_cpu(cpu, &readings, window.as_ref()));
    progress.phase("settling statistics");
    let (xacts_after, counters_after) = readings(bench).await?;
    let audits = audit_all(bench, &prepared.sales).await?;
    let fault = match injected {
        Some(injected) => {
            let settling = (injected, &audits[..], payment.as_ref());
            Some(settle_fault(bench, key.strategy, prepared, settling, progress).await?)
        }
        None => None,
    };
    progress.phase("http_rps ceiling");
    let args = bench.args;
    let urls = &bench.instances.buyer_urls;
    let http_rps = scenario::http_ceiling(urls, args.users, args.ceiling_duration).await?;
    progress.phase("rejection phase");
    let later = payment.as_ref().map_or(0, |p| p.outcome.later_buyers);
    let rejection = rejection_phase(bench, &ids, prepared.buyers + later, tokens).await?;
    Ok(Phases {
        http_rps,
        window,
        sold_per_second: sale.first_send.map(|at| series::sold_per_second(&orders, at)),
        sale,
        rejection,
        queue_stats,
        group_commit,
        xacts: [xacts_before, xacts_after],
        counters: [counters_before, counters_after],
        sold_in_sale_phase: audits.iter().map(|a| a.units_sold).sum(),
        cpu,
        peak_rss_mb: rss.stop().await,
        fault,
        payment,
        arrival,
        fairness,
    })
}

/// The fairness of the run's sales, from the buyers of each in arrival
/// order (`arrivals`, one list per sale of `prepared`) and its orders.
async fn fairness_of(
    bench: &Bench<'_>,
    prepared: &Prepared,
    arrivals: &[Vec<i64>],
) -> anyhow::Result<Fairness> {
    let mut orders = Vec::with_capacity(prepared.sales.len());
    for sale in &prepared.sales {
        orders.push(fairness::orders(bench.db, sale.0).await?);
    }
    let sales: Vec<fairness::SaleArrivals<'_>> = prepared
        .plan
        .stock_per_sale()
        .into_iter()
        .zip(arrivals)
        .zip(&orders)
        .map(|((stock, arrivals), orders)| fairness::SaleArrivals { arrivals, stock, orders })
        .collect();
    Ok(fairness::of_run(&sales))
}

/// What the sale phase leaves to finish before its readings: the requests
/// still to settle of a strategy that settles after its answer, a payment
/// run's unpaid orders expiring, the batch statistics of a strategy that
/// settles in batches (its registration's `settles` and `ceiling`).
/// Answers the settling and the batches' figures where they apply.
async fn finish_sale_phase(
    bench: &Bench<'_>,
    key: RunKey,
    prepared: &Prepared,
    progress: &mut Progress,
) -> anyhow::Result<(Option<Vec<QueueStats>>, Option<BatchStats>)> {
    let strategy = registration(key.strategy);
    let queue_stats = if strategy.settles == Settles::AfterTheAnswer {
        progress.phase("waiting for the accepted requests to settle");
        Some(bench.admin.drained(&prepared.sales, QUEUE_DRAIN_WAIT).await?)
    } else {
        None
    };
    if let Some(window) = prepared.plan.knobs.payment_window_ms {
        progress.phase("waiting for the unpaid orders to expire");
        pending_ended(bench, &prepared.sales, window).await?;
    }
    let group_commit = if strategy.ceiling.settle_batch().is_some() {
        Some(batch_stats(bench, &prepared.sales).await?)
    } else {
        None
    };
    Ok((queue_stats, group_commit))
}

/// The rejection phase: fresh buyers, numbered after the `used` ones the
/// sale phase had, on the run's sold-out sales.
async fn rejection_phase(
    bench: &Bench<'_>,
    sales: &[i64],
    used: u64,
    tokens: Option<scenario::Tokens>,
) -> anyhow::Result<PhaseResult> {
    let args = bench.args;
    let urls = &bench.instances.buyer_urls;
    let first_fresh = used as i64 + 1;
    scenario::rejection_phase(urls, sales, args.users, first_fresh, args.rejection_phase, tokens)
        .await
}

/// The sale phase's CPU with the service side's share of the steady
/// `window` filled in from the sampler's `readings`.
fn steady_cpu(mut cpu: Cpu, readings: &[cpu::Reading], window: Option<&Window>) -> Cpu {
    let steady = window.and_then(|w| Some((cpu::service_between(readings, w.from, w.to)?, w)));
    if let Some((service_s, window)) = steady {
        cpu.steady_service_s = Some((service_s * 1000.0).round() / 1000.0);
        cpu.steady_service_cores =
            (window.seconds > 0.0).then(|| (service_s / window.seconds * 1000.0).round() / 1000.0);
    }
    cpu
}

/// The progress label of a sale phase that sends `sent` purchases for
/// `buyers` distinct buyers, `flood` of them by the flooding buyer; a
/// payment run's goes on with later buyers until every unit is paid.
fn sale_phase_label(buyers: u64, sent: u64, flood: u64, payment: bool) -> String {
    if payment {
        return format!("sale phase ({buyers} buyers, then later ones until every unit is paid)");
    }
    let resubmissions = sent.saturating_sub(buyers + flood);
    let flood = if flood > 0 { format!(" + {flood} by one flooding buyer") } else { String::new() };
    format!("sale phase ({buyers} buyers + {resubmissions} resubmissions{flood})")
}

/// Where goose writes its HTML report of the run's sale phase:
/// `goose-<strategy slug>-<profile>[-<fault>]-<run label>.html` in `out`.
fn goose_report_path(out: &std::path::Path, key: RunKey) -> std::path::PathBuf {
    let fault = key.fault.map(|f| format!("-{f}")).unwrap_or_default();
    let label = run_label(key);
    out.join(format!("goose-{}-{}{fault}-{label}.html", key.strategy.slug(), key.profile))
}

/// The run's repeat as reports show it: `3`, `3.2` for the second take of
/// round 3, `pilot` for a pilot sale (repeat 0; `pilot-2` for its second
/// try).
pub fn run_label(key: RunKey) -> String {
    match (key.repeat, key.take) {
        (0, 1) => "pilot".to_owned(),
        (0, take) => format!("pilot-{take}"),
        (repeat, 1) => repeat.to_string(),
        (repeat, take) => format!("{repeat}.{take}"),
    }
}

/// What the sale phase gave, with its fault when the run has one.
struct SalePhase {
    result: PhaseResult,
    fault: Option<InjectedFault>,
    /// The buyers' payments (`payment` profile).
    payment: Option<PaymentPhase>,
    /// The buyers' arrivals (`arrival` profile).
    arrival: Option<ArrivalPhase>,
}

/// What the sale phase of a run's profile measured besides its
/// [`PhaseResult`].
#[derive(Default)]
struct ProfileExtras {
    payment: Option<PaymentPhase>,
    arrival: Option<ArrivalPhase>,
}

/// A fault the sale phase injected (or missed), and every answer of the
/// phase to check against Postgres.
struct InjectedFault {
    kind: FaultKind,
    /// `None`: the sale phase ended before the fault point.
    hit: Option<Hit>,
    answers: Vec<Answer>,
    /// When the sale phase's first purchase was sent.
    first_send: Option<DateTime<Utc>>,
}

/// The sale phase of `key`: goose sends every buyer's purchases; for a fault
/// run the run's fault is injected alongside once the fault point is sold
/// (`--fault-at`), and every answer is kept.
async fn sale_phase(
    bench: &Bench<'_>,
    key: RunKey,
    prepared: &Prepared,
    buyers: Vec<scenario::Buyer>,
    tally: Arc<OutcomeCounters>,
    tokens: Option<scenario::Tokens>,
) -> anyhow::Result<SalePhase> {
    let ids: Vec<i64> = prepared.sales.iter().map(|s| s.0).collect();
    let args = bench.args;
    let log = key.fault.map(|_| Arc::new(AnswerLog::default()));
    let phase_done = Arc::new(AtomicBool::new(false));
    let sale_phase = async {
        let report = goose_report_path(&args.out, key);
        let result =
            buyers_phase(bench, prepared, &ids, buyers, report, tally, tokens, log.clone()).await;
        phase_done.store(true, Ordering::Relaxed);
        result
    };
    let Some(kind) = key.fault else {
        let (result, ProfileExtras { payment, arrival }) = sale_phase.await?;
        return Ok(SalePhase { result, fault: None, payment, arrival });
    };
    let target = fault::Target {
        instances: bench.instances,
        admin: bench.admin,
        db: bench.db,
        strategy: key.strategy,
        sales: &ids,
        redis_url: &args.redis_url,
        servers: bench.servers,
        lease_ms: prepared.plan.knobs.lock_lease_ms.unwrap_or(SERVICE_LEASE_MS),
        settings: bench.faults,
    };
    let threshold = fault::threshold(prepared.plan.stock, bench.faults.at);
    let injector = fault::inject_when_sold(kind, &target, threshold, phase_done.clone());
    let (result, hit) = tokio::join!(sale_phase, injector);
    let hit = hit.with_context(|| format!("injecting {kind}"))?;
    let ((result, extras), answers) = (result?, log.map(|log| log.answers()).unwrap_or_default());
    let fault = InjectedFault { kind, hit, answers, first_send: result.first_send };
    let ProfileExtras { payment, arrival } = extras;
    Ok(SalePhase { result, fault: Some(fault), payment, arrival })
}

/// The sale phase of the run's profile: [`scenario::sale_phase`], for
/// `arrival` [`arrival::arrival_phase`], or for `payment`
/// [`payment::payment_phase`] with a watch on the books that ends it once
/// every unit is paid.
#[allow(clippy::too_many_arguments)]
async fn buyers_phase(
    bench: &Bench<'_>,
    prepared: &Prepared,
    ids: &[i64],
    buyers: Vec<scenario::Buyer>,
    report: std::path::PathBuf,
    tally: Arc<OutcomeCounters>,
    tokens: Option<scenario::Tokens>,
    log: Option<Arc<AnswerLog>>,
) -> anyhow::Result<(PhaseResult, ProfileExtras)> {
    let (urls, args) = (&bench.instances.buyer_urls, bench.args);
    let (users, retries) = (args.users, args.retries);
    if let Some(arrival) = prepared.plan.arrival {
        let schedule = (arrival.shape, arrival.per_s, arrival.cap);
        let weighted = generator_weight(arrival.generator_cpu_shares);
        let longest_look = Duration::from_millis(arrival.longest_look_ms);
        let room = prepared.plan.knobs.waiting_room.map(|_| longest_look);
        let phase = arrival::arrival_phase(
            urls, ids, schedule, retries, buyers, report, tally, tokens, room,
        );
        let (sale, mut arrival) = phase.await?;
        arrival.generator_cpu_shares = weighted.as_ref().map(Weighted::shares);
        drop(weighted);
        return Ok((sale, ProfileExtras { arrival: Some(arrival), ..ProfileExtras::default() }));
    }
    let Some(plan) = prepared.plan.payment else {
        let sale =
            scenario::sale_phase(urls, ids, users, retries, buyers, report, tally, tokens, log);
        return Ok((sale.await?, ProfileExtras::default()));
    };
    let window_ms = prepared.plan.knobs.payment_window_ms.unwrap_or(0).max(0) as u64;
    let (settled, done) = (Arc::new(AtomicBool::new(false)), AtomicBool::new(false));
    let settings = payment::Settings {
        unpaid_share: plan.unpaid_share,
        come_back: come_back(Duration::from_millis(window_ms)),
        settled: settled.clone(),
        deadline: std::time::Instant::now() + Duration::from_secs(plan.sale_window_s),
    };
    let phase = async {
        let result = payment::payment_phase(
            urls, ids, users, retries, buyers, report, tally, tokens, settings,
        )
        .await;
        done.store(true, Ordering::Relaxed);
        result
    };
    let watch = watch_settled(bench.admin, &prepared.sales, &settled, &done);
    let (phase, settled_s) = tokio::join!(phase, watch);
    let (sale, outcome) = phase?;
    let payment = Some(PaymentPhase { outcome, settled_s: settled_s? });
    Ok((sale, ProfileExtras { payment, ..ProfileExtras::default() }))
}

/// The generator in a `cpu` group of `shares` for an `arrival` phase
/// (`--generator-cpu-shares`; 0: none); when none can be made, a warning
/// says why and the phase runs at the default weight.
fn generator_weight(shares: u64) -> Option<Weighted> {
    if shares == 0 {
        return None;
    }
    Weighted::enter(shares)
        .inspect_err(|why| {
            tracing::warn!("the generator sends at the default CPU weight: {why}");
        })
        .ok()
}

/// How long a `payment` buyer refused waits before the next one comes: an
/// eighth of the payment window, between 50 ms and 1 s — often enough that
/// an expired unit finds a buyer well within a window, seldom enough that
/// the refusals stay a small load beside the purchases.
fn come_back(window: Duration) -> Duration {
    (window / 8).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// The settle period after a fault run's sale phase, given the audits taken
/// when the phase ended (and a `payment` run's payments, for its demand).
async fn settle_fault(
    bench: &Bench<'_>,
    strategy: StrategyName,
    prepared: &Prepared,
    (fault, audits, payment): (InjectedFault, &[Audit], Option<&PaymentPhase>),
    progress: &mut Progress,
) -> anyhow::Result<FaultPhase> {
    progress.phase(&format!("settling after {}", fault.kind));
    let demand = split_demand(demand(prepared, payment), prepared.sales.len());
    let settle = settle(bench, strategy, &prepared.sales).await?;
    Ok(FaultPhase {
        kind: fault.kind,
        hit: fault.hit,
        answers: fault.answers,
        first_send: fault.first_send,
        undersold_after_phase: undersold(audits, &demand),
        settle,
    })
}

/// The audit of each of `sales`, in order.
async fn audit_all(bench: &Bench<'_>, sales: &[SaleId]) -> anyhow::Result<Vec<Audit>> {
    let mut audits = Vec::with_capacity(sales.len());
    for &sale in sales {
        audits.push(bench.admin.audit(sale).await?);
    }
    Ok(audits)
}

/// The service's default lock lease, milliseconds (`POST /admin/sales`
/// without `lock_lease_ms`).
const SERVICE_LEASE_MS: i32 = 2000;

/// How often the settle period looks at the books.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// The settle period after a fault run's sale phase: waits until every unit
/// of the run's sales is sold, their Redis counter (if any) agrees with
/// Postgres and (for a strategy that settles after its answer) no accepted
/// request is pending, or until
/// `--settle-s` has passed; answers how long it took. Books that oversold
/// or drifted end it at once: nothing heals those.
/// Meanwhile the service heals what it can: leases expire, the reconciler
/// returns reservations, the queue redelivers.
async fn settle(
    bench: &Bench<'_>,
    strategy: StrategyName,
    sales: &[SaleId],
) -> anyhow::Result<Duration> {
    let start = std::time::Instant::now();
    loop {
        let mut settled = true;
        for &sale in sales {
            let audit = bench.admin.audit(sale).await?;
            let beyond_healing = audit.oversold > 0 || audit.ledger_drift != 0;
            settled &= beyond_healing
                || (audit.remaining_stock <= 0 && audit.redis_drift.unwrap_or(0) == 0);
        }
        if registration(strategy).settles == Settles::AfterTheAnswer {
            let stats = bench.admin.drained(sales, Duration::ZERO).await?;
            settled &= stats.iter().all(|s| s.accepted_unresolved == 0);
        }
        if settled || start.elapsed() >= bench.faults.settle {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// `(created_at, quantity)` of every order of `sales`.
async fn order_times(
    db: &sqlx::PgPool,
    sales: &[i64],
) -> anyhow::Result<Vec<(DateTime<Utc>, i64)>> {
    Ok(sqlx::query_as("SELECT created_at, quantity::bigint FROM orders WHERE sale_id = ANY($1)")
        .bind(sales)
        .fetch_all(db)
        .await?)
}

/// Settled Postgres transactions and the instances' counters, now.
async fn readings(bench: &Bench<'_>) -> anyhow::Result<(Xacts, Counters)> {
    let xacts = bench.xacts.settle().await?;
    let counters = bench.admin.counters(&bench.instances.urls).await?;
    Ok((xacts, counters))
}

/// The batches of the run's sales, over every instance (a strategy that
/// settles in batches).
async fn batch_stats(bench: &Bench<'_>, sales: &[SaleId]) -> anyhow::Result<BatchStats> {
    let mut all = Vec::with_capacity(sales.len());
    for &sale in sales {
        all.push(bench.admin.batch_stats(&bench.instances.urls, sale).await?);
    }
    Ok(BatchStats::merge(sales[0], &all))
}

/// The most purchases inside a lock's critical section at once, over the
/// run's sales.
async fn max_concurrency(bench: &Bench<'_>, sales: &[SaleId]) -> anyhow::Result<i64> {
    let mut most = 0;
    for &sale in sales {
        most = most.max(bench.admin.max_concurrency(&bench.instances.urls, sale).await?);
    }
    Ok(most)
}

impl Counted {
    /// The sale phase's deltas of the figures that apply to `strategy`,
    /// its sales behind a waiting room or not (`room`: the room's Redis
    /// round trips count under the sale's strategy, whatever it uses).
    /// Errors: a series the service exports for the strategy is missing.
    fn of(
        strategy: StrategyName,
        room: bool,
        [before, after]: &[Counters; 2],
    ) -> anyhow::Result<Counted> {
        let delta = |figure: &Figure| Counters::delta(before, after, figure, strategy);
        let count = |figure: &Figure| delta(figure).map(|d| d.map(|d| d as u64));
        let lock = match (
            count(&scrape::LOCK_RENEWALS)?,
            count(&scrape::LOCK_TIMEOUTS)?,
            count(&scrape::FENCE_REJECTIONS)?,
        ) {
            (Some(renewals), Some(lock_timeouts), Some(fence_rejections)) => {
                Some(LockStats { max_concurrency: 0, renewals, lock_timeouts, fence_rejections })
            }
            _ => None,
        };
        // The units counter is at /metrics from the start, the hold
        // histogram from its first hold: a phase in which no purchase
        // waited through another's hold (no contention) has no sum to read.
        let serial_units = delta(&scrape::SERIAL_UNITS)?;
        let serial_hold_s = match serial_units {
            Some(0.0) => Some(0.0),
            _ => delta(&scrape::SERIAL_HOLD)?,
        };
        let redis = if room { scrape::ROOM_REDIS_ROUND_TRIPS } else { scrape::REDIS_ROUND_TRIPS };
        Ok(Counted {
            redis_round_trips: delta(&redis)?,
            amqp_messages: delta(&scrape::AMQP_MESSAGES)?,
            serial_hold_s,
            serial_units,
            lock,
        })
    }
}

/// Buyer `i` buys from sale `(i − 1) mod sales`: each sale's demand is
/// `buyers / sales`, the remainder going one each to the first sales.
fn split_demand(buyers: u64, sales: usize) -> Vec<u64> {
    let n = sales.max(1) as u64;
    (0..n).map(|j| buyers / n + u64::from(j < buyers % n)).collect()
}

/// Units wanted and in stock that did not sell, added up over the sales:
/// `min(total_stock, demand) − units_sold` of each sale when positive.
fn undersold(audits: &[Audit], demand: &[u64]) -> i64 {
    audits
        .iter()
        .zip(demand)
        .map(|(audit, &wanted)| (audit.total_stock.min(wanted as i64) - audit.units_sold).max(0))
        .sum()
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
        units_pending: audits.iter().map(|a| a.units_pending).sum(),
        units_returned: audits.iter().map(|a| a.units_returned).sum(),
        units_resold: audits.iter().map(|a| a.units_resold).sum(),
        oversold: audits.iter().map(|a| a.oversold).sum(),
        ledger_drift: audits.iter().map(|a| a.ledger_drift).sum(),
        duplicate_orders: audits.iter().map(|a| a.duplicate_orders).sum(),
        first_order_at: audits.iter().filter_map(|a| a.first_order_at).min(),
        last_order_at: audits.iter().filter_map(|a| a.last_order_at).max(),
        redis_drift: sum_opt(|a| a.redis_drift),
        reconcile_fixes: sum_opt(|a| a.reconcile_fixes),
    }
}

/// Units sold ÷ (commit of the last unit − send of the first purchase):
/// the whole-phase rate; `None` when nothing sold or the interval is empty.
fn sell_through_whole(
    units_sold: i64,
    first_send: Option<DateTime<Utc>>,
    last_order: Option<DateTime<Utc>>,
) -> Option<f64> {
    let (first, last) = first_send.zip(last_order)?;
    let seconds = (last - first).num_microseconds().unwrap_or(0) as f64 / 1e6;
    (units_sold > 0 && seconds > 0.0).then(|| units_sold as f64 / seconds)
}

/// `value ÷ ceiling`, `None` when either is missing or the ratio is not
/// finite.
fn ratio_to(value: Option<f64>, ceiling: Option<f64>) -> Option<f64> {
    value.zip(ceiling).map(|(v, c)| v / c).filter(|v| v.is_finite())
}

/// The sale phase's costs per unit it sold; the CPU per unit over the
/// steady window, as the sell-through it is read beside.
fn cost(counted: &Counted, phases: &Phases) -> Cost {
    let sold = phases.sold_in_sale_phase;
    let per_unit = |total: f64| (sold > 0).then(|| total / sold as f64);
    let [xacts_before, xacts_after] = phases.xacts;
    let steady_units = phases.window.map_or(0, |w| w.units);
    let cpu_ms_per_unit = phases
        .cpu
        .as_ref()
        .and_then(|cpu| cpu.steady_service_s)
        .filter(|_| steady_units > 0)
        .map(|s| s * 1000.0 / steady_units as f64);
    let serial_ms_per_unit = counted
        .serial_hold_s
        .zip(counted.serial_units)
        .filter(|&(_, units)| units > 0.0)
        .map(|(held, units)| held * 1000.0 / units);
    Cost {
        redis_round_trips_per_unit: counted.redis_round_trips.and_then(per_unit),
        pg_xacts_per_unit: per_unit(PgXacts::between(xacts_before, xacts_after) as f64),
        amqp_messages_per_unit: counted.amqp_messages.and_then(per_unit),
        cpu_ms_per_unit,
        cpu_ms_per_unit_by_tier: cpu_ms_per_unit
            .zip(phases.cpu.as_ref())
            .map(|(total, cpu)| Tiers::split(total, cpu)),
        serial_ms_per_unit,
        serial_ceiling_per_s: serial_ms_per_unit.map(|ms| 1000.0 / ms),
        peak_rss_mb: phases.peak_rss_mb,
    }
}

/// The queue figures of a run, over its sales: unresolved requests added up,
/// and for latency and batch sizes the largest of each figure over the sales
/// (the batch mean weighted by the batches), which is the sale's own figure
/// for a single-sale run.
#[derive(Debug, PartialEq)]
struct QueueFigures {
    unresolved: i64,
    e2e: Option<Latency>,
    batches: Option<BatchSizes>,
}

impl QueueFigures {
    fn of(stats: &[QueueStats]) -> QueueFigures {
        let unresolved = stats.iter().map(|s| s.accepted_unresolved).sum();
        let e2e = stats.iter().filter_map(|s| s.e2e_latency_ms.as_ref()).fold(None, |acc, l| {
            let acc: Latency = acc.unwrap_or_default();
            Some(Latency {
                p50: acc.p50.max(l.p50),
                p95: acc.p95.max(l.p95),
                p99: acc.p99.max(l.p99),
                max: acc.max.max(l.max),
            })
        });
        let with_batches: Vec<(&BatchSizes, i64)> =
            stats.iter().filter_map(|s| s.batch_sizes.as_ref().map(|b| (b, s.batches))).collect();
        let batches = (!with_batches.is_empty()).then(|| {
            let total: i64 = with_batches.iter().map(|(_, n)| n).sum();
            let weighted: f64 = with_batches.iter().map(|(b, n)| b.mean * *n as f64).sum();
            BatchSizes {
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

/// The run record of what was measured, judged against its expectation
/// (`ratio.sell_through_vs_sql_strategy` is filled in once every run is in,
/// by [`report::relate_to_sql`]).
fn assemble(m: Measured, round: &Round, min_window_s: f64, cores: f64) -> Run {
    let cost = cost(&m.counted, &m.phases);
    let Measured {
        key,
        conditions,
        expected,
        prepared,
        phases,
        audit,
        undersold,
        counted,
        fault,
        delays,
    } = m;
    let later = phases.payment.as_ref().map_or(0, |p| p.outcome.later_buyers);
    let demanded_units = demand(&prepared, phases.payment.as_ref());
    let payment = (phases.payment.as_ref())
        .map(|phase| payment_record(&prepared.plan, phase, audit.units_pending, &delays));
    let rates = Rates::of(key, &audit, &phases, round);
    let (sale, rejection) = (phases.sale, phases.rejection);
    let outcomes = settled_outcomes(sale.outcomes, phases.queue_stats.as_deref());
    let queue = phases.queue_stats.as_deref().map(QueueFigures::of);
    let group_commit = phases.group_commit.and_then(|stats| stats.batch_sizes);
    let mut run = Run {
        strategy: key.strategy.as_str().to_owned(),
        profile: key.profile.name().to_owned(),
        repeat: key.repeat,
        take: key.take,
        expected,
        verdict: report::Verdict::Ok,
        instances: conditions.instances,
        sales: prepared.plan.sales,
        total_stock: audit.total_stock,
        buyers: prepared.buyers + later,
        demanded_units,
        requests: sale.requests,
        duration_s: sale.duration_s,
        throughput_rps: per_second(sale.requests, sale.duration_s),
        sell_through_per_s: rates.sell_through_per_s,
        sell_through_whole_per_s: rates.sell_through_whole_per_s,
        steady_window_s: phases.window.map(|w| w.seconds),
        too_short_to_rank: phases.window.is_none_or(|w| w.is_too_short(min_window_s)),
        rejection_rps: rates.rejection_rps,
        http_rps: Some(phases.http_rps),
        ceiling_undershot: rates.ceiling_undershot,
        cpu_over_cores: cpu_over_cores(phases.cpu.as_ref(), cores),
        units_sold: audit.units_sold,
        orders: audit.orders,
        remaining_stock: audit.remaining_stock,
        oversold: audit.oversold,
        undersold,
        ledger_drift: audit.ledger_drift,
        duplicate_orders: audit.duplicate_orders,
        errors_5xx: sale.errors_5xx + rejection.errors_5xx,
        outcomes,
        status_counts: sale.status_counts,
        latency_ms: sale.latency_ms,
        flood: sale.flood,
        ratio: rates.ratio,
        redis_drift: audit.redis_drift,
        reconcile_fixes: audit.reconcile_fixes,
        lock_stats: counted.lock,
        accepted_unresolved: queue.as_ref().map(|q| q.unresolved),
        e2e_latency_ms: queue.as_ref().and_then(|q| q.e2e.clone()),
        batch_sizes: queue.and_then(|q| q.batches).or(group_commit),
        cpu: phases.cpu,
        cost,
        sold_per_second: phases.sold_per_second,
        fault,
        units_returned: audit.units_returned,
        units_resold: audit.units_resold,
        payment,
        arrival: phases.arrival,
        fairness: Some(phases.fairness),
    };
    run.verdict = run.judge();
    run
}

/// The sale phase's `outcomes`, with the requests a queue refused after
/// accepting them counted as `rejected` when the strategy settles later.
fn settled_outcomes(
    mut outcomes: scenario::Outcomes,
    queue_stats: Option<&[QueueStats]>,
) -> scenario::Outcomes {
    if let Some(stats) = queue_stats {
        outcomes.rejected = stats.iter().map(|s| s.rejected.max(0) as u64).sum();
    }
    outcomes
}

/// The machine's CPUs, as the load generator sees them.
fn cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The CPU time a steady window may read beyond its cores × seconds and
/// still be consistent, in periods of the kernel's CPU quota: a quota (a
/// `--service-cpu-budget`) is granted per period of 100 ms (the CFS
/// bandwidth period, `cpu.cfs_period_us`), so a window whose ends fall
/// inside periods can take in up to one period's quota more at each end.
const OVER_CORES_SLACK_PERIODS: f64 = 2.0;

/// Whether the service side kept more than `cores` busy over the steady
/// window — the machine's CPUs, or the service's CPU budget — beyond what
/// the quota's periods at the window's ends allow: impossible, so a
/// measurement that cannot be read as consistent.
fn cpu_over_cores(cpu: Option<&Cpu>, cores: f64) -> bool {
    let Some((used_s, used_cores)) =
        cpu.and_then(|c| Some((c.steady_service_s?, c.steady_service_cores?)))
    else {
        return false;
    };
    let window_s = if used_cores > 0.0 { used_s / used_cores } else { return false };
    let period_s = owned_servers::cpu_group::BUDGET_PERIOD_US as f64 / 1e6;
    used_s > cores * (window_s + OVER_CORES_SLACK_PERIODS * period_s)
}

/// A run's rates (see docs/report-format.md) and their ratios to the
/// ceilings of its round, `http_rps` being the run's own sample.
struct Rates {
    sell_through_per_s: Option<f64>,
    sell_through_whole_per_s: Option<f64>,
    rejection_rps: Option<f64>,
    /// A rate more than 5 % above the ceiling that bounds it.
    ceiling_undershot: bool,
    ratio: Ratio,
}

impl Rates {
    fn of(key: RunKey, audit: &Audit, phases: &Phases, round: &Round) -> Rates {
        let sell_through_whole_per_s =
            sell_through_whole(audit.units_sold, phases.sale.first_send, audit.last_order_at);
        let sell_through_per_s = phases.window.and_then(|w| w.rate());
        let rejection_rps = Some(phases.rejection.steady_rps).filter(|r| *r > 0.0);
        let round = round.clone().with_own_http_rps(Some(phases.http_rps));
        let exceeded = round.exceeded_by(key.strategy.as_str(), sell_through_per_s, rejection_rps);
        Rates {
            sell_through_per_s,
            sell_through_whole_per_s,
            rejection_rps,
            ceiling_undershot: !exceeded.is_empty(),
            ratio: Ratio {
                sell_through_vs_sql_tps: ratio_to(sell_through_per_s, round.get(Kind::SqlTps)),
                rejection_vs_http_rps: ratio_to(rejection_rps, round.get(Kind::HttpRps)),
                sell_through_vs_sql_strategy: None,
                sell_through_vs_batched_ceiling: None,
            },
        }
    }
}

/// The `payment` record of a run: the plan's settings, what the buyers did,
/// the units still pending at the final audit, and the delays: expiry →
/// resale, its part beyond the line, expiry → return.
fn payment_record(
    plan: &Plan,
    phase: &PaymentPhase,
    units_pending: i64,
    delays: &LifecycleDelays,
) -> report::PaymentRecord {
    let settings =
        plan.payment.unwrap_or(crate::profile::Payment { unpaid_share: 0.0, sale_window_s: 0 });
    report::PaymentRecord {
        payment_window_ms: plan.knobs.payment_window_ms.unwrap_or(0),
        unpaid_share: settings.unpaid_share,
        sale_window_s: settings.sale_window_s,
        units_pending,
        expiry_to_resale_ms: report::ResaleDelays::of(&delays.resale_ms),
        resale_beyond_line_ms: report::ResaleDelays::of(&delays.resale_wait_ms),
        expiry_to_return_ms: report::ResaleDelays::of(&delays.return_ms),
        return_bound_ms: report::RETURN_BOUND_MS,
        later_buyers: phase.outcome.later_buyers,
        paying_buyers: phase.outcome.paying_buyers,
        payments: phase.outcome.payments.clone(),
        settled_s: phase.settled_s,
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use seckill::strategy::descriptor::E2eLatency;

    use super::*;
    use crate::profile::SaleKnobs;
    use crate::report::Verdict;
    use crate::scenario::Outcomes;

    fn at(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    fn audit(total_stock: i64, units_sold: i64) -> Audit {
        Audit {
            sale_id: SaleId(1),
            strategy: "sql".to_owned(),
            total_stock,
            remaining_stock: (total_stock - units_sold).max(0),
            orders: units_sold,
            units_sold,
            units_pending: 0,
            units_returned: 0,
            units_resold: 0,
            oversold: (units_sold - total_stock).max(0),
            ledger_drift: 0,
            duplicate_orders: 0,
            first_order_at: Some(at(100)),
            last_order_at: Some(at(2_100)),
            redis_drift: None,
            reconcile_fixes: None,
        }
    }

    fn key(strategy: &str) -> RunKey {
        RunKey {
            strategy: strategy.parse().unwrap(),
            profile: Profile::Burst,
            fault: None,
            repeat: 2,
            take: 1,
        }
    }

    #[test]
    fn demand_is_split_round_robin_over_the_sales() {
        assert_eq!(split_demand(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(split_demand(10, 1), vec![10]);
        assert_eq!(split_demand(2, 3), vec![1, 1, 0]);
    }

    #[test]
    fn undersold_counts_per_sale_what_was_wanted_and_in_stock() {
        // Sale 1 sold 4 of 5 wanted (1 undersold); sale 2 oversold, which
        // must not offset sale 1; sale 3 had less demand than stock.
        let audits = [audit(5, 4), audit(5, 7), audit(5, 2)];
        assert_eq!(undersold(&audits, &[6, 6, 2]), 1);
    }

    #[test]
    fn audits_add_up_without_offsetting_and_keep_null_redis_figures_null() {
        let mut first = audit(5, 7);
        first.ledger_drift = -2;
        first.first_order_at = Some(at(50));
        let mut second = audit(5, 5);
        second.last_order_at = Some(at(9_000));
        second.redis_drift = Some(0);
        let total = add_up(&[first, second]);
        assert_eq!((total.total_stock, total.units_sold, total.oversold), (10, 12, 2));
        assert_eq!(total.ledger_drift, -2);
        assert_eq!((total.first_order_at, total.last_order_at), (Some(at(50)), Some(at(9_000))));
        assert_eq!((total.redis_drift, total.reconcile_fixes), (Some(0), None));
    }

    #[test]
    fn sell_through_needs_units_and_a_positive_interval() {
        assert_eq!(sell_through_whole(100, Some(at(0)), Some(at(2_000))), Some(50.0));
        assert_eq!(sell_through_whole(0, Some(at(0)), Some(at(2_000))), None);
        assert_eq!(sell_through_whole(100, Some(at(2_000)), Some(at(2_000))), None);
        assert_eq!(sell_through_whole(100, None, Some(at(2_000))), None);
        assert_eq!(ratio_to(Some(50.0), Some(200.0)), Some(0.25));
        assert_eq!(ratio_to(Some(50.0), Some(0.0)), None);
        assert_eq!(ratio_to(None, Some(200.0)), None);
        assert_eq!(ratio_to(Some(50.0), None), None);
    }

    #[test]
    fn the_sale_phase_label_counts_resubmissions_apart_from_the_flood() {
        assert_eq!(
            sale_phase_label(100, 130, 0, false),
            "sale phase (100 buyers + 30 resubmissions)"
        );
        assert_eq!(
            sale_phase_label(100, 100, 0, true),
            "sale phase (100 buyers, then later ones until every unit is paid)"
        );
        assert_eq!(
            sale_phase_label(100, 10_110, 10_000, false),
            "sale phase (100 buyers + 10 resubmissions + 10000 by one flooding buyer)"
        );
    }

    #[test]
    fn each_run_writes_its_goose_report_under_a_name_of_its_own() {
        let out = std::path::Path::new("out");
        let plain = goose_report_path(out, key("lock/watchdog"));
        assert_eq!(plain, out.join("goose-lock-watchdog-burst-2.html"));
        let faulted = RunKey { fault: Some(FaultKind::KillInstance), ..key("lock/watchdog") };
        assert_eq!(
            goose_report_path(out, faulted),
            out.join("goose-lock-watchdog-burst-kill-instance-2.html")
        );
    }

    #[test]
    fn a_sale_body_names_its_run_and_carries_the_knobs() {
        let knobs = serde_json::to_value(SaleKnobs { work_ms: Some(5), ..Default::default() });
        let body = sale_body(key("sql/for-update"), 1, 250, &knobs.unwrap());
        assert_eq!(
            body,
            json!({ "name": "sql/for-update / burst / 2 / sale 2", "stock": 250,
                    "strategy": "sql/for-update", "work_ms": 5 })
        );
    }

    const EXPOSITION: &str = "\
seckill_redis_round_trips_total{strategy=\"lock/token\"} 30
seckill_lock_renewals_total{strategy=\"lock/token\"} 0
seckill_lock_timeouts_total{strategy=\"lock/token\"} 4
seckill_fence_rejections_total{strategy=\"lock/token\"} 0
seckill_amqp_messages_total{direction=\"published\"} 12
seckill_serial_hold_duration_seconds_sum{strategy=\"lock/token\"} 0.25
seckill_serial_hold_units_total{strategy=\"lock/token\"} 20
seckill_serial_hold_duration_seconds_sum{strategy=\"sql\"} 0.5
seckill_serial_hold_units_total{strategy=\"sql\"} 100
seckill_serial_hold_units_total{strategy=\"sql/for-update\"} 0
";

    #[test]
    fn counted_figures_are_the_sale_phases_deltas_of_what_applies() {
        let counters = [Counters::default(), Counters::parse(EXPOSITION)];
        let token = Counted::of(key("lock/token").strategy, false, &counters).unwrap();
        assert_eq!(token.redis_round_trips, Some(30.0));
        assert_eq!(token.amqp_messages, None, "lock/token does not use RabbitMQ");
        let lock = token.lock.expect("a lock strategy has lock stats");
        assert_eq!((lock.renewals, lock.lock_timeouts, lock.fence_rejections), (0, 4, 0));
        assert_eq!((token.serial_hold_s, token.serial_units), (Some(0.25), Some(20.0)));
        let sql =
            Counted { serial_hold_s: Some(0.5), serial_units: Some(100.0), ..Counted::default() };
        assert_eq!(Counted::of(key("sql").strategy, false, &counters).unwrap(), sql);
        // Behind a waiting room, `sql`'s sales send the room's round trips:
        // counted from 0 when the series appeared during the phase.
        let roomed =
            EXPOSITION.to_owned() + "seckill_redis_round_trips_total{strategy=\"sql\"} 7\n";
        let roomed = [Counters::default(), Counters::parse(&roomed)];
        let with_room = Counted::of(key("sql").strategy, true, &roomed).unwrap();
        assert_eq!(with_room.redis_round_trips, Some(7.0));
        assert_eq!(Counted::of(key("sql").strategy, false, &roomed).unwrap(), sql);
        // A Redis strategy whose series is missing fails the run.
        let err = Counted::of(key("redis-decr").strategy, false, &counters).unwrap_err();
        assert!(err.to_string().contains("strategy=\"redis-decr\""), "{err}");
        // No hold yet: the units are 0 and the histogram not shown, which
        // reads as nothing held, not as a missing series.
        let idle = Counted::of(key("sql/for-update").strategy, false, &counters).unwrap();
        assert_eq!((idle.serial_hold_s, idle.serial_units), (Some(0.0), Some(0.0)));
        // Units without their hold sum is a renamed or missing series.
        let renamed = [
            Counters::default(),
            Counters::parse(
                &EXPOSITION.replace("_sum{strategy=\"sql\"}", "_total_s{strategy=\"sql\"}"),
            ),
        ];
        let err = Counted::of(key("sql").strategy, false, &renamed).unwrap_err();
        assert!(err.to_string().contains("seckill_serial_hold_duration_seconds_sum"), "{err}");
    }

    fn queue_stats(unresolved: i64, p99: f64, batches: i64, mean: f64) -> QueueStats {
        QueueStats {
            sale_id: SaleId(1),
            accepted: 10,
            accepted_unresolved: unresolved,
            placed: 5,
            sold_out: 5,
            already_purchased: 0,
            rejected: 1,
            e2e_latency_ms: Some(E2eLatency { p50: 1.0, p95: 2.0, p99, max: p99 + 1.0 }),
            batches,
            batch_sizes: Some(BatchSizes { p50: mean, max: mean * 2.0, mean }),
        }
    }

    #[test]
    fn queue_figures_take_the_worst_latency_and_weight_batch_means() {
        let figures =
            QueueFigures::of(&[queue_stats(1, 9.0, 1, 10.0), queue_stats(2, 4.0, 3, 2.0)]);
        assert_eq!(figures.unresolved, 3);
        assert_eq!(figures.e2e.map(|l| (l.p99, l.max)), Some((9.0, 10.0)));
        let batches = figures.batches.unwrap();
        assert_eq!((batches.p50, batches.max, batches.mean), (10.0, 20.0, 4.0));
        assert_eq!(QueueFigures::of(&[]), QueueFigures { unresolved: 0, e2e: None, batches: None });
    }

    fn phase(requests: u64, duration_s: f64, first_send: Option<DateTime<Utc>>) -> PhaseResult {
        PhaseResult {
            requests,
            duration_s,
            steady_rps: requests as f64 / duration_s,
            first_send,
            outcomes: Outcomes { placed: 100, sold_out: 200, ..Outcomes::default() },
            errors_5xx: 0,
            status_counts: Default::default(),
            latency_ms: Latency { p50: 1.0, p95: 2.0, p99: 3.0, max: 4.0 },
            flood: None,
        }
    }

    fn ceilings() -> Round {
        let mut round = Round::default();
        round.set(Kind::HttpRps, 1000.0);
        round.set(Kind::SqlTps, 200.0);
        round
    }

    fn measured(strategy: &str, sold: i64) -> Measured {
        let key = key(strategy);
        let conditions = Conditions { profile: key.profile, instances: 2, fault: None };
        let plan = Plan {
            stock: 100,
            sales: 1,
            submissions: 1,
            resubmit: 0.0,
            flood: 0,
            knobs: SaleKnobs::default(),
            payment: None,
            arrival: None,
        };
        let mut total = audit(100, sold);
        total.first_order_at = Some(at(0));
        total.last_order_at = Some(at(2_000));
        Measured {
            key,
            conditions,
            expected: expected(seckill::strategy::registration(key.strategy), &conditions),
            prepared: Prepared { plan, sales: vec![SaleId(7)], buyers: 300 },
            phases: Phases {
                sale: phase(400, 2.0, Some(at(0))),
                http_rps: 1000.0,
                rejection: phase(500, 1.0, None),
                queue_stats: None,
                group_commit: None,
                xacts: [Xacts { total: 1_000, nudges: 0 }, Xacts { total: 1_330, nudges: 30 }],
                counters: [Counters::default(), Counters::default()],
                sold_in_sale_phase: sold,
                window: Some(Window {
                    units: sold * 8 / 10,
                    seconds: 1.6,
                    from: at(200),
                    to: at(1_800),
                }),
                sold_per_second: Some(vec![40, sold - 40]),
                cpu: Some(Cpu {
                    loadgen_s: 1.0,
                    instances_s: 0.5,
                    postgres_s: Some(0.4),
                    redis_s: Some(0.0),
                    rabbitmq_s: Some(0.1),
                    machine_share_loadgen: Some(0.2),
                    steady_service_s: Some(0.8),
                    steady_service_cores: Some(0.5),
                }),
                peak_rss_mb: Some(40.0),
                fault: None,
                payment: None,
                arrival: None,
                fairness: Fairness::default(),
            },
            undersold: undersold(std::slice::from_ref(&total), &[300]),
            audit: total,
            counted: Counted {
                redis_round_trips: Some(250.0),
                serial_hold_s: Some(0.05),
                serial_units: Some(100.0),
                ..Counted::default()
            },
            fault: None,
            delays: LifecycleDelays::default(),
        }
    }

    #[test]
    fn a_run_record_holds_the_ratios_costs_and_verdict_of_its_measurements() {
        let run = assemble(measured("sql", 100), &ceilings(), 1.0, 2.0);
        assert_eq!((run.strategy.as_str(), run.profile.as_str(), run.repeat), ("sql", "burst", 2));
        assert_eq!((run.expected, run.verdict), (Expectation::Correct, Verdict::Ok));
        assert_eq!((run.buyers, run.demanded_units, run.sales, run.instances), (300, 300, 1, 2));
        assert_eq!((run.throughput_rps, run.rejection_rps), (200.0, Some(500.0)));
        assert_eq!(run.sell_through_whole_per_s, Some(50.0));
        assert_eq!(run.sell_through_per_s, Some(50.0), "80 units in the 1.6 s window");
        assert_eq!((run.steady_window_s, run.too_short_to_rank), (Some(1.6), false));
        assert_eq!(run.ratio.sell_through_vs_sql_tps, Some(0.25));
        assert_eq!(run.ratio.rejection_vs_http_rps, Some(0.5));
        assert!(!run.ceiling_undershot);
        assert_eq!(run.cost.pg_xacts_per_unit, Some(3.0), "330 transactions − 30 nudges");
        assert_eq!(run.cost.cpu_ms_per_unit, Some(10.0), "0.8 s of service CPU, 80 units");
        // The phase's service CPU was 0.5 + 0.4 + 0 + 0.1 s: the 10 ms split
        // by those shares.
        let tiers = run.cost.cpu_ms_per_unit_by_tier.unwrap();
        assert_eq!(
            (tiers.instances, tiers.postgres, tiers.redis, tiers.rabbitmq),
            (5.0, Some(4.0), Some(0.0), Some(1.0))
        );
        assert_eq!(run.cost.serial_ms_per_unit, Some(0.5), "50 ms held for 100 units");
        assert_eq!(run.cost.serial_ceiling_per_s, Some(2000.0));
        assert!(!run.cpu_over_cores);
        assert_eq!(run.cost.redis_round_trips_per_unit, Some(2.5));
        assert_eq!(run.cost.amqp_messages_per_unit, None);
        assert_eq!(run.accepted_unresolved, None);
        assert_eq!(run.undersold, 0);
    }

    #[test]
    fn a_rate_above_its_rounds_ceiling_is_flagged_and_a_short_window_is_not_ranked() {
        let mut m = measured("sql", 100);
        m.phases.rejection = phase(1_100, 1.0, None);
        m.phases.window = Some(Window { units: 80, seconds: 0.4, from: at(0), to: at(400) });
        let run = assemble(m, &ceilings(), 1.0, 2.0);
        assert!(run.ceiling_undershot, "1 100 answers/s against http_rps 1 000");
        assert_eq!((run.sell_through_per_s, run.too_short_to_rank), (Some(200.0), true));
    }

    #[test]
    fn the_cpu_per_unit_and_the_rate_share_the_steady_window() {
        // The whole phase used 1 s of service CPU for 100 units; the
        // window 0.8 s for its 80: both 10 ms per unit, read over the same
        // 1.6 s as the 50 units/s.
        let readings: Vec<cpu::Reading> =
            (0..=10).map(|i| cpu::Reading { at: at(i * 200), service_s: i as f64 * 0.1 }).collect();
        let window = Window { units: 80, seconds: 1.6, from: at(200), to: at(1_800) };
        let cpu = steady_cpu(phase_cpu_only(), &readings, Some(&window));
        assert_eq!((cpu.steady_service_s, cpu.steady_service_cores), (Some(0.8), Some(0.5)));
        assert!(!cpu_over_cores(Some(&cpu), 2.0));
        // 3.1 CPU-seconds a second on 2 cores cannot be: flagged.
        let over = |cores: f64| Cpu {
            steady_service_s: Some(cores * 1.6),
            steady_service_cores: Some(cores),
            ..cpu.clone()
        };
        let busy = over(3.1);
        assert!(cpu_over_cores(Some(&busy), 2.0) && !cpu_over_cores(Some(&busy), 4.0));
        assert!(!cpu_over_cores(None, 2.0), "not measured is not flagged");
        let mut m = measured("sql", 100);
        m.phases.cpu = Some(busy);
        let run = assemble(m, &ceilings(), 1.0, 2.0);
        assert!(run.cpu_over_cores);
        // Under a budget of 1 core, 1.5 busy cores are as impossible.
        let budgeted = over(1.5);
        assert!(cpu_over_cores(Some(&budgeted), 1.0) && !cpu_over_cores(Some(&budgeted), 2.0));
        // A quota is granted per 100 ms period: a window may take in one
        // more at each end, 0.2 s of a core over 1.6 s, and no more.
        assert!(!cpu_over_cores(Some(&over(0.55)), 0.5), "0.88 s ≤ 0.5 × 1.8 s");
        assert!(cpu_over_cores(Some(&over(0.57)), 0.5), "0.912 s > 0.5 × 1.8 s");
        // No window, no CPU per unit: never the whole phase's in its place.
        assert_eq!(steady_cpu(phase_cpu_only(), &readings, None).steady_service_s, None);
    }

    fn phase_cpu_only() -> Cpu {
        Cpu { instances_s: 1.0, ..Cpu::default() }
    }

    #[test]
    fn a_run_is_too_short_to_rank_under_the_comparisons_window() {
        let run = assemble(measured("sql", 100), &ceilings(), 3.0, 2.0);
        assert!(run.too_short_to_rank, "1.6 s under 3 s");
        assert!(!assemble(measured("sql", 100), &ceilings(), 1.6, 2.0).too_short_to_rank);
    }

    #[test]
    fn run_labels_name_the_round_the_take_and_the_pilots() {
        let label = |repeat, take| run_label(RunKey { repeat, take, ..key("sql") });
        assert_eq!(
            (label(3, 1), label(3, 2), label(0, 1), label(0, 2)),
            ("3".to_owned(), "3.2".to_owned(), "pilot".to_owned(), "pilot-2".to_owned())
        );
    }

    #[test]
    fn rejections_divide_by_the_runs_own_http_sample_not_the_rounds() {
        let mut m = measured("sql", 100);
        m.phases.http_rps = 2_000.0;
        m.phases.rejection = phase(1_100, 1.0, None);
        let run = assemble(m, &ceilings(), 1.0, 2.0);
        assert_eq!(run.http_rps, Some(2_000.0));
        assert_eq!(run.ratio.rejection_vs_http_rps, Some(0.55), "the round's 1 000 is not used");
        assert!(!run.ceiling_undershot, "1 100 answers/s are below the run's own 2 000");
    }

    fn paid_out(later: u64, paying: u64) -> PaymentPhase {
        let outcome = payment::Outcome {
            later_buyers: later,
            paying_buyers: paying,
            payments: payment::Payments { paid: 100, refused: 2, failed: 0 },
        };
        PaymentPhase { outcome, settled_s: Some(9.5) }
    }

    #[test]
    fn a_payment_run_counts_its_later_buyers_and_wants_the_paying_ones_units() {
        let mut m = measured("sql", 100);
        m.key.profile = Profile::Payment;
        m.prepared.plan.knobs.payment_window_ms = Some(2000);
        m.prepared.plan.payment =
            Some(crate::profile::Payment { unpaid_share: 0.3, sale_window_s: 120 });
        m.phases.payment = Some(paid_out(40, 250));
        m.audit.units_returned = 45;
        m.audit.units_resold = 45;
        m.delays.resale_ms = vec![900.0, 500.0, 700.0];
        let run = assemble(m, &ceilings(), 1.0, 2.0);
        assert_eq!((run.buyers, run.demanded_units), (340, 250));
        assert_eq!((run.units_returned, run.units_resold), (45, 45));
        let payment = run.payment.clone().expect("a payment record");
        assert_eq!((payment.payment_window_ms, payment.units_pending), (2000, 0));
        let delays = payment.expiry_to_resale_ms.expect("delays");
        assert_eq!((delays.p50, delays.p90, delays.max, delays.units), (700.0, 900.0, 900.0, 3));
        assert_eq!(delays.p99, Some(900.0));
        assert_eq!(run.verdict, Verdict::Ok);
    }

    #[test]
    fn a_payment_run_whose_units_came_back_late_is_judged_broke() {
        let payment_run = |return_ms: Vec<f64>, resale_wait_ms: Vec<f64>| {
            let mut m = measured("lock/fenced", 100);
            m.prepared.plan.knobs.payment_window_ms = Some(2000);
            m.prepared.plan.payment =
                Some(crate::profile::Payment { unpaid_share: 0.3, sale_window_s: 120 });
            m.phases.payment = Some(paid_out(0, 300));
            (m.audit.units_returned, m.audit.units_resold) = (100, 100);
            (m.delays.return_ms, m.delays.resale_wait_ms) = (return_ms, resale_wait_ms);
            assemble(m, &ceilings(), 1.0, 2.0)
        };
        let bound = report::RETURN_BOUND_MS as f64;
        // 99 of 100 within the bound: p99 is within it.
        let mut within: Vec<f64> = vec![bound; 99];
        within.push(60_000.0);
        let run = payment_run(within.clone(), Vec::new());
        let returns = run.payment.as_ref().and_then(|p| p.expiry_to_return_ms.clone());
        assert_eq!(returns.and_then(|d| d.p99), Some(bound));
        assert_eq!(run.verdict, Verdict::Ok);
        // Two of 100 past it: p99 is past it, the units starved.
        let mut late: Vec<f64> = vec![100.0; 98];
        late.extend([bound + 1.0, 62_000.0]);
        assert_eq!(payment_run(late.clone(), Vec::new()).verdict, Verdict::Broke);
        // Back in time but left standing for sale with nothing ahead of
        // them: starved all the same.
        assert_eq!(payment_run(vec![100.0; 100], late).verdict, Verdict::Broke);
        assert_eq!(payment_run(vec![100.0; 100], within).verdict, Verdict::Ok);
    }

    #[test]
    fn a_payment_run_with_nothing_resold_or_an_order_left_pending_is_judged_broke() {
        let payment_run = |returned: i64, resold: i64, pending: i64| {
            let mut m = measured("sql", 100);
            m.prepared.plan.knobs.payment_window_ms = Some(2000);
            m.prepared.plan.payment =
                Some(crate::profile::Payment { unpaid_share: 0.3, sale_window_s: 120 });
            m.phases.payment = Some(paid_out(0, 300));
            (m.audit.units_returned, m.audit.units_resold) = (returned, resold);
            m.audit.units_pending = pending;
            assemble(m, &ceilings(), 1.0, 2.0).verdict
        };
        assert_eq!(payment_run(10, 10, 0), Verdict::Ok);
        assert_eq!(payment_run(10, 0, 0), Verdict::Broke, "returned, never resold");
        assert_eq!(payment_run(0, 0, 0), Verdict::Broke, "nothing returned");
        assert_eq!(payment_run(10, 10, 1), Verdict::Broke, "an order never expired");
    }

    #[test]
    fn a_refused_payment_buyer_comes_back_after_an_eighth_of_the_window_within_bounds() {
        assert_eq!(come_back(Duration::from_millis(2000)), Duration::from_millis(250));
        assert_eq!(come_back(Duration::from_millis(100)), Duration::from_millis(50));
        assert_eq!(come_back(Duration::from_secs(60)), Duration::from_secs(1));
    }

    #[test]
    fn a_correct_strategy_that_undersold_is_judged_broke() {
        let run = assemble(measured("sql", 90), &ceilings(), 1.0, 2.0);
        assert_eq!((run.undersold, run.verdict), (10, Verdict::Broke));
        // A baseline that kept exact books did not demonstrate anything.
        let run = assemble(measured("naive", 100), &ceilings(), 1.0, 2.0);
        assert_eq!((run.expected, run.verdict), (Expectation::Breaks, Verdict::Unexpected));
    }
}
