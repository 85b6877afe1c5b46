//! Horizontal bar, range and per-second series charts as standalone SVG
//! text.
//!
//! Written by hand rather than with a plotting library because every data
//! mark must be one element that names its run (`<g class="mark"
//! data-run="…">`, with a `<title>` tooltip), so that a reader can hover it
//! and a test can count it; plotting libraries draw anonymous shapes. The
//! charts are simple — one row per run, a linear or logarithmic axis, an
//! optional reference line for a ceiling — and need no fonts or scripts: the
//! viewer draws the text. Every chart holds exactly one mark per row it is
//! given, including rows whose value is `null` (drawn as "n/a").

use std::fmt::Write;

/// Width of a chart, px.
const WIDTH: f64 = 820.0;
/// Left edge of the plot area (the run labels sit to its left), px.
const PLOT_LEFT: f64 = 250.0;
/// Right edge of the plot area (value labels may overhang it), px.
const PLOT_RIGHT: f64 = 740.0;
const ROW: f64 = 18.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 14.0;

/// One row: a run and its value.
pub struct Row {
    /// Identifies the run (`data-run`), e.g. `naive|burst|1`.
    pub run: String,
    /// Shown left of the row.
    pub label: String,
    pub value: Option<f64>,
    /// Fill colour of the bar.
    pub colour: &'static str,
    /// Extra lines for the tooltip.
    pub detail: String,
}

/// A vertical reference line across the plot, e.g. a ceiling.
pub struct Reference {
    pub label: String,
    pub value: f64,
}

/// One row of a range chart: latency percentiles of a run.
pub struct RangeRow {
    pub run: String,
    pub label: String,
    /// Percentiles to draw, low to high, with their names (`p50`, …).
    pub points: Vec<(&'static str, f64)>,
    pub colour: &'static str,
    pub detail: String,
}

/// One row of an interval chart: a figure over a strategy's repeats.
pub struct IntervalRow {
    /// Identifies the summary (`data-summary`), e.g. `queue|burst`.
    pub key: String,
    pub label: String,
    pub median: f64,
    /// Smallest and largest value over the repeats.
    pub range: [f64; 2],
    /// The 95 % confidence interval, when there is one.
    pub ci95: Option<[f64; 2]>,
    pub colour: &'static str,
    pub detail: String,
}

/// XML-escapes text and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// A compact number for labels: `12 345`, `1.5`, `0.023`.
pub fn number(value: f64) -> String {
    let abs = value.abs();
    if abs >= 100.0 || value == value.trunc() {
        let rounded = value.round() as i64;
        let digits = rounded.unsigned_abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push('\u{202f}');
            }
            grouped.push(c);
        }
        if rounded < 0 { format!("−{grouped}") } else { grouped }
    } else if abs >= 1.0 {
        format!("{value:.1}")
    } else {
        let text = format!("{value:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Round tick steps (1, 2, 5 × 10^k) covering `[lo, hi]` with about five
/// ticks.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| span / s <= 5.0)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

fn header(out: &mut String, id: &str, title: &str, height: f64) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-chart="{id}" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11" role="img" aria-label="{title}"><title>{title}</title><rect width="{WIDTH}" height="{height}" fill="#fff"/>"##,
        id = escape(id),
        title = escape(title),
    );
}

fn row_label(out: &mut String, y: f64, label: &str) {
    let _ = write!(
        out,
        r##"<text x="{x}" y="{y}" text-anchor="end" fill="#333">{label}</text>"##,
        x = PLOT_LEFT - 8.0,
        y = y + ROW * 0.68,
        label = escape(label),
    );
}

fn tooltip(run_label: &str, value: &str, detail: &str) -> String {
    let mut text = format!("{run_label}: {value}");
    if !detail.is_empty() {
        text.push('\n');
        text.push_str(detail);
    }
    format!("<title>{}</title>", escape(&text))
}

/// The plot's x coordinate of `v` on the linear axis `[lo, hi]`.
fn linear_x(lo: f64, hi: f64) -> impl Fn(f64) -> f64 {
    move |v: f64| PLOT_LEFT + (v - lo) / (hi - lo) * (PLOT_RIGHT - PLOT_LEFT)
}

