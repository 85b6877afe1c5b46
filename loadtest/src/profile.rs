//! Load profiles: the shapes of demand a strategy is compared under.
//!
//! A profile is one row of a small table: its own default stock, how many
//! sales run at once, how often each buyer sends its purchase, and the
//! demonstration knobs its sales are created with (`POST /admin/sales`
//! accepts `lock_lease_ms`, `work_ms`, `pause_ms`, `pause_ratio`). Every
//! other parameter (users, demand, instances, retries of `busy`) comes from
//! the flags and is the same for every profile, so two profiles differ only
//! in what this table says (the knob flags, when given, override every
//! profile's knobs alike). The profile is also a key of the expectation
//! table (`crate::expectation`).
//!
//! Adding a profile: a variant with a doc comment (it becomes the `--help`
//! text), then one arm in each `match` below.

use serde::{Deserialize, Serialize};

/// The flags of `loadtest compare` that make a profile's runs (flattened
/// into its flags, and into report.json's `config`).
#[derive(clap::Args, Debug, Clone, Serialize)]
pub struct PlanFlags {
    /// Units of stock of a run, over all its sales, for every strategy and
    /// profile. Default: burst, retry-storm, multi-sale and flood sized per
    /// strategy from pilot sales so that each run's steady window lasts 5/3
    /// of --steady-window-s (docs/report-format.md, "Steady windows"); slow
    /// 500 and payment 1000.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub stock: Option<u64>,

    /// Lease of `lock/*` strategies, milliseconds, for every profile's sales
    /// (default: the profile's own — slow 200, others the service's 2000).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=600_000))]
    pub lock_lease_ms: Option<i32>,

    /// Simulated work inside every strategy's critical section or
    /// transaction, milliseconds ±50 %, for every profile's sales (default:
    /// the profile's own — slow 5, others 0).
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=600_000))]
    pub work_ms: Option<i32>,

    /// Length of a stall inside the critical section, milliseconds, for every
    /// profile's sales (default: the profile's own — slow 600, others 0).
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=600_000))]
    pub pause_ms: Option<i32>,

    /// Fraction (0..=1) of purchases that stall for `--pause-ms`, for every
    /// profile's sales (default: the profile's own — slow 0.01, others 0).
    #[arg(long, value_parser = crate::parse_fraction)]
    pub pause_ratio: Option<f64>,

    /// `retry-storm`: times each buyer sends its purchase, back to back.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=100))]
    pub storm: u32,

    /// `flood`: extra purchases by one buyer (buyer 1), spread among the
    /// other buyers' sends.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub flood: u64,

    /// `payment`: how long a buyer has to pay an order, milliseconds; unpaid
    /// then, it expires and its unit returns to the sale.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(i32).range(1..=600_000))]
    pub payment_window_ms: i32,

    /// `payment`: fraction (0..=1) of buyers who never pay.
    #[arg(long, default_value_t = 0.3, value_parser = crate::parse_fraction)]
    pub unpaid_share: f64,

    /// `payment`: the sale closes this many seconds after it is created;
    /// must outlast the payment window. A run stops earlier, as soon as
    /// every unit is paid.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub sale_window_s: u64,

    /// `multi-sale`: sales at once, each with stock/N units.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub sales: u32,

    /// Fraction of buyers who submit their purchase a second time.
    #[arg(long, default_value_t = 0.1, value_parser = crate::parse_fraction)]
    pub resubmit: f64,

    /// `arrival`: the shape of the buyers' arrival schedule — `spike`
    /// (`--arrival-peak` buyers within the first second, then a tail
    /// decaying from the same rate) or `constant` (`--arrival-rate` buyers
    /// a second).
    #[arg(long, value_enum, default_value_t = crate::scenario::arrival::Shape::Spike)]
    pub arrival_shape: crate::scenario::arrival::Shape,

    /// `arrival`, `spike`: buyers arriving within the first second.
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub arrival_peak: u64,

    /// `arrival`, `constant`: buyers arriving each second.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub arrival_rate: u64,

    /// `arrival`: most purchases in flight at once (one connection each;
    /// mind the open-file limit). An arrival that finds all of them busy is
    /// sent late, and its latency still counts from its schedule.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub arrival_cap: u64,

    /// `arrival`: the `cpu.shares` of a cgroup v1 `cpu` group the load
    /// generator enters for the sale phase, the service's processes staying
    /// outside it, so that it sends on schedule while the service keeps the
    /// cores busy (every other group weighs 1024; 0: no group). Needs root
    /// and the cgroup v1 `cpu` controller; without them the run says so
    /// (`runs[].arrival.generator_cpu_shares` null) and goes on.
    #[arg(long, default_value_t = 10_240, value_parser = clap::value_parser!(u64).range(0..=262_144))]
    pub generator_cpu_shares: u64,

    /// `arrival`: put a waiting room in front of every sale of the run,
    /// admitting at most this many buyers a second (docs/waiting-room.md);
    /// each buyer joins the line, waits for their turn and buys with the
    /// admission. 0: no pace (only `--waiting-room-concurrency`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub waiting_room_rate: u32,

    /// `arrival`: a waiting room as `--waiting-room-rate`, letting at most
    /// this many admitted buyers buy at once. 0: no bound.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub waiting_room_concurrency: u32,

    /// `arrival` with a waiting room: the longest a buyer in line waits
    /// between two looks at their place, milliseconds (each looks again
    /// after half its estimated wait, at least 100 ms and at most this).
    /// Under the service's 10 s, after which a place not looked at is lost.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(200..=8000))]
    pub waiting_room_look_max_ms: u64,
}

