//! Sale sizing: each strategy's stock set so that its steady window lasts
//! the target, instead of one stock for every strategy.
//!
//! With one stock for all, a strategy 60 times faster than the slowest
//! sells it in a sixtieth of the time: at 5000 units `sql/batched`'s steady
//! window was under a second, `lock/redlock`'s 25 s. So when `--stock` is
//! not given, a comparison first runs a short pilot sale of each strategy
//! ([`PILOT_STOCK`] units, larger while its window is too short to read a
//! rate from), and each run then sells
//! `rate × target ÷ (1 − 2 × TRIM)` units ([`stock_for_window`]), the
//! target being [`AIM`] × the shortest window that ranks. The rate is the
//! highest steady rate of the strategy's runs so far, and before its first
//! run [`PILOT_MARGIN`] × its pilot's: on a 2-core machine a strategy's
//! rate varied by up to 1.7 times between its runs of one comparison, and
//! a first run sold at 0.55–1.58 times its pilot's rate
//! (docs/report-format.md, "Steady windows"). A stock sized from a typical
//! rate gave the faster runs windows too short to rank; one sized from the
//! highest costs the slower runs some seconds.
//! Every sized run still sells out and is audited; one whose window still
//! fell short is flagged `too_short_to_rank`, never ranked.
//!
//! Profiles whose runs measure something other than a rate keep their
//! fixed stock ([`sized`]): `slow` (stalls of 600 ms: its point is which
//! locks survive them), `payment` (units returned and resold within a
//! sale window) and `arrival` (its schedule, not its stock, sets how long
//! it lasts).

use std::collections::BTreeMap;

use seckill::strategy::StrategyName;
use serde::{Deserialize, Serialize};

use crate::profile::Profile;
use crate::steady::TRIM;

/// How far above the shortest ranked window sizing aims: a run up to 1.67
/// times as fast as the rate its stock was sized from still gives a window
/// long enough.
pub const AIM: f64 = 5.0 / 3.0;

/// How much faster than its pilot a strategy's first run is assumed to
/// sell: its first runs sold at up to 1.58 times their pilot's rate.
pub const PILOT_MARGIN: f64 = 1.5;

/// Units of the first pilot sale of a strategy.
pub const PILOT_STOCK: u64 = 1_000;

/// The shortest pilot window whose rate sizes the runs, seconds: the
/// first tenth of a sale is goose launching its users, so a shorter
/// window mostly measures the launch.
pub const PILOT_MIN_WINDOW_S: f64 = 1.0;

/// Pilot sales at most per strategy and profile (each several times the
/// last one's stock).
pub const PILOT_TRIES: usize = 3;

/// Fewest and most units a sized run sells: below, a window is a handful of
/// orders; above, the load generator's buyers (3 × stock by default) no
/// longer fit a few seconds of sending.
pub const STOCK_BOUNDS: (u64, u64) = (200, 300_000);

/// Whether runs of `profile` are sized (see the module documentation).
pub fn sized(profile: Profile) -> bool {
    !matches!(profile, Profile::Slow | Profile::Payment | Profile::Arrival)
}

/// Units that sell in a steady window of `window_s` seconds at `rate` units
/// per second: the window holds the middle `1 − 2 × TRIM` of a sale's
/// units. Within [`STOCK_BOUNDS`]; the lower bound for a rate that is not a
/// positive number.
pub fn stock_for_window(rate: f64, window_s: f64) -> u64 {
    let (least, most) = STOCK_BOUNDS;
    if !(rate.is_finite() && rate > 0.0) {
        return least;
    }
    let units = (rate * window_s / (1.0 - 2.0 * TRIM)).ceil();
    (units as u64).clamp(least, most)
}

/// The stock of the next pilot sale after one of `stock` units whose
/// steady window lasted `window_s` (`None`: fewer than two orders): enough
/// for twice [`PILOT_MIN_WINDOW_S`] at the rate seen, at least 4 and at
/// most 20 times more.
pub fn next_pilot_stock(stock: u64, window_s: Option<f64>) -> u64 {
    let factor = match window_s {
        Some(seconds) if seconds > 0.0 => (2.0 * PILOT_MIN_WINDOW_S / seconds).clamp(4.0, 20.0),
        _ => 20.0,
    };
    ((stock as f64 * factor).ceil() as u64).min(STOCK_BOUNDS.1)
}

/// One pilot sale, as report.json's `pilots` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pilot {
    pub strategy: String,
    pub profile: String,
    pub stock: u64,
    pub units_sold: i64,
    /// Oversold, from the audit (a baseline's pilot oversells too).
    pub oversold: i64,
    pub steady_window_s: Option<f64>,
    /// Units per second over the steady window.
    pub sell_through_per_s: Option<f64>,
}

/// The rates the stocks of the next runs are sized from.
#[derive(Debug, Clone)]
pub struct Sizing {
    /// The steady window aimed at, seconds (`AIM` × the shortest ranked).
    target_s: f64,
    /// The highest pilot rate by (strategy, profile).
    pilots: BTreeMap<(StrategyName, Profile), f64>,
    /// The highest steady rate of a run so far by (strategy, profile).
    runs: BTreeMap<(StrategyName, Profile), f64>,
}

impl Sizing {
    /// Sizing for runs whose steady window must last `min_window_s`.
    pub fn new(min_window_s: f64) -> Sizing {
        Sizing { target_s: min_window_s * AIM, pilots: BTreeMap::new(), runs: BTreeMap::new() }
    }

