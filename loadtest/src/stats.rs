//! The numerical side of comparing repeats: medians, and a 95 % confidence
//! interval for a ratio measured once per round.
//!
//! Every ratio the report prints is already paired within its round: a
//! run's rate over its own round's ceiling, or a strategy's sell-through
//! over the `sql` run of the same round. Rounds differ mostly by a factor
//! (the machine was busier or idler for all of that round), so the interval
//! is taken on the logarithms of the per-round ratios: the mean of the logs
//! ± Student's t (two-sided 95 %, n − 1 degrees of freedom) × their
//! standard error, mapped back with `exp` — a t-interval for the geometric
//! mean ratio. With three repeats t is 4.30, so the interval is wide: that
//! is what three repeats can say. A bootstrap over three values would draw
//! from at most ten distinct resamples and understate the spread; a
//! sign-based interval cannot reach 95 % below six values.
//!
//! A strategy's sell-through against `sql` is the exception
//! ([`welch_ratio_ci95`]): its interval compares the logarithms of the
//! strategy's rates and of `sql`'s per-round means over the same rounds,
//! unpaired, with Welch's degrees of freedom (docs/report-format.md,
//! "Intervals", gives the measurements that chose it).

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Fewest repeats for which an interval is given.
pub const MIN_REPEATS: usize = 3;

/// The two-sided 95 % quantile of Student's t for `df ≥ 1` degrees of
/// freedom (`statrs`; 4.303 for 2, 1.96 in the limit).
fn t_975(df: usize) -> f64 {
    t_975_of(df as f64)
}

/// [`t_975`] for fractional degrees of freedom (`df > 0`; NaN otherwise).
fn t_975_of(df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df).map_or(f64::NAN, |t| t.inverse_cdf(0.975))
}

/// The logarithms of the positive finite `values`; `None` when any value
/// is not (a rate of 0 or below means nothing was measured).
fn logs(values: &[f64]) -> Option<Vec<f64>> {
    values.iter().map(|&v| (v.is_finite() && v > 0.0).then(|| v.ln())).collect()
}

/// Mean and sample variance (`n − 1`) of at least two values.
fn mean_variance(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (mean, values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0))
}

/// The 95 % interval `[lo, hi]` of the ratio of the geometric means of
/// `numerator` and `denominator` (one rate per round on each side, from the
/// same rounds): Welch's unequal-variances t-interval on their
/// logarithms, `exp(Δ ± t₀.₉₇₅,ν × √(s₁²/n₁ + s₂²/n₂))`, with ν from the
/// Welch–Satterthwaite equation (Welch 1947, "The generalization of
/// 'Student's' problem when several different population variances are
/// involved", Biometrika 34).
///
/// Unpaired: where a round's factor is shared by both sides (the machine
/// busier for the whole round), it cancels in Δ, since both sides come from
/// the same rounds, while each side's spread still contains it — the
/// interval is then wider than the paired one would need, and in exchange
/// has up to 2(n − 1) degrees of freedom instead of n − 1 (4 instead of 2
/// for three rounds). Where a round's factor is one side's own, it is in
/// that side's spread, as it would be in the paired differences.
///
/// `None` with fewer than [`MIN_REPEATS`] numerator values, fewer than two
/// denominator values, or any value that is not positive and finite.
pub fn welch_ratio_ci95(numerator: &[f64], denominator: &[f64]) -> Option<[f64; 2]> {
    let (a, b) = (logs(numerator)?, logs(denominator)?);
    if a.len() < MIN_REPEATS || b.len() < 2 {
        return None;
    }
    let ((mean_a, var_a), (mean_b, var_b)) = (mean_variance(&a), mean_variance(&b));
    let (sa, sb) = (var_a / a.len() as f64, var_b / b.len() as f64);
    let delta = mean_a - mean_b;
    let se2 = sa + sb;
    if se2 == 0.0 {
        return Some([delta.exp(), delta.exp()]);
    }
    let df = se2.powi(2) / (sa.powi(2) / (a.len() - 1) as f64 + sb.powi(2) / (b.len() - 1) as f64);
    let half = t_975_of(df) * se2.sqrt();
    Some([(delta - half).exp(), (delta + half).exp()])
}

