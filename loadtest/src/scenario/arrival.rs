//! The buyers of the `arrival` profile: an open model. Every buyer has an
//! arrival time fixed before the phase starts ([`Schedule`]), whatever the
//! service does meanwhile, and each purchase's latency is measured from that
//! intended arrival, not from the moment it could be sent.
//!
//! Why: every other profile is a closed loop — a goose user sends its next
//! purchase only after the previous answer — so while a strategy stalls the
//! generator stops sending, and the stall never shows in the latency
//! ("coordinated omission", Gil Tene's term; wrk2, k6's
//! `constant-arrival-rate` executor and vegeta are built around it). A flash
//! sale is the opposite: buyers press "buy" when the sale opens, and pile up
//! when it slows down.
//!
//! How the schedule is kept with goose: the phase runs `cap` goose users on
//! one shared HTTP client (`--arrival-cap`, the most purchases in flight);
//! each user takes the next arrival of the schedule, sleeps until its time,
//! sends it (retrying `busy` as every profile does), and takes the next.
//! While fewer than `cap` purchases are in flight an arrival is sent on time;
//! when all `cap` are busy it waits for one and is sent late — never
//! dropped, and its latency still counts from its schedule, so the wait is
//! in the figures. Every arrival sent more than [`ON_TIME`] after its
//! schedule is counted as late (`arrival.late`), with the lateness's
//! percentiles. Goose's own `--co-mitigation` was not used: it back-fills a
//! closed loop's missing requests from averages (experimental in 0.19, and
//! for requests only), where this sends them (docs/report-format.md,
//! "Open arrivals").
//!
//! Latencies go into HDR histograms (the `hdrhistogram` crate, 3
//! significant digits, microseconds). A `202 Accepted` (`queue`) is the
//! buyer's answer but not their result: after the phase, each accepted
//! request's result is read once (`GET /sales/{id}/requests/{request_id}`)
//! for its `resolved_at`, the moment the result existed, and
//! `result_from_arrival_ms` counts from the arrival to then (the other
//! answers are results already). This compares the load generator's clock
//! with Postgres', which is sound only when both run on one machine, as the
//! comparison's instances do.

use std::sync::atomic::AtomicU64;

use hdrhistogram::Histogram;

use super::line::Turn;
use super::*;

/// How long after its schedule an arrival may be sent and still count as on
/// time: a timer's wake-up on a loaded 2-core machine takes a few
/// milliseconds; a buyer kept waiting for a free slot takes longer.
pub const ON_TIME: Duration = Duration::from_millis(10);

/// How long after the first goose user starts the schedule begins: goose
/// launches every user within the first 0.1 s (`base_config`), and each must
/// be waiting for its first arrival when the schedule starts.
const LAUNCH: Duration = Duration::from_millis(500);

/// Result reads of accepted requests at once, after the phase.
const RESULT_READS_AT_ONCE: usize = 16;

/// The shape of an arrival schedule (`--arrival-shape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// `--arrival-peak` buyers within the first second, evenly spaced, then
    /// the rest in a tail that decays exponentially from the same rate: the
    /// rate at `t` seconds after the first second is `peak · e^(−t/τ)`, with
    /// τ = (buyers − peak) / peak seconds so that the tail holds exactly the
    /// remaining buyers.
    Spike,
    /// `--arrival-rate` buyers a second, evenly spaced, until every buyer
    /// has arrived.
    Constant,
}

/// Intended arrival times, as offsets from the schedule's start, in
/// arrival order (non-decreasing).
pub fn schedule(shape: Shape, buyers: u64, per_s: f64) -> Vec<Duration> {
    let per_s = if per_s.is_finite() && per_s > 0.0 { per_s } else { 1.0 };
    let at = |s: f64| Duration::from_secs_f64(s.max(0.0));
    match shape {
        Shape::Constant => (0..buyers).map(|k| at(k as f64 / per_s)).collect(),
        Shape::Spike => {
            let peak = (per_s.round() as u64).clamp(1, buyers.max(1)).min(buyers);
            let tail = buyers - peak;
            let tau = tail as f64 / per_s;
            let first = (0..peak).map(|k| at(k as f64 / peak as f64));
            // The inverse of the tail's cumulative arrivals
            // Λ(t) = tail · (1 − e^(−t/τ)), at k + ½ so that the last one
            // is finite.
            let rest =
                (0..tail).map(move |k| at(1.0 - tau * (1.0 - (k as f64 + 0.5) / tail as f64).ln()));
            first.chain(rest).collect()
        }
    }
}