/// The linear axis of a bar chart: it always includes 0 (and the
/// reference), never has zero width, and is padded by 4 % on the side(s)
/// away from 0 so that no bar ends on the frame.
fn linear_domain(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((0.0f64, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if (hi - lo).abs() < f64::EPSILON {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.04;
    hi += if hi > 0.0 { pad } else { 0.0 };
    lo -= if lo < 0.0 { pad } else { 0.0 };
    (lo, hi)
}

/// A horizontal bar per row on a linear axis that always includes 0 (bars
/// grow left for negative values), with an optional reference line.
pub fn bars(
    id: &str,
    title: &str,
    unit: &str,
    rows: &[Row],
    reference: Option<&Reference>,
) -> String {
    let values = rows.iter().filter_map(|r| r.value);
    linear_chart((id, title, unit), rows.len(), values, reference, |out, i, y, x| {
        bar(out, &rows[i], y, &x, unit)
    })
}

/// A chart of `rows` rows on a linear axis covering `values`, 0 and the
/// reference, titled `id, title, unit`: row `i` is drawn at `y` by
/// `draw(out, i, y, x)`, `x` mapping a value to its coordinate.
fn linear_chart(
    (id, title, unit): (&str, &str, &str),
    rows: usize,
    values: impl Iterator<Item = f64>,
    reference: Option<&Reference>,
    draw: impl Fn(&mut String, usize, f64, &dyn Fn(f64) -> f64),
) -> String {
    let height = TOP + ROW * rows as f64 + BOTTOM;
    let (lo, hi) = linear_domain(values.chain(reference.map(|r| r.value)));
    let x = linear_x(lo, hi);
    let mut out = String::new();
    header(&mut out, id, title, height);
    axis(&mut out, &ticks(lo, hi), &x, unit, height, false);
    for i in 0..rows {
        draw(&mut out, i, TOP + ROW * i as f64, &x);
    }
    if let Some(reference) = reference {
        reference_line(&mut out, reference, x(reference.value), height);
    }
    out.push_str("</svg>");
    out
}

/// The mark of one bar row at `y`: its bar and value, or "n/a".
fn bar(out: &mut String, row: &Row, y: f64, x: &impl Fn(f64) -> f64, unit: &str) {
    row_label(out, y, &row.label);
    let shown = row.value.map_or_else(|| "n/a".to_owned(), number);
    let _ = write!(
        out,
        r#"<g class="mark" data-run="{run}" data-value="{value}">{tip}"#,
        run = escape(&row.run),
        value = row.value.map_or_else(String::new, |v| v.to_string()),
        tip = tooltip(&row.label, &format!("{shown} {unit}"), &row.detail),
    );
    match row.value {
        Some(v) => {
            let (x0, x1) = if v < 0.0 { (x(v), x(0.0)) } else { (x(0.0), x(v)) };
            let _ = write!(
                out,
                r##"<rect x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{fill}"/><text x="{tx:.1}" y="{ty:.1}" fill="#333">{shown}</text>"##,
                y = y + 3.0,
                w = (x1 - x0).max(0.0),
                h = ROW - 6.0,
                fill = row.colour,
                tx = x1.max(x(0.0)) + 4.0,
                ty = y + ROW * 0.68,
                shown = escape(&shown),
            );
        }
        None => {
            let _ = write!(
                out,
                r##"<text x="{tx:.1}" y="{ty:.1}" fill="#999">n/a</text>"##,
                tx = x(0.0) + 4.0,
                ty = y + ROW * 0.68,
            );
        }
    }
    out.push_str("</g>");
}

/// A dashed vertical line at `rx` across the plot, labelled below it.
fn reference_line(out: &mut String, reference: &Reference, rx: f64, height: f64) {
    let _ = write!(
        out,
        r##"<g class="reference"><line x1="{rx:.1}" x2="{rx:.1}" y1="{y0}" y2="{y1}" stroke="#000" stroke-dasharray="4 3"/><text x="{rx:.1}" y="{ty}" text-anchor="middle" fill="#000">{label} {value}</text></g>"##,
        y0 = TOP - 4.0,
        y1 = height - BOTTOM,
        ty = height - 2.0,
        label = escape(&reference.label),
        value = escape(&number(reference.value)),
    );
}

/// One row per summary on a linear axis that includes 0 and the reference:
/// a thin line from the smallest to the largest repeat, a thick bar over
/// the 95 % interval where there is one, and a dot at the median.
pub fn intervals(
    id: &str,
    title: &str,
    unit: &str,
    rows: &[IntervalRow],
    reference: &Reference,
) -> String {
    let values = rows.iter().flat_map(|r| r.range.into_iter().chain(r.ci95.into_iter().flatten()));
    linear_chart((id, title, unit), rows.len(), values, Some(reference), |out, i, y, x| {
        interval(out, &rows[i], y, &x)
    })
}

/// The mark of one interval row at `y`.
fn interval(out: &mut String, row: &IntervalRow, y: f64, x: &impl Fn(f64) -> f64) {
    let cy = y + ROW / 2.0;
    row_label(out, y, &row.label);
    let shown = match row.ci95 {
        Some([lo, hi]) => format!("{} (95 % CI {}–{})", number(row.median), number(lo), number(hi)),
        None => format!("{} (no interval: fewer than 3 repeats)", number(row.median)),
    };
    let _ = write!(
        out,
        r#"<g class="mark" data-summary="{key}">{tip}<line x1="{:.1}" x2="{:.1}" y1="{cy:.1}" y2="{cy:.1}" stroke="{colour}" stroke-width="1"/>"#,
        x(row.range[0]),
        x(row.range[1]),
        key = escape(&row.key),
        tip = tooltip(&row.label, &shown, &row.detail),
        colour = row.colour,
    );
    if let Some([lo, hi]) = row.ci95 {
        let _ = write!(
            out,
            r#"<rect class="ci" x="{:.1}" y="{:.1}" width="{:.1}" height="6" fill="{}" fill-opacity="0.45"/>"#,
            x(lo),
            cy - 3.0,
            (x(hi) - x(lo)).max(1.0),
            row.colour,
        );
    }
    let _ = write!(
        out,
        r##"<circle cx="{:.1}" cy="{cy:.1}" r="3.5" fill="{}" stroke="#333" stroke-width="0.5"/><text x="{:.1}" y="{:.1}" fill="#333">{}</text></g>"##,
        x(row.median),
        row.colour,
        x(row.range[1].max(row.ci95.map_or(f64::MIN, |c| c[1]))) + 6.0,
        y + ROW * 0.68,
        escape(&number(row.median)),
    );
}

/// The logarithmic axis of a range chart, as whole decades `(lo, hi)` of
/// log10 covering every positive value (at least one decade wide);
/// `(0, 1)` when no value is positive.
fn log_domain(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let positive: Vec<f64> = values.filter(|v| *v > 0.0).collect();
    if positive.is_empty() {
        return (0.0, 1.0);
    }
    let lo = positive.iter().copied().fold(f64::INFINITY, f64::min).log10().floor();
    let hi = positive.iter().copied().fold(0.0f64, f64::max).log10().ceil();
    (lo, hi.max(lo + 1.0))
}

/// Ticks 1, 2, 5 × 10^k from decade `lo` up to `10^hi`.
fn decade_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    for k in lo as i32..=hi as i32 {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(k);
            if v.log10() <= hi + 1e-9 {
                ticks.push(v);
            }
        }
    }
    ticks
}

/// A row of points per run (e.g. p50, p95, p99) joined by a line, on a
/// logarithmic axis so that sub-millisecond and second-long latencies share
/// one chart. Values ≤ 0 are drawn at the axis' low end.
pub fn ranges(id: &str, title: &str, unit: &str, rows: &[RangeRow]) -> String {
    let height = TOP + ROW * rows.len() as f64 + BOTTOM;
    let (lo, hi) = log_domain(rows.iter().flat_map(|r| r.points.iter().map(|p| p.1)));
    let x = move |v: f64| {
        let l = if v > 0.0 { v.log10().clamp(lo, hi) } else { lo };
        PLOT_LEFT + (l - lo) / (hi - lo) * (PLOT_RIGHT - PLOT_LEFT)
    };
    let mut out = String::new();
    header(&mut out, id, title, height);
    axis(&mut out, &decade_ticks(lo, hi), x, unit, height, true);
    for (i, row) in rows.iter().enumerate() {
        range(&mut out, row, TOP + ROW * i as f64, &x, unit);
    }
    out.push_str("</svg>");
    out
}

/// The mark of one range row at `y`: the line from its first to its last
/// point, a circle per point (the first filled), and the values.
fn range(out: &mut String, row: &RangeRow, y: f64, x: &impl Fn(f64) -> f64, unit: &str) {
    let cy = y + ROW / 2.0;
    row_label(out, y, &row.label);
    let shown = row
        .points
        .iter()
        .map(|(name, v)| format!("{name} {}", number(*v)))
        .collect::<Vec<_>>()
        .join(" · ");
    let _ = write!(
        out,
        r#"<g class="mark" data-run="{run}">{tip}"#,
        run = escape(&row.run),
        tip = tooltip(&row.label, &format!("{shown} ({unit})"), &row.detail),
    );
    if let (Some(first), Some(last)) = (row.points.first(), row.points.last()) {
        let _ = write!(
            out,
            r#"<line x1="{:.1}" x2="{:.1}" y1="{cy:.1}" y2="{cy:.1}" stroke="{}" stroke-width="3"/>"#,
            x(first.1),
            x(last.1),
            row.colour,
        );
    }
    for (k, (name, v)) in row.points.iter().enumerate() {
        let _ = write!(
            out,
            r##"<circle class="pct" data-pct="{name}" cx="{:.1}" cy="{cy:.1}" r="{}" fill="{}" stroke="#333" stroke-width="0.5"/>"##,
            x(*v),
            3.0 + k as f64,
            if k == 0 { row.colour } else { "#fff" },
        );
    }
    if let Some(last) = row.points.last() {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" fill="#333">{}</text>"##,
            x(last.1) + 9.0,
            y + ROW * 0.68,
            escape(&row.points.iter().map(|p| number(p.1)).collect::<Vec<_>>().join(" / ")),
        );
    }
    out.push_str("</g>");
}

