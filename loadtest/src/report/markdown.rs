//! The human-readable forms of a report: the console table and report.md.

use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{CellAlignment, Table};

use super::{Report, Run, Verdict};

fn num(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

fn verdict(run: &Run) -> &'static str {
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
        "redis drift",
        "redis rt/unit",
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
            run.redis_drift.map_or_else(|| "–".to_owned(), |d| d.to_string()),
            num(run.cost.redis_round_trips_per_unit, 1),
        ]);
    }
    for column in 2..19 {
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
    line
}

/// report.md: machine, parameters, ceilings and the table.
pub fn render(report: &Report) -> String {
    let m = &report.machine;
    let config = serde_json::to_string_pretty(&report.config).unwrap_or_default();
    format!(
        "# Flash-sale strategy comparison\n\n\
         Generated {} on {} CPUs, {:.1} GiB, {}.\n\n\
         {}\n\n\
         {}\n\n\
         Verdict `ok`: the run matched its expectation (a `correct` strategy kept exact books, \
         a `breaks` baseline visibly broke them). Oversold, undersold and drift come from an \
         audit of Postgres, never from the strategy's own counters.\n\n\
         <details><summary>Parameters</summary>\n\n```json\n{}\n```\n</details>\n",
        report.generated_at.format("%Y-%m-%d %H:%M UTC"),
        m.cpus,
        m.memory_gb,
        m.os,
        ceilings_line(report),
        runs_table(report, true),
        config,
    )
}
