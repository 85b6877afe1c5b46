//! The goose scenarios: the sale phase (every buyer as its profile says), the
//! rejection phase (fresh buyers against the sold-out sale), and the trivial
//! endpoint for the `http_rps` ceiling.
//!
//! Goose counts every non-2xx answer as a failure unless told otherwise; here
//! a `409` and a designed `503 busy` are expected outcomes and are marked as
//! successes, while the outcome of every answer is classified from its
//! problem `type` into [`Outcomes`].
//!
//! With buyer authentication on (`--buyer-auth on`), every purchase carries
//! its buyer's token ([`Tokens`]) and an empty body, as a client of such a
//! service would send it.

pub mod arrival;
mod line;
pub mod payment;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use goose::config::GooseConfiguration;
use goose::prelude::*;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Name of the purchase request in goose's metrics (key `POST purchase`).
const PURCHASE: &str = "purchase";

/// Name of a flooding buyer's purchases (`flood` profile), kept apart from
/// [`PURCHASE`] so that the phase's latency is the other buyers'.
const FLOOD: &str = "flood";

/// How long the buyer tokens of a run are valid, in seconds: longer than any
/// run.
const TOKEN_TTL_S: u64 = 6 * 3600;

/// The buyer tokens of a run whose instances verify them: signed with the
/// instances' `HS256` key, those of the sale phase's buyers up front (so
/// that signing costs the load generator nothing while it measures), any
/// other buyer's when first needed.
#[derive(Clone)]
pub struct Tokens {
    key: Arc<[u8]>,
    exp: u64,
    signed: Arc<HashMap<i64, String>>,
}

impl Tokens {
    /// Tokens for `users`, signed with `key`.
    pub fn new(key: &str, users: impl IntoIterator<Item = i64>) -> Tokens {
        let exp = seckill::buyer_token::now_s() + TOKEN_TTL_S;
        let signed = users
            .into_iter()
            .map(|user| (user, seckill::buyer_token::mint_hs256(key.as_bytes(), user, exp)))
            .collect();
        Tokens { key: key.as_bytes().into(), exp, signed: Arc::new(signed) }
    }

    /// The token of `user`.
    fn of(&self, user: i64) -> std::borrow::Cow<'_, str> {
        match self.signed.get(&user) {
            Some(token) => token.as_str().into(),
            None => seckill::buyer_token::mint_hs256(&self.key, user, self.exp).into(),
        }
    }
}

/// Answers by kind, as the report's `outcomes`.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Outcomes {
    pub placed: u64,
    /// `202 Accepted` (`queue`): settled later; see the run's
    /// `accepted_unresolved`.
    #[serde(default)]
    pub accepted: u64,
    /// Accepted requests the consumer dead-lettered (`queue`; from its
    /// queue statistics, not from an HTTP answer).
    #[serde(default)]
    pub rejected: u64,
    pub sold_out: u64,
    pub already_purchased: u64,
    pub busy: u64,
    pub unavailable: u64,
    pub not_started: u64,
    pub ended: u64,
    pub invalid: u64,
    pub other: u64,
}

/// The answers of a phase by kind, counted as they arrive; the caller of
/// [`sale_phase`] may read them while it runs (the live view does).
#[derive(Default)]
pub struct OutcomeCounters {
    placed: AtomicU64,
    accepted: AtomicU64,
    sold_out: AtomicU64,
    already_purchased: AtomicU64,
    busy: AtomicU64,
    unavailable: AtomicU64,
    not_started: AtomicU64,
    ended: AtomicU64,
    invalid: AtomicU64,
    other: AtomicU64,
    /// 5xx answers other than the designed `busy`.
    errors_5xx: AtomicU64,
}

impl Outcomes {
    /// Answers that neither placed nor accepted a purchase.
    pub fn refused(&self) -> u64 {
        self.sold_out
            + self.already_purchased
            + self.busy
            + self.unavailable
            + self.not_started
            + self.ended
            + self.invalid
            + self.other
    }
}

