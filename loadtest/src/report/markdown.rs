//! The human-readable forms of a report: the console table and report.md.

use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{CellAlignment, Table};

use super::Report;
use super::columns::{Align, Column, RUN_COLUMNS, SUMMARY_COLUMNS, cells, num};

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