impl PlanFlags {
    /// The waiting room the flags ask for: `None` when neither bound is set.
    pub fn waiting_room(&self) -> Option<RoomKnobs> {
        let bound = |n: u32| (n > 0).then_some(n);
        let room = RoomKnobs {
            admissions_per_s: bound(self.waiting_room_rate),
            concurrency: bound(self.waiting_room_concurrency),
        };
        (room.admissions_per_s.is_some() || room.concurrency.is_some()).then_some(room)
    }
}

/// A sale's waiting room, as `POST /admin/sales` takes it (the admission's
/// lifetime left at the service's default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RoomKnobs {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admissions_per_s: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// A load profile for `--profile`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    clap::ValueEnum,
    Serialize,
    Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Every buyer at once, no injected delays; a `--resubmit` fraction of
    /// buyers sends a second time. Without `--stock`, each strategy's sale
    /// is sized for its steady window (docs/report-format.md, "Steady
    /// windows"); 5000 units when its pilot measured no rate.
    Burst,
    /// Buyers resubmit fast and many times: each sends its purchase
    /// `--storm` times back to back (default 5), as clients that retry on
    /// every slow answer do. `--resubmit` does not apply. Default stock 2000,
    /// so that a run sends about as many requests as `burst`.
    RetryStorm,
    /// `--sales` sales at once (default 4), each with stock/N units and
    /// buyers spread round-robin over them: shows whether a strategy
    /// partitions by sale or serialises every sale on one hot spot. The audit
    /// and every figure add up over the run's sales. Default stock 10000.
    MultiSale,
    /// Slow critical sections: a 200 ms lock lease, 5 ms of simulated work
    /// (±50 %) inside every strategy's critical section or transaction, and
    /// 1 % of purchases stalling 600 ms there (3 × the lease), like a slow
    /// downstream call. Shows which locks survive a holder outliving its
    /// lease. Default stock 500, so a run stays well under a minute.
    Slow,
    /// `burst`, plus one buyer who floods the sale: `--flood` more
    /// purchases (default 10000) by buyer 1, spread among the other buyers'
    /// sends. They are sent under a request name of their own, so
    /// `latency_ms` stays the other buyers'; compare it with a `burst` run's
    /// to see what one hammering client costs everyone else. Default stock
    /// 5000, as `burst`.
    Flood,
    /// A payment window: orders start `pending_payment` and must be paid
    /// within `--payment-window-ms` (default 2000); a share `--unpaid-share`
    /// of buyers (default 0.30) never pays, the others pay at once (`POST
    /// /orders/{id}/pay` with an `Idempotency-Key`). The sale closes
    /// `--sale-window-s` after it opens (default 120), well after the
    /// payment window, so expired units are sold again: a buyer refused as
    /// sold out is followed, after a pause, by a later buyer, until every
    /// unit is paid. Default stock 1000.
    Payment,
    /// Open arrivals: buyers arrive on a schedule fixed in advance
    /// (`--arrival-shape`: a spike of `--arrival-peak` buyers in the first
    /// second and a decaying tail, or `--arrival-rate` a second), whatever
    /// the service answers, with at most `--arrival-cap` purchases in
    /// flight; latency counts from each buyer's intended arrival, so a stall
    /// shows in full (no coordinated omission). Default stock 2000; no
    /// resubmissions.
    Arrival,
}