/// The middle value of the finite `values`; the mean of the two middle ones
/// for an even count; `None` for none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    Some(if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 })
}

/// The 95 % interval `[lo, hi]` of a ratio from its per-round values (see
/// the module documentation); `None` with fewer than [`MIN_REPEATS`]
/// positive finite values (a ratio of 0 or below has no logarithm, and
/// means that nothing was measured).
pub fn ratio_ci95(ratios: &[f64]) -> Option<[f64; 2]> {
    let [lo, hi] = mean_ci95(&logs(ratios)?)?;
    Some([lo.exp(), hi.exp()])
}

/// The 95 % interval `[lo, hi]` of the mean of `values` on their own scale:
/// the mean ± Student's t × the standard error. For figures that are not
/// positive factors of a round's state but bounded scores (a share of
/// buyers, a rank correlation), whose rounds differ by an amount, not a
/// factor. `None` with fewer than [`MIN_REPEATS`] finite values or with any
/// value that is not finite.
pub fn mean_ci95(values: &[f64]) -> Option<[f64; 2]> {
    let n = values.len();
    if n < MIN_REPEATS || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let (mean, variance) = mean_variance(values);
    let half = t_975(n - 1) * (variance / n as f64).sqrt();
    Some([mean - half, mean + half])
}

/// How a strategy's sell-through compares with `sql`'s, from the interval
/// of their paired ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VsSql {
    /// The whole interval lies above 1.
    Faster,
    /// The whole interval lies below 1.
    Slower,
    /// The interval contains 1.
    Indistinguishable,
}

impl VsSql {
    /// The verdict of interval `[lo, hi]` of a ratio to `sql`.
    pub fn of([lo, hi]: [f64; 2]) -> VsSql {
        if lo > 1.0 {
            VsSql::Faster
        } else if hi < 1.0 {
            VsSql::Slower
        } else {
            VsSql::Indistinguishable
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            VsSql::Faster => "faster",
            VsSql::Slower => "slower",
            VsSql::Indistinguishable => "indistinguishable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-3
    }

    /// Within 0.1 %: the tables give t to three decimals.
    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-3 * b.abs()
    }

    #[test]
    fn the_welch_interval_matches_a_worked_example_and_needs_enough_values() {
        // Unequal counts, as the formula allows. Logs 0, 0.1, 0.2 against 0,
        // 0.2, 0, 0.2, 0, 0.2: Δ = 0.1 − 0.1 = 0; s₁²/3 = 0.01/3, s₂²/6 =
        // 0.012/6, standard error √0.005333 = 0.07303; ν = 0.005333² /
        // (0.003333²/2 + 0.002²/5) = 4.475.
        let (e, f) = (std::f64::consts::E, |x: f64| x.exp());
        let a = [1.0, f(0.1), f(0.2)];
        let b = [1.0, f(0.2), 1.0, f(0.2), 1.0, f(0.2)];
        let [lo, hi] = welch_ratio_ci95(&a, &b).unwrap();
        let half = t_975_of(4.475) * 0.07303;
        assert!((2.66..2.67).contains(&t_975_of(4.475)), "between t(4) 2.776 and t(5) 2.571");
        assert!(near(hi.ln(), half) && near(lo.ln(), -half), "[{lo}, {hi}]");
        // A pure factor: twice as fast in every round, no spread.
        assert_eq!(welch_ratio_ci95(&[2.0, 2.0, 2.0], &[1.0, 1.0]), Some([2.0, 2.0]));
        assert_eq!(welch_ratio_ci95(&[e, e], &[1.0, 1.0]), None, "two repeats");
        assert_eq!(welch_ratio_ci95(&[e, e, e], &[1.0]), None, "one reference run");
        assert_eq!(welch_ratio_ci95(&[e, 0.0, e], &[1.0, 1.0]), None, "a rate of 0");
    }

    #[test]
    fn a_round_factor_cancels_in_the_welch_ratio_and_only_widens_it() {
        // Both sides 1.3 times faster in round 2: the ratio stays 2.
        let (a, b) = ([2.0, 2.6, 2.0], [1.0, 1.3, 1.0]);
        let [lo, hi] = welch_ratio_ci95(&a, &b).unwrap();
        assert!(lo < 2.0 && hi > 2.0, "[{lo}, {hi}]");
        assert!(ratio_ci95(&[2.0, 2.0, 2.0]) == Some([2.0, 2.0]), "paired: a point");
    }