    /// The steady window aimed at, seconds.
    pub fn target_s(&self) -> f64 {
        self.target_s
    }

    /// Records the steady rate of a pilot sale (one without a rate adds
    /// nothing).
    pub fn pilot(&mut self, strategy: StrategyName, profile: Profile, rate: Option<f64>) {
        highest(&mut self.pilots, (strategy, profile), rate);
    }

    /// Records the steady rate of a run (one without a rate, or of a profile
    /// that is not [`sized`], adds nothing).
    pub fn record(&mut self, strategy: StrategyName, profile: Profile, rate: Option<f64>) {
        if sized(profile) {
            highest(&mut self.runs, (strategy, profile), rate);
        }
    }

    /// The stock of the next run of `strategy` in `profile`, sized from the
    /// highest rate of its runs so far, else from [`PILOT_MARGIN`] × its
    /// pilot's; `None` before either, and always for a profile that is not
    /// [`sized`] (the profile's own stock then).
    pub fn stock(&self, strategy: StrategyName, profile: Profile) -> Option<u64> {
        if !sized(profile) {
            return None;
        }
        let key = (strategy, profile);
        let rate =
            self.runs.get(&key).copied().or(self.pilots.get(&key).map(|r| r * PILOT_MARGIN))?;
        Some(stock_for_window(rate, self.target_s))
    }
}

/// Keeps in `rates` the highest of its rate for `key` and `rate` (a rate
/// that is not a positive number changes nothing).
fn highest(
    rates: &mut BTreeMap<(StrategyName, Profile), f64>,
    key: (StrategyName, Profile),
    rate: Option<f64>,
) {
    if let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) {
        let highest = rates.entry(key).or_insert(rate);
        *highest = highest.max(rate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sized_stock_sells_for_the_window_in_the_middle_80_percent() {
        // 1000 units/s for a 4 s window: 4000 units in the middle 80 %.
        assert_eq!(stock_for_window(1000.0, 4.0), 5000);
        assert_eq!(stock_for_window(150.0, 4.0), 750);
        assert_eq!(stock_for_window(10.0, 4.0), STOCK_BOUNDS.0, "at least a few hundred");
        assert_eq!(stock_for_window(1e9, 4.0), STOCK_BOUNDS.1, "at most the upper bound");
        assert_eq!(stock_for_window(f64::NAN, 4.0), STOCK_BOUNDS.0);
        assert_eq!(stock_for_window(0.0, 4.0), STOCK_BOUNDS.0);
    }

    #[test]
    fn a_short_pilot_is_followed_by_a_larger_one() {
        // 0.1 s: 20 times more would reach 2 s.
        assert_eq!(next_pilot_stock(1000, Some(0.1)), 20_000);
        // 0.8 s: 2.5 times would do, at least 4.
        assert_eq!(next_pilot_stock(1000, Some(0.8)), 4_000);
        assert_eq!(next_pilot_stock(1000, Some(0.2)), 10_000);
        assert_eq!(next_pilot_stock(1000, None), 20_000, "no window at all");
        assert_eq!(next_pilot_stock(100_000, Some(0.01)), STOCK_BOUNDS.1);
    }

    #[test]
    fn stocks_come_from_the_pilot_with_a_margin_then_from_the_fastest_run() {
        let (sql, profile) = (StrategyName::ALL[0], Profile::Burst);
        let mut sizing = Sizing::new(3.0);
        assert!((sizing.target_s() - 5.0).abs() < 1e-12);
        assert_eq!(sizing.stock(sql, profile), None, "nothing measured yet");
        sizing.pilot(sql, profile, Some(300.0));
        sizing.pilot(sql, profile, Some(400.0));
        // 1.5 × 400 units/s for 5 s in the middle 80 %.
        assert_eq!(sizing.stock(sql, profile), Some(3_750), "the faster pilot's, with the margin");
        sizing.record(sql, profile, Some(500.0));
        assert_eq!(sizing.stock(sql, profile), Some(3_125), "a run replaces the pilots");
        sizing.record(sql, profile, Some(1_000.0));
        assert_eq!(sizing.stock(sql, profile), Some(6_250), "a faster run's");
        sizing.record(sql, profile, None);
        sizing.record(sql, profile, Some(f64::NAN));
        sizing.record(sql, profile, Some(700.0));
        assert_eq!(sizing.stock(sql, profile), Some(6_250), "a slower run changes nothing");
        assert_eq!(sizing.stock(sql, Profile::Flood), None, "per profile");
    }

    /// `payment` and `slow` keep their own stock in every round: a run's
    /// rate, recorded, does not size the next one (rounds 2 and 3 of a
    /// `payment` comparison had sold 900 to 6600 units instead of 1000).
    #[test]
    fn runs_of_an_unsized_profile_keep_the_profiles_stock() {
        let sql = StrategyName::ALL[0];
        let mut sizing = Sizing::new(3.0);
        for profile in [Profile::Payment, Profile::Slow] {
            sizing.pilot(sql, profile, Some(400.0));
            sizing.record(sql, profile, Some(500.0));
            assert_eq!(sizing.stock(sql, profile), None, "{profile:?}");
        }
    }

    #[test]
    fn only_the_profiles_that_measure_a_rate_are_sized() {
        let sized: Vec<Profile> = Profile::ALL.iter().copied().filter(|p| sized(*p)).collect();
        assert_eq!(
            sized,
            [Profile::Burst, Profile::RetryStorm, Profile::MultiSale, Profile::Flood]
        );
    }
}
