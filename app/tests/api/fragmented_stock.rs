//! Multi-unit purchases on fragmented stock, for every correct strategy: a
//! purchase of q units is sold whenever the sale has q units left in total
//! when it is decided — or answered `503 busy` — and never `sold_out`.
//!
//! A property test over seeded random cases: per case a stock, a per-user
//! limit and, for `sql/buckets`, every other case at least as many buckets
//! as units, so that every bucket holds 0 or 1 unit (the end of every bucket
//! sale), the others a few buckets that the purchases fragment. Waves of
//! concurrent buyers, each a new user asking for a random 1..=limit units,
//! buy until the sale is sold out. After each wave the books give the units
//! left; stock only falls (no payment window, no restock), so a buyer of q
//! told `sold_out` in a wave after which q units or more were left was
//! refused while the units were there. Then the audit must be exact and the
//! orders must be the `201`s.
//!
//! The seed is printed with every failure; `SECKILL_TEST_SEED=<n>` replays it.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use test_support::RedisServer;

use crate::support::{TestApp, resolved};

/// Every strategy expected to keep exact books (`lock/redlock` over three
/// Redis nodes of the test's own, `queue` with a consumer on queues of its
/// own).
const CORRECT: &[&str] = &[
    "sql",
    "sql/for-update",
    "sql/batched",
    "sql/buckets",
    "redis-decr",
    "lock/watchdog",
    "lock/fenced",
    "lock/fair",
    "lock/redlock",
    "queue",
];

/// Random cases per strategy.
const CASES: u64 = 4;

/// Waves after which a sale that is not sold out fails the case.
const MAX_WAVES: usize = 60;

/// One random case: the sale and the buyers of each wave.
#[derive(Debug)]
struct Case {
    stock: i64,
    per_user_limit: i64,
    /// For `sql/buckets`: at least `stock` when `one_per_bucket`, so each
    /// bucket holds 0 or 1 unit from the start; else 2 to 8, several units
    /// each, which the waves' purchases leave scattered.
    buckets: i32,
    /// The quantity of each buyer, wave by wave.
    waves: Vec<Vec<i64>>,
}

impl Case {
    fn draw(rng: &mut StdRng, one_per_bucket: bool) -> Case {
        let stock = rng.random_range(8..=24);
        let per_user_limit = rng.random_range(2..=4);
        let buckets = if one_per_bucket {
            rng.random_range(stock..=2 * stock)
        } else {
            rng.random_range(2..=8)
        } as i32;
        let waves = (0..MAX_WAVES)
            .map(|_| {
                let buyers = rng.random_range(3..=8);
                (0..buyers).map(|_| rng.random_range(1..=per_user_limit)).collect()
            })
            .collect();
        Case { stock, per_user_limit, buckets, waves }
    }
}

