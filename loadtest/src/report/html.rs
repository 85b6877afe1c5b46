//! report.html: one self-contained page (inline CSS and SVG, no script, no
//! external resource), readable offline — the verdicts in words, the charts,
//! the summary over repeats, every run, the ceilings, the machine and every
//! parameter.
//!
//! Each chart has one mark per run shown (see [`super::svg`]); runs are
//! listed grouped by profile, then strategy, then repeat.

use std::fmt::Write;

use seckill::strategy::Expectation;

use super::markdown::{SUMMARY_COLUMNS, cell, num, verdict};
use super::svg::{self, RangeRow, Reference, Row, escape};
use super::{Report, Run};

/// One colour per strategy, in order of first appearance (Okabe–Ito
/// palette, distinguishable with the common colour-vision deficiencies).
const PALETTE: &[&str] =
    &["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
/// A broken figure of a run that was expected to be correct.
const RED: &str = "#C0392B";
/// A broken figure of a baseline that is expected to break.
const ORANGE: &str = "#E69F00";
const GREY: &str = "#9E9E9E";

/// `data-run` of a run: `strategy|profile|repeat`.
pub fn run_id(run: &Run) -> String {
    format!("{}|{}|{}", run.strategy, run.profile, run.repeat)
}

/// The runs in chart order, with their labels (profile and repeat only
/// where the report has more than one).
fn chart_runs(report: &Report) -> Vec<(&Run, String)> {
    let first = |key: &dyn Fn(&Run) -> &str, value: &str| {
        report.runs.iter().position(|r| key(r) == value).unwrap_or(usize::MAX)
    };
    let mut runs: Vec<&Run> = report.runs.iter().collect();
    runs.sort_by_key(|r| {
        (
            first(&|x: &Run| x.profile.as_str(), &r.profile),
            first(&|x: &Run| x.strategy.as_str(), &r.strategy),
            r.repeat,
        )
    });
    let profiles = distinct(report.runs.iter().map(|r| r.profile.as_str()));
    let repeats = report.runs.iter().any(|r| r.repeat > 1);
    runs.into_iter()
        .map(|r| {
            let mut label = r.strategy.clone();
            if profiles.len() > 1 {
                label += &format!(" · {}", r.profile);
            }
            if repeats {
                label += &format!(" #{}", r.repeat);
            }
            (r, label)
        })
        .collect()
}

fn distinct<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn strategy_colour(report: &Report, strategy: &str) -> &'static str {
    let strategies = distinct(report.runs.iter().map(|r| r.strategy.as_str()));
    let i = strategies.iter().position(|s| *s == strategy).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

fn detail(run: &Run) -> String {
    format!(
        "expected {}, verdict {}; sold {} of {} units",
        expected(run),
        verdict(run),
        run.units_sold,
        run.total_stock
    )
}

fn expected(run: &Run) -> &'static str {
    match run.expected {
        Expectation::Correct => "correct",
        Expectation::Breaks => "breaks",
    }
}

