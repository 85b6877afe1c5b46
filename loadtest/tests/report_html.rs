//! report.html in a real browser: `loadtest render` turns a report.json
//! (built here, no load run needed) into the page, headless Chromium loads it
//! from disk, and every chart of the rendered DOM must hold exactly one data
//! mark per run — no run missing, none drawn twice — while the page loads
//! nothing from anywhere.
//!
//! Chromium is required: without it the test fails (CI installs Debian's
//! `chromium` package; set `CHROMIUM` to use another binary).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CHARTS: &[&str] =
    &["oversold", "undersold", "drift", "sell-through", "rejections", "latency"];

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

fn fixture() -> (Value, BTreeSet<String>) {
    let mut runs = Vec::new();
    let mut ids = BTreeSet::new();
    let mut i = 0;
    for repeat in 1..=2 {
        for profile in ["burst", "multi-sale"] {
            for strategy in ["naive", "sql", "sql/for-update", "redis-decr"] {
                runs.push(run(strategy, profile, repeat, i));
                ids.insert(format!("{strategy}|{profile}|{repeat}"));
                i += 1;
            }
        }
    }
    let report = json!({
        "schema_version": 1,
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
    (report, ids)
}

fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!(
        "headless Chromium is required for this test and was not found; install Debian's \
         `chromium` package (`apt-get install -y chromium`) or set CHROMIUM"
    );
}

/// Runs headless Chromium on `page` with `extra` arguments, for at most 90 s;
/// answers its stdout.
fn headless(page: &Path, extra: &[String], profile_dir: &Path) -> String {
    let mut child = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        .args(["--disable-component-update", "--disable-sync", "--no-first-run"])
        .args(["--disable-dev-shm-usage", "--hide-scrollbars"])
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

/// `(chart id, marks, distinct data-run values)` of every chart figure.
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
        let runs = figure
            .split("data-run=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(|run| run.replace("&amp;", "&"))
            .collect();
        charts.push((id, marks, runs));
    }
    charts
}

#[test]
fn report_html_renders_in_chromium_with_one_mark_per_run_in_every_chart() {
    let dir = std::env::temp_dir().join(format!("loadtest-html-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (report, ids) = fixture();
    let json_path = dir.join("report.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report).unwrap()).unwrap();

    let status = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("render")
        .arg(&json_path)
        .status()
        .expect("loadtest runs");
    assert!(status.success(), "loadtest render exited with {status}");
    let page = dir.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();

    // Self-contained: nothing to fetch.
    for needle in ["<script", "<link", " src=", " href=", "url(", "@import"] {
        assert!(!html.contains(needle), "report.html must not load anything ({needle})");
    }
    for chart in CHARTS {
        assert!(dir.join("charts").join(format!("{chart}.svg")).exists(), "charts/{chart}.svg");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    // The summary over repeats lists every repeat's books.
    assert!(md.contains("- naive (burst): broke in 2 of 2 runs (oversold 3, 11; drift -7, -15)"));
    assert!(md.contains("- sql (multi-sale): kept exact books in 2 of 2 runs"));

    let profile_dir = dir.join("chromium-profile");
    let dom = headless(&page, &["--dump-dom".to_owned()], &profile_dir);
    assert!(dom.contains("</html>"), "Chromium dumped no DOM: {dom:.200}");
    let charts = marks_per_chart(&dom);
    let found: Vec<&str> = charts.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(found, CHARTS, "the page's charts");
    for (id, marks, runs) in &charts {
        assert_eq!(*marks, ids.len(), "chart {id}: one mark per run");
        assert_eq!(runs, &ids, "chart {id}: every run, once");
    }

    // And it paints: a screenshot of the page is a real image.
    let shot = dir.join("report.png");
    headless(
        &page,
        &[format!("--screenshot={}", shot.display()), "--window-size=1280,3000".to_owned()],
        &profile_dir,
    );
    let png = std::fs::read(&shot).expect("Chromium wrote a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
    assert!(png.len() > 30_000, "the screenshot is almost empty ({} bytes)", png.len());
    let _ = std::fs::remove_dir_all(&dir);
}
