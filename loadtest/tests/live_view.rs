//! `loadtest compare --serve-progress` watched in headless Chromium: the
//! page, opened once, updates by itself while the comparison runs — it shows
//! the run in progress with its samples (units sold and rejected per second,
//! stock left; a `naive` baseline's oversell marked), then the finished runs
//! with their verdicts and their units sold per second — and the report the
//! comparison writes keeps each run's series, which report.html draws.
//! Screenshots: `target/screenshots/live-*.png`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use test_support::Browser;

/// How long the comparison may take to get to a step.
const STEP: Duration = Duration::from_secs(90);

fn artifact(name: &str) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap().join("screenshots").join(format!("live-{name}.png"))
}

async fn shoot(browser: &Browser, name: &str) {
    let bytes = browser.screenshot(&artifact(name)).await;
    assert!(bytes > 10_000, "the screenshot {name} is almost empty ({bytes} bytes)");
}

/// Kills the comparison if the test fails before it ends.
struct Comparison(std::process::Child);

impl Drop for Comparison {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_follows_a_comparison_and_the_report_keeps_each_runs_series() {
    let _heavy = test_support::heavy();
    let out = std::env::temp_dir().join(format!("loadtest-live-{}", std::process::id()));
    let port = test_support::free_port();
    let addr = format!("127.0.0.1:{port}");
    // Few users and simulated work: sale phases of a few seconds, so that
    // the page sees them while they run.
    let child = Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .arg("compare")
        .args([
            "--strategies",
            "naive,sql",
            "--stock",
            "300",
            "--repeat",
            "1",
            "--reference-runs",
            "1",
        ])
        .args(["--users", "8", "--work-ms", "10", "--instances", "1"])
        .args(["--rejection-phase", "1", "--ceiling-duration", "1", "--quiet"])
        .args(["--database-url", &crate::support::test_database_url(), "--serve-progress", &addr])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .spawn()
        .expect("loadtest runs");
    let mut comparison = Comparison(child);
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let up = test_support::eventually(Duration::from_secs(30), || async {
        client.get(format!("{url}progress.json")).send().await.is_ok()
    })
    .await;
    assert!(up, "the live view answers at {url}");

    let browser = Browser::start(1200, 1400).await;
    browser.goto(&url).await;
    // The first run, once its sale phase has been sampled: its figures and
    // its chart (sold / s, rejected / s, stock left), on the page opened
    // before it began.
    let seen = browser
        .wait_for(
            "(() => { const current = document.getElementById('current'); \
             if (Number(current.dataset.samples || 0) < 1) return null; \
             return { label: document.getElementById('current-label').textContent, \
               rows: document.querySelectorAll('#current-chart g.mark[data-points]').length, \
               finished: document.querySelectorAll('#finished-rows tr[data-verdict]').length }; })()",
            STEP,
        )
        .await;
    assert!(seen["label"].as_str().unwrap().starts_with("naive"), "{seen}");
    assert_eq!((seen["rows"].as_u64(), seen["finished"].as_u64()), (Some(3), Some(0)), "{seen}");
    shoot(&browser, "running").await;

    // The naive run finishes with its verdict (it oversells, as expected).
    let verdict = "document.querySelector('#finished-rows tr[data-verdict]')";
    browser.wait_for(verdict, STEP).await;
    let row = browser.eval(&format!("{verdict}.textContent")).await;
    assert!(row.as_str().unwrap().starts_with("naive"), "{row}");
    assert_eq!(browser.eval(&format!("{verdict}.dataset.verdict")).await, "ok");
    let series = "document.querySelector('#finished-chart g.mark').dataset.points";
    let points: u64 = browser.eval(series).await.as_str().unwrap().parse().unwrap();
    assert!(points >= 1, "the finished run's series is drawn");
    shoot(&browser, "finished").await;

    // Both runs done: the page says the comparison ended.
    browser
        .wait_for("document.querySelectorAll('#finished-rows tr[data-verdict]').length === 2", STEP)
        .await;
    browser.wait_for("!document.getElementById('ended').hidden", STEP).await;
    shoot(&browser, "ended").await;
    let status = comparison.0.wait().expect("loadtest ends");
    assert!(status.success(), "loadtest compare exited with {status}");

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    for run in report["runs"].as_array().unwrap() {
        let series: Vec<i64> = run["sold_per_second"]
            .as_array()
            .expect("sold_per_second")
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        let sold: i64 = series.iter().sum();
        assert!(sold > 0, "{}: {series:?}", run["strategy"]);
        assert!(sold <= run["units_sold"].as_i64().unwrap(), "{}", run["strategy"]);
        if run["strategy"] == "sql" {
            assert_eq!(sold, 300, "every unit sql sold, in the second it was sold");
        }
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    let (_, chart) = html.split_once("data-chart=\"sold-per-second\"").expect("the series chart");
    let chart = chart.split("</figure>").next().unwrap();
    assert_eq!(chart.matches("<path ").count(), 2, "each run's series is drawn");
    let _ = std::fs::remove_dir_all(&out);
}