/// Latency percentiles from an HDR histogram, milliseconds.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    /// Values recorded.
    pub count: u64,
}

impl Percentiles {
    /// The percentiles of `histogram` (microseconds); all 0 when empty.
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        Percentiles {
            p50: ms(0.50),
            p90: ms(0.90),
            p99: ms(0.99),
            p999: ms(0.999),
            max: histogram.max() as f64 / 1000.0,
            count: histogram.len(),
        }
    }
}

/// What an `arrival` run's generator did and measured (`runs[].arrival`).
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct ArrivalRecord {
    pub shape: Option<Shape>,
    /// `spike`: buyers in the first second; `constant`: buyers a second.
    pub per_s: f64,
    /// Arrivals scheduled (= the run's buyers).
    pub scheduled: u64,
    /// Most purchases in flight allowed (`--arrival-cap`).
    pub cap: u64,
    /// Most purchases that were in flight at once.
    pub in_flight_max: u64,
    /// Arrivals sent more than `on_time_ms` after their schedule.
    pub late: u64,
    pub on_time_ms: f64,
    /// How long after its schedule each arrival was sent.
    pub lateness_ms: Percentiles,
    /// From each arrival to its buyer's answer (after the `busy` retries).
    pub latency_from_arrival_ms: Percentiles,
    /// From each arrival to its result: the answer, or for a `202` the
    /// moment its request was resolved; `None` when no answer was a `202`.
    pub result_from_arrival_ms: Option<Percentiles>,
    /// `cpu.shares` of the cgroup the generator sent from (`--generator-cpu-shares`);
    /// `None`: it shared the default weight (none asked, or none could be
    /// made: not root, no cgroup v1 `cpu` controller).
    #[serde(default)]
    pub generator_cpu_shares: Option<u64>,
    /// The waiting room in front of the sale, when the run had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room: Option<RoomRecord>,
}

/// What the buyers of a run met in a waiting room (`runs[].arrival.room`).
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoomRecord {
    /// Buyers admitted (each then sent one purchase with the admission).
    pub admitted: u64,
    /// Buyers told sold out while in line (counted as `sold_out` answers).
    pub told_sold_out: u64,
    /// Buyers who got no turn: their place lost twice, or five minutes in
    /// line (counted as `other` answers).
    pub lost: u64,
    /// From each buyer's intended arrival to their admission (the wait in
    /// line, the joining included), admitted buyers only.
    pub wait_ms: Percentiles,
    /// From sending an admitted buyer's purchase to its answer (after the
    /// `busy` retries): what the room leaves of the purchase's latency.
    pub purchase_ms: Percentiles,
}

/// The schedule of a phase and what it measured, shared by its users.
pub struct Arrivals {
    offsets: Vec<Duration>,
    start: OnceLock<(Instant, DateTime<Utc>)>,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    late: AtomicU64,
    lateness_us: Mutex<Histogram<u64>>,
    /// Answer latencies of the answers that are results.
    results_us: Mutex<Histogram<u64>>,
    /// Answer latencies of the `202`s.
    accepted_us: Mutex<Histogram<u64>>,
    /// Each `202`: its sale, request id and intended arrival.
    accepted: Mutex<Vec<(i64, uuid::Uuid, DateTime<Utc>)>>,
    /// The waiting room's figures, when the sale has one.
    room: Option<RoomTally>,
}

/// [`RoomRecord`] as it is counted.
struct RoomTally {
    admitted: AtomicU64,
    told_sold_out: AtomicU64,
    lost: AtomicU64,
    wait_us: Mutex<Histogram<u64>>,
    purchase_us: Mutex<Histogram<u64>>,
}

impl RoomTally {
    fn new() -> RoomTally {
        RoomTally {
            admitted: AtomicU64::new(0),
            told_sold_out: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            wait_us: Mutex::new(histogram()),
            purchase_us: Mutex::new(histogram()),
        }
    }