/// Height of a row of a series chart, px.
const SERIES_ROW: f64 = 34.0;

/// One row of a series chart: a run's values, one per second.
pub struct SeriesRow {
    /// Identifies the run (`data-run`).
    pub run: String,
    pub label: String,
    /// One value per second from the start; empty: no series ("n/a").
    pub values: Vec<f64>,
    pub colour: &'static str,
    pub detail: String,
    /// The second to mark in red, and why (e.g. where oversell began).
    pub marker: Option<(usize, String)>,
}

/// A row per run of values over time, as steps one second wide on one time
/// axis (seconds from the start, along the top). With `shared_scale` every
/// row has the same vertical scale (the largest value of any row), so that
/// rows compare; without, each row fills its height (for rows of different
/// units). Each row is one mark with its peak written at its right end.
pub fn series(id: &str, title: &str, unit: &str, rows: &[SeriesRow], shared_scale: bool) -> String {
    let height = TOP + SERIES_ROW * rows.len() as f64 + BOTTOM;
    let seconds = rows.iter().map(|r| r.values.len()).max().unwrap_or(0).max(1) as f64;
    let x = linear_x(0.0, seconds);
    let peak = |values: &[f64]| values.iter().copied().fold(0.0f64, f64::max);
    let shared = rows.iter().map(|r| peak(&r.values)).fold(0.0f64, f64::max);
    let mut out = String::new();
    header(&mut out, id, title, height);
    axis(&mut out, &ticks(0.0, seconds), &x, "s", height, false);
    for (i, row) in rows.iter().enumerate() {
        let top = TOP + SERIES_ROW * i as f64;
        let scale = if shared_scale { shared } else { peak(&row.values) };
        series_row(&mut out, row, top, &x, scale, unit);
    }
    out.push_str("</svg>");
    out
}

