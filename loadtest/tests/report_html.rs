//! report.html in a real browser: `loadtest render` turns a report.json
//! (built here, no load run needed) into the page, headless Chromium loads it
//! from disk, and every chart of the rendered DOM must hold exactly one data
//! mark per run (per strategy for the interval charts) — no run missing, none
//! drawn twice — while the page loads nothing from anywhere. In a
//! 1400-pixel-wide window the wide tables stay inside the page and keep
//! their strategy column in view when scrolled. A version-1 report still
//! renders.
//!
//! Chromium is required: without it the test fails (CI installs Debian's
//! `chromium` package; set `CHROMIUM` to use another binary).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Charts with one mark per run.
const CHARTS: &[&str] =
    &["oversold", "undersold", "drift", "sell-through", "rejections", "latency", "sold-per-second"];
/// Charts with one mark per (strategy, profile): the ratios' intervals, and
/// the fairness scores' (reports without fairness figures have none).
const INTERVAL_CHARTS: &[&str] = &["vs-sql", "vs-http-rps", "first-served", "kendall-tau"];

const STRATEGIES: [&str; 4] = ["naive", "sql", "sql/for-update", "redis-decr"];

fn run(strategy: &str, profile: &str, repeat: u64, i: u64) -> Value {
    let breaks = strategy == "naive";
    let (oversold, drift) = if breaks { (3 + i as i64, -(7 + i as i64)) } else { (0, 0) };
    let sold = 1000 + oversold;
    // One run sold nothing measurable: its sell-through is null, and its
    // mark must still be there.
    let sell_through = if strategy == "sql" && profile == "multi-sale" && repeat == 2 {
        Value::Null
    } else {
        json!(800.0 + 37.0 * i as f64)
    };
    json!({
        "strategy": strategy, "profile": profile, "repeat": repeat,
        "expected": if breaks { "breaks" } else { "correct" }, "verdict": "ok",
        "instances": 2, "sales": if profile == "multi-sale" { 4 } else { 1 },
        "total_stock": 1000, "buyers": 3000, "demanded_units": 3000,
        "requests": 3300, "duration_s": 2.5, "throughput_rps": 1320.0,
        "sell_through_per_s": sell_through, "rejection_rps": 2100.0 + i as f64,
        "units_sold": sold, "orders": sold, "remaining_stock": 0,
        "oversold": oversold, "undersold": 0, "ledger_drift": drift, "duplicate_orders": 0,
        "errors_5xx": 0,
        "outcomes": { "placed": sold, "sold_out": 2000, "already_purchased": 300, "busy": 0,
                      "unavailable": 0, "not_started": 0, "ended": 0, "invalid": 0, "other": 0 },
        "status_counts": { "201": sold, "409": 2300 },
        "latency_ms": { "p50": 2.0 + i as f64, "p95": 20.0, "p99": 80.0 + i as f64, "max": 400.0 },
        "ratio": { "sell_through_vs_sql_tps": 0.4, "rejection_vs_http_rps": 0.3,
                   "sell_through_vs_sql_strategy": 1.0 },
        "redis_drift": if strategy == "redis-decr" { json!(0) } else { Value::Null },
        "reconcile_fixes": if strategy == "redis-decr" { json!(0) } else { Value::Null },
        "cost": { "redis_round_trips_per_unit": if strategy == "redis-decr" { json!(3.1) } else { Value::Null },
                  "pg_xacts_per_unit": 3.2, "amqp_messages_per_unit": null, "peak_rss_mb": 41.5 }
    })
}

/// A version-2 run: the version-1 fields and those added since.
fn run_v2(strategy: &str, profile: &str, repeat: u64, i: u64) -> Value {
    let mut run = run(strategy, profile, repeat, i);
    let ratio = if strategy == "sql" { 1.0 } else { 0.8 + 0.05 * repeat as f64 };
    run["ratio"]["sell_through_vs_sql_strategy"] = json!(ratio);
    run["ratio"]["rejection_vs_http_rps"] = json!(0.3 + 0.02 * repeat as f64);
    run["sell_through_whole_per_s"] = json!(700.0);
    run["steady_window_s"] = json!(if i == 3 { 0.3 } else { 1.9 });
    run["too_short_to_rank"] = json!(i == 3);
    run["ceiling_undershot"] = json!(i == 5);
    run["cpu"] = json!({ "loadgen_s": 0.9, "instances_s": 1.1, "postgres_s": 0.8,
                         "redis_s": 0.0, "rabbitmq_s": 0.0, "machine_share_loadgen": 0.18 });
    run["cost"]["cpu_ms_per_unit"] = json!(1.9);
    // How the sale unfolded: the units sold, second by second.
    let sold = run["units_sold"].as_i64().unwrap();
    run["sold_per_second"] = json!([sold / 4, sold / 2, sold - sold / 4 - sold / 2]);
    // Who got the units (added in schema 3, read by any version).
    let served = if strategy == "naive" { 0.5 } else { 0.9 + 0.01 * repeat as f64 };
    run["fairness"] =
        json!({ "first_served": served, "kendall_tau": served - 0.2, "winners": 1000 });
    run
}