    fn record(&self) -> RoomRecord {
        let lock = |h: &Mutex<Histogram<u64>>| h.lock().map(|h| h.clone()).unwrap_or(histogram());
        RoomRecord {
            admitted: self.admitted.load(Relaxed),
            told_sold_out: self.told_sold_out.load(Relaxed),
            lost: self.lost.load(Relaxed),
            wait_ms: Percentiles::of(&lock(&self.wait_us)),
            purchase_ms: Percentiles::of(&lock(&self.purchase_us)),
        }
    }
}

/// A histogram of microseconds up to an hour, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

fn record(histogram: &Mutex<Histogram<u64>>, value: Duration) {
    if let Ok(mut h) = histogram.lock() {
        h.saturating_record(value.as_micros().max(1) as u64);
    }
}

impl Arrivals {
    fn new(offsets: Vec<Duration>, room: bool) -> Arrivals {
        Arrivals {
            offsets,
            start: OnceLock::new(),
            in_flight: AtomicU64::new(0),
            in_flight_max: AtomicU64::new(0),
            late: AtomicU64::new(0),
            lateness_us: Mutex::new(histogram()),
            results_us: Mutex::new(histogram()),
            accepted_us: Mutex::new(histogram()),
            accepted: Mutex::new(Vec::new()),
            room: room.then(RoomTally::new),
        }
    }

    /// The schedule's start, set by the first user [`LAUNCH`] ahead.
    fn start(&self) -> (Instant, DateTime<Utc>) {
        *self.start.get_or_init(|| {
            (Instant::now() + LAUNCH, Utc::now() + chrono::Duration::from_std(LAUNCH).unwrap())
        })
    }

    /// Waits for arrival `i`'s time; answers its intended instant and wall
    /// time, and counts how late it is now.
    async fn arrive(&self, i: usize) -> (Instant, DateTime<Utc>) {
        let (start, wall) = self.start();
        let due = start + self.offsets[i];
        tokio::time::sleep_until(due.into()).await;
        let lateness = due.elapsed();
        if lateness > ON_TIME {
            self.late.fetch_add(1, Relaxed);
        }
        record(&self.lateness_us, lateness);
        let flying = self.in_flight.fetch_add(1, Relaxed) + 1;
        self.in_flight_max.fetch_max(flying, Relaxed);
        (due, wall + chrono::Duration::from_std(self.offsets[i]).unwrap_or_default())
    }

    /// Records the answer to the arrival due at `due` (`wall`).
    fn answered(&self, due: Instant, wall: DateTime<Utc>, sale: i64, receipt: Option<Receipt>) {
        self.in_flight.fetch_sub(1, Relaxed);
        match receipt {
            Some(Receipt::Request(id)) => {
                record(&self.accepted_us, due.elapsed());
                if let Ok(mut accepted) = self.accepted.lock() {
                    accepted.push((sale, id, wall));
                }
            }
            _ => record(&self.results_us, due.elapsed()),
        }
    }
}

/// What an arrival phase leaves for [`ArrivalPhase::record`]: its figures
/// so far, and the accepted requests whose results are still to read.
pub struct ArrivalPhase {
    pub shape: Shape,
    pub per_s: f64,
    pub cap: u64,
    /// `cpu.shares` of the generator's group during the phase, if it had one.
    pub generator_cpu_shares: Option<u64>,
    arrivals: Arc<Arrivals>,
}