impl OutcomeCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> Outcomes {
        Outcomes {
            placed: self.placed.load(Relaxed),
            accepted: self.accepted.load(Relaxed),
            rejected: 0,
            sold_out: self.sold_out.load(Relaxed),
            already_purchased: self.already_purchased.load(Relaxed),
            busy: self.busy.load(Relaxed),
            unavailable: self.unavailable.load(Relaxed),
            not_started: self.not_started.load(Relaxed),
            ended: self.ended.load(Relaxed),
            invalid: self.invalid.load(Relaxed),
            other: self.other.load(Relaxed),
        }
    }
}

impl OutcomeCounters {
    /// Counts one answer of `kind` with HTTP `status`.
    fn count(&self, kind: Kind, status: u16) {
        let counter = match kind {
            Kind::Placed => &self.placed,
            Kind::Accepted => &self.accepted,
            Kind::SoldOut => &self.sold_out,
            Kind::AlreadyPurchased => &self.already_purchased,
            Kind::Busy => &self.busy,
            Kind::Unavailable => &self.unavailable,
            Kind::NotStarted => &self.not_started,
            Kind::Ended => &self.ended,
            Kind::Invalid => &self.invalid,
            Kind::Other => &self.other,
        };
        counter.fetch_add(1, Relaxed);
        if status >= 500 && kind != Kind::Busy {
            self.errors_5xx.fetch_add(1, Relaxed);
        }
    }
}

/// The kind of one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Placed,
    Accepted,
    SoldOut,
    AlreadyPurchased,
    Busy,
    Unavailable,
    NotStarted,
    Ended,
    Invalid,
    Other,
}

impl Kind {
    /// A designed answer that goose must count as a success, although its
    /// status is not 2xx: the sale said no (`409`) or asked to retry
    /// (`503 busy`).
    fn is_expected(self) -> bool {
        matches!(
            self,
            Kind::SoldOut | Kind::AlreadyPurchased | Kind::NotStarted | Kind::Ended | Kind::Busy
        )
    }
}

/// The kind of an answer, from its status and its problem `type`.
fn classify(status: u16, body: &[u8]) -> Kind {
    match status {
        201 => return Kind::Placed,
        202 => return Kind::Accepted,
        _ => {}
    }
    let problem: Option<Value> = serde_json::from_slice(body).ok();
    let kind = problem.as_ref().and_then(|p| p["type"].as_str()).unwrap_or("");
    match (status, kind.rsplit('/').next().unwrap_or("")) {
        (409, "sold-out") => Kind::SoldOut,
        (409, "already-purchased") => Kind::AlreadyPurchased,
        (409, "not-started") => Kind::NotStarted,
        (409, "ended") => Kind::Ended,
        (503, "busy") => Kind::Busy,
        (503, "unavailable") => Kind::Unavailable,
        (400 | 404 | 413 | 415 | 422, _) => Kind::Invalid,
        _ => Kind::Other,
    }
}

/// What a purchase answer promised, as its body says: a `201`'s order or a
/// `202`'s request. The load test keeps every one it was given, to check
/// after a fault that each still holds (`crate::fault::accepted_lost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// `201 Created`: `order_id` of the body.
    Order(i64),
    /// `202 Accepted`: `request_id` of the body.
    Request(uuid::Uuid),
}

impl Receipt {
    /// The receipt of an answer with `status` and `body`; `None` for any
    /// other answer, or a body without the id.
    fn of(status: u16, body: &[u8]) -> Option<Receipt> {
        let body: Value = serde_json::from_slice(body).ok()?;
        match status {
            201 => body["order_id"].as_i64().map(Receipt::Order),
            202 => body["request_id"].as_str()?.parse().ok().map(Receipt::Request),
            _ => None,
        }
    }
}

