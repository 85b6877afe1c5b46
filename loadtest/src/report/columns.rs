//! The columns of the two tables every view of a report shows — every run,
//! and the summary over repeats — defined once: header, alignment and how a
//! cell is written. report.md, the console and report.html all render these
//! lists, so the views cannot drift apart; a figure added to a table is one
//! line here.
//!
//! Cells are plain text (the HTML view escapes them). A figure that does not
//! apply (`null` in report.json) is written `–`, never 0.

use super::Run;
use super::summary::Summary;

/// How a column's cells are aligned: text left, figures right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// One column of a table of `T` (a [`Run`] or a [`Summary`]).
pub struct Column<T> {
    pub header: &'static str,
    pub align: Align,
    pub cell: fn(&T) -> String,
}

use Align::{Left, Right};

/// The text of a `null` figure.
pub const ABSENT: &str = "–";

/// A figure with `digits` decimals, `–` for `null`.
pub fn num(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| ABSENT.to_owned(), |v| format!("{v:.digits$}"))
}

/// A count, `–` for `null`.
pub fn int(value: Option<i64>) -> String {
    value.map_or_else(|| ABSENT.to_owned(), |v| v.to_string())
}

/// `3, 11`: one value per repeat.
pub fn list(values: &[i64]) -> String {
    values.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
}

/// `median (min–max)` of the summary's figure `path` (see
/// [`super::summary`]), just the median when the range is one value, `–`
/// when the figure is `null` throughout.
pub fn spread(summary: &Summary, path: &str, digits: usize) -> String {
    match summary.figures.get(path).copied().flatten() {
        None => ABSENT.to_owned(),
        Some(s) if s.n == 1 || s.min == s.max => format!("{:.digits$}", s.median),
        Some(s) => format!("{:.digits$} ({:.digits$}–{:.digits$})", s.median, s.min, s.max),
    }
}

/// `median (min–max; CI lo–hi)` of a ratio figure: [`spread`] with the
/// 95 % interval when the summary has one.
pub fn spread_ci(summary: &Summary, path: &str, digits: usize) -> String {
    let text = spread(summary, path, digits);
    match summary.figures.get(path).copied().flatten().and_then(|s| s.ci95) {
        None => text,
        Some([lo, hi]) => {
            let interval = format!("CI {lo:.digits$}–{hi:.digits$}");
            match text.strip_suffix(')') {
                Some(open) => format!("{open}; {interval})"),
                None => format!("{text} ({interval})"),
            }
        }
    }
}

/// The verdict against `sql`, or why there is none.
pub fn vs_sql(summary: &Summary) -> String {
    match summary.vs_sql {
        Some(verdict) => verdict.as_str().to_owned(),
        None if summary.too_short_to_rank => "too short to rank".to_owned(),
        None => ABSENT.to_owned(),
    }
}

/// What a reader must know before ranking a run: a steady window too short
/// to rank, a ceiling it exceeded, more service CPU than the machine has.
pub fn notes(run: &Run) -> String {
    let mut notes = Vec::new();
    if run.too_short_to_rank {
        notes.push("too short to rank");
    }
    if run.ceiling_undershot {
        notes.push("ceiling undershot");
    }
    if run.cpu_over_cores {
        notes.push("cpu over cores");
    }
    if notes.is_empty() { ABSENT.to_owned() } else { notes.join(", ") }
}

/// The profile, with the fault of the run after it: `burst · kill-instance`.
fn under(profile: &str, fault: Option<&str>) -> String {
    match fault {
        Some(fault) => format!("{profile} · {fault}"),
        None => profile.to_owned(),
    }
}

/// A share as a percentage, `–` for `null`.
fn percent(value: Option<f64>) -> String {
    num(value.map(|v| v * 100.0), 0)
}