/// The demonstration knobs a profile sets on each of its sales; `None`
/// leaves the service's default (see `seckill::sale::Knobs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SaleKnobs {
    /// Lease of `lock/*` strategies, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_lease_ms: Option<i32>,
    /// Simulated work inside the critical section, milliseconds (±50 %).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_ms: Option<i32>,
    /// Length of a stall, milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<i32>,
    /// Fraction (0..=1) of purchases that stall for `pause_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_ratio: Option<f64>,
    /// Payment window of the sale's orders, milliseconds (`payment`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_window_ms: Option<i32>,
    /// A waiting room in front of the sale (`arrival`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_room: Option<RoomKnobs>,
}

/// What one run of a profile does, with the flags applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// Units of stock over all the run's sales (`--stock`, else the
    /// profile's default).
    pub stock: u64,
    /// Sales created for the run; buyer `i` (1-based) buys from sale
    /// `(i − 1) mod sales`.
    pub sales: u32,
    /// Times each buyer sends its purchase, back to back (each send waits
    /// for the previous answer).
    pub submissions: u32,
    /// Fraction of buyers who send once more, shuffled among the others.
    pub resubmit: f64,
    /// Extra purchases by buyer 1, shuffled among the others' sends (the
    /// `flood` profile; 0 for the others).
    pub flood: u64,
    pub knobs: SaleKnobs,
    /// The buyers' payment behaviour (`payment` profile); `None` otherwise.
    pub payment: Option<Payment>,
    /// The buyers' arrival schedule (`arrival` profile); `None` otherwise.
    pub arrival: Option<Arrival>,
}

/// How the buyers of an `arrival` run arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Arrival {
    pub shape: crate::scenario::arrival::Shape,
    /// `spike`: buyers in the first second; `constant`: buyers a second.
    pub per_s: f64,
    /// Most purchases in flight.
    pub cap: u64,
    /// `cpu.shares` of the generator's group during the phase (0: none).
    pub generator_cpu_shares: u64,
    /// With a waiting room: the longest wait between two looks at a place,
    /// milliseconds.
    pub longest_look_ms: u64,
}

/// How the buyers of a `payment` run pay, and how long its sale is open.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Payment {
    /// Fraction (0..=1) of buyers who never pay their order.
    pub unpaid_share: f64,
    /// The sale closes this long after it is created, seconds; longer than
    /// the payment window.
    pub sale_window_s: u64,
}