/// The report's charts as `(id, title, caption, svg)`: oversold, undersold,
/// drift, sell-through against `sql_tps`, rejections against `http_rps`,
/// latency percentiles.
pub fn charts(report: &Report) -> Vec<(&'static str, &'static str, String, String)> {
    let runs = chart_runs(report);
    let books = |pick: fn(&Run) -> i64| -> Vec<Row> {
        runs.iter()
            .map(|(run, label)| {
                let value = pick(run);
                let colour = match (value, run.expected) {
                    (0, _) => GREY,
                    (_, Expectation::Breaks) => ORANGE,
                    (_, Expectation::Correct) => RED,
                };
                Row {
                    run: run_id(run),
                    label: label.clone(),
                    value: Some(value as f64),
                    colour,
                    detail: detail(run),
                }
            })
            .collect()
    };
    let rates = |pick: fn(&Run) -> Option<f64>| -> Vec<Row> {
        runs.iter()
            .map(|(run, label)| Row {
                run: run_id(run),
                label: label.clone(),
                value: pick(run),
                colour: strategy_colour(report, &run.strategy),
                detail: detail(run),
            })
            .collect()
    };
    let c = &report.ceilings;
    let sql_tps = Reference { label: "sql_tps".to_owned(), value: c.sql_tps.value };
    let http_rps = Reference { label: "http_rps".to_owned(), value: c.http_rps.value };
    let latency: Vec<RangeRow> = runs
        .iter()
        .map(|(run, label)| RangeRow {
            run: run_id(run),
            label: label.clone(),
            points: vec![
                ("p50", run.latency_ms.p50),
                ("p95", run.latency_ms.p95),
                ("p99", run.latency_ms.p99),
            ],
            colour: strategy_colour(report, &run.strategy),
            detail: format!("max {} ms; {}", svg::number(run.latency_ms.max), detail(run)),
        })
        .collect();
    vec![
        (
            "oversold",
            "Oversold units",
            "Units sold beyond the stock (audit of Postgres). Red: a strategy expected to be \
             correct; orange: a baseline that is expected to break."
                .to_owned(),
            svg::bars("oversold", "Oversold units", "units", &books(|r| r.oversold), None),
        ),
        (
            "undersold",
            "Undersold units",
            "Units wanted and in stock that did not sell.".to_owned(),
            svg::bars("undersold", "Undersold units", "units", &books(|r| r.undersold), None),
        ),
        (
            "drift",
            "Ledger drift",
            "total − remaining − sold: 0 for exact books, negative after lost updates.".to_owned(),
            svg::bars("drift", "Ledger drift", "units", &books(|r| r.ledger_drift), None),
        ),
        (
            "sell-through",
            "Sell-through",
            format!(
                "Units sold per second of the sale phase; the dashed line is this machine's \
                 sql_tps ceiling ({} transactions/s).",
                svg::number(c.sql_tps.value)
            ),
            svg::bars(
                "sell-through",
                "Sell-through",
                "units/s",
                &rates(|r| r.sell_through_per_s),
                Some(&sql_tps),
            ),
        ),
        (
            "rejections",
            "Rejection throughput",
            format!(
                "Answers per second to fresh buyers of the sold-out sale; the dashed line is \
                 the http_rps ceiling ({} answers/s of a trivial endpoint).",
                svg::number(c.http_rps.value)
            ),
            svg::bars(
                "rejections",
                "Rejection throughput",
                "answers/s",
                &rates(|r| r.rejection_rps),
                Some(&http_rps),
            ),
        ),
        (
            "latency",
            "Purchase latency",
            "Sale-phase purchase latency p50 (filled), p95, p99, in ms on a logarithmic axis \
             (the maximum is in each mark's tooltip)."
                .to_owned(),
            svg::ranges("latency", "Purchase latency", "ms", &latency),
        ),
    ]
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:70rem;\
padding:0 1rem;color:#222;line-height:1.45}h1{font-size:1.6rem}h2{font-size:1.25rem;\
margin-top:2.2rem;border-bottom:1px solid #ddd}table{border-collapse:collapse;font-size:.85rem;\
margin:.6rem 0}th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right;\
white-space:nowrap}th{background:#f4f4f4}td.l,th.l{text-align:left}.scroll{overflow-x:auto}\
figure{margin:1.4rem 0}figcaption{font-size:.9rem;color:#555;margin-bottom:.3rem}\
.broke{color:#C0392B;font-weight:bold}.unexpected{color:#B9770E}ul.verdicts li{margin:.2rem 0}\
code{background:#f4f4f4;padding:0 .2rem}";

/// The whole page.
pub fn render(report: &Report) -> String {
    let m = &report.machine;
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Flash-sale strategy comparison</title><style>{STYLE}</style></head><body>\
         <h1>Flash-sale strategy comparison</h1>\
         <p>Generated {} on {} CPUs, {:.1} GiB, {}. {} runs.</p>",
        report.generated_at.format("%Y-%m-%d %H:%M UTC"),
        m.cpus,
        m.memory_gb,
        escape(&m.os),
        report.runs.len(),
    );

    page.push_str("<h2>Verdicts</h2><ul class=\"verdicts\">");
    for s in &report.summary {
        let class = if s.verdicts.broke > 0 {
            " class=\"broke\""
        } else if s.verdicts.unexpected > 0 {
            " class=\"unexpected\""
        } else {
            ""
        };
        let expected = match s.expected {
            Expectation::Correct => "expected correct",
            Expectation::Breaks => "expected to break",
        };
        let verdicts = if s.verdicts.ok == s.runs {
            String::new()
        } else {
            format!(
                "; verdicts: {} ok, {} broke, {} unexpected",
                s.verdicts.ok, s.verdicts.broke, s.verdicts.unexpected
            )
        };
        let _ = write!(page, "<li{class}>{} — {expected}{verdicts}</li>", escape(&s.broke_line()));
    }
    page.push_str(
        "</ul><p>Verdict <code>ok</code>: the run matched its expectation (a <code>correct</code> \
         strategy kept exact books, a <code>breaks</code> baseline visibly broke them). Oversold, \
         undersold and drift come from an audit of Postgres, never from the strategy's own \
         counters.</p>",
    );

    page.push_str("<h2>Charts</h2><p>One mark per run; hover a mark for its figures.</p>");
    for (id, title, caption, chart) in charts(report) {
        let _ = write!(
            page,
            "<figure id=\"chart-{id}\" data-chart=\"{id}\"><figcaption><strong>{}</strong> — {}\
             </figcaption><div class=\"scroll\">{chart}</div></figure>",
            escape(title),
            escape(&caption),
        );
    }

    page.push_str(
        "<h2>Summary over repeats</h2><p>Median (min–max) over each strategy's repeats.</p>",
    );
    page.push_str("<div class=\"scroll\"><table><tr><th class=\"l\">strategy</th><th class=\"l\">profile</th><th>runs</th><th>broken</th><th class=\"l\">oversold per repeat</th><th class=\"l\">drift per repeat</th>");
    for (header, _, _) in SUMMARY_COLUMNS {
        let _ = write!(page, "<th>{}</th>", escape(header));
    }
    page.push_str("</tr>");
    for s in &report.summary {
        let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        let _ = write!(
            page,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td>",
            escape(&s.strategy),
            escape(&s.profile),
            s.runs,
            s.broken_runs,
            list(&s.oversold),
            list(&s.ledger_drift),
        );
        for (_, path, digits) in SUMMARY_COLUMNS {
            let _ = write!(page, "<td>{}</td>", escape(&cell(s, path, *digits)));
        }
        page.push_str("</tr>");
    }
    page.push_str("</table></div>");

    page.push_str("<h2>Every run</h2><div class=\"scroll\"><table><tr>");
    for header in [
        "strategy",
        "profile",
        "#",
        "sales",
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
        "pg xacts/unit",
        "redis rt/unit",
        "amqp msgs/unit",
        "peak RSS MiB",
    ] {
        let _ = write!(page, "<th>{}</th>", escape(header));
    }
    page.push_str("</tr>");
    for (run, _) in chart_runs(report) {
        let class = match verdict(run) {
            "BROKE" => " class=\"broke\"",
            "unexpected" => " class=\"unexpected\"",
            _ => "",
        };
        let cells = [
            run.strategy.clone(),
            run.profile.clone(),
            run.repeat.to_string(),
            run.sales.to_string(),
            expected(run).to_owned(),
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
            num(run.cost.pg_xacts_per_unit, 2),
            num(run.cost.redis_round_trips_per_unit, 1),
            num(run.cost.amqp_messages_per_unit, 1),
            num(run.cost.peak_rss_mb, 0),
        ];
        let _ = write!(page, "<tr{class}>");
        for (i, value) in cells.iter().enumerate() {
            let align = if i < 2 || i == 4 || i == 5 { " class=\"l\"" } else { "" };
            let _ = write!(page, "<td{align}>{}</td>", escape(value));
        }
        page.push_str("</tr>");
    }
    page.push_str("</table></div>");

    let _ = write!(
        page,
        "<h2>Ceilings of this machine</h2><p>{}</p>",
        escape(&super::markdown::ceilings_line(report))
    );
    page.push_str("<h2>Parameters</h2><table>");
    if let Some(config) = report.config.as_object() {
        for (key, value) in config {
            let value = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = write!(
                page,
                "<tr><th class=\"l\">{}</th><td class=\"l\">{}</td></tr>",
                escape(key),
                escape(&value)
            );
        }
    }
    page.push_str("</table></body></html>\n");
    page
}