/// One answer of the sale phase: when it arrived, its status (0: no answer,
/// the connection failed or timed out) and what it promised.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub at: Instant,
    pub status: u16,
    pub receipt: Option<Receipt>,
}

/// Every answer of a sale phase, in arrival order; kept only for fault runs.
#[derive(Default)]
pub struct AnswerLog {
    answers: Mutex<Vec<Answer>>,
}

impl AnswerLog {
    fn push(&self, answer: Answer) {
        if let Ok(mut answers) = self.answers.lock() {
            answers.push(answer);
        }
    }

    /// The answers so far.
    pub fn answers(&self) -> Vec<Answer> {
        self.answers.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

/// One buyer of the sale phase: `user` buys one unit of `sale`, sending the
/// purchase `sends` times back to back (each send waits for the answer to
/// the previous one). A `flood` send is one of a flooding buyer's extra
/// purchases, timed apart from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buyer {
    pub sale: i64,
    pub user: i64,
    pub sends: u32,
    pub flood: bool,
}

/// Shared state of one goose attack on the sales of one run.
struct Attack {
    /// The run's sales; the rejection phase spreads fresh buyers over them.
    sales: Vec<i64>,
    urls: Vec<String>,
    retries: u32,
    /// Buyers of the sale phase, in sending order (resubmissions included).
    buyers: Vec<Buyer>,
    next_buyer: AtomicUsize,
    /// Rejection phase: the next fresh buyer id.
    next_fresh: AtomicI64,
    counters: Arc<OutcomeCounters>,
    answers: AtomicU64,
    first_send: OnceLock<(Instant, DateTime<Utc>)>,
    /// Nanoseconds after `first_send` of the latest answer.
    last_answer_ns: AtomicU64,
    /// Seconds after `first_send` of every answer, for the steady rate.
    answer_times_s: Mutex<Vec<f64>>,
    /// The buyers' tokens, when the instances verify them.
    tokens: Option<Tokens>,
    /// Every answer with its receipt (fault runs only).
    log: Option<Arc<AnswerLog>>,
}

impl Attack {
    fn new(
        sales: &[i64],
        urls: &[String],
        retries: u32,
        buyers: Vec<Buyer>,
        first_fresh: i64,
        counters: Arc<OutcomeCounters>,
        tokens: Option<Tokens>,
    ) -> Self {
        Attack {
            sales: sales.to_vec(),
            urls: urls.to_vec(),
            retries,
            buyers,
            next_buyer: AtomicUsize::new(0),
            next_fresh: AtomicI64::new(first_fresh),
            counters,
            answers: AtomicU64::new(0),
            first_send: OnceLock::new(),
            last_answer_ns: AtomicU64::new(0),
            answer_times_s: Mutex::new(Vec::new()),
            tokens,
            log: None,
        }
    }

    /// Sends `buyer`'s `method` request to `url`, named `name` in goose's
    /// metrics: with the buyer's signed identity when the run signs them,
    /// else with `user_id` added to the JSON `body`. A request without a
    /// body (`None`) names its buyer in its path.
    async fn send_as(
        &self,
        user: &mut GooseUser,
        method: GooseMethod,
        url: &str,
        name: &str,
        buyer: i64,
        body: Option<serde_json::Map<String, Value>>,
    ) -> Result<goose::goose::GooseResponse, Box<TransactionError>> {
        let mut builder = user.get_request_builder(&method, url)?;
        let body = match &self.tokens {
            Some(tokens) => {
                builder = builder.bearer_auth(tokens.of(buyer));
                body
            }
            None => body.map(|mut body| {
                body.insert("user_id".to_owned(), json!(buyer));
                body
            }),
        };
        if let Some(body) = body {
            builder = builder.json(&body);
        }
        let request = GooseRequest::builder()
            .method(method)
            .path(url)
            .name(name)
            .set_request_builder(builder)
            .build();
        user.request(request).await
    }