/// The mark of one series row whose box starts at `top`: the steps, filled
/// below, on a baseline; its peak; the marker line.
fn series_row(
    out: &mut String,
    row: &SeriesRow,
    top: f64,
    x: &impl Fn(f64) -> f64,
    scale: f64,
    unit: &str,
) {
    let _ = write!(
        out,
        r##"<text x="{lx}" y="{ly:.1}" text-anchor="end" fill="#333">{label}</text>"##,
        lx = PLOT_LEFT - 8.0,
        ly = top + SERIES_ROW * 0.6,
        label = escape(&row.label),
    );
    let peak = row.values.iter().copied().fold(0.0f64, f64::max);
    let shown = if row.values.is_empty() {
        "n/a".to_owned()
    } else {
        format!("{} s, peak {} {unit}", row.values.len(), number(peak))
    };
    let marker = row.marker.as_ref().map(|(second, why)| format!("; {why} in second {second}"));
    let _ = write!(
        out,
        r#"<g class="mark" data-run="{run}" data-points="{n}">{tip}"#,
        run = escape(&row.run),
        n = row.values.len(),
        tip = tooltip(&row.label, &format!("{shown}{}", marker.unwrap_or_default()), &row.detail),
    );
    let base = top + SERIES_ROW - 4.0;
    let y = |v: f64| if scale > 0.0 { base - v / scale * (SERIES_ROW - 10.0) } else { base };
    let _ = write!(
        out,
        r##"<line x1="{PLOT_LEFT}" x2="{PLOT_RIGHT}" y1="{base:.1}" y2="{base:.1}" stroke="#bbb"/>"##
    );
    if row.values.is_empty() {
        let _ = write!(
            out,
            r##"<text x="{tx}" y="{base:.1}" fill="#999">n/a</text>"##,
            tx = PLOT_LEFT + 4.0
        );
    } else {
        let mut path = format!("M{:.1},{base:.1}", x(0.0));
        for (i, v) in row.values.iter().enumerate() {
            let _ = write!(
                path,
                " L{:.1},{:.1} L{:.1},{:.1}",
                x(i as f64),
                y(*v),
                x(i as f64 + 1.0),
                y(*v)
            );
        }
        let _ = write!(path, " L{:.1},{base:.1} Z", x(row.values.len() as f64));
        let _ = write!(
            out,
            r##"<path d="{path}" fill="{c}" fill-opacity="0.25" stroke="{c}" stroke-width="1.5"/><text x="{tx:.1}" y="{ty:.1}" fill="#333">{peak}</text>"##,
            c = row.colour,
            tx = PLOT_RIGHT + 4.0,
            ty = top + SERIES_ROW * 0.6,
            peak = escape(&number(peak)),
        );
    }
    if let Some((second, _)) = &row.marker {
        let mx = x(*second as f64 + 0.5);
        let _ = write!(
            out,
            r##"<line class="marker" x1="{mx:.1}" x2="{mx:.1}" y1="{y0:.1}" y2="{base:.1}" stroke="#C0392B" stroke-width="2"/>"##,
            y0 = top + 2.0,
        );
    }
    out.push_str("</g>");
}