/// The table of every run.
pub const RUN_COLUMNS: &[Column<Run>] = &[
    Column { header: "strategy", align: Left, cell: |r| r.strategy.clone() },
    Column {
        header: "profile",
        align: Left,
        cell: |r| under(&r.profile, r.fault.as_ref().map(|f| f.kind.as_str())),
    },
    Column { header: "#", align: Right, cell: Run::label },
    Column { header: "sales", align: Right, cell: |r| r.sales.to_string() },
    Column { header: "expected", align: Left, cell: |r| r.expected.as_str().to_owned() },
    Column { header: "verdict", align: Left, cell: |r| r.verdict.label().to_owned() },
    Column { header: "sold", align: Right, cell: |r| r.units_sold.to_string() },
    Column { header: "oversold", align: Right, cell: |r| r.oversold.to_string() },
    Column { header: "undersold", align: Right, cell: |r| r.undersold.to_string() },
    Column { header: "drift", align: Right, cell: |r| r.ledger_drift.to_string() },
    Column { header: "5xx", align: Right, cell: |r| r.errors_5xx.to_string() },
    Column { header: "sell-through/s", align: Right, cell: |r| num(r.sell_through_per_s, 0) },
    Column { header: "window s", align: Right, cell: |r| num(r.steady_window_s, 2) },
    Column {
        header: "× sql_tps", align: Right, cell: |r| num(r.ratio.sell_through_vs_sql_tps, 2)
    },
    Column {
        header: "× sql",
        align: Right,
        cell: |r| num(r.ratio.sell_through_vs_sql_strategy, 2),
    },
    Column { header: "rejections/s", align: Right, cell: |r| num(r.rejection_rps, 0) },
    Column { header: "× http_rps", align: Right, cell: |r| num(r.ratio.rejection_vs_http_rps, 2) },
    Column { header: "p50 ms", align: Right, cell: |r| format!("{:.1}", r.latency_ms.p50) },
    Column { header: "p99 ms", align: Right, cell: |r| format!("{:.1}", r.latency_ms.p99) },
    Column { header: "unresolved", align: Right, cell: |r| int(r.accepted_unresolved) },
    Column {
        header: "e2e p50 ms",
        align: Right,
        cell: |r| num(r.e2e_latency_ms.as_ref().map(|l| l.p50), 1),
    },
    Column {
        header: "e2e p99 ms",
        align: Right,
        cell: |r| num(r.e2e_latency_ms.as_ref().map(|l| l.p99), 1),
    },
    Column {
        header: "batch mean",
        align: Right,
        cell: |r| num(r.batch_sizes.as_ref().map(|b| b.mean), 1),
    },
    Column { header: "redis drift", align: Right, cell: |r| int(r.redis_drift) },
    Column {
        header: "redis rt/unit",
        align: Right,
        cell: |r| num(r.cost.redis_round_trips_per_unit, 1),
    },
    Column { header: "pg xacts/unit", align: Right, cell: |r| num(r.cost.pg_xacts_per_unit, 2) },
    Column {
        header: "amqp msgs/unit",
        align: Right,
        cell: |r| num(r.cost.amqp_messages_per_unit, 1),
    },
    Column { header: "peak RSS MiB", align: Right, cell: |r| num(r.cost.peak_rss_mb, 0) },
    Column { header: "cpu ms/unit", align: Right, cell: |r| num(r.cost.cpu_ms_per_unit, 2) },
    Column {
        header: "tiers ms/unit",
        align: Left,
        cell: |r| tiers(r.cost.cpu_ms_per_unit_by_tier),
    },
    Column { header: "serial ms/unit", align: Right, cell: |r| num(r.cost.serial_ms_per_unit, 3) },
    Column {
        header: "loadgen CPU %",
        align: Right,
        cell: |r| percent(r.cpu.as_ref().and_then(|c| c.machine_share_loadgen)),
    },
    Column { header: "notes", align: Left, cell: notes },
];