    /// Counts an answer received now, `start` being the phase's first send.
    fn answered(&self, start: Instant) {
        let elapsed = start.elapsed();
        self.answers.fetch_add(1, Relaxed);
        self.last_answer_ns.fetch_max(elapsed.as_nanos() as u64, Relaxed);
        if let Ok(mut times) = self.answer_times_s.lock() {
            times.push(elapsed.as_secs_f64());
        }
    }

    /// Points `user` at its instance: users are spread round-robin.
    fn assign(&self, user: &mut GooseUser) -> TransactionResult {
        let url = &self.urls[user.weighted_users_index % self.urls.len()];
        user.set_base_url(&format!("{url}/"))
    }

    /// One buyer's purchase from `sale`, retrying a `busy` answer up to
    /// `retries` times after [`backoff_s`], ±50 % jitter; `name` is the
    /// request's name in goose's metrics. A request that got no answer (its
    /// instance died or refused the connection) is retried the same way on
    /// the next instance, as a load balancer in front of them would: a dead
    /// instance does not use up the buyers.
    async fn purchase(
        &self,
        user: &mut GooseUser,
        sale: i64,
        buyer: i64,
        name: &str,
    ) -> TransactionResult {
        self.purchase_answer(user, sale, buyer, name, None).await.map(|_| ())
    }