    #[test]
    fn the_t_quantiles_are_the_tables() {
        // NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2.
        for (df, table) in [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)] {
            assert!((t_975(df) - table).abs() < 1e-3, "df {df}: {}", t_975(df));
        }
    }

    #[test]
    fn the_median_takes_the_middle_and_skips_what_is_not_finite() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn the_interval_is_a_t_interval_on_the_logarithms() {
        // ln 1, ln e, ln e² = 0, 1, 2: mean 1, sd 1, n 3, t 4.303.
        let e = std::f64::consts::E;
        let [lo, hi] = ratio_ci95(&[1.0, e, e * e]).unwrap();
        let half = 4.303 / 3f64.sqrt();
        assert!(near(lo, (1.0 - half).exp()) && near(hi, (1.0 + half).exp()), "{lo} {hi}");
        // Four values 2, 8, 2, 8: the logs' mean is ln 4; t(3) = 3.182.
        let logs = [2f64.ln(), 2f64.ln(), 8f64.ln(), 8f64.ln()];
        let mean = logs.iter().sum::<f64>() / 4.0;
        let sd = (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 3.0).sqrt();
        let [lo, hi] = ratio_ci95(&[2.0, 8.0, 2.0, 8.0]).unwrap();
        assert!(near(lo, (mean - 3.182 * sd / 2.0).exp()), "{lo}");
        assert!(near(hi, (mean + 3.182 * sd / 2.0).exp()), "{hi}");
        assert!(close((lo * hi).sqrt(), 4.0), "centred on the geometric mean");
    }

    #[test]
    fn identical_ratios_give_a_point_and_too_few_give_nothing() {
        assert_eq!(ratio_ci95(&[2.0, 2.0, 2.0]), Some([2.0, 2.0]));
        assert_eq!(ratio_ci95(&[2.0, 2.1]), None, "two repeats");
        assert_eq!(ratio_ci95(&[2.0, 0.0, 2.1, 1.9]), None, "a round that measured nothing");
        assert_eq!(ratio_ci95(&[2.0, f64::NAN, 2.1, 1.9]), None);
    }

    #[test]
    fn the_verdict_is_whether_the_interval_excludes_one() {
        assert_eq!(VsSql::of([1.02, 1.5]), VsSql::Faster);
        assert_eq!(VsSql::of([0.4, 0.98]), VsSql::Slower);
        assert_eq!(VsSql::of([0.9, 1.1]), VsSql::Indistinguishable);
        assert_eq!(VsSql::of([1.0, 1.0]), VsSql::Indistinguishable, "sql against itself");
        // Three rounds of a strategy about twice as fast as sql, and three
        // that straddle it.
        assert_eq!(VsSql::of(ratio_ci95(&[2.05, 2.3, 2.21]).unwrap()), VsSql::Faster);
        assert_eq!(VsSql::of(ratio_ci95(&[0.9, 1.2, 1.05]).unwrap()), VsSql::Indistinguishable);
        assert_eq!(VsSql::of(ratio_ci95(&[0.46, 0.49, 0.58]).unwrap()), VsSql::Slower);
    }

    /// 0.5, 0.6, 0.7: mean 0.6, standard error 0.1 / √3, t(2) = 4.303.
    #[test]
    fn a_mean_interval_is_symmetric_on_the_values_own_scale() {
        let [lo, hi] = mean_ci95(&[0.5, 0.6, 0.7]).unwrap();
        let half = 4.302_652_7 * 0.1 / 3f64.sqrt();
        assert!((lo - (0.6 - half)).abs() < 1e-6 && (hi - (0.6 + half)).abs() < 1e-6);
        let [lo, hi] = mean_ci95(&[-0.2, -0.3, -0.1]).unwrap();
        assert!(
            ((lo + hi) / 2.0 + 0.2).abs() < 1e-12 && lo < -0.3,
            "a negative score: [{lo}, {hi}]"
        );
        assert_eq!(mean_ci95(&[0.5, 0.6]), None, "two values");
        assert_eq!(mean_ci95(&[0.5, f64::NAN, 0.7]), None);
    }
}