/// A report of 4 strategies × 2 profiles × `repeats`, of schema `version`;
/// the `data-run` of every run, and the `data-summary` of every (strategy,
/// profile).
fn fixture(version: u32, repeats: u64) -> (Value, BTreeSet<String>, BTreeSet<String>) {
    let mut runs = Vec::new();
    let (mut ids, mut summaries) = (BTreeSet::new(), BTreeSet::new());
    let mut i = 0;
    for repeat in 1..=repeats {
        for profile in ["burst", "multi-sale"] {
            for strategy in STRATEGIES {
                runs.push(if version == 1 {
                    run(strategy, profile, repeat, i)
                } else {
                    run_v2(strategy, profile, repeat, i)
                });
                ids.insert(format!("{strategy}|{profile}|{repeat}"));
                summaries.insert(format!("{strategy}|{profile}"));
                i += 1;
            }
        }
    }
    let mut report = json!({
        "schema_version": version,
        "generated_at": "2026-11-29T21:00:00Z",
        "machine": { "cpus": 2, "os": "Debian GNU/Linux 12, kernel 6.1", "memory_gb": 23.4 },
        "config": { "strategies": ["naive", "sql", "sql/for-update", "redis-decr"],
                    "profile": ["burst", "multi-sale"], "repeat": 2, "users": 200 },
        "ceilings": {
            "http_rps": { "value": 7000.0, "users": 200, "instances": 2, "duration_s": 5.0 },
            "sql_tps": { "value": 2000.0, "connections": 20, "duration_s": 5.0 },
            "redis_ops": { "value": 60000.0, "clients": 200, "duration_s": 5.0 }
        },
        "runs": runs
    });
    if version > 1 {
        let samples: Vec<f64> = (0..repeats).map(|r| 7000.0 + 100.0 * r as f64).collect();
        report["ceilings"]["http_rps"]["samples"] = json!(samples);
        report["ceilings"]["sql_tps"]["samples"] = json!(vec![2000.0; repeats as usize]);
        report["ceilings"]["redis_ops"]["samples"] = json!(vec![60000.0; repeats as usize]);
    }
    (report, ids, summaries)
}

/// Runs headless Chromium on `page` with `extra` arguments, for at most 90 s;
/// answers its stdout.
fn headless(page: &Path, extra: &[String], profile_dir: &Path) -> String {
    let mut child = Command::new(test_support::chromium())
        .args(test_support::HEADLESS_FLAGS)
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("Chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("Chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "Chromium exited with {status}");
    reader.join().unwrap().expect("Chromium's output is UTF-8")
}

/// `(chart id, marks, distinct data-run or data-summary values)` of every
/// chart figure.
fn marks_per_chart(dom: &str) -> Vec<(String, usize, BTreeSet<String>)> {
    let mut charts = Vec::new();
    for figure in dom.split("<figure").skip(1) {
        let figure = figure.split("</figure>").next().unwrap();
        let id = figure
            .split("data-chart=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or("?")
            .to_owned();
        let marks = figure.matches("class=\"mark\"").count();
        let key = if figure.contains("data-summary=") { "data-summary=\"" } else { "data-run=\"" };
        let runs = figure
            .split(key)
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(|run| run.replace("&amp;", "&"))
            .collect();
        charts.push((id, marks, runs));
    }
    charts
}

/// Writes `report` into a fresh directory named after `name`, runs
/// `loadtest render` on it, and answers the directory.
fn render(name: &str, report: &Value) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loadtest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(report).unwrap()).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("render")
        .arg(&json_path)
        .status()
        .expect("loadtest runs");
    assert!(status.success(), "loadtest render exited with {status}");
    dir
}