    /// [`Attack::purchase`], answering the kind of the last answer and what
    /// it promised.
    async fn purchase_answer(
        &self,
        user: &mut GooseUser,
        sale: i64,
        buyer: i64,
        name: &str,
        admission: Option<&str>,
    ) -> Result<(Kind, Option<Receipt>), Box<TransactionError>> {
        let mut instance = user.weighted_users_index % self.urls.len();
        let mut last = (Kind::Other, None);
        for attempt in 0..=self.retries {
            let (start, _) = *self.first_send.get_or_init(|| (Instant::now(), Utc::now()));
            let url = format!("{}/sales/{sale}/orders", self.urls[instance]);
            let mut body = serde_json::Map::new();
            if let Some(admission) = admission {
                body.insert("admission".to_owned(), json!(admission));
            }
            let mut goose =
                self.send_as(user, GooseMethod::Post, &url, name, buyer, Some(body)).await?;
            let status = goose.request.status_code;
            let unanswered = goose.response.is_err();
            let (retry_after_s, body) = read_answer(goose.response).await;
            self.answered(start);
            let kind = classify(status, &body);
            self.counters.count(kind, status);
            let receipt = Receipt::of(status, &body);
            if let Some(log) = &self.log {
                log.push(Answer { at: Instant::now(), status, receipt });
            }
            if kind.is_expected() {
                user.set_success(&mut goose.request)?;
            }
            last = (kind, receipt);
            if unanswered {
                instance = (instance + 1) % self.urls.len();
            } else if kind != Kind::Busy {
                break;
            }
            if attempt == self.retries {
                break;
            }
            let jittered = backoff_s(attempt, retry_after_s) * rand::rng().random_range(0.5..1.5);
            tokio::time::sleep(Duration::from_secs_f64(jittered)).await;
        }
        Ok(last)
    }
}

/// The `Retry-After` seconds (0 when absent or not a number) and the body
/// of an answer; nothing of a request that got no answer.
async fn read_answer(response: Result<reqwest::Response, reqwest::Error>) -> (f64, Vec<u8>) {
    let Ok(response) = response else { return (0.0, Vec::new()) };
    let retry_after_s = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    (retry_after_s, response.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
}

/// Seconds before retry `attempt + 1` of a `busy` answer, before jitter:
/// `20 ms · 2^attempt`, but never less than `Retry-After` asks (a polite
/// client).
fn backoff_s(attempt: u32, retry_after_s: f64) -> f64 {
    (0.02 * 2f64.powi(attempt as i32)).max(retry_after_s)
}

/// Latency percentiles in milliseconds (goose times to the first byte).
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Latency {
    /// The percentiles of goose's timings of one request name.
    fn of(timings: &goose::metrics::GooseRequestMetricTimingData) -> Latency {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            p50: ms(timings.percentile_us(0.50)),
            p95: ms(timings.percentile_us(0.95)),
            p99: ms(timings.percentile_us(0.99)),
            max: ms(timings.maximum_time_us),
        }
    }
}

/// The flooding buyer's purchases of a `flood` run (`runs[].flood`).
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Flood {
    /// Purchases the flooding buyer sent (retries of `busy` included).
    pub requests: u64,
    /// Their answers by HTTP status.
    pub status_counts: BTreeMap<String, u64>,
    /// Their latency; the run's `latency_ms` is the other buyers'.
    pub latency_ms: Latency,
}

/// What one phase measured.
pub struct PhaseResult {
    /// Answers received (every attempt counts).
    pub requests: u64,
    /// From the first request sent to the last answer, seconds.
    pub duration_s: f64,
    /// Answers per second between 10 % and 90 % of the phase
    /// ([`crate::steady::answer_rate`]).
    pub steady_rps: f64,
    pub first_send: Option<DateTime<Utc>>,
    pub outcomes: Outcomes,
    pub errors_5xx: u64,
    pub status_counts: BTreeMap<String, u64>,
    pub latency_ms: Latency,
    /// The flooding buyer's purchases (`flood` profile), apart.
    pub flood: Option<Flood>,
}

fn base_config(urls: &[String], users: u64) -> GooseConfiguration {
    let mut config = GooseConfiguration::default();
    config.host = Some(format!("{}/", urls[0]));
    config.users = Some(users as usize);
    // Every user starts within the first 0.1 s: a burst, not a ramp (the
    // steady windows of `crate::steady` assume so).
    config.increase_rate = Some((users * 10).to_string());
    config.quiet = 1;
    config.no_print_metrics = true;
    config.no_error_summary = true;
    config.no_telnet = true;
    config.timeout = Some("60".to_owned());
    config
}

async fn execute(
    config: GooseConfiguration,
    transaction: Transaction,
    attack: &Attack,
) -> anyhow::Result<PhaseResult> {
    execute_on(GooseAttack::initialize_with_config(config)?, transaction, attack).await
}

/// [`execute`] with one HTTP client shared by every user instead of one
/// each: for phases with thousands of users (`arrival`), where a client per
/// user costs seconds to build. The shared client keeps as many connections
/// as requests are in flight, as the users' own would.
async fn execute_shared_client(
    config: GooseConfiguration,
    transaction: Transaction,
    attack: &Attack,
) -> anyhow::Result<PhaseResult> {
    let client = goose::client::GooseClientBuilder::new().without_cookies();
    let goose =
        GooseAttack::initialize_with_config(config)?.set_client_builder_without_cookies(client)?;
    execute_on(goose, transaction, attack).await
}

async fn execute_on(
    goose: GooseAttack,
    transaction: Transaction,
    attack: &Attack,
) -> anyhow::Result<PhaseResult> {
    // Goose prints "All N users launched." to stdout whatever `quiet` says;
    // the report goes to stdout after the phases, so silence it meanwhile.
    // (`None` when stdout is already redirected by another gag.)
    let _quiet_stdout = gag::Gag::stdout().ok();
    let metrics = goose
        .register_scenario(scenario!("FlashSale").register_transaction(transaction))
        .execute()
        .await?;
    let mut status_counts = BTreeMap::new();
    let mut latency_ms = Latency::default();
    if let Some(purchase) = metrics.requests.get(&format!("POST {PURCHASE}")) {
        for (status, count) in &purchase.status_code_counts {
            status_counts.insert(status.to_string(), *count as u64);
        }
        latency_ms = Latency::of(&purchase.raw_data);
    }
    let flood = metrics.requests.get(&format!("POST {FLOOD}")).map(|flood| Flood {
        requests: flood.raw_data.counter as u64,
        status_counts: flood
            .status_code_counts
            .iter()
            .map(|(s, n)| (s.to_string(), *n as u64))
            .collect(),
        latency_ms: Latency::of(&flood.raw_data),
    });
    let duration_s = attack.last_answer_ns.load(Relaxed) as f64 / 1e9;
    let times = attack.answer_times_s.lock().map(|t| t.clone()).unwrap_or_default();
    Ok(PhaseResult {
        requests: attack.answers.load(Relaxed),
        duration_s,
        steady_rps: crate::steady::answer_rate(&times, duration_s),
        first_send: attack.first_send.get().map(|(_, at)| *at),
        outcomes: attack.counters.snapshot(),
        errors_5xx: attack.counters.errors_5xx.load(Relaxed),
        status_counts,
        latency_ms,
        flood,
    })
}

/// The buyers of a sale phase: `distinct` buyers with ids `1..=distinct`,
/// buyer `i` on sale `sales[(i − 1) mod sales.len()]`, each sending
/// `sends` times back to back, and a `resubmit` fraction of them sending
/// once more later, in shuffled order.
pub fn buyers(distinct: u64, sales: &[i64], sends: u32, resubmit: f64) -> Vec<Buyer> {
    use rand::seq::{IndexedRandom, SliceRandom};
    let mut rng = rand::rng();
    let mut buyers: Vec<Buyer> = (1..=distinct as i64)
        .map(|user| Buyer {
            sale: sales[(user as usize - 1) % sales.len()],
            user,
            sends,
            flood: false,
        })
        .collect();
    let again = ((distinct as f64) * resubmit.clamp(0.0, 1.0)).round() as usize;
    let repeats: Vec<Buyer> =
        buyers.choose_multiple(&mut rng, again).map(|buyer| Buyer { sends: 1, ..*buyer }).collect();
    buyers.extend(repeats);
    buyers.shuffle(&mut rng);
    buyers
}

/// `buyers` with `extra` more single purchases by buyer 1, shuffled among
/// the others' sends (`buyers` is in random order already, so shuffling
/// again only places the flood).
pub fn with_flood(mut buyers: Vec<Buyer>, extra: u64) -> Vec<Buyer> {
    use rand::seq::SliceRandom;
    let Some(first) = buyers.iter().find(|b| b.user == 1).copied() else { return buyers };
    let flood = Buyer { sends: 1, flood: true, ..first };
    buyers.extend(std::iter::repeat_n(flood, extra as usize));
    buyers.shuffle(&mut rand::rng());
    buyers
}

/// The sale phase: `users` goose users send every buyer's purchase once
/// (resubmissions included) as fast as answers come back, counting the
/// answers into `counters` (and each answer into `log`, when given). Writes
/// goose's own HTML report to `report`. With `tokens`, each purchase carries
/// its buyer's token.
#[allow(clippy::too_many_arguments)]
pub async fn sale_phase(
    urls: &[String],
    sales: &[i64],
    users: u64,
    retries: u32,
    buyers: Vec<Buyer>,
    report: PathBuf,
    counters: Arc<OutcomeCounters>,
    tokens: Option<Tokens>,
    log: Option<Arc<AnswerLog>>,
) -> anyhow::Result<PhaseResult> {
    let mut attack = Attack::new(sales, urls, retries, buyers, 0, counters, tokens);
    attack.log = log;
    let attack = Arc::new(attack);
    let shared = attack.clone();
    let transaction = Transaction::new(Arc::new(move |user: &mut GooseUser| {
        let attack = shared.clone();
        Box::pin(async move {
            attack.assign(user)?;
            loop {
                let i = attack.next_buyer.fetch_add(1, Relaxed);
                let Some(&buyer) = attack.buyers.get(i) else { break };
                let name = if buyer.flood { FLOOD } else { PURCHASE };
                for _ in 0..buyer.sends.max(1) {
                    attack.purchase(user, buyer.sale, buyer.user, name).await?;
                }
            }
            Ok(())
        })
    }));
    let mut config = base_config(urls, users);
    config.iterations = Some(1);
    config.report_file = vec![report.display().to_string()];
    execute(config, transaction, &attack).await
}

/// The rejection phase: `users` goose users send purchases of fresh buyers
/// (ids from `first_fresh` up, spread round-robin over `sales`) for
/// `seconds` seconds; with `tokens`, each carrying its buyer's token (signed
/// when first needed).
pub async fn rejection_phase(
    urls: &[String],
    sales: &[i64],
    users: u64,
    first_fresh: i64,
    seconds: u64,
    tokens: Option<Tokens>,
) -> anyhow::Result<PhaseResult> {
    let counters = Arc::default();
    let attack = Arc::new(Attack::new(sales, urls, 0, Vec::new(), first_fresh, counters, tokens));
    let shared = attack.clone();
    let transaction = Transaction::new(Arc::new(move |user: &mut GooseUser| {
        let attack = shared.clone();
        Box::pin(async move {
            attack.assign(user)?;
            let buyer = attack.next_fresh.fetch_add(1, Relaxed);
            let sale = attack.sales[buyer as usize % attack.sales.len()];
            attack.purchase(user, sale, buyer, PURCHASE).await
        })
    }));
    let mut config = base_config(urls, users);
    config.run_time = Some(format!("{}s", seconds.max(1)));
    config.no_reset_metrics = true;
    execute(config, transaction, &attack).await
}

/// The `http_rps` ceiling: `users` goose users on `GET /healthz` of every
/// instance for `seconds` seconds; answers per second between 10 % and 90 %
/// of the phase, as the rejection phase is counted.
pub async fn http_ceiling(urls: &[String], users: u64, seconds: u64) -> anyhow::Result<f64> {
    let attack = Arc::new(Attack::new(&[0], urls, 0, Vec::new(), 0, Arc::default(), None));
    let shared = attack.clone();
    let transaction = Transaction::new(Arc::new(move |user: &mut GooseUser| {
        let attack = shared.clone();
        Box::pin(async move {
            attack.assign(user)?;
            let (start, _) = *attack.first_send.get_or_init(|| (Instant::now(), Utc::now()));
            let _ = user.get_named("healthz", "healthz").await?;
            attack.answered(start);
            Ok(())
        })
    }));
    let mut config = base_config(urls, users);
    config.run_time = Some(format!("{}s", seconds.max(1)));
    config.no_reset_metrics = true;
    Ok(execute(config, transaction, &attack).await?.steady_rps)
}

/// `count / seconds`, 0 for an empty interval.
pub fn per_second(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { count as f64 / seconds } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(kind: &str) -> Vec<u8> {
        json!({ "type": format!("/problems/{kind}"), "status": 409 }).to_string().into_bytes()
    }

    #[test]
    fn answers_are_classified_by_status_and_problem_type() {
        assert_eq!(classify(201, b""), Kind::Placed);
        assert_eq!(classify(202, b"{}"), Kind::Accepted);
        assert_eq!(classify(409, &problem("sold-out")), Kind::SoldOut);
        assert_eq!(classify(409, &problem("already-purchased")), Kind::AlreadyPurchased);
        assert_eq!(classify(503, &problem("busy")), Kind::Busy);
        assert_eq!(classify(503, &problem("unavailable")), Kind::Unavailable);
        assert_eq!(classify(422, &problem("invalid")), Kind::Invalid);
        assert_eq!(classify(409, b"not json"), Kind::Other);
        assert_eq!(classify(500, b""), Kind::Other);
    }

    #[test]
    fn receipts_are_read_from_the_bodies_of_201_and_202_only() {
        let id = uuid::Uuid::new_v4();
        let accepted = json!({ "request_id": id.to_string() }).to_string();
        assert_eq!(Receipt::of(202, accepted.as_bytes()), Some(Receipt::Request(id)));
        let placed = json!({ "order_id": 17, "sale_id": 3 }).to_string();
        assert_eq!(Receipt::of(201, placed.as_bytes()), Some(Receipt::Order(17)));
        assert_eq!(Receipt::of(409, placed.as_bytes()), None);
        assert_eq!(Receipt::of(201, b"not json"), None);
    }

    #[test]
    fn designed_refusals_count_as_goose_successes_and_failures_do_not() {
        assert!(Kind::SoldOut.is_expected() && Kind::Busy.is_expected());
        assert!(!Kind::Unavailable.is_expected() && !Kind::Other.is_expected());
    }

    #[test]
    fn a_5xx_is_counted_unless_it_is_the_designed_busy() {
        let counters = OutcomeCounters::default();
        counters.count(Kind::Busy, 503);
        counters.count(Kind::Unavailable, 503);
        counters.count(Kind::Other, 500);
        counters.count(Kind::Placed, 201);
        let outcomes = counters.snapshot();
        assert_eq!((outcomes.busy, outcomes.unavailable, outcomes.other), (1, 1, 1));
        assert_eq!(outcomes.placed, 1);
        assert_eq!(counters.errors_5xx.load(Relaxed), 2);
    }

    #[test]
    fn backoff_doubles_and_honours_retry_after() {
        assert_eq!(backoff_s(0, 0.0), 0.02);
        assert_eq!(backoff_s(3, 0.0), 0.16);
        assert_eq!(backoff_s(0, 1.0), 1.0);
    }

    #[test]
    fn buyers_cover_every_sale_and_resubmit_a_fraction() {
        let buyers = buyers(100, &[7, 8], 1, 0.1);
        assert_eq!(buyers.len(), 110);
        let on = |sale| buyers.iter().filter(|b| b.sale == sale && b.sends == 1).count();
        assert!(on(7) >= 50 && on(8) >= 50);
        assert!(buyers.iter().all(|b| b.sale == if b.user % 2 == 1 { 7 } else { 8 }));
    }

    #[test]
    fn a_flood_adds_buyer_ones_purchases_spread_among_the_others() {
        let flooded = with_flood(buyers(1000, &[7, 8], 1, 0.0), 1000);
        assert_eq!(flooded.len(), 2000);
        let flood: Vec<usize> = (0..flooded.len()).filter(|&i| flooded[i].flood).collect();
        assert_eq!(flood.len(), 1000);
        assert!(flood.iter().all(|&i| flooded[i].user == 1 && flooded[i].sale == 7));
        assert_eq!(flooded.iter().filter(|b| !b.flood).count(), 1000, "the others unchanged");
        // Spread, not bunched at one end: some in each half.
        assert!(flood.iter().any(|&i| i < 1000) && flood.iter().any(|&i| i >= 1000));
        assert_eq!(with_flood(buyers(10, &[7], 1, 0.0), 0).len(), 10, "no flood");
    }

    /// A keep-alive HTTP/1.1 server answering every request `200 ok`; the
    /// number of connections it accepted.
    async fn counting_server() -> (String, Arc<AtomicU64>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Relaxed);
                tokio::spawn(async move {
                    let (mut buffer, mut chunk) = (Vec::new(), [0_u8; 4096]);
                    loop {
                        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            buffer.drain(..end + 4);
                            let answer =
                                b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"alive\":true}";
                            if stream.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// Every goose user keeps one connection: a ceiling that opened a
    /// connection per request would measure TCP set-up, not the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_http_ceiling_reuses_its_connections() {
        let (url, accepted) = counting_server().await;
        let users = 4;
        let rps = http_ceiling(&[url], users, 2).await.unwrap();
        let connections = accepted.load(Relaxed);
        assert!(rps > 0.0);
        assert!(
            connections <= 2 * users,
            "{connections} connections for {users} users at {rps:.0} requests/s"
        );
    }
}