/// The table of the summary over repeats: the books of every repeat, then
/// `median (min–max)` of the figures.
pub const SUMMARY_COLUMNS: &[Column<Summary>] = &[
    Column { header: "strategy", align: Left, cell: |s| s.strategy.clone() },
    Column { header: "profile", align: Left, cell: |s| under(&s.profile, s.fault.as_deref()) },
    Column { header: "runs", align: Right, cell: |s| s.runs.to_string() },
    Column { header: "broken", align: Right, cell: |s| s.broken_runs.to_string() },
    Column { header: "oversold", align: Left, cell: |s| list(&s.oversold) },
    Column { header: "drift", align: Left, cell: |s| list(&s.ledger_drift) },
    Column { header: "sold", align: Right, cell: |s| spread(s, "units_sold", 0) },
    Column { header: "undersold", align: Right, cell: |s| spread(s, "undersold", 0) },
    Column { header: "5xx", align: Right, cell: |s| spread(s, "errors_5xx", 0) },
    Column { header: "sell-through/s", align: Right, cell: |s| spread(s, "sell_through_per_s", 0) },
    Column {
        header: "× sql",
        align: Right,
        cell: |s| spread_ci(s, "ratio.sell_through_vs_sql_strategy", 2),
    },
    Column { header: "vs sql", align: Left, cell: vs_sql },
    Column {
        header: "× sql_tps",
        align: Right,
        cell: |s| spread_ci(s, "ratio.sell_through_vs_sql_tps", 2),
    },
    Column { header: "rejections/s", align: Right, cell: |s| spread(s, "rejection_rps", 0) },
    Column {
        header: "× http_rps",
        align: Right,
        cell: |s| spread_ci(s, "ratio.rejection_vs_http_rps", 2),
    },
    Column { header: "p50 ms", align: Right, cell: |s| spread(s, "latency_ms.p50", 1) },
    Column { header: "p99 ms", align: Right, cell: |s| spread(s, "latency_ms.p99", 1) },
    Column { header: "e2e p99 ms", align: Right, cell: |s| spread(s, "e2e_latency_ms.p99", 1) },
    Column { header: "batch mean", align: Right, cell: |s| spread(s, "batch_sizes.mean", 1) },
    Column {
        header: "pg xacts/unit",
        align: Right,
        cell: |s| spread(s, "cost.pg_xacts_per_unit", 2),
    },
    Column {
        header: "redis rt/unit",
        align: Right,
        cell: |s| spread(s, "cost.redis_round_trips_per_unit", 1),
    },
    Column {
        header: "amqp msgs/unit",
        align: Right,
        cell: |s| spread(s, "cost.amqp_messages_per_unit", 1),
    },
    Column { header: "peak RSS MiB", align: Right, cell: |s| spread(s, "cost.peak_rss_mb", 0) },
    Column {
        header: "cpu ms/unit",
        align: Right,
        cell: |s| spread_ci(s, "cost.cpu_ms_per_unit", 2),
    },
    Column { header: "app ms/unit", align: Right, cell: |s| spread_ci(s, TIER_INSTANCES, 2) },
    Column { header: "pg ms/unit", align: Right, cell: |s| spread_ci(s, TIER_POSTGRES, 2) },
    Column { header: "redis ms/unit", align: Right, cell: |s| spread_ci(s, TIER_REDIS, 2) },
    Column { header: "rabbitmq ms/unit", align: Right, cell: |s| spread_ci(s, TIER_RABBITMQ, 2) },
    Column {
        header: "serial ms/unit",
        align: Right,
        cell: |s| spread_ci(s, "cost.serial_ms_per_unit", 3),
    },
    Column {
        header: "serial ceiling/s",
        align: Right,
        cell: |s| spread_ci(s, "cost.serial_ceiling_per_s", 0),
    },
    Column {
        header: "loadgen CPU share",
        align: Right,
        cell: |s| spread(s, "cpu.machine_share_loadgen", 2),
    },
];

/// The summary paths of the CPU per unit of each tier.
const TIER_INSTANCES: &str = "cost.cpu_ms_per_unit_by_tier.instances";
const TIER_POSTGRES: &str = "cost.cpu_ms_per_unit_by_tier.postgres";
const TIER_REDIS: &str = "cost.cpu_ms_per_unit_by_tier.redis";
const TIER_RABBITMQ: &str = "cost.cpu_ms_per_unit_by_tier.rabbitmq";

/// A run's CPU per unit of each measured tier, `app 0.41 · postgres 1.02`.
fn tiers(tiers: Option<crate::report::Tiers>) -> String {
    let Some(tiers) = tiers else { return "–".to_owned() };
    let short = |name: &str| if name == "instances" { "app".to_owned() } else { name.to_owned() };
    let cells: Vec<String> =
        tiers.named().iter().map(|(name, ms)| format!("{} {ms:.2}", short(name))).collect();
    cells.join(" · ")
}

