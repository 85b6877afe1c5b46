//! report.html: one self-contained page (inline CSS and SVG, no script, no
//! external resource), readable offline — the verdicts in words, the charts,
//! the summary over repeats, every run, the ceilings, the machine and every
//! parameter.
//!
//! Each chart has one mark per run shown (see [`super::svg`]); runs are
//! listed grouped by profile, then strategy, then repeat.

use std::fmt::Write;

use seckill::strategy::REFERENCE;

use super::columns::{Align, Column, RUN_COLUMNS, SUMMARY_COLUMNS, cells};
use super::summary::{Summary, VS_SQL};
use super::svg::{self, IntervalRow, RangeRow, Reference, Row, SeriesRow, escape};
use super::{Report, Run, Verdict, arrivals, matrix};
use crate::ceilings::Kind;
use crate::expectation::Expectation;
use crate::series::Sample;

/// One colour per strategy, in order of first appearance (Okabe–Ito
/// palette, distinguishable with the common colour-vision deficiencies).
const PALETTE: &[&str] =
    &["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
/// A broken figure of a run that was expected to be correct.
const RED: &str = "#C0392B";
/// A broken figure of a baseline that is expected to break.
const ORANGE: &str = "#E69F00";
const GREY: &str = "#9E9E9E";

/// One chart of the page, also written alone as `charts/<id>.svg`.
pub struct Chart {
    /// `data-chart` and file name, e.g. `sell-through`.
    pub id: &'static str,
    pub title: &'static str,
    /// What the chart shows, in a sentence or two (plain text).
    pub caption: String,
    /// The standalone SVG document.
    pub svg: String,
}

/// `data-run` of a run: `strategy|profile|repeat`, the profile followed by
/// `/fault` in a fault run.
pub fn run_id(run: &Run) -> String {
    match &run.fault {
        Some(fault) => format!("{}|{}/{}|{}", run.strategy, run.profile, fault.kind, run.label()),
        None => format!("{}|{}|{}", run.strategy, run.profile, run.label()),
    }
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
            first(&|x: &Run| x.fault_name(), r.fault_name()),
            first(&|x: &Run| x.strategy.as_str(), &r.strategy),
            r.repeat,
            r.take,
        )
    });
    let profiles = distinct(report.runs.iter().map(|r| r.profile.as_str()));
    let faults = report.runs.iter().any(|r| r.fault.is_some());
    let repeats = report.runs.iter().any(|r| r.repeat > 1);
    runs.into_iter()
        .map(|r| {
            let mut label = r.strategy.clone();
            if profiles.len() > 1 {
                label += &format!(" · {}", r.profile);
            }
            if faults {
                label += &format!(" · {}", r.fault_name());
            }
            if repeats {
                label += &format!(" #{}", r.label());
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
    colour_among(&report.runs, strategy)
}

/// The colour of `strategy`: the palette's in order of first appearance in
/// `runs`.
fn colour_among(runs: &[Run], strategy: &str) -> &'static str {
    let strategies = distinct(runs.iter().map(|r| r.strategy.as_str()));
    let i = strategies.iter().position(|s| *s == strategy).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

fn detail(run: &Run) -> String {
    format!(
        "expected {}, verdict {}; sold {} of {} units",
        run.expected.as_str(),
        run.verdict.label(),
        run.units_sold,
        run.total_stock
    )
}

/// Title, unit and caption of a chart, before its rows.
struct Spec {
    id: &'static str,
    title: &'static str,
    unit: &'static str,
    caption: String,
}

impl Spec {
    fn bars(self, rows: &[Row], reference: Option<&Reference>) -> Chart {
        let svg = svg::bars(self.id, self.title, self.unit, rows, reference);
        Chart { id: self.id, title: self.title, caption: self.caption, svg }
    }

    fn ranges(self, rows: &[RangeRow]) -> Chart {
        let svg = svg::ranges(self.id, self.title, self.unit, rows);
        Chart { id: self.id, title: self.title, caption: self.caption, svg }
    }

    fn series(self, rows: &[SeriesRow]) -> Chart {
        let svg = svg::series(self.id, self.title, self.unit, rows, true);
        Chart { id: self.id, title: self.title, caption: self.caption, svg }
    }

    fn intervals(self, rows: &[IntervalRow], reference: &Reference) -> Chart {
        let svg = svg::intervals(self.id, self.title, self.unit, rows, reference);
        Chart { id: self.id, title: self.title, caption: self.caption, svg }
    }
}

/// One interval row per (strategy, profile) of the ratio `path`, for those
/// that have it, each saying how it compares with `sql`.
fn ratio_rows(report: &Report, path: &str) -> Vec<IntervalRow> {
    interval_rows(report, path, super::columns::vs_sql)
}

/// One interval row per (strategy, profile) of the figure `path`, for those
/// that have it, its tooltip ending with `about` of its summary.
fn interval_rows(report: &Report, path: &str, about: fn(&Summary) -> String) -> Vec<IntervalRow> {
    let profiles = distinct(report.summary.iter().map(|s| s.profile.as_str()));
    report
        .summary
        .iter()
        .filter_map(|s: &Summary| {
            let spread = s.figures.get(path).copied().flatten()?;
            let mut label = s.strategy.clone();
            if profiles.len() > 1 {
                label += &format!(" · {}", s.profile);
            }
            Some(IntervalRow {
                key: format!("{}|{}", s.strategy, s.profile),
                label,
                median: spread.median,
                range: [spread.min, spread.max],
                ci95: spread.ci95,
                colour: strategy_colour(report, &s.strategy),
                detail: format!(
                    "median of {} repeats; range {}–{}; {}",
                    spread.n,
                    svg::number(spread.min),
                    svg::number(spread.max),
                    about(s)
                ),
            })
        })
        .collect()
}

/// One bar per run of a figure of the books: grey at 0, orange where a
/// baseline was meant to break them, red where a strategy that should be
/// correct broke them.
fn books(runs: &[(&Run, String)], pick: fn(&Run) -> i64) -> Vec<Row> {
    runs.iter()
        .map(|(run, label)| {
            let value = pick(run);
            let colour = match value {
                0 => GREY,
                _ if run.expected.tolerates_broken_books() => ORANGE,
                _ => RED,
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
}

/// One bar per run of a rate, in the strategy's colour.
fn rates(report: &Report, runs: &[(&Run, String)], pick: fn(&Run) -> Option<f64>) -> Vec<Row> {
    runs.iter()
        .map(|(run, label)| Row {
            run: run_id(run),
            label: label.clone(),
            value: pick(run),
            colour: strategy_colour(report, &run.strategy),
            detail: detail(run),
        })
        .collect()
}

/// One range of latency percentiles per run.
fn latencies(report: &Report, runs: &[(&Run, String)]) -> Vec<RangeRow> {
    runs.iter()
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
        .collect()
}

/// One row per run of its units sold per second over the sale phase, with
/// the second in which oversell began marked; colours by strategy among
/// `all`.
fn sold_series(all: &[Run], runs: &[(&Run, String)]) -> Vec<SeriesRow> {
    runs.iter()
        .map(|(run, label)| {
            let series = run.sold_per_second.as_deref().unwrap_or_default();
            SeriesRow {
                run: run_id(run),
                label: label.clone(),
                values: series.iter().map(|&units| units as f64).collect(),
                colour: colour_among(all, &run.strategy),
                detail: detail(run),
                marker: fault_hit(run).or_else(|| {
                    crate::series::oversell_began(series, run.total_stock)
                        .map(|second| (second, "oversell began".to_owned()))
                }),
            }
        })
        .collect()
}

/// The second of the sale phase in which the run's fault hit, with its
/// name, for the marker of the units-sold series.
fn fault_hit(run: &Run) -> Option<(usize, String)> {
    let fault = run.fault.as_ref()?;
    let second = fault.hit_s?.floor() as usize;
    Some((second, format!("{} hit", fault.kind)))
}

const OVERSOLD: &str = "Units sold beyond the stock (audit of Postgres). Red: a strategy \
expected to be correct; orange: a baseline that is expected to break.";
const UNDERSOLD: &str = "Units wanted and in stock that did not sell.";
const DRIFT: &str = "total − remaining − sold: 0 for exact books, negative after lost updates.";
const VS_SQL_CAPTION: &str = "Sell-through ÷ the sql run of the same round: the median \
(dot), the range over the repeats (thin line) and the 95 % confidence interval (bar, from 3 \
repeats on). An interval clear of the dashed line at 1 is faster or slower than sql; one \
across it is indistinguishable.";
const VS_HTTP_CAPTION: &str = "Rejection throughput ÷ the http_rps ceiling the run \
measured right before its rejection phase: median (dot), range (thin line), 95 % confidence \
interval (bar).";
const SOLD_PER_SECOND: &str = "How each sale unfolded: units sold in each second of the \
sale phase, from the first purchase sent (orders by their commit time in Postgres), on one \
scale for every run; the drop to 0 is the sell-out, and a red line marks the second in which \
a run sold past its stock, or in a fault run the second in which its fault hit. \"n/a\": a report written before the series was recorded.";
const LATENCY: &str = "Sale-phase purchase latency p50 (filled), p95, p99, in ms on a \
logarithmic axis (the maximum is in each mark's tooltip).";

/// The report's charts: oversold, undersold, drift, sell-through against
/// `sql_tps`, rejections against `http_rps`, latency percentiles, units sold
/// per second, and the ratios' intervals.
pub fn charts(report: &Report) -> Vec<Chart> {
    let runs = chart_runs(report);
    let c = &report.ceilings;
    let sql_tps = Reference { label: Kind::SqlTps.name().to_owned(), value: c.sql_tps.value };
    let http_rps = Reference { label: "http_rps".to_owned(), value: c.http_rps.value };
    let spec = |id, title, unit, caption: String| Spec { id, title, unit, caption };
    let sell_through = format!(
        "Units sold per second in each run's steady window (from 10 % to 90 % of its units \
         sold); the dashed line is this machine's sql_tps ceiling ({} transactions/s, the \
         median over the rounds; each run's ratios use its own round's).",
        svg::number(c.sql_tps.value)
    );
    let rejections = format!(
        "Answers per second to fresh buyers of the sold-out sale, between 10 % and 90 % of the \
         phase; the dashed line is the http_rps ceiling ({} answers/s of a trivial endpoint, \
         the median of the samples each run measured before its rejection phase).",
        svg::number(c.http_rps.value)
    );
    let mut charts = vec![
        spec("oversold", "Oversold units", "units", OVERSOLD.to_owned())
            .bars(&books(&runs, |r| r.oversold), None),
        spec("undersold", "Undersold units", "units", UNDERSOLD.to_owned())
            .bars(&books(&runs, |r| r.undersold), None),
        spec("drift", "Ledger drift", "units", DRIFT.to_owned())
            .bars(&books(&runs, |r| r.ledger_drift), None),
        spec("sell-through", "Sell-through", "units/s", sell_through)
            .bars(&rates(report, &runs, |r| r.sell_through_per_s), Some(&sql_tps)),
        spec("rejections", "Rejection throughput", "answers/s", rejections)
            .bars(&rates(report, &runs, |r| r.rejection_rps), Some(&http_rps)),
        spec("latency", "Purchase latency", "ms", LATENCY.to_owned())
            .ranges(&latencies(report, &runs)),
        spec("sold-per-second", "Units sold per second", "units/s", SOLD_PER_SECOND.to_owned())
            .series(&sold_series(&report.runs, &runs)),
        spec("vs-sql", "Sell-through × sql", "× sql", VS_SQL_CAPTION.to_owned())
            .intervals(&ratio_rows(report, VS_SQL), &one(REFERENCE.as_str())),
        spec("vs-http-rps", "Rejections × http_rps", "× http_rps", VS_HTTP_CAPTION.to_owned())
            .intervals(&ratio_rows(report, "ratio.rejection_vs_http_rps"), &one("http_rps")),
    ];
    // Reports written before the fairness figures have none to draw.
    let served = interval_rows(report, "fairness.first_served", |s| format!("{} runs", s.runs));
    if !served.is_empty() {
        let tau = interval_rows(report, "fairness.kendall_tau", |s| format!("{} runs", s.runs));
        let first = Reference { label: "first come, first served".to_owned(), value: 1.0 };
        let ordered = Reference { label: "in arrival order".to_owned(), value: 1.0 };
        charts.push(
            spec("first-served", "First served", "share", FIRST_SERVED.to_owned())
                .intervals(&served, &first),
        );
        charts.push(
            spec("kendall-tau", "Arrival order kept (Kendall's τ)", "τ", KENDALL_TAU.to_owned())
                .intervals(&tau, &ordered),
        );
    }
    let arrival = arrival_latencies(report, &runs);
    if !arrival.is_empty() {
        charts.push(
            spec("from-arrival", "Latency from intended arrival", "ms", FROM_ARRIVAL.to_owned())
                .ranges(&arrival),
        );
    }
    charts
}

const FIRST_SERVED: &str = "Of the first `stock` buyers to arrive, the share that got a unit: the median over the repeats (dot), the 95 % interval of the mean (bar) and the range (line); 1 is first come, first served.";

const KENDALL_TAU: &str = "Among the buyers who got a unit, the rank correlation between \
their arrival order and the order the units were taken: 1 in arrival order, 0 unrelated; median \
over the repeats (dot), the 95 % interval of the mean (bar) and the range (line).";

const FROM_ARRIVAL: &str = "arrival runs: latency from each buyer's intended arrival, p50 (filled), p90, p99, p99.9, in ms on a logarithmic axis (the maximum and goose's closed-loop p99 are in each mark's tooltip).";

/// One row per `arrival` run of its latency from intended arrival.
fn arrival_latencies(report: &Report, runs: &[(&Run, String)]) -> Vec<RangeRow> {
    runs.iter()
        .filter_map(|(run, label)| {
            let l = &run.arrival.as_ref()?.latency_from_arrival_ms;
            Some(RangeRow {
                run: run_id(run),
                label: label.clone(),
                points: vec![("p50", l.p50), ("p90", l.p90), ("p99", l.p99), ("p99.9", l.p999)],
                colour: strategy_colour(report, &run.strategy),
                detail: format!(
                    "max {} ms; closed-loop p99 {} ms; {}",
                    svg::number(l.max),
                    svg::number(run.latency_ms.p99),
                    detail(run)
                ),
            })
        })
        .collect()
}

/// The live view's chart of the run in progress: units sold and purchases
/// rejected per sample (about a second each) and the stock left, each row
/// on its own scale, with the first sample that saw oversell marked.
pub fn live_chart(samples: &[Sample], total_stock: i64) -> String {
    let oversold = samples.iter().position(|s| s.oversold > 0);
    let marker = oversold.map(|i| (i, "the audit saw oversell".to_owned()));
    let row = |id: &str, label: &str, colour, pick: fn(&Sample) -> f64| SeriesRow {
        run: id.to_owned(),
        label: label.to_owned(),
        values: samples.iter().map(pick).collect(),
        colour,
        detail: format!("stock {total_stock}"),
        marker: marker.clone(),
    };
    let rows = [
        row("sold", "units sold / s", PALETTE[0], |s| s.sold_per_s),
        row("rejected", "rejected / s", PALETTE[5], |s| s.rejected_per_s),
        row("stock-left", "stock left", GREY, |s| s.stock_left as f64),
    ];
    svg::series("live-current", "The run in progress", "per s", &rows, false)
}

/// The live view's chart of the finished runs: units sold per second of
/// each, on one scale (as report.html draws them).
pub fn finished_chart(runs: &[Run]) -> String {
    let labelled: Vec<(&Run, String)> = runs
        .iter()
        .map(|run| (run, format!("{} · {} #{}", run.strategy, run.profile, run.label())))
        .collect();
    let rows = sold_series(runs, &labelled);
    svg::series("live-finished", "Units sold per second", "units/s", &rows, true)
}

/// The reference line at 1 of a ratio to `what`.
fn one(what: &str) -> Reference {
    Reference { label: what.to_owned(), value: 1.0 }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:70rem;\
padding:0 1rem;color:#222;line-height:1.45}h1{font-size:1.6rem}h2{font-size:1.25rem;\
margin-top:2.2rem;border-bottom:1px solid #ddd}table{border-collapse:collapse;font-size:.85rem;\
margin:.6rem 0}th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right;\
white-space:nowrap}th{background:#f4f4f4}td.l,th.l{text-align:left}.scroll{overflow-x:auto;max-width:100%}\
.wide th:first-child,.wide td:first-child{position:sticky;left:0;background:#fff;\
box-shadow:inset -1px 0 0 #bbb}.wide th:first-child{background:#f4f4f4}\
figure{margin:1.4rem 0}figcaption{font-size:.9rem;color:#555;margin-bottom:.3rem}\
.broke{color:#C0392B;font-weight:bold}.unexpected{color:#B9770E}ul.verdicts li{margin:.2rem 0}\
code{background:#f4f4f4;padding:0 .2rem}td.m-ok{background:#E3F1E6}\
td.m-broke{background:#F6D5D1;font-weight:bold}td.m-unexpected{background:#FBEBC8}\
p.partial{border:2px solid #C0392B;background:#F6D5D1;padding:.6rem .8rem}";

/// The whole page.
pub fn render(report: &Report) -> String {
    let mut page = String::new();
    head(&mut page, report);
    verdicts(&mut page, report);
    fault_matrices(&mut page, report);
    page.push_str("<h2>Charts</h2><p>One mark per run; hover a mark for its figures.</p>");
    for chart in charts(report) {
        let _ = write!(
            page,
            "<figure id=\"chart-{id}\" data-chart=\"{id}\"><figcaption><strong>{}</strong> — {}\
             </figcaption><div class=\"scroll\">{}</div></figure>",
            escape(chart.title),
            escape(&chart.caption),
            chart.svg,
            id = chart.id,
        );
    }
    warnings(&mut page, report);
    lines(
        &mut page,
        "arrivals",
        "Open arrivals",
        arrivals::ARRIVAL_NOTE,
        &arrivals::arrival_lines(report),
    );
    let fairness = arrivals::fairness_lines(report);
    lines(&mut page, "fairness", "Who got the units", arrivals::FAIRNESS_NOTE, &fairness);
    payment(&mut page, report);
    let _ = write!(
        page,
        "<h2>Summary over repeats</h2><p>{}</p>",
        escape(super::markdown::SUMMARY_NOTE)
    );
    table(&mut page, SUMMARY_COLUMNS, report.summary.iter().map(|s| (s, "")));
    page.push_str("<h2>Every run</h2>");
    let runs = chart_runs(report);
    table(&mut page, RUN_COLUMNS, runs.iter().map(|(run, _)| (*run, verdict_class(run))));
    let _ = write!(
        page,
        "<h2>Ceilings of this machine</h2><p>{}</p>",
        escape(&super::markdown::ceilings_line(report))
    );
    parameters(&mut page, report);
    page.push_str("</body></html>\n");
    page
}

/// A section `title` (anchor `id`) with its `note` and one item per line;
/// nothing without lines.
fn lines(page: &mut String, id: &str, title: &str, note: &str, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    let _ = write!(page, "<h2 id=\"{id}\">{title}</h2><p>{}</p><ul>", escape(note));
    for line in lines {
        let _ = write!(page, "<li>{}</li>", escape(line));
    }
    page.push_str("</ul>");
}

/// The `payment` runs' returned and resold units, one line each; nothing
/// without a `payment` run.
fn payment(page: &mut String, report: &Report) {
    let lines = super::markdown::payment_lines(report);
    if lines.is_empty() {
        return;
    }
    let _ = write!(
        page,
        "<h2 id=\"payment\">Payment window</h2><p>{}</p><ul>",
        escape(super::markdown::PAYMENT_NOTE)
    );
    for line in lines {
        let _ = write!(page, "<li>{}</li>", escape(&line));
    }
    page.push_str("</ul>");
}

/// The document head, the title and the line about the machine.
fn head(page: &mut String, report: &Report) {
    let m = &report.machine;
    let title = match report.partial {
        Some(_) => "Flash-sale strategy comparison (partial)",
        None => "Flash-sale strategy comparison",
    };
    // A partial report says so before anything else.
    let partial = report.partial_line().map_or_else(String::new, |line| {
        format!("<p class=\"partial\" role=\"alert\"><strong>{}</strong></p>", escape(&line))
    });
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\
         <h1>{title}</h1>{partial}\
         <p>Generated {} on {} CPUs, {:.1} GiB, {}. {} runs.</p>",
        report.generated_at.format("%Y-%m-%d %H:%M UTC"),
        m.cpus,
        m.memory_gb,
        escape(&m.os),
        report.runs.len(),
    );
}

/// The verdicts in words, one per (strategy, profile).
fn verdicts(page: &mut String, report: &Report) {
    page.push_str("<h2>Verdicts</h2><ul class=\"verdicts\">");
    for s in &report.summary {
        let class = if s.verdicts.broke > 0 {
            " class=\"broke\""
        } else if s.verdicts.unexpected > 0 {
            " class=\"unexpected\""
        } else {
            ""
        };
        let verdicts = if s.verdicts.ok == s.runs {
            String::new()
        } else {
            format!(
                "; verdicts: {} ok, {} broke, {} unexpected",
                s.verdicts.ok, s.verdicts.broke, s.verdicts.unexpected
            )
        };
        let _ = write!(
            page,
            "<li{class}>{} — {}{verdicts}</li>",
            escape(&s.broke_line()),
            s.expected.phrase()
        );
    }
    page.push_str(
        "</ul><p>Verdict <code>ok</code>: the run matched its expectation (a <code>correct</code> \
         strategy kept exact books, a <code>breaks</code> baseline visibly broke them). Oversold, \
         undersold and drift come from an audit of Postgres, never from the strategy's own \
         counters.</p>",
    );
}

/// The fault matrices: strategies × faults, each cell coloured by its
/// verdict (a `may_break` cell that broke in amber).
fn fault_matrices(page: &mut String, report: &Report) {
    for m in matrix::matrices(report) {
        let _ = write!(
            page,
            "<h2 id=\"faults-{profile}\">Faults — {profile}</h2><p>{}</p>\
             <div class=\"scroll\"><table class=\"wide matrix\"><tr><th class=\"l\">strategy</th>",
            escape(matrix::LEGEND),
            profile = escape(&m.profile),
        );
        for fault in &m.faults {
            let _ = write!(page, "<th class=\"l\">{}</th>", escape(fault));
        }
        page.push_str("</tr>");
        for row in &m.rows {
            let _ = write!(page, "<tr><td class=\"l\">{}</td>", escape(&row.strategy));
            for cell in &row.cells {
                match cell {
                    None => page.push_str("<td class=\"l\">–</td>"),
                    Some(cell) => {
                        let _ = write!(
                            page,
                            "<td class=\"l {}\" data-verdict=\"{}\">{}</td>",
                            cell_class(cell),
                            cell.verdict.label().to_lowercase(),
                            escape(&cell.text())
                        );
                    }
                }
            }
            page.push_str("</tr>");
        }
        page.push_str("</table></div>");
    }
}

/// The colour of a matrix cell: green `ok`, red `broke`, amber for a
/// `may_break` cell that broke or an `unexpected` verdict.
fn cell_class(cell: &matrix::Cell) -> &'static str {
    match cell.verdict {
        Verdict::Broke => "m-broke",
        Verdict::Unexpected => "m-unexpected",
        Verdict::Ok if cell.expected == Expectation::MayBreak && cell.broken > 0 => "m-unexpected",
        Verdict::Ok => "m-ok",
    }
}

/// The warnings of report.md (undershot ceilings, runs too short to rank,
/// the load generator's share of the machine).
fn warnings(page: &mut String, report: &Report) {
    page.push_str("<h2>Warnings</h2>");
    let lines = super::markdown::warning_lines(report);
    if lines.is_empty() {
        page.push_str("<p>None.</p>");
        return;
    }
    page.push_str("<ul class=\"warnings\">");
    for line in lines {
        let class = if line.starts_with("warning") { " class=\"broke\"" } else { "" };
        let _ = write!(page, "<li{class}>{}</li>", escape(&line));
    }
    page.push_str("</ul>");
}

/// The row class of a run whose verdict needs the reader's eye.
fn verdict_class(run: &Run) -> &'static str {
    match run.verdict {
        Verdict::Ok => "",
        Verdict::Broke => "broke",
        Verdict::Unexpected => "unexpected",
    }
}

/// `rows` (each with its row class, `""` for none) under `columns`, in a
/// box that scrolls sideways with the first column (the strategy) kept in
/// view.
fn table<'a, T: 'a>(
    page: &mut String,
    columns: &[Column<T>],
    rows: impl Iterator<Item = (&'a T, &'static str)>,
) {
    let align = |column: &Column<T>| match column.align {
        Align::Left => " class=\"l\"",
        Align::Right => "",
    };
    page.push_str("<div class=\"scroll\"><table class=\"wide\"><tr>");
    for column in columns {
        let _ = write!(page, "<th{}>{}</th>", align(column), escape(column.header));
    }
    page.push_str("</tr>");
    for (row, class) in rows {
        match class {
            "" => page.push_str("<tr>"),
            class => {
                let _ = write!(page, "<tr class=\"{class}\">");
            }
        }
        for (column, cell) in columns.iter().zip(cells(columns, row)) {
            let _ = write!(page, "<td{}>{}</td>", align(column), escape(&cell));
        }
        page.push_str("</tr>");
    }
    page.push_str("</table></div>");
}

/// Every flag of the invocation.
fn parameters(page: &mut String, report: &Report) {
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
    page.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{fixture, markdown};

    /// The header cells of the first table after `heading` in report.html.
    fn html_headers(page: &str, heading: &str) -> Vec<String> {
        let section = page.split(heading).nth(1).expect("the section exists");
        let header_row = section.split("</tr>").next().unwrap();
        header_row
            .split("<th")
            .skip(1)
            .map(|th| th.split_once('>').unwrap().1.split("</th>").next().unwrap().to_owned())
            .collect()
    }

    /// The header cells of the first table after `heading` in report.md.
    fn markdown_headers(page: &str, heading: &str) -> Vec<String> {
        let section = page.split(heading).nth(1).expect("the section exists");
        let header_row = section.lines().find(|l| l.starts_with('|')).unwrap();
        header_row.split('|').map(str::trim).filter(|h| !h.is_empty()).map(str::to_owned).collect()
    }

    #[test]
    fn both_renderers_show_the_same_columns_in_the_same_order() {
        let report = fixture::report();
        let (html, md) = (render(&report), markdown::render(&report));
        let runs: Vec<&str> = RUN_COLUMNS.iter().map(|c| c.header).collect();
        assert_eq!(html_headers(&html, "<h2>Every run</h2>"), runs);
        assert_eq!(markdown_headers(&md, "## Every run"), runs);
        let summary: Vec<&str> = SUMMARY_COLUMNS.iter().map(|c| c.header).collect();
        assert_eq!(html_headers(&html, "<h2>Summary over repeats</h2>"), summary);
        assert_eq!(markdown_headers(&md, "## Summary over repeats"), summary);
    }

    #[test]
    fn report_md_keeps_every_column_it_had() {
        let before = [
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
        ];
        let now = markdown_headers(&markdown::render(&fixture::report()), "## Every run");
        let kept: Vec<&str> =
            now.iter().map(String::as_str).filter(|h| before.contains(h)).collect();
        assert_eq!(kept, before, "in the same order");
        let added = [
            "sales",
            "window s",
            "cpu ms/unit",
            "tiers ms/unit",
            "serial ms/unit",
            "loadgen CPU %",
            "notes",
        ];
        assert_eq!(now.len(), before.len() + added.len(), "plus {added:?}");
        assert!(added.iter().all(|h| now.iter().any(|n| n == h)));
    }

    #[test]
    fn every_run_is_one_row_marked_by_its_verdict() {
        let mut report = fixture::report();
        report.runs[1].verdict = Verdict::Broke;
        let html = render(&report);
        let runs = html.split("<h2>Every run</h2>").nth(1).unwrap().split("</table>").next();
        let runs = runs.unwrap();
        assert_eq!(runs.matches("<tr").count(), 1 + report.runs.len());
        assert_eq!(runs.matches("<tr class=\"broke\">").count(), 1);
        assert!(runs.contains("<td class=\"l\">BROKE</td>"));
    }

    #[test]
    fn charts_colour_broken_books_by_what_was_expected() {
        let mut report = fixture::report();
        let sql = report.runs.iter_mut().find(|r| r.strategy == "sql").unwrap();
        sql.oversold = 2;
        let oversold = &charts(&report)[0];
        assert_eq!(oversold.id, "oversold");
        assert_eq!(oversold.svg.matches(RED).count(), 1, "the correct strategy that oversold");
        assert_eq!(oversold.svg.matches(ORANGE).count(), 2, "the baseline, twice");
    }
}
