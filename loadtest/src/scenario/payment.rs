//! The buyers of the `payment` profile: each buys one unit, then pays for it
//! at once (`POST /orders/{id}/pay` with an `Idempotency-Key`) unless they
//! are one of the share who never pays ([`pays`]). A buyer refused (sold
//! out, or any answer that placed nothing) is followed, after a pause, by a
//! later buyer with a fresh id: units that expire unpaid come back to the
//! sale and are sold again to those later buyers. The phase ends when every
//! unit is paid (`Settings::settled`, set by the caller from the Postgres
//! audit), when the sale closes (`409 ended`), or at its deadline.
//!
//! A `queue` purchase is answered `202`; its buyer reads the result
//! (`GET /sales/{id}/requests/{request_id}`, a long poll) to learn the order
//! to pay. A buyer refused by the queue keeps that request, which is why
//! later buyers are fresh ids rather than the refused buyers again.

use std::sync::atomic::AtomicBool;

use super::*;

/// Name of a payment in goose's metrics.
const PAY: &str = "pay";

/// Name of a `queue` result read in goose's metrics.
const RESULT: &str = "result";

/// How long one result read waits for the consumer, milliseconds (the
/// service allows up to 5000).
const RESULT_WAIT_MS: u64 = 2000;

/// Result reads of one request at most (each waits up to
/// [`RESULT_WAIT_MS`]): a request still pending after them counts as
/// refused for its buyer (the run's `accepted_unresolved` tells the rest).
const RESULT_READS: u32 = 30;

/// Whether buyer `user` pays their order: a fixed draw per id, so that a run
/// is reproducible and every process agrees. The id is mixed with
/// SplitMix64's finaliser (Steele, Lea and Flood, "Fast splittable
/// pseudorandom number generators", OOPSLA 2014) into 53 uniform bits; the
/// buyer pays when that fraction is at least `unpaid_share`.
pub fn pays(user: i64, unpaid_share: f64) -> bool {
    let mut z = (user as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 >= unpaid_share
}

/// What the paying buyers' payments were answered (`runs[].payment.payments`;
/// the load generator's count, not a figure of the books).
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Payments {
    /// `200`: the order is paid.
    pub paid: u64,
    /// `409`: refused — the order had expired (its window passed before the
    /// payment arrived) or ended otherwise.
    pub refused: u64,
    /// Any other answer, or none, after the `busy` retries.
    pub failed: u64,
}

/// The settings of a payment phase.
pub struct Settings {
    /// Fraction of buyers who never pay ([`pays`]).
    pub unpaid_share: f64,
    /// How long a goose user waits after an answer that placed nothing
    /// before the next buyer arrives (±50 %).
    pub come_back: Duration,
    /// Set by the caller once every unit is paid: no further buyer arrives.
    pub settled: Arc<AtomicBool>,
    /// No buyer arrives after this.
    pub deadline: Instant,
}

/// What a payment phase adds to its [`PhaseResult`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Buyers who arrived after the first `buyers` (fresh ids from
    /// `buyers + 1`).
    pub later_buyers: u64,
    /// Buyers, first and later, who would pay.
    pub paying_buyers: u64,
    pub payments: Payments,
}

/// The counts of a phase in progress.
#[derive(Default)]
struct Tally {
    later: AtomicU64,
    paying: AtomicU64,
    paid: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

/// The `payment` sale phase: `users` goose users take the buyers in order,
/// then later buyers, until [`Settings`] says stop; buyers ids `1..=n` are
/// `buyers`, later ones follow. Writes goose's HTML report to `report`.
#[allow(clippy::too_many_arguments)]
pub async fn payment_phase(
    urls: &[String],
    sales: &[i64],
    users: u64,
    retries: u32,
    buyers: Vec<Buyer>,
    report: PathBuf,
    counters: Arc<OutcomeCounters>,
    tokens: Option<Tokens>,
    settings: Settings,
) -> anyhow::Result<(PhaseResult, Outcome)> {
    let first_later = buyers.iter().map(|b| b.user).max().unwrap_or(0) + 1;
    let attack = Arc::new(Attack::new(sales, urls, retries, buyers, first_later, counters, tokens));
    let (tally, settings) = (Arc::new(Tally::default()), Arc::new(settings));
    let (shared, shared_tally, shared_settings) = (attack.clone(), tally.clone(), settings.clone());
    let transaction = Transaction::new(Arc::new(move |user: &mut GooseUser| {
        let (attack, tally, settings) =
            (shared.clone(), shared_tally.clone(), shared_settings.clone());
        Box::pin(async move {
            attack.assign(user)?;
            while !settings.settled.load(Relaxed) && Instant::now() < settings.deadline {
                let buyer = attack.next_payment_buyer(&tally);
                if buyer.pays(&settings) {
                    tally.paying.fetch_add(1, Relaxed);
                }
                match attack.buy_and_pay(user, buyer, &settings, &tally).await? {
                    Visit::Bought => {}
                    Visit::Refused => {
                        let pause = settings.come_back.mul_f64(rand::rng().random_range(0.5..1.5));
                        tokio::time::sleep(pause).await;
                    }
                    Visit::Closed => break,
                }
            }
            Ok(())
        })
    }));
    let mut config = base_config(urls, users);
    config.iterations = Some(1);
    config.report_file = vec![report.display().to_string()];
    let result = execute(config, transaction, &attack).await?;
    let outcome = Outcome {
        later_buyers: tally.later.load(Relaxed),
        paying_buyers: tally.paying.load(Relaxed),
        payments: Payments {
            paid: tally.paid.load(Relaxed),
            refused: tally.refused.load(Relaxed),
            failed: tally.failed.load(Relaxed),
        },
    };
    Ok((result, outcome))
}

/// How one buyer's visit ended.
enum Visit {
    /// An order was placed (paid or not).
    Bought,
    /// Nothing placed: the next buyer comes after a pause.
    Refused,
    /// The sale is closed: no buyer comes any more.
    Closed,
}

impl Buyer {
    fn pays(&self, settings: &Settings) -> bool {
        pays(self.user, settings.unpaid_share)
    }
}

impl Attack {
    /// The next buyer of the first ones, else a later buyer with a fresh id
    /// (on sale `(id − 1) mod sales`, as the first ones).
    fn next_payment_buyer(&self, tally: &Tally) -> Buyer {
        let i = self.next_buyer.fetch_add(1, Relaxed);
        if let Some(&buyer) = self.buyers.get(i) {
            return buyer;
        }
        tally.later.fetch_add(1, Relaxed);
        let user = self.next_fresh.fetch_add(1, Relaxed);
        let sale = self.sales[(user as usize - 1) % self.sales.len()];
        Buyer { sale, user, sends: 1, flood: false }
    }

