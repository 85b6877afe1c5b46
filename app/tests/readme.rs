//! The README's "Using the service" commands, run as they are written (the
//! block between `<!-- walkthrough:start -->` and `<!-- walkthrough:end -->`,
//! with only `localhost:8080` replaced by a free port), against a fresh
//! instance started by `scripts/serve.sh` on a scratch database that already
//! holds other sales — as after a comparison — so that a walkthrough that
//! buys from a fixed sale id fails here before it fails a reader.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::support::{TestApp, test_database_url};

/// The repository root (scripts/ and README.md live there).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("app/ has a parent").to_owned()
}

/// The shell commands of the README's walkthrough block.
fn walkthrough(readme: &str) -> String {
    let start = readme.find("<!-- walkthrough:start -->").expect("README has walkthrough:start");
    let end = readme.find("<!-- walkthrough:end -->").expect("README has walkthrough:end");
    let block = &readme[start..end];
    let body = block.split_once("```sh\n").expect("the walkthrough is a ```sh block").1;
    body.split_once("```").expect("the ```sh block is closed").0.to_owned()
}

/// Runs `script` with bash in the repository root, the service's
/// configuration pointing at `port` and `database`, and a service binary
/// that is already built.
fn run_script(script: &str, port: u16, database: &str) -> Output {
    let prefix = test_support::unique_prefix();
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(root())
        .env("SECKILL_ADDR", format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", database)
        .env("SECKILL_BIN", env!("CARGO_BIN_EXE_seckill"))
        .env("SECKILL_REDIS_PREFIX", &prefix)
        .env("SECKILL_AMQP_PREFIX", &prefix)
        .env("SECKILL_QUEUE_CONSUME", "false")
        // The walkthrough uses the development token, as a reader would.
        .env_remove("SECKILL_ADMIN_TOKEN")
        // …and names its buyer in the body, as development mode without a
        // buyer token key takes it.
        .env_remove("SECKILL_BUYER_AUTH")
        .env_remove("SECKILL_BUYER_JWT_KEY")
        .env_remove("SECKILL_BUYER_JWT_KEY_FILE")
        .env_remove("SECKILL_BUYER_JWT_PUBLIC_KEY_FILE")
        .output()
        .expect("bash runs")
}

#[tokio::test]
async fn the_readme_walkthrough_buys_from_the_sale_it_created_on_a_database_with_other_sales() {
    let _heavy = test_support::heavy();
    let database = test_support::scratch_database("walkthrough").await;
    // Leftovers, as a comparison or an earlier try leaves them: user 42 has
    // already bought from sale 1, so a walkthrough aimed at sale 1 gets 409.
    let earlier =
        TestApp::spawn_with(|config| config.backends.database_url = database.clone()).await;
    let leftover = earlier.sale("sql", 1_000_000).await;
    earlier.create_sale(json!({ "name": "another", "stock": 5, "strategy": "sql" })).await;
    assert_eq!(earlier.buy(leftover, 42).await.status(), reqwest::StatusCode::CREATED);

    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = walkthrough(&readme).replace("localhost:8080", &format!("127.0.0.1:{port}"));
    let output = run_script(&script, port, &database);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Whatever happened, no service of this test outlives it.
    let stopped = run_script("scripts/serve.sh stop", port, &database);
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    assert!(output.status.success(), "the walkthrough failed:\n{stdout}\n{stderr}");

    let sale: i64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("sale "))
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `sale ID` line:\n{stdout}"));
    assert!(sale > leftover, "the walkthrough's sale {sale} is a new one");
    let order = stdout
        .lines()
        .find(|line| line.starts_with("{\"order_id\""))
        .unwrap_or_else(|| panic!("no order line:\n{stdout}"));
    assert!(order.ends_with(" 201"), "the purchase answered {order}");
    let audit: Value = stdout
        .lines()
        .find(|line| line.starts_with("{\"sale_id\""))
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no audit line:\n{stdout}"));
    assert_eq!((audit["sale_id"].as_i64(), audit["orders"].as_i64()), (Some(sale), Some(1)));
    assert_eq!(audit["units_sold"], 1, "{audit}");
    assert!(stdout.contains("stopped"), "the walkthrough stops the service:\n{stdout}");

    earlier.db.close().await;
    test_support::drop_scratch_database(&database).await;
}

/// A port `p` with `p + 1` and `p + 2` free too, a moment ago.
fn three_free_ports() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port < u16::MAX - 2 && free(port + 1) && free(port + 2) {
            return port;
        }
    }
}

#[tokio::test]
async fn serve_replicas_runs_two_replicas_behind_haproxy_that_share_the_books() {
    let _heavy = test_support::heavy();
    let database = test_database_url();
    let port = three_free_ports();
    let started = run_script("SERVE_REPLICAS=2 scripts/serve.sh", port, &database);
    let outcome = async move {
        let out = String::from_utf8_lossy(&started.stdout).into_owned();
        let err = String::from_utf8_lossy(&started.stderr);
        assert!(started.status.success(), "{out}\n{err}");
        assert!(out.contains("through HAProxy, 2 replicas"), "{out}");
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let body = json!({ "name": "replicas", "stock": 3, "strategy": "sql" });
        let sale = crate::support::create_sale_at(&base, "dev-admin-token", body).await;
        let mut statuses = Vec::new();
        for user in 1..=6 {
            let url = format!("{base}/sales/{sale}/orders");
            let answer = client.post(url).json(&json!({ "user_id": user })).send().await.unwrap();
            statuses.push(answer.status().as_u16());
        }
        statuses.sort();
        assert_eq!(statuses, [201, 201, 201, 409, 409, 409], "3 units, 6 buyers");
        let audit: Value = client
            .get(format!("{base}/admin/sales/{sale}/audit"))
            .bearer_auth("dev-admin-token")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!((audit["orders"].as_i64(), audit["oversold"].as_i64()), (Some(3), Some(0)));
        // Round robin: each replica answered purchases.
        for replica in [port + 1, port + 2] {
            let page = client
                .get(format!("http://127.0.0.1:{replica}/metrics"))
                .bearer_auth("dev-admin-token")
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let purchases = page.lines().any(|line| {
                line.starts_with("axum_http_requests_total{")
                    && line.contains(r#"endpoint="/sales/{id}/orders""#)
            });
            assert!(purchases, "replica on {replica} answered no purchase:\n{page}");
        }
    };
    let result = tokio::spawn(outcome).await;
    let stopped = run_script("scripts/serve.sh stop", port, &database);
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic.into_panic());
    }
}