impl Profile {
    /// Every profile, in the order reports list them.
    pub const ALL: &'static [Profile] = &[
        Profile::Burst,
        Profile::RetryStorm,
        Profile::MultiSale,
        Profile::Slow,
        Profile::Flood,
        Profile::Payment,
        Profile::Arrival,
    ];

    /// The wire name, as in `--profile` and the report's `profile`.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Burst => "burst",
            Profile::RetryStorm => "retry-storm",
            Profile::MultiSale => "multi-sale",
            Profile::Slow => "slow",
            Profile::Flood => "flood",
            Profile::Payment => "payment",
            Profile::Arrival => "arrival",
        }
    }

    /// Units of stock when `--stock` is not given.
    pub fn default_stock(self) -> u64 {
        match self {
            Profile::Burst | Profile::Flood => 5_000,
            Profile::MultiSale => 10_000,
            Profile::RetryStorm => 2_000,
            Profile::Slow => 500,
            Profile::Payment => 1_000,
            Profile::Arrival => 2_000,
        }
    }

    /// Knobs of the profile's sales.
    pub fn knobs(self) -> SaleKnobs {
        match self {
            Profile::Burst
            | Profile::RetryStorm
            | Profile::MultiSale
            | Profile::Flood
            | Profile::Payment
            | Profile::Arrival => SaleKnobs::default(),
            Profile::Slow => SaleKnobs {
                lock_lease_ms: Some(200),
                work_ms: Some(5),
                pause_ms: Some(600),
                pause_ratio: Some(0.01),
                payment_window_ms: None,
                waiting_room: None,
            },
        }
    }

    /// The run this profile asks for under `args`: the knob flags
    /// (`--lock-lease-ms`, `--work-ms`, `--pause-ms`, `--pause-ratio`)
    /// override the profile's knobs; `payment` takes its window from
    /// `--payment-window-ms`.
    pub fn plan(self, args: &PlanFlags) -> Plan {
        let stock = args.stock.unwrap_or_else(|| self.default_stock());
        let (sales, submissions, resubmit) = match self {
            Profile::Burst => (1, 1, args.resubmit),
            Profile::RetryStorm => (1, args.storm, 0.0),
            Profile::MultiSale => (args.sales, 1, args.resubmit),
            Profile::Slow | Profile::Flood => (1, 1, args.resubmit),
            // Later buyers replace the refused ones; none resubmits.
            Profile::Payment => (1, 1, 0.0),
            // Each arrival is a buyer of its own.
            Profile::Arrival => (1, 1, 0.0),
        };
        let flood = if self == Profile::Flood { args.flood } else { 0 };
        // Never more sales than units: every sale gets at least one.
        let sales = sales.clamp(1, u32::try_from(stock).unwrap_or(u32::MAX).max(1));
        let profile = self.knobs();
        let knobs = SaleKnobs {
            lock_lease_ms: args.lock_lease_ms.or(profile.lock_lease_ms),
            work_ms: args.work_ms.or(profile.work_ms),
            pause_ms: args.pause_ms.or(profile.pause_ms),
            pause_ratio: args.pause_ratio.or(profile.pause_ratio),
            payment_window_ms: (self == Profile::Payment).then_some(args.payment_window_ms),
            waiting_room: args.waiting_room().filter(|_| self == Profile::Arrival),
        };
        let payment = (self == Profile::Payment).then_some(Payment {
            unpaid_share: args.unpaid_share,
            sale_window_s: args.sale_window_s,
        });
        let arrival = (self == Profile::Arrival).then(|| {
            let per_s = match args.arrival_shape {
                crate::scenario::arrival::Shape::Spike => args.arrival_peak,
                crate::scenario::arrival::Shape::Constant => args.arrival_rate,
            };
            Arrival {
                shape: args.arrival_shape,
                per_s: per_s as f64,
                cap: args.arrival_cap,
                generator_cpu_shares: args.generator_cpu_shares,
                longest_look_ms: args.waiting_room_look_max_ms,
            }
        });
        Plan { stock, sales, submissions, resubmit, flood, knobs, payment, arrival }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Plan {
    /// Stock of each sale: `stock / sales`, the remainder going one unit
    /// each to the first sales, so that they add up to `stock`.
    pub fn stock_per_sale(&self) -> Vec<u64> {
        let n = u64::from(self.sales);
        (0..n).map(|i| self.stock / n + u64::from(i < self.stock % n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_match_the_clap_values_and_serde() {
        for &profile in Profile::ALL {
            let value = profile.to_possible_value().expect("every profile is a value");
            assert_eq!(value.get_name(), profile.name());
            assert_eq!(serde_json::to_value(profile).unwrap(), profile.name());
        }
    }

    /// `loadtest compare` flags as parsed from `flags`.
    fn plan_flags(flags: &[&str]) -> PlanFlags {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: PlanFlags,
        }
        let argv = std::iter::once("compare").chain(flags.iter().copied());
        <Cli as clap::Parser>::parse_from(argv).args
    }

    #[test]
    fn knob_flags_override_every_profiles_knobs() {
        let defaults = plan_flags(&[]);
        assert_eq!(Profile::Burst.plan(&defaults).knobs, SaleKnobs::default());
        assert_eq!(Profile::Slow.plan(&defaults).knobs, Profile::Slow.knobs());

        let args = plan_flags(&["--work-ms", "7", "--pause-ratio", "0.5"]);
        let slow = SaleKnobs { work_ms: Some(7), pause_ratio: Some(0.5), ..Profile::Slow.knobs() };
        assert_eq!(Profile::Slow.plan(&args).knobs, slow);
        let burst = SaleKnobs { work_ms: Some(7), pause_ratio: Some(0.5), ..SaleKnobs::default() };
        assert_eq!(Profile::Burst.plan(&args).knobs, burst);
    }

    #[test]
    fn knob_flags_out_of_range_are_refused() {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            _args: PlanFlags,
        }
        for flags in [["--pause-ratio", "1.5"], ["--lock-lease-ms", "0"], ["--work-ms", "-1"]] {
            let argv = std::iter::once("compare").chain(flags);
            assert!(<Cli as clap::Parser>::try_parse_from(argv).is_err(), "{flags:?}");
        }
    }

    #[test]
    fn stock_per_sale_adds_up_to_the_stock() {
        let plan = Plan {
            stock: 10,
            sales: 4,
            submissions: 1,
            resubmit: 0.0,
            flood: 0,
            knobs: SaleKnobs::default(),
            payment: None,
            arrival: None,
        };
        assert_eq!(plan.stock_per_sale(), vec![3, 3, 2, 2]);
    }

    #[test]
    fn the_payment_profile_sets_the_window_and_the_buyers_payment() {
        let plan = Profile::Payment.plan(&plan_flags(&["--unpaid-share", "0.5"]));
        assert_eq!(plan.knobs.payment_window_ms, Some(2000));
        assert_eq!(plan.payment, Some(Payment { unpaid_share: 0.5, sale_window_s: 120 }));
        assert_eq!((plan.stock, plan.sales, plan.resubmit), (1000, 1, 0.0));
        let burst = Profile::Burst.plan(&plan_flags(&["--payment-window-ms", "500"]));
        assert_eq!((burst.knobs.payment_window_ms, burst.payment), (None, None));
    }

    #[test]
    fn the_arrival_profile_takes_its_schedule_from_the_shape_it_names() {
        use crate::scenario::arrival::Shape;
        let spike = Profile::Arrival.plan(&plan_flags(&["--arrival-peak", "2500"]));
        assert_eq!(
            spike.arrival,
            Some(Arrival {
                shape: Shape::Spike,
                per_s: 2500.0,
                cap: 10_000,
                generator_cpu_shares: 10_240,
                longest_look_ms: 2000,
            })
        );
        assert_eq!((spike.stock, spike.resubmit), (2000, 0.0));
        let flags = [
            "--arrival-shape",
            "constant",
            "--arrival-rate",
            "700",
            "--arrival-cap",
            "9",
            "--generator-cpu-shares",
            "0",
            "--waiting-room-look-max-ms",
            "5000",
        ];
        let constant = Profile::Arrival.plan(&plan_flags(&flags));
        assert_eq!(
            constant.arrival,
            Some(Arrival {
                shape: Shape::Constant,
                per_s: 700.0,
                cap: 9,
                generator_cpu_shares: 0,
                longest_look_ms: 5000,
            })
        );
        assert_eq!(Profile::Burst.plan(&plan_flags(&[])).arrival, None);
    }
}