/// The cells of `row` under `columns`, in order.
pub fn cells<T>(columns: &[Column<T>], row: &T) -> Vec<String> {
    columns.iter().map(|column| (column.cell)(row)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;
    use crate::report::summary::Spread;

    #[test]
    fn absent_figures_are_a_dash_and_present_ones_keep_their_decimals() {
        assert_eq!(num(None, 2), "–");
        assert_eq!(num(Some(0.256), 2), "0.26");
        assert_eq!(num(Some(1663.4), 0), "1663");
        assert_eq!(num(Some(0.0), 1), "0.0");
        assert_eq!(int(None), "–");
        assert_eq!(int(Some(-41)), "-41");
        assert_eq!(list(&[3, 11]), "3, 11");
    }

    #[test]
    fn a_spread_shows_the_range_only_when_there_is_one() {
        let mut summary = fixture::report().summary.remove(0);
        let figure = |median, min, max, n| Some(Spread { median, min, max, n, ci95: None });
        summary.figures.insert("a".into(), figure(2.0, 1.0, 3.5, 3));
        summary.figures.insert("b".into(), figure(2.0, 2.0, 2.0, 3));
        summary.figures.insert("c".into(), None);
        assert_eq!(spread(&summary, "a", 1), "2.0 (1.0–3.5)");
        assert_eq!(spread(&summary, "b", 2), "2.00");
        assert_eq!(spread(&summary, "c", 0), "–");
        assert_eq!(spread(&summary, "not a figure", 0), "–");
        let with_ci =
            |median, min, max| Some(Spread { median, min, max, n: 3, ci95: Some([0.5, 4.0]) });
        summary.figures.insert("r".into(), with_ci(2.0, 1.0, 3.5));
        summary.figures.insert("s".into(), with_ci(2.0, 2.0, 2.0));
        assert_eq!(spread_ci(&summary, "r", 1), "2.0 (1.0–3.5; CI 0.5–4.0)");
        assert_eq!(spread_ci(&summary, "s", 1), "2.0 (CI 0.5–4.0)");
        assert_eq!(spread_ci(&summary, "a", 1), "2.0 (1.0–3.5)", "no interval");
    }

    #[test]
    fn run_cells_write_ratios_and_absent_queue_figures() {
        let report = fixture::report();
        let queue = report.runs.iter().find(|r| r.strategy == "queue").unwrap();
        let sql = report.runs.iter().find(|r| r.strategy == "sql").unwrap();
        let cell = |run: &Run, header: &str| {
            let column = RUN_COLUMNS.iter().find(|c| c.header == header).unwrap();
            (column.cell)(run)
        };
        assert_eq!(cell(sql, "× sql_tps"), "0.40");
        assert_eq!(cell(sql, "× sql"), "1.00");
        assert_eq!(cell(sql, "unresolved"), "–");
        assert_eq!(cell(sql, "e2e p99 ms"), "–");
        assert_eq!(cell(sql, "expected"), "correct");
        assert_eq!(cell(queue, "unresolved"), "0");
        assert_eq!(cell(queue, "batch mean"), "112.8");
        assert_eq!(cell(queue, "amqp msgs/unit"), "2.1");
        assert_eq!(cell(sql, "notes"), "–");
        let mut flagged = sql.clone();
        (flagged.too_short_to_rank, flagged.ceiling_undershot) = (true, true);
        assert_eq!(cell(&flagged, "notes"), "too short to rank, ceiling undershot");
        flagged.cpu_over_cores = true;
        assert!(cell(&flagged, "notes").ends_with(", cpu over cores"));
    }

    #[test]
    fn headers_are_unique_and_every_cell_is_written() {
        let report = fixture::report();
        for headers in [
            RUN_COLUMNS.iter().map(|c| c.header).collect::<Vec<_>>(),
            SUMMARY_COLUMNS.iter().map(|c| c.header).collect(),
        ] {
            let mut unique = headers.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), headers.len(), "{headers:?}");
        }
        for run in &report.runs {
            assert!(cells(RUN_COLUMNS, run).iter().all(|c| !c.is_empty()));
        }
        for summary in &report.summary {
            assert!(cells(SUMMARY_COLUMNS, summary).iter().all(|c| !c.is_empty()));
        }
    }
}
