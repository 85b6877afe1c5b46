//! The stock-deduction strategies under a burst: every buyer at once, no
//! injected delay. `sql` and `sql/for-update` must sell exactly the stock and
//! keep the ledger exact, round after round; `naive` must visibly break.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use seckill::audit::Audit;
use serde_json::{Value, json};

use crate::support::TestApp;

const STOCK: i64 = 50;
const BUYERS: i64 = 200;
const ROUNDS: usize = 3;

/// What a burst of purchases answered: the count of each answer, keyed by
/// `201` or by the problem type of a refusal.
#[derive(Debug, Default)]
struct Answers(BTreeMap<String, usize>);

impl Answers {
    fn count(&self, key: &str) -> usize {
        self.0.get(key).copied().unwrap_or(0)
    }
    fn total(&self) -> usize {
        self.0.values().sum()
    }
}

/// `BUYERS` distinct users buy one unit each of a fresh `STOCK`-unit sale
/// under `strategy`, all at once. Returns the answers and the sale's audit.
async fn burst_sale(app: &TestApp, strategy: &str) -> (Answers, Audit) {
    let sale = app.sale(strategy, STOCK).await;
    let mut tasks = tokio::task::JoinSet::new();
    for user in 1..=BUYERS {
        let client = app.client.clone();
        let url = app.url(&format!("/sales/{sale}/orders"));
        tasks.spawn(async move {
            let response = client.post(url).json(&json!({ "user_id": user })).send().await;
            let response = response.expect("the service answers");
            let status = response.status();
            let body: Value = response.json().await.expect("a JSON answer");
            if status == StatusCode::CREATED {
                "201".to_owned()
            } else {
                format!("{} {}", status.as_u16(), body["type"].as_str().unwrap_or("?"))
            }
        });
    }
    let mut answers = Answers::default();
    for key in tasks.join_all().await {
        *answers.0.entry(key).or_default() += 1;
    }
    (answers, app.audit(sale).await)
}

/// Asserts a run sold exactly its stock: `STOCK` orders, every other buyer
/// told `sold-out`, nothing left, the ledger exact, no duplicates.
fn assert_sold_exactly_the_stock(strategy: &str, round: usize, answers: &Answers, audit: &Audit) {
    let context = format!("{strategy}, round {round}: {answers:?} {audit:?}");
    assert_eq!(answers.total(), BUYERS as usize, "{context}");
    assert_eq!(answers.count("201"), STOCK as usize, "{context}");
    assert_eq!(answers.count("409 /problems/sold-out"), (BUYERS - STOCK) as usize, "{context}");
    assert_eq!(audit.total_stock, STOCK, "{context}");
    assert_eq!(audit.units_sold, STOCK, "{context}");
    assert_eq!(audit.orders, STOCK, "{context}");
    assert_eq!(audit.remaining_stock, 0, "{context}");
    assert_eq!(audit.oversold, 0, "{context}");
    assert_eq!(audit.ledger_drift, 0, "{context}");
    assert_eq!(audit.duplicate_orders, 0, "{context}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_strategy_never_oversells_under_200_concurrent_buyers() {
    let app = TestApp::spawn().await;
    for round in 1..=ROUNDS {
        let (answers, audit) = burst_sale(&app, "sql").await;
        assert_sold_exactly_the_stock("sql", round, &answers, &audit);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_for_update_strategy_never_oversells_under_200_concurrent_buyers() {
    let app = TestApp::spawn().await;
    for round in 1..=ROUNDS {
        let (answers, audit) = burst_sale(&app, "sql/for-update").await;
        assert_sold_exactly_the_stock("sql/for-update", round, &answers, &audit);
    }
}

/// `naive` reads the stock, checks it and writes back the value it computed:
/// concurrent buyers overwrite each other's decrements. The race needs no
/// help, but whether one burst hits it is a matter of scheduling, so the test
/// allows a few bursts and asserts that one of them broke the books.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn naive_strategy_loses_updates_under_200_concurrent_buyers() {
    const ATTEMPTS: usize = 5;
    let app = TestApp::spawn().await;
    let mut runs = Vec::new();
    for _ in 0..ATTEMPTS {
        let (answers, audit) = burst_sale(&app, "naive").await;
        // It breaks through lost updates, never through errors: every buyer
        // still gets an order or a sold-out answer.
        assert_eq!(
            answers.count("201") + answers.count("409 /problems/sold-out"),
            BUYERS as usize,
            "{answers:?}"
        );
        // Whatever it lost, the audit must tell it from what happened: the
        // stock created, the stock column as Postgres holds it, the orders
        // the buyers were told of.
        let remaining: i64 = sqlx::query_scalar("SELECT remaining_stock FROM sales WHERE id = $1")
            .bind(audit.sale_id.0)
            .fetch_one(&app.db)
            .await
            .unwrap();
        let placed = answers.count("201") as i64;
        assert_eq!((audit.total_stock, audit.units_sold), (STOCK, placed), "{audit:?}");
        assert_eq!(audit.ledger_drift, STOCK - remaining - placed, "{audit:?}");
        let broke = audit.oversold > 0 || audit.ledger_drift != 0;
        runs.push(audit);
        if broke {
            let audit = runs.last().unwrap();
            // A lost update sells a unit the stock column never gave up.
            assert!(audit.ledger_drift < 0, "{audit:?}");
            assert!(audit.units_sold > audit.total_stock - audit.remaining_stock, "{audit:?}");
            return;
        }
    }
    panic!("naive kept exact books in {ATTEMPTS} bursts of {BUYERS} buyers: {runs:#?}");
}