impl ArrivalPhase {
    /// The run's record, reading each accepted request's result through
    /// `urls` (round robin) once the caller has let them settle.
    pub async fn record(&self, urls: &[String]) -> anyhow::Result<ArrivalRecord> {
        let a = &self.arrivals;
        let lock = |h: &Mutex<Histogram<u64>>| h.lock().map(|h| h.clone()).unwrap_or(histogram());
        let (results, accepted_answers) = (lock(&a.results_us), lock(&a.accepted_us));
        let mut answers = results.clone();
        answers.add(&accepted_answers)?;
        let accepted = a.accepted.lock().map(|v| v.clone()).unwrap_or_default();
        let result_from_arrival_ms = if accepted.is_empty() {
            None
        } else {
            let mut finals = results;
            for delay in resolved_after_arrival(urls, &accepted).await? {
                record_into(&mut finals, delay);
            }
            Some(Percentiles::of(&finals))
        };
        Ok(ArrivalRecord {
            shape: Some(self.shape),
            per_s: self.per_s,
            scheduled: a.offsets.len() as u64,
            cap: self.cap,
            in_flight_max: a.in_flight_max.load(Relaxed),
            late: a.late.load(Relaxed),
            on_time_ms: ON_TIME.as_secs_f64() * 1000.0,
            lateness_ms: Percentiles::of(&lock(&a.lateness_us)),
            latency_from_arrival_ms: Percentiles::of(&answers),
            result_from_arrival_ms,
            generator_cpu_shares: self.generator_cpu_shares,
            room: a.room.as_ref().map(RoomTally::record),
        })
    }
}

fn record_into(histogram: &mut Histogram<u64>, value: Duration) {
    histogram.saturating_record(value.as_micros().max(1) as u64);
}