#[test]
fn a_version_1_report_still_renders() {
    let (report, ids, _) = fixture(1, 2);
    let dir = render("html-v1", &report);
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("- naive (burst): broke in 2 of 2 runs (oversold 3, 11; drift -7, -15)"));
    assert!(md.contains("- sql (multi-sale): kept exact books in 2 of 2 runs"));
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    for (id, marks, runs) in marks_per_chart(&html) {
        if !INTERVAL_CHARTS.contains(&id.as_str()) {
            assert_eq!((marks, &runs), (ids.len(), &ids), "chart {id}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// JavaScript appended to a copy of the page (report.html itself has no
/// script): scrolls every table box to its far right and records, in
/// `data-measure` of the body, the window width and per box its right edge,
/// its scroll and client widths, and how far the first cell of its last
/// row sits from the box's left edge.
const MEASURE: &str = "<script>const boxes=[...document.querySelectorAll('div.scroll')]\
.filter(b=>b.querySelector('table'));document.body.setAttribute('data-measure',JSON.stringify(\
{width:window.innerWidth,boxes:boxes.map(b=>{b.scrollLeft=b.scrollWidth;const r=b.\
getBoundingClientRect();const rows=b.querySelectorAll('tr');const c=rows[rows.length-1].\
firstElementChild.getBoundingClientRect();return [r.right,b.scrollWidth,b.clientWidth,\
c.left-r.left];})}));</script>";

#[test]
fn report_html_renders_in_chromium_with_one_mark_per_run_in_every_chart() {
    let (report, ids, summaries) = fixture(2, 3);
    let dir = render("html", &report);
    let page = dir.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();

    // Self-contained: nothing to fetch.
    for needle in ["<script", "<link", " src=", " href=", "url(", "@import"] {
        assert!(!html.contains(needle), "report.html must not load anything ({needle})");
    }
    for chart in CHARTS.iter().chain(INTERVAL_CHARTS) {
        assert!(dir.join("charts").join(format!("{chart}.svg")).exists(), "charts/{chart}.svg");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("CI "), "the summary gives the ratios' intervals");
    assert!(md.contains("too short to rank"), "run 3's window is 0.3 s");

    let profile_dir = dir.join("chromium-profile");
    let dom = headless(&page, &["--dump-dom".to_owned()], &profile_dir);
    assert!(dom.contains("</html>"), "Chromium dumped no DOM: {dom:.200}");
    let charts = marks_per_chart(&dom);
    let found: Vec<&str> = charts.iter().map(|(id, _, _)| id.as_str()).collect();
    let expected: Vec<&str> = CHARTS.iter().chain(INTERVAL_CHARTS).copied().collect();
    assert_eq!(found, expected, "the page's charts");
    for (id, marks, keys) in &charts {
        let want = if INTERVAL_CHARTS.contains(&id.as_str()) { &summaries } else { &ids };
        assert_eq!(*marks, want.len(), "chart {id}: one mark per run or strategy");
        assert_eq!(keys, want, "chart {id}: every run or strategy, once");
    }
    // Units sold over time: every run's series is drawn, second by second.
    let (_, series) = dom.split_once("data-chart=\"sold-per-second\"").expect("the series chart");
    let series = series.split("</figure>").next().unwrap();
    assert_eq!(series.matches("data-points=\"3\"").count(), ids.len(), "3 seconds per run");
    assert_eq!(series.matches("<path ").count(), ids.len(), "a drawn series per run");

    // 1400 px wide: every table box ends inside the window, the runs table
    // is wider than its box (so it scrolls), and scrolled to its far right
    // its first column is still at the box's left edge.
    let measured = dir.join("measured.html");
    std::fs::write(&measured, html.replace("</body>", &format!("{MEASURE}</body>"))).unwrap();
    let dom = headless(
        &measured,
        &["--dump-dom".to_owned(), "--window-size=1400,2000".to_owned()],
        &profile_dir,
    );
    let attribute = dom.split("data-measure=\"").nth(1).expect("the script ran").split('"');
    let measure: Value =
        serde_json::from_str(&attribute.into_iter().next().unwrap().replace("&quot;", "\""))
            .unwrap();
    let width = measure["width"].as_f64().unwrap();
    assert_eq!(width, 1400.0);
    let boxes = measure["boxes"].as_array().unwrap();
    assert_eq!(boxes.len(), 2, "the summary and the runs: {measure}");
    for b in boxes {
        let [right, scroll, client, first_left] =
            [0, 1, 2, 3].map(|i| b[i].as_f64().expect("a number"));
        assert!(right <= width, "a table box ends past the window: {measure}");
        if scroll > client {
            assert!(first_left.abs() <= 1.0, "the strategy column scrolled away: {measure}");
        }
    }
    assert!(boxes.iter().any(|b| b[1].as_f64() > b[2].as_f64()), "no table scrolls: {measure}");

    // And it paints: a screenshot of the page is a real image, kept as
    // target/screenshots/report-html.png.
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let shot = tmp.parent().unwrap().join("screenshots").join("report-html.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    headless(
        &page,
        &[format!("--screenshot={}", shot.display()), "--window-size=1400,4000".to_owned()],
        &profile_dir,
    );
    let png = std::fs::read(&shot).expect("Chromium wrote a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    assert!(png.len() > 30_000, "the screenshot is almost empty ({} bytes)", png.len());
    let _ = std::fs::remove_dir_all(&dir);
}
