//! End to end: `loadtest compare --strategies sql,queue` on a small sale and
//! two real instances: the `queue` run resolves every accepted request, keeps
//! exact books, and fills its queue fields, its cost in AMQP messages and the
//! two queue ceilings (docs/report-format.md); and it writes into the
//! database `--database-url` names.

const STOCK: i64 = 200;

use crate::support::test_database_url;

/// Sales of the test database with an id above `after` and `name`.
fn sales_named(after: i64, name: &str) -> i64 {
    use sqlx::Connection as _;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // No database yet: the comparison's instances create it.
        let Ok(mut conn) = sqlx::PgConnection::connect(&test_database_url()).await else {
            return 0;
        };
        sqlx::query_scalar("SELECT count(*) FROM sales WHERE id > $1 AND name = $2")
            .bind(after)
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .unwrap_or(0)
    })
}

/// The largest sale id of the test database (0 when there is none yet).
fn last_sale_id() -> i64 {
    use sqlx::Connection as _;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let Ok(mut conn) = sqlx::PgConnection::connect(&test_database_url()).await else {
            return 0;
        };
        let last: Option<i64> = sqlx::query_scalar("SELECT max(id) FROM sales")
            .fetch_one(&mut conn)
            .await
            .unwrap_or(None);
        last.unwrap_or(0)
    })
}

#[test]
fn compare_reports_the_queue_strategy_with_its_ceilings_and_queue_fields() {
    let out = std::env::temp_dir().join(format!("loadtest-queue-{}", std::process::id()));
    let before = last_sale_id();
    let stock = STOCK.to_string();
    let args = ["--strategies", "sql,queue", "--stock", &stock, "--repeat", "1"];
    let report = crate::support::compare(&out, &args);
    // `--database-url` chose where the comparison writes: the test database.
    for name in ["sql / burst / 1 / sale 1", "queue / burst / 1 / sale 1"] {
        assert!(sales_named(before, name) >= 1, "{name} is not in the test database");
    }

    let ceilings = &report["ceilings"];
    assert!(ceilings["amqp_rps"]["value"].as_f64().unwrap() > 0.0, "{ceilings}");
    let drain = &ceilings["queue_drain_units_per_s"];
    assert_eq!(drain["units"], 20_000, "{drain}");
    assert!(drain["value"].as_f64().unwrap() > 0.0, "{drain}");
    assert!(drain["ratio_vs_sql_tps"].as_f64().unwrap() > 0.0, "{drain}");

    let runs = report["runs"].as_array().unwrap();
    let sql = runs.iter().find(|r| r["strategy"] == "sql").unwrap();
    assert!(sql["accepted_unresolved"].is_null() && sql["batch_sizes"].is_null(), "{sql}");
    assert!(sql["cost"]["amqp_messages_per_unit"].is_null());
    let queue = runs.iter().find(|r| r["strategy"] == "queue").unwrap();
    assert_eq!(
        (&queue["expected"], &queue["verdict"]),
        (&"correct".into(), &"ok".into()),
        "{queue}"
    );
    assert_eq!(queue["units_sold"], STOCK);
    assert_eq!((queue["oversold"].as_i64(), queue["undersold"].as_i64()), (Some(0), Some(0)));
    assert_eq!((queue["ledger_drift"].as_i64(), queue["errors_5xx"].as_i64()), (Some(0), Some(0)));
    assert_eq!(queue["accepted_unresolved"], 0, "{queue}");
    let accepted = queue["outcomes"]["accepted"].as_i64().unwrap();
    assert!(accepted >= STOCK, "{queue}");
    assert_eq!(queue["outcomes"]["placed"], 0, "queue purchases are answered 202, not 201");
    assert_eq!(queue["outcomes"]["rejected"], 0);
    // Accept → resolved takes time, and the percentiles are ordered.
    let e2e: Vec<f64> = ["p50", "p95", "p99", "max"]
        .map(|key| queue["e2e_latency_ms"][key].as_f64().unwrap())
        .to_vec();
    assert!(e2e[0] > 0.0, "{queue}");
    assert!(e2e.windows(2).all(|pair| pair[0] <= pair[1]), "e2e latency {e2e:?}");
    let batches = &queue["batch_sizes"];
    assert!(batches["max"].as_f64().unwrap() >= 1.0 && batches["mean"].as_f64().unwrap() >= 1.0);
    // Every unit sold was published and consumed at least once.
    let messages = queue["cost"]["amqp_messages_per_unit"].as_f64().unwrap();
    assert!(messages >= 2.0, "amqp_messages_per_unit {messages}");
    assert!(queue["sell_through_per_s"].as_f64().unwrap() > 0.0);
    assert!(queue["ratio"]["sell_through_vs_sql_strategy"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&out);
}