    /// One buyer's visit: the purchase, the `queue` result if any, and the
    /// payment if the buyer pays.
    async fn buy_and_pay(
        &self,
        user: &mut GooseUser,
        buyer: Buyer,
        settings: &Settings,
        tally: &Tally,
    ) -> Result<Visit, Box<TransactionError>> {
        let order = match self.purchase_answer(user, buyer.sale, buyer.user, PURCHASE, None).await?
        {
            (_, Some(Receipt::Order(order))) => Some(order),
            (_, Some(Receipt::Request(request))) => {
                self.order_of(user, buyer.sale, request, buyer.user).await?
            }
            (Kind::Ended, _) => return Ok(Visit::Closed),
            _ => None,
        };
        let Some(order) = order else { return Ok(Visit::Refused) };
        if buyer.pays(settings) {
            self.pay(user, order, buyer.user, tally).await?;
        }
        Ok(Visit::Bought)
    }

    /// The order a `queue` request was settled into, read with long polls;
    /// `None` when it was refused (or is still pending after
    /// [`RESULT_READS`] reads).
    async fn order_of(
        &self,
        user: &mut GooseUser,
        sale: i64,
        request: uuid::Uuid,
        buyer: i64,
    ) -> Result<Option<i64>, Box<TransactionError>> {
        let instance = user.weighted_users_index % self.urls.len();
        let url = format!(
            "{}/sales/{sale}/requests/{request}?wait_ms={RESULT_WAIT_MS}",
            self.urls[instance]
        );
        for _ in 0..RESULT_READS {
            let builder = user.get_request_builder(&GooseMethod::Get, &url)?;
            let builder = match &self.tokens {
                Some(tokens) => builder.bearer_auth(tokens.of(buyer)),
                None => builder,
            };
            let request = GooseRequest::builder()
                .method(GooseMethod::Get)
                .path(url.as_str())
                .name(RESULT)
                .set_request_builder(builder)
                .build();
            let goose = user.request(request).await?;
            let (_, body) = read_answer(goose.response).await;
            let result: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            match result["status"].as_str() {
                Some("pending") => continue,
                Some("placed") => return Ok(result["order_id"].as_i64()),
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Pays `order` for `buyer` under a fresh `Idempotency-Key`, retrying a
    /// `busy` answer or none (with the same key) as a purchase is retried.
    async fn pay(
        &self,
        user: &mut GooseUser,
        order: i64,
        buyer: i64,
        tally: &Tally,
    ) -> TransactionResult {
        let key = uuid::Uuid::new_v4().to_string();
        let mut instance = user.weighted_users_index % self.urls.len();
        for attempt in 0..=self.retries {
            let url = format!("{}/orders/{order}/pay", self.urls[instance]);
            let builder = user.get_request_builder(&GooseMethod::Post, &url)?;
            let builder = builder.header("Idempotency-Key", key.as_str());
            let builder = match &self.tokens {
                Some(tokens) => builder.bearer_auth(tokens.of(buyer)),
                None => builder.json(&json!({ "user_id": buyer })),
            };
            let request = GooseRequest::builder()
                .method(GooseMethod::Post)
                .path(url.as_str())
                .name(PAY)
                .set_request_builder(builder)
                .build();
            let mut goose = user.request(request).await?;
            let status = goose.request.status_code;
            let unanswered = goose.response.is_err();
            let (retry_after_s, body) = read_answer(goose.response).await;
            match (status, classify(status, &body)) {
                (200, _) => {
                    tally.paid.fetch_add(1, Relaxed);
                    return Ok(());
                }
                (409, _) => {
                    tally.refused.fetch_add(1, Relaxed);
                    return user.set_success(&mut goose.request);
                }
                (_, Kind::Busy) => user.set_success(&mut goose.request)?,
                _ if unanswered => instance = (instance + 1) % self.urls.len(),
                _ => break,
            }
            if attempt == self.retries {
                break;
            }
            let jittered = backoff_s(attempt, retry_after_s) * rand::rng().random_range(0.5..1.5);
            tokio::time::sleep(Duration::from_secs_f64(jittered)).await;
        }
        tally.failed.fetch_add(1, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unpaid_share_of_buyers_never_pays_and_the_draw_is_fixed_per_id() {
        let unpaid = (1..=10_000).filter(|&user| !pays(user, 0.3)).count();
        assert!((2_800..=3_200).contains(&unpaid), "{unpaid} of 10 000 never pay");
        assert!((1..=1000).all(|user| pays(user, 0.0)), "share 0: everyone pays");
        assert!((1..=1000).all(|user| !pays(user, 1.0)), "share 1: nobody pays");
        assert_eq!(pays(42, 0.3), pays(42, 0.3));
    }
}
