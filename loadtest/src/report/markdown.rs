//! The human-readable forms of a report: the console table and report.md.

use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{CellAlignment, Table};

use super::columns::{Align, Column, RUN_COLUMNS, SUMMARY_COLUMNS, cells, num};
use super::summary::{Summary, VS_SQL};
use super::{Report, arrivals, matrix};
use crate::ceilings::Kind;
use crate::stats::median;

/// `rows` under `columns` as a table, `markdown` or console style.
fn table<'a, T: 'a>(
    columns: &[Column<T>],
    rows: impl IntoIterator<Item = &'a T>,
    markdown: bool,
) -> String {
    let mut table = Table::new();
    table.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    table.set_header(columns.iter().map(|c| c.header));
    for row in rows {
        table.add_row(cells(columns, row));
    }
    for (i, column) in columns.iter().enumerate() {
        if let (Align::Right, Some(column)) = (column.align, table.column_mut(i)) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
}

/// The summary over repeats as a table, `markdown` or console style.
pub fn summary_table(report: &Report, markdown: bool) -> String {
    table(SUMMARY_COLUMNS, &report.summary, markdown)
}

/// One line per (strategy, profile): "naive (burst): broke in 5 of 5 runs …".
pub fn verdict_lines(report: &Report) -> String {
    report.summary.iter().map(|s| format!("- {}\n", s.broke_line())).collect()
}

/// What a reader must see before ranking, one line each: every run that
/// exceeded its own round's ceiling by more than 5 % (the ceiling was
/// measured too low), every run whose service side used more CPU than the
/// machine has, every run whose steady window was too short to rank, every
/// strategy whose interval against `sql` is too wide to decide (with the
/// measured reason), and the share of the machine the load generator took.
pub fn warning_lines(report: &Report) -> Vec<String> {
    let mut lines = Vec::new();
    let min_window_s = report.min_window_s();
    for run in &report.runs {
        let who = format!("{} ({}, round {})", run.strategy, run.profile, run.label());
        let round = report.ceilings.round(run.repeat).with_own_http_rps(run.http_rps);
        for (kind, ratio) in
            round.exceeded_by(&run.strategy, run.sell_through_per_s, run.rejection_rps)
        {
            let rate = if kind == Kind::HttpRps { "rejections" } else { "sell-through" };
            let whose = match (kind, run.http_rps) {
                (Kind::HttpRps, Some(_)) => "its own",
                _ => "its round's",
            };
            lines.push(format!(
                "warning: {who}: {rate} at {ratio:.2} × {whose} {}: that ceiling was measured \
                 too low (ceiling_undershot)",
                kind.name()
            ));
        }
        if run.cpu_over_cores {
            let cores = run.cpu.as_ref().and_then(|c| c.steady_service_cores).unwrap_or(0.0);
            lines.push(format!(
                "warning: {who}: the service side used {cores:.2} CPU-seconds per second over \
                 the steady window, more than the machine's {} CPUs: its CPU per unit does not \
                 add up (cpu_over_cores)",
                report.machine.cpus
            ));
        }
        if run.too_short_to_rank {
            let window = run.steady_window_s.map_or("none".to_owned(), |s| format!("{s:.2} s"));
            lines.push(format!(
                "note: {who}: steady window {window}, under {min_window_s} s: reported, not ranked"
            ));
        }
    }
    let sql = report.summary.iter().find(|s| s.strategy == seckill::strategy::REFERENCE.as_str());
    for summary in &report.summary {
        lines.extend(undecided_line(summary, sql));
    }
    lines.extend(loadgen_line(report));
    lines
}

/// "note: lock/fenced (burst): × sql 0.61 [0.40–0.93] is wider than
/// −25 %/+33 % of its centre: its own sell-through varied by a factor 1.52
/// over the runs (590–898 units/s), sql's by 1.21", for a strategy expected
/// to be correct whose interval against `sql` does not decide (not for
/// `sql`, whose interval against itself only says how far its runs spread).
fn undecided_line(summary: &Summary, sql: Option<&Summary>) -> Option<String> {
    if summary.expected != crate::expectation::Expectation::Correct
        || summary.too_short_to_rank
        || summary.strategy == seckill::strategy::REFERENCE.as_str()
    {
        return None;
    }
    let spread = summary.figures.get(VS_SQL).copied().flatten()?;
    let [lo, hi] = spread.ci95?;
    if spread.decides()? {
        return None;
    }
    let rate = |s: &Summary| s.figures.get("sell_through_per_s").copied().flatten();
    let own = rate(summary)?;
    let factor =
        |s: super::summary::Spread| if s.min > 0.0 { s.max / s.min } else { f64::INFINITY };
    let reference =
        sql.and_then(rate).map_or(String::new(), |s| format!(", sql's by {:.2}", factor(s)));
    Some(format!(
        "note: {} ({}): × sql {:.2} [{lo:.2}–{hi:.2}] is wider than −25 %/+33 % of its centre: \
         its own sell-through varied by a factor {:.2} over the runs ({:.0}–{:.0} units/s){reference}",
        summary.strategy,
        summary.profile,
        spread.median,
        factor(own),
        own.min,
        own.max,
    ))
}

/// "the load generator used 31 % of the machine's CPU during the sale
/// phases (median; 22–41 %)", when it was measured.
fn loadgen_line(report: &Report) -> Option<String> {
    let shares: Vec<f64> = report
        .runs
        .iter()
        .filter_map(|r| r.cpu.as_ref().and_then(|c| c.machine_share_loadgen))
        .collect();
    let middle = median(&shares)?;
    let low = shares.iter().copied().fold(f64::INFINITY, f64::min);
    let high = shares.iter().copied().fold(0.0, f64::max);
    Some(format!(
        "the load generator used {:.0} % of the machine's CPU during the sale phases (median \
         over the runs; {:.0}–{:.0} %): the services had the rest",
        middle * 100.0,
        low * 100.0,
        high * 100.0
    ))
}

/// The runs as a table, in report order, `markdown` or console style.
pub fn runs_table(report: &Report, markdown: bool) -> String {
    table(RUN_COLUMNS, &report.runs, markdown)
}

/// The ceilings line.
pub fn ceilings_line(report: &Report) -> String {
    let c = &report.ceilings;
    let mut line = format!(
        "ceilings: http_rps {:.0} ({} goose users, {} instances, {:.0} s); \
         sql_tps {:.0} ({} connections, {:.0} s)",
        c.http_rps.value,
        c.http_rps.users,
        c.http_rps.instances,
        c.http_rps.duration_s,
        c.sql_tps.value,
        c.sql_tps.connections,
        c.sql_tps.duration_s,
    );
    if let Some(redis) = &c.redis_ops {
        line += &format!(
            "; redis_ops {:.0} ({} clients, {:.0} s)",
            redis.value, redis.clients, redis.duration_s
        );
    }
    if let Some(amqp) = &c.amqp_rps {
        line += &format!(
            "; amqp_rps {:.0} ({} clients, {:.0} s)",
            amqp.value, amqp.clients, amqp.duration_s
        );
    }
    if let Some(drain) = &c.queue_drain_units_per_s {
        line += &format!(
            "; queue_drain_units_per_s {:.0} ({} units, batches of {}, {} × sql_tps)",
            drain.value,
            drain.units,
            drain.batch_size,
            num(drain.ratio_vs_sql_tps, 1)
        );
    }
    if let Some(batched) = &c.sql_batched_units_per_s {
        line += &format!(
            "; sql_batched_units_per_s {:.0} (batches of {}, {} connections, {:.0} s, {} × sql_tps)",
            batched.value,
            batched.batch_size,
            batched.connections,
            batched.duration_s,
            num(batched.ratio_vs_sql_tps, 1)
        );
    }
    if c.http_rps.samples.len() > 1 {
        line += &format!(
            " — medians of {} rounds, each run measured against its own round's",
            c.http_rps.samples.len()
        );
    }
    if report.runs.iter().any(|r| r.http_rps.is_some()) {
        line += "; http_rps: each run measures its own right before its rejection phase, \
                 a round's sample is the median of its runs'";
    }
    line
}

/// One line per `flood` run: the other buyers' p99 beside the `burst` run's
/// of the same strategy and round, when there is one, and what the
/// flooding buyer's own purchases were answered.
pub fn flood_lines(report: &Report) -> Vec<String> {
    let runs = &report.runs;
    runs.iter()
        .filter_map(|run| Some((run, run.flood.as_ref()?)))
        .map(|(run, flood)| {
            let burst = runs.iter().find(|r| {
                r.profile == "burst" && r.strategy == run.strategy && r.repeat == run.repeat
            });
            let against = match burst {
                Some(burst) if burst.latency_ms.p99 > 0.0 => format!(
                    "; {:.1} ms without the flood (burst, same round): × {:.2}",
                    burst.latency_ms.p99,
                    run.latency_ms.p99 / burst.latency_ms.p99
                ),
                _ => String::new(),
            };
            let statuses: Vec<String> =
                flood.status_counts.iter().map(|(status, n)| format!("{n} × {status}")).collect();
            format!(
                "{} #{}: the other buyers' p99 {:.1} ms with {} purchases by one buyer{against}; \
                 the flood was answered {} (p99 {:.1} ms)",
                run.strategy,
                run.repeat,
                run.latency_ms.p99,
                flood.requests,
                statuses.join(", "),
                flood.latency_ms.p99,
            )
        })
        .collect()
}

/// One line per `payment` run: the units returned and resold (from the
/// audit), the expiry → resale delays, the orders left pending, when every
/// unit was paid, and what the buyers did.
pub fn payment_lines(report: &Report) -> Vec<String> {
    report
        .runs
        .iter()
        .filter_map(|run| Some((run, run.payment.as_ref()?)))
        .map(|(run, p)| {
            let delays = match &p.expiry_to_resale_ms {
                Some(d) => format!("expiry → resale {}", percentiles(d)),
                None => "no resale".to_owned(),
            };
            let beyond = match &p.resale_beyond_line_ms {
                Some(d) => format!("; beyond the sale's line {}", percentiles(d)),
                None => String::new(),
            };
            let returns = match &p.expiry_to_return_ms {
                Some(d) => format!(
                    "; expiry → return {} (bound p99 {} ms)",
                    percentiles(d),
                    p.return_bound_ms
                ),
                None => String::new(),
            };
            let settled = match p.settled_s {
                Some(s) => format!("every unit paid {s:.1} s after the start"),
                None => "not every unit paid within the phase".to_owned(),
            };
            format!(
                "{} #{}: {} units returned, {} resold ({delays}{beyond}{returns}); {} pending after the \
                 windows; {settled}; {} later buyers; payments {} paid, {} refused, {} failed \
                 (window {} ms, {:.0} % never pay)",
                run.strategy,
                run.repeat,
                run.units_returned,
                run.units_resold,
                p.units_pending,
                p.later_buyers,
                p.payments.paid,
                p.payments.refused,
                p.payments.failed,
                p.payment_window_ms,
                p.unpaid_share * 100.0,
            )
        })
        .collect()
}

/// `p50 … ms, p90 … ms, p99 … ms, max … ms` (no p99 in older reports).
fn percentiles(d: &crate::report::ResaleDelays) -> String {
    let p99 = d.p99.map(|p99| format!(", p99 {p99:.0} ms")).unwrap_or_default();
    format!("p50 {:.0} ms, p90 {:.0} ms{p99}, max {:.0} ms", d.p50, d.p90, d.max)
}

/// What the payment lines mean.
pub const PAYMENT_NOTE: &str = "Units returned and resold come from the audit of Postgres. \
Expiry → resale: the k-th unit that came back is resold by the (total stock + k)-th unit \
placed, and the delay runs from the returned order's expiry to that placement \
(docs/report-format.md, \"Payment\"); beyond the sale's line: the part of it after the unit ahead \
of it sold, the time it stood for sale with nothing ahead of it (its p99 is held to the same \
bound as the return's). The books stay `total = units never sold + live units + \
units returned and not resold`.";

/// `- line` per line, or "None." for none.
fn bullets(lines: &[String]) -> String {
    if lines.is_empty() {
        return "None.\n".to_owned();
    }
    lines.iter().map(|l| format!("- {l}\n")).collect()
}

/// What the summary's cells mean.
pub const SUMMARY_NOTE: &str = "Median (min–max) over each strategy's repeats; ratios also \
give their 95 % confidence interval (CI from 3 repeats on: a t-interval over the per-round ratios; \
for × sql, Welch's interval between the strategy's rates and each round's mean of its sql runs). \
The verdict against sql is faster or slower when the interval of × sql excludes 1, else \
indistinguishable; a strategy with a run whose steady window was too short is not ranked.";

/// The fault matrices as markdown sections (`### Faults — <profile>`), empty
/// without fault runs.
pub fn fault_matrices(report: &Report) -> String {
    let mut out = String::new();
    for m in matrix::matrices(report) {
        let mut table = Table::new();
        table.load_style(ASCII_MARKDOWN);
        let mut header = vec!["strategy".to_owned()];
        header.extend(m.faults.iter().cloned());
        table.set_header(header);
        for row in &m.rows {
            let mut cells = vec![row.strategy.clone()];
            cells.extend(row.cells.iter().map(|c| c.as_ref().map_or("–".to_owned(), |c| c.text())));
            table.add_row(cells);
        }
        out.push_str(&format!("## Faults — {}\n\n{}\n\n{table}\n\n", m.profile, matrix::LEGEND));
    }
    out
}

/// The Redis Cluster sentence of report.md (`--redis-cluster`); empty
/// without one.
pub fn cluster_line(report: &Report) -> String {
    let Some(cluster) = &report.redis_cluster else { return String::new() };
    let masters: Vec<String> = cluster
        .masters
        .iter()
        .map(|m| format!("{} (slots {}, keys at the end: {})", m.addr, m.slots, m.keys))
        .collect();
    format!(
        "Redis: a local Redis Cluster of {} masters started for this comparison: {}.\n\n",
        masters.len(),
        masters.join("; ")
    )
}

/// report.md: machine, ceilings, the verdict over repeats, the fault
/// matrices, the summary table, every run and the parameters (charts are in
/// report.html).
pub fn render(report: &Report) -> String {
    let m = &report.machine;
    let config = serde_json::to_string_pretty(&report.config).unwrap_or_default();
    let balancer = match &report.balancer {
        Some(b) => format!(
            "The buyers went through HAProxy ({}), which passed the instances {} requests.\n\n",
            b.kind.split(" - ").next().unwrap_or(&b.kind),
            b.requests_per_instance.iter().map(u64::to_string).collect::<Vec<_>>().join(" and ")
        ),
        None => String::new(),
    };
    let balancer = balancer + &cluster_line(report);
    let payment = payment_lines(report);
    let payment = if payment.is_empty() {
        String::new()
    } else {
        format!("## Payment window\n\n{PAYMENT_NOTE}\n\n{}\n", bullets(&payment))
    };
    let flood = flood_lines(report);
    let flood = if flood.is_empty() {
        String::new()
    } else {
        format!("## One buyer's flood\n\n{}\n", bullets(&flood))
    };
    let arrival = arrivals::arrival_lines(report);
    let arrival = if arrival.is_empty() {
        String::new()
    } else {
        format!("## Open arrivals\n\n{}\n\n{}\n", arrivals::ARRIVAL_NOTE, bullets(&arrival))
    };
    let fairness = arrivals::fairness_lines(report);
    let fairness = if fairness.is_empty() {
        String::new()
    } else {
        format!("## Who got the units\n\n{}\n\n{}\n", arrivals::FAIRNESS_NOTE, bullets(&fairness))
    };
    // A partial report says so before anything else.
    let partial = match report.partial_line() {
        Some(line) => format!("> **{line}**\n\n"),
        None => String::new(),
    };
    format!(
        "# Flash-sale strategy comparison{}\n\n{partial}\
         Generated {} on {} CPUs, {:.1} GiB, {}. Charts: report.html.\n\n\
         {balancer}{}\n\n\
         ## Verdicts\n\n{}\n\
         {}\
         ## Warnings\n\n{}\n\
         ## Summary over repeats\n\n{SUMMARY_NOTE}\n\n{}\n\n\
         {arrival}\
         {fairness}\
         {flood}\
         {payment}\
         ## Every run\n\n{}\n\n\
         Verdict `ok`: the run matched its expectation (a `correct` strategy kept exact books, \
         a `breaks` baseline visibly broke them). Oversold, undersold and drift come from an \
         audit of Postgres, never from the strategy's own counters.\n\n\
         <details><summary>Parameters</summary>\n\n```json\n{}\n```\n</details>\n",
        if report.partial.is_some() { " (partial)" } else { "" },
        report.generated_at.format("%Y-%m-%d %H:%M UTC"),
        m.cpus,
        m.memory_gb,
        m.os,
        ceilings_line(report),
        verdict_lines(report),
        fault_matrices(report),
        bullets(&warning_lines(report)),
        summary_table(report, true),
        runs_table(report, true),
        config,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;
    use crate::report::summary::Spread;
    use crate::scenario::{Flood, Latency};

    #[test]
    fn a_correct_strategy_whose_interval_does_not_decide_is_named_but_not_sql() {
        let mut summaries = fixture::report().summary;
        let wide = Spread { median: 2.0, min: 1.5, max: 3.0, n: 3, ci95: Some([1.2, 3.3]) };
        let narrow = Spread { ci95: Some([1.8, 2.2]), ..wide };
        let rate = Spread { median: 900.0, min: 800.0, max: 1000.0, n: 3, ci95: None };
        for summary in &mut summaries {
            summary.figures.insert(VS_SQL.to_owned(), Some(wide));
            summary.figures.insert("sell_through_per_s".to_owned(), Some(rate));
            summary.too_short_to_rank = false;
        }
        let sql = summaries.iter().find(|s| s.strategy == "sql").unwrap().clone();
        assert_eq!(undecided_line(&sql, Some(&sql)), None, "sql is the reference");
        let mut queue = summaries.iter().find(|s| s.strategy == "queue").unwrap().clone();
        let line = undecided_line(&queue, Some(&sql)).expect("a wide interval is named");
        assert!(line.contains("× sql 2.00 [1.20–3.30] is wider than"), "{line}");
        assert!(
            line.contains("varied by a factor 1.25 over the runs (800–1000 units/s)"),
            "{line}"
        );
        queue.figures.insert(VS_SQL.to_owned(), Some(narrow));
        assert_eq!(undecided_line(&queue, Some(&sql)), None, "a narrow one is not");
    }

    #[test]
    fn a_flood_run_is_set_beside_the_burst_run_of_its_strategy_and_round() {
        let mut report = fixture::report();
        assert!(flood_lines(&report).is_empty(), "no flood run, no line");
        assert!(!render(&report).contains("## One buyer's flood"));

        let mut flooded = report.runs.iter().find(|r| r.strategy == "sql").unwrap().clone();
        flooded.profile = "flood".to_owned();
        flooded.latency_ms.p99 = 120.0;
        flooded.flood = Some(Flood {
            requests: 10_000,
            status_counts: [("409".to_owned(), 10_000)].into(),
            latency_ms: Latency { p50: 0.5, p95: 1.0, p99: 2.0, max: 9.0 },
        });
        report.runs.push(flooded);
        let lines = flood_lines(&report);
        assert_eq!(lines.len(), 1);
        // The fixture's burst run of sql in round 1 has a p99 of 80 ms.
        assert!(lines[0].starts_with("sql #1: the other buyers' p99 120.0 ms"), "{}", lines[0]);
        assert!(lines[0].contains("80.0 ms without the flood (burst, same round): × 1.50"));
        assert!(lines[0].contains("answered 10000 × 409 (p99 2.0 ms)"), "{}", lines[0]);
        assert!(render(&report).contains("## One buyer's flood"));
    }

    #[test]
    fn a_payment_run_shows_its_returned_and_resold_units() {
        use crate::report::{PaymentRecord, ResaleDelays};
        let mut report = fixture::report();
        assert!(payment_lines(&report).is_empty());
        assert!(!render(&report).contains("## Payment window"));
        let mut run = report.runs.iter().find(|r| r.strategy == "sql").unwrap().clone();
        run.profile = "payment".to_owned();
        (run.units_returned, run.units_resold) = (300, 290);
        run.payment = Some(PaymentRecord {
            payment_window_ms: 2000,
            unpaid_share: 0.3,
            expiry_to_resale_ms: ResaleDelays::of(&[400.0, 800.0]),
            expiry_to_return_ms: ResaleDelays::of(&[100.0, 300.0]),
            return_bound_ms: 1500,
            settled_s: Some(12.5),
            later_buyers: 900,
            ..PaymentRecord::default()
        });
        report.runs.push(run);
        let lines = payment_lines(&report);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with(
                "sql #1: 300 units returned, 290 resold (expiry → resale p50 400 ms, p90 800 ms"
            ),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("every unit paid 12.5 s after the start"), "{}", lines[0]);
        let returns =
            "expiry → return p50 100 ms, p90 300 ms, p99 300 ms, max 300 ms (bound p99 1500 ms)";
        assert!(lines[0].contains(returns), "{}", lines[0]);
        assert!(render(&report).contains("## Payment window"));
    }
}