/// From each accepted request's intended arrival to its `resolved_at`, read
/// from its result; a request still unresolved counts until now.
async fn resolved_after_arrival(
    urls: &[String],
    accepted: &[(i64, uuid::Uuid, DateTime<Utc>)],
) -> anyhow::Result<Vec<Duration>> {
    use futures_util::StreamExt;
    let client = reqwest::Client::new();
    let reads = accepted.iter().enumerate().map(|(i, &(sale, id, arrived))| {
        let url = format!("{}/sales/{sale}/requests/{id}", urls[i % urls.len()]);
        let client = client.clone();
        async move {
            let body: Value = client.get(url).send().await?.error_for_status()?.json().await?;
            let resolved = body["resolved_at"]
                .as_str()
                .and_then(|at| at.parse::<DateTime<Utc>>().ok())
                .unwrap_or_else(Utc::now);
            anyhow::Ok((resolved - arrived).to_std().unwrap_or_default())
        }
    });
    futures_util::stream::iter(reads)
        .buffer_unordered(RESULT_READS_AT_ONCE)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// The `arrival` sale phase: `buyers` arrive on `offsets` (one each, in
/// order), at most `cap` purchases in flight, through `urls` round robin;
/// answers counted into `counters` and goose's report written to `report`.
#[allow(clippy::too_many_arguments)]
pub async fn arrival_phase(
    urls: &[String],
    sales: &[i64],
    (shape, per_s, cap): (Shape, f64, u64),
    retries: u32,
    buyers: Vec<Buyer>,
    report: PathBuf,
    counters: Arc<OutcomeCounters>,
    tokens: Option<Tokens>,
    room: Option<Duration>,
) -> anyhow::Result<(PhaseResult, ArrivalPhase)> {
    let offsets = schedule(shape, buyers.len() as u64, per_s);
    let users = cap.clamp(1, buyers.len().max(1) as u64);
    let arrivals = Arc::new(Arrivals::new(offsets, room.is_some()));
    let longest_look = room.unwrap_or_default();
    let attack = Arc::new(Attack::new(sales, urls, retries, buyers, 0, counters, tokens));
    let (shared, timing) = (attack.clone(), arrivals.clone());
    let transaction = Transaction::new(Arc::new(move |user: &mut GooseUser| {
        let (attack, arrivals) = (shared.clone(), timing.clone());
        Box::pin(async move {
            attack.assign(user)?;
            loop {
                let i = attack.next_buyer.fetch_add(1, Relaxed);
                let Some(&buyer) = attack.buyers.get(i) else { break };
                let (due, wall) = arrivals.arrive(i).await;
                let admission = match &arrivals.room {
                    None => None,
                    Some(room) => match attack
                        .wait_in_line(user, buyer.sale, buyer.user, longest_look)
                        .await?
                    {
                        Turn::Admitted(admission) => {
                            room.admitted.fetch_add(1, Relaxed);
                            record(&room.wait_us, due.elapsed());
                            Some(admission)
                        }
                        turn => {
                            let (tally, kind) = match turn {
                                Turn::SoldOut => (&room.told_sold_out, Kind::SoldOut),
                                _ => (&room.lost, Kind::Other),
                            };
                            tally.fetch_add(1, Relaxed);
                            attack.counters.count(kind, 0);
                            arrivals.answered(due, wall, buyer.sale, None);
                            continue;
                        }
                    },
                };
                let sent = Instant::now();
                let (_, receipt) = attack
                    .purchase_answer(user, buyer.sale, buyer.user, PURCHASE, admission.as_deref())
                    .await?;
                if let Some(room) = &arrivals.room {
                    record(&room.purchase_us, sent.elapsed());
                }
                arrivals.answered(due, wall, buyer.sale, receipt);
            }
            Ok(())
        })
    }));
    let mut config = base_config(urls, users);
    config.iterations = Some(1);
    config.report_file = vec![report.display().to_string()];
    let result = execute_shared_client(config, transaction, &attack).await?;
    let generator_cpu_shares = None;
    Ok((result, ArrivalPhase { shape, per_s, cap, generator_cpu_shares, arrivals }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(offsets: &[Duration]) -> Vec<f64> {
        offsets.iter().map(Duration::as_secs_f64).collect()
    }

    #[test]
    fn a_constant_rate_spaces_arrivals_evenly() {
        let s = secs(&schedule(Shape::Constant, 5, 10.0));
        assert_eq!(s, [0.0, 0.1, 0.2, 0.3, 0.4]);
    }

    #[test]
    fn a_spike_sends_the_peak_in_the_first_second_then_a_decaying_tail() {
        let s = secs(&schedule(Shape::Spike, 3_000, 1_000.0));
        assert_eq!(s.len(), 3_000);
        assert!(s.windows(2).all(|w| w[0] <= w[1]), "in order");
        assert_eq!(s.iter().filter(|&&t| t < 1.0).count(), 1_000, "the peak in the first second");
        // The tail: 2000 buyers, τ = 2 s; within τ of its start, 1 − 1/e of them.
        let within_tau = s.iter().filter(|&&t| (1.0..3.0).contains(&t)).count() as f64;
        assert!((within_tau / 2_000.0 - (1.0 - (-1.0f64).exp())).abs() < 0.01, "{within_tau}");
        // It starts at the peak's rate: about 1000 a second in its first 0.1 s.
        let start = s.iter().filter(|&&t| (1.0..1.1).contains(&t)).count();
        assert!((90..=100).contains(&start), "{start}");
        assert!(s[2_999].is_finite() && s[2_999] < 1.0 + 2.0 * (4_000f64).ln());
    }

    #[test]
    fn a_spike_no_larger_than_its_peak_is_all_in_the_first_second() {
        let s = secs(&schedule(Shape::Spike, 10, 50.0));
        assert_eq!(s.len(), 10);
        assert!(s.iter().all(|&t| t < 1.0));
        assert!(schedule(Shape::Spike, 0, 50.0).is_empty());
    }

    #[tokio::test]
    async fn latency_counts_from_the_schedule_through_a_stall() {
        // Two arrivals 10 ms apart, one slot: the first stalls 200 ms, so the
        // second is sent ~190 ms late. A closed loop would time the second
        // from its send (~0 ms); from its arrival it waited ~190 ms more.
        let arrivals = Arrivals::new(schedule(Shape::Constant, 2, 100.0), false);
        let (due, wall) = arrivals.arrive(0).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        arrivals.answered(due, wall, 1, None);
        let (due, wall) = arrivals.arrive(1).await;
        arrivals.answered(due, wall, 1, None);
        let phase = ArrivalPhase {
            shape: Shape::Constant,
            per_s: 100.0,
            cap: 1,
            generator_cpu_shares: None,
            arrivals: Arc::new(arrivals),
        };
        let record = phase.record(&[]).await.unwrap();
        assert_eq!((record.scheduled, record.late, record.in_flight_max), (2, 1, 1));
        assert!(record.lateness_ms.max >= 180.0, "{:?}", record.lateness_ms);
        let latency = &record.latency_from_arrival_ms;
        assert_eq!(latency.count, 2);
        assert!(latency.p50 >= 180.0, "the second buyer's wait is in its latency: {latency:?}");
        assert!(latency.max >= 200.0, "{latency:?}");
        assert_eq!(record.result_from_arrival_ms, None, "no 202");
    }
}
