//! The human-readable forms of a report: the console table and report.md.

use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{CellAlignment, Table};

use super::summary::Summary;
use super::{Report, Run, Verdict};

/// A figure with `digits` decimals, `–` for `null`.
pub fn num(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The columns of the summary table: header, figure path (see
/// [`super::summary`]) and decimals.
pub const SUMMARY_COLUMNS: &[(&str, &str, usize)] = &[
    ("sold", "units_sold", 0),
    ("undersold", "undersold", 0),
    ("5xx", "errors_5xx", 0),
    ("sell-through/s", "sell_through_per_s", 0),
    ("× sql_tps", "ratio.sell_through_vs_sql_tps", 2),
    ("rejections/s", "rejection_rps", 0),
    ("× http_rps", "ratio.rejection_vs_http_rps", 2),
    ("p50 ms", "latency_ms.p50", 1),
    ("p99 ms", "latency_ms.p99", 1),
    ("e2e p99 ms", "e2e_latency_ms.p99", 1),
    ("batch mean", "batch_sizes.mean", 1),
    ("pg xacts/unit", "cost.pg_xacts_per_unit", 2),
    ("redis rt/unit", "cost.redis_round_trips_per_unit", 1),
    ("amqp msgs/unit", "cost.amqp_messages_per_unit", 1),
    ("peak RSS MiB", "cost.peak_rss_mb", 0),
];

/// `median (min–max)` of figure `path`, just the median when the range is
/// one value, `–` when the figure is `null` throughout.
pub fn cell(summary: &Summary, path: &str, digits: usize) -> String {
    match summary.figures.get(path).copied().flatten() {
        None => "–".to_owned(),
        Some(s) if s.n == 1 || s.min == s.max => format!("{:.digits$}", s.median),
        Some(s) => format!("{:.digits$} ({:.digits$}–{:.digits$})", s.median, s.min, s.max),
    }
}

/// The summary over repeats as a table, `markdown` or console style.
pub fn summary_table(report: &Report, markdown: bool) -> String {
    let mut table = Table::new();
    table.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    let mut header = vec!["strategy", "profile", "runs", "broken", "oversold", "drift"];
    header.extend(SUMMARY_COLUMNS.iter().map(|c| c.0));
    table.set_header(header);
    for s in &report.summary {
        let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        let mut row = vec![
            s.strategy.clone(),
            s.profile.clone(),
            s.runs.to_string(),
            s.broken_runs.to_string(),
            list(&s.oversold),
            list(&s.ledger_drift),
        ];
        row.extend(SUMMARY_COLUMNS.iter().map(|(_, path, digits)| cell(s, path, *digits)));
        table.add_row(row);
    }
    for column in 2..6 + SUMMARY_COLUMNS.len() {
        if let Some(column) = table.column_mut(column) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
}

/// One line per (strategy, profile): "naive (burst): broke in 5 of 5 runs …".
pub fn verdict_lines(report: &Report) -> String {
    report.summary.iter().map(|s| format!("- {}\n", s.broke_line())).collect()
}

/// `ok`, `BROKE` or `unexpected`.
pub fn verdict(run: &Run) -> &'static str {
    match run.verdict {
        Verdict::Ok => "ok",
        Verdict::Broke => "BROKE",
        Verdict::Unexpected => "unexpected",
    }
}

/// The runs as a table, `markdown` or console style.
pub fn runs_table(report: &Report, markdown: bool) -> String {
    let mut table = Table::new();
    table.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    table.set_header([
        "strategy",
        "profile",
        "#",
        "expected",
        "verdict",
        "sold",
        "oversold",
        "undersold",
        "drift",
        "5xx",
        "sell-through/s",
        "× sql_tps",
        "× sql",
        "rejections/s",
        "× http_rps",
        "p50 ms",
        "p99 ms",
        "unresolved",
        "e2e p50 ms",
        "e2e p99 ms",
        "batch mean",
        "redis drift",
        "redis rt/unit",
        "pg xacts/unit",
        "amqp msgs/unit",
        "peak RSS MiB",
    ]);
    for run in &report.runs {
        table.add_row([
            run.strategy.clone(),
            run.profile.clone(),
            run.repeat.to_string(),
            format!("{:?}", run.expected).to_lowercase(),
            verdict(run).to_owned(),
            run.units_sold.to_string(),
            run.oversold.to_string(),
            run.undersold.to_string(),
            run.ledger_drift.to_string(),
            run.errors_5xx.to_string(),
            num(run.sell_through_per_s, 0),
            num(run.ratio.sell_through_vs_sql_tps, 2),
            num(run.ratio.sell_through_vs_sql_strategy, 2),
            num(run.rejection_rps, 0),
            num(run.ratio.rejection_vs_http_rps, 2),
            format!("{:.1}", run.latency_ms.p50),
            format!("{:.1}", run.latency_ms.p99),
            run.accepted_unresolved.map_or_else(|| "–".to_owned(), |n| n.to_string()),
            num(run.e2e_latency_ms.as_ref().map(|l| l.p50), 1),
            num(run.e2e_latency_ms.as_ref().map(|l| l.p99), 1),
            num(run.batch_sizes.as_ref().map(|b| b.mean), 1),
            run.redis_drift.map_or_else(|| "–".to_owned(), |d| d.to_string()),
            num(run.cost.redis_round_trips_per_unit, 1),
            num(run.cost.pg_xacts_per_unit, 2),
            num(run.cost.amqp_messages_per_unit, 1),
            num(run.cost.peak_rss_mb, 0),
        ]);
    }
    for column in 2..26 {
        if let Some(column) = table.column_mut(column) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
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
    line
}

/// report.md: machine, ceilings, the verdict over repeats, the summary
/// table, every run and the parameters (charts are in report.html).
pub fn render(report: &Report) -> String {
    let m = &report.machine;
    let config = serde_json::to_string_pretty(&report.config).unwrap_or_default();
    format!(
        "# Flash-sale strategy comparison\n\n\
         Generated {} on {} CPUs, {:.1} GiB, {}. Charts: report.html.\n\n\
         {}\n\n\
         ## Verdicts\n\n{}\n\
         ## Summary over repeats\n\nMedian (min–max) over each strategy's repeats.\n\n{}\n\n\
         ## Every run\n\n{}\n\n\
         Verdict `ok`: the run matched its expectation (a `correct` strategy kept exact books, \
         a `breaks` baseline visibly broke them). Oversold, undersold and drift come from an \
         audit of Postgres, never from the strategy's own counters.\n\n\
         <details><summary>Parameters</summary>\n\n```json\n{}\n```\n</details>\n",
        report.generated_at.format("%Y-%m-%d %H:%M UTC"),
        m.cpus,
        m.memory_gb,
        m.os,
        ceilings_line(report),
        verdict_lines(report),
        summary_table(report, true),
        runs_table(report, true),
        config,
    )
}