/// Grid lines and tick labels along the top of the plot area.
fn axis(
    out: &mut String,
    ticks: &[f64],
    x: impl Fn(f64) -> f64,
    unit: &str,
    height: f64,
    log: bool,
) {
    for &t in ticks {
        let tx = x(t);
        let _ = write!(
            out,
            r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{y0}" y2="{y1}" stroke="{stroke}"/><text x="{tx:.1}" y="{ty}" text-anchor="middle" fill="#666">{label}</text>"##,
            y0 = TOP - 4.0,
            y1 = height - BOTTOM,
            stroke = if t == 0.0 && !log { "#999" } else { "#e4e4e4" },
            ty = TOP - 8.0,
            label = escape(&number(t)),
        );
    }
    let _ = write!(
        out,
        r##"<text x="{x}" y="{y}" text-anchor="end" fill="#666">{unit}</text>"##,
        x = PLOT_LEFT - 8.0,
        y = TOP - 8.0,
        unit = escape(unit),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(-30.0, 0.0), vec![-30.0, -20.0, -10.0, 0.0]);
    }

    #[test]
    fn every_row_is_one_mark_even_without_a_value() {
        let row = |run: &str, value| Row {
            run: run.to_owned(),
            label: run.to_owned(),
            value,
            colour: "#333",
            detail: String::new(),
        };
        let svg = bars("x", "X", "units", &[row("a", Some(-3.0)), row("b", None)], None);
        assert_eq!(svg.matches(r#"class="mark""#).count(), 2);
        assert!(svg.contains(r#"data-run="b" data-value="""#));
    }

    #[test]
    fn an_interval_row_draws_its_interval_only_when_it_has_one() {
        let row = |key: &str, ci95| IntervalRow {
            key: key.to_owned(),
            label: key.to_owned(),
            median: 2.0,
            range: [1.8, 2.3],
            ci95,
            colour: "#333",
            detail: String::new(),
        };
        let one = Reference { label: "sql".to_owned(), value: 1.0 };
        let svg = intervals("x", "X", "× sql", &[row("a", Some([1.2, 3.0])), row("b", None)], &one);
        assert_eq!(svg.matches(r#"class="mark""#).count(), 2);
        assert_eq!(svg.matches(r#"class="ci""#).count(), 1);
        assert!(svg.contains("95 % CI 1.2–3"), "{svg}");
    }

    #[test]
    fn a_linear_axis_includes_zero_and_pads_away_from_it() {
        let (lo, hi) = linear_domain([].into_iter());
        assert!(lo == 0.0 && (hi - 1.04).abs() < 1e-9, "an empty axis is one unit wide");
        let (lo, hi) = linear_domain([10.0, 50.0].into_iter());
        assert_eq!(lo, 0.0);
        assert!((hi - 52.0).abs() < 1e-9, "{hi}");
        let (lo, hi) = linear_domain([-25.0].into_iter());
        assert_eq!((lo, hi), (-26.0, 0.0));
    }

    #[test]
    fn a_log_axis_spans_whole_decades() {
        assert_eq!(log_domain([0.0, -1.0].into_iter()), (0.0, 1.0));
        assert_eq!(log_domain([0.3, 0.0, 450.0].into_iter()), (-1.0, 3.0));
        assert_eq!(log_domain([5.0].into_iter()), (0.0, 1.0));
        assert_eq!(decade_ticks(0.0, 1.0), vec![1.0, 2.0, 5.0, 10.0]);
    }

    #[test]
    fn a_series_row_is_one_mark_with_its_points_and_marker() {
        let row = |run: &str, values: Vec<f64>, marker| SeriesRow {
            run: run.to_owned(),
            label: run.to_owned(),
            values,
            colour: "#333",
            detail: String::new(),
            marker,
        };
        let rows = [
            row("a", vec![3.0, 5.0, 0.0], Some((1, "oversold".to_owned()))),
            row("b", vec![], None),
        ];
        let svg = series("x", "X", "units/s", &rows, true);
        assert_eq!(svg.matches(r#"class="mark""#).count(), 2);
        assert!(svg.contains(r#"data-run="a" data-points="3""#), "{svg}");
        assert!(svg.contains(r#"data-run="b" data-points="0""#), "{svg}");
        assert_eq!(svg.matches(r#"class="marker""#).count(), 1);
        assert!(svg.contains("oversold in second 1"), "{svg}");
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(12345.4), "12\u{202f}345");
        assert_eq!(number(-12.0), "−12");
        assert_eq!(number(2.26), "2.3");
        assert_eq!(number(0.0234), "0.023");
        assert_eq!(number(0.5), "0.5");
    }
}