/// What one purchase was finally answered (for `queue`, its request's result).
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Placed,
    SoldOut,
    Busy,
    Other(String),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_correct_strategy_sells_q_units_whenever_the_sale_has_them() {
    let seed = std::env::var("SECKILL_TEST_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    let nodes =
        [RedisServer::start().await, RedisServer::start().await, RedisServer::start().await];
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let prefix = test_support::unique_prefix();
    let queues = prefix.clone();
    let app = TestApp::spawn_with(move |config| {
        config.strategies.lock.redlock_urls = urls;
        config.backends.amqp_prefix = queues;
        config.strategies.queue.partitions = 1;
        config.strategies.queue.consume = true;
    })
    .await;
    let mut failures = Vec::new();
    for (index, &strategy) in CORRECT.iter().enumerate() {
        for case in 0..CASES {
            let case_seed = seed ^ ((index as u64) << 32 | case);
            let drawn = Case::draw(&mut StdRng::seed_from_u64(case_seed), case % 2 == 0);
            if let Err(failure) = run_case(&app, strategy, &drawn).await {
                let Case { stock, per_user_limit, buckets, .. } = drawn;
                failures.push(format!(
                    "{strategy}, case {case} (stock {stock}, limit {per_user_limit}, \
                     {buckets} buckets for sql/buckets): {failure}"
                ));
            }
        }
    }
    crate::support::delete_queues(&prefix, 1).await;
    assert!(failures.is_empty(), "SECKILL_TEST_SEED={seed}:\n{}", failures.join("\n"));
}

/// Sells the sale of `case` under `strategy` wave by wave until it is sold
/// out; the first broken property, if any.
async fn run_case(app: &TestApp, strategy: &str, case: &Case) -> Result<(), String> {
    let mut body = json!({ "name": format!("{strategy} fragmented"), "stock": case.stock,
                           "strategy": strategy, "per_user_limit": case.per_user_limit });
    if strategy == "sql/buckets" {
        body["buckets"] = json!(case.buckets);
    }
    let sale = app.create_sale(body).await["id"].as_i64().unwrap();
    let mut placed = BTreeMap::new();
    let mut next_user = 1;
    let mut left = case.stock;
    for (wave, quantities) in case.waves.iter().enumerate() {
        let buyers: Vec<(i64, i64)> =
            quantities.iter().enumerate().map(|(i, &q)| (next_user + i as i64, q)).collect();
        next_user += buyers.len() as i64;
        let answers = wave_of(app, sale, &buyers).await;
        left = app.audit(sale).await.remaining_stock;
        for ((user, quantity), answer) in buyers.iter().zip(&answers) {
            match answer {
                Answer::Placed => {
                    placed.insert(*user, *quantity as i32);
                }
                Answer::SoldOut if *quantity <= left => {
                    return Err(format!(
                        "wave {wave}: buyer {user} of {quantity} told sold_out, and {left} units \
                         were left after the wave (answers {answers:?} to {buyers:?})"
                    ));
                }
                Answer::SoldOut | Answer::Busy => {}
                Answer::Other(other) => {
                    return Err(format!("wave {wave}: buyer {user} of {quantity}: {other}"));
                }
            }
        }
        if left == 0 {
            break;
        }
    }
    if left != 0 {
        return Err(format!("{left} units still left after {MAX_WAVES} waves"));
    }
    let audit = app.audit(sale).await;
    let sold: i64 = placed.values().map(|&q| i64::from(q)).sum();
    let books = (audit.total_stock, audit.units_sold, audit.remaining_stock, audit.orders);
    let exact = (audit.oversold, audit.ledger_drift, audit.duplicate_orders);
    if books != (case.stock, sold, 0, placed.len() as i64) || exact != (0, 0, 0) {
        return Err(format!("the books are not exact for {sold} units placed: {audit:?}"));
    }
    let orders: BTreeMap<i64, i32> =
        sqlx::query_as("SELECT user_id, quantity FROM orders WHERE sale_id = $1")
            .bind(sale)
            .fetch_all(&app.db)
            .await
            .unwrap()
            .into_iter()
            .collect();
    if orders != placed {
        return Err(format!("the orders {orders:?} are not the 201s {placed:?}"));
    }
    Ok(())
}

/// `buyers` (user, quantity) of `sale` all at once; each one's final answer,
/// in their order.
async fn wave_of(app: &TestApp, sale: i64, buyers: &[(i64, i64)]) -> Vec<Answer> {
    let purchases = buyers.iter().map(|&(user, quantity)| async move {
        let response = app.order(sale, json!({ "user_id": user, "quantity": quantity })).await;
        answer_of(app, sale, quantity, response).await
    });
    futures_util::future::join_all(purchases).await
}

/// The final answer to a purchase of `quantity` units: its own, or for a
/// `202` its request's result.
async fn answer_of(app: &TestApp, sale: i64, quantity: i64, response: reqwest::Response) -> Answer {
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let kind = body["type"].as_str().unwrap_or_default();
    match status {
        StatusCode::CREATED if body["quantity"] == quantity => Answer::Placed,
        StatusCode::CONFLICT if kind == "/problems/sold-out" => Answer::SoldOut,
        StatusCode::SERVICE_UNAVAILABLE if kind == "/problems/busy" => Answer::Busy,
        StatusCode::ACCEPTED => {
            let id = body["request_id"].as_str().expect("a request id");
            let result = resolved(app, sale, id, Duration::from_secs(20)).await;
            match result["status"].as_str() {
                Some("placed") if result["quantity"] == quantity => Answer::Placed,
                Some("sold_out") => Answer::SoldOut,
                _ => Answer::Other(format!("request result {result}")),
            }
        }
        _ => Answer::Other(format!("{status} {body}")),
    }
}
