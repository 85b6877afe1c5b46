//! Reads counters from every instance's `/metrics` (Prometheus text format),
//! for figures the app counts itself, such as Redis round trips.
//!
//! The scraper fails loudly: each series a run reads is declared once as a
//! [`Figure`], with the strategies for which the service exports it. For
//! those strategies a series absent from `/metrics` after the phase is an
//! error that names it (a renamed metric would otherwise read as 0 and the
//! report would show a strategy that costs nothing). Absent *before* the
//! phase reads as 0: the service creates a counter on its first increment,
//! which is a count of 0 until then. For other strategies the figure does not
//! apply and reads as `None`.

use std::collections::BTreeMap;

use anyhow::bail;
use seckill::metric_names;
use seckill::strategy::{Backend, StrategyName, registration};

/// What follows a metric's name when the series has labels.
const LABELS: char = '{';

/// Sample values summed over every instance, keyed by `name{labels}` exactly
/// as the exposition writes the series.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Counters(BTreeMap<String, f64>);

/// A series a run reads, and when the service must export it.
#[derive(Clone, Copy)]
pub struct Figure {
    /// Metric name, from [`seckill::metric_names`].
    pub metric: &'static str,
    /// The label that carries the strategy's wire name, for a metric with
    /// one series per strategy; `None` adds up every series of the metric.
    pub strategy_label: Option<&'static str>,
    /// Whether the service exports the series when `strategy` is under test.
    pub exported_for: fn(StrategyName) -> bool,
}

fn uses_redis(strategy: StrategyName) -> bool {
    strategy.needs().contains(&Backend::Redis)
}

fn uses_rabbitmq(strategy: StrategyName) -> bool {
    strategy.needs().contains(&Backend::Rabbitmq)
}

/// The strategies that take a lock (their registration's `takes_a_lock`)
/// register their lock counters at 0 when built.
fn takes_a_lock(strategy: StrategyName) -> bool {
    registration(strategy).takes_a_lock
}

/// Round trips to Redis, per strategy: counted by every strategy that uses
/// Redis, on every purchase that reaches it.
pub const REDIS_ROUND_TRIPS: Figure = Figure {
    metric: metric_names::REDIS_ROUND_TRIPS_TOTAL,
    strategy_label: Some("strategy"),
    exported_for: uses_redis,
};

/// Round trips to Redis of a run whose sales have a waiting room: the room
/// counts its own under the sale's strategy, so every strategy has them
/// (the series appears with the room's first round trip: none before the
/// phase reads as 0).
pub const ROOM_REDIS_ROUND_TRIPS: Figure = Figure { exported_for: |_| true, ..REDIS_ROUND_TRIPS };

/// AMQP messages, both directions: published by every accepted purchase.
pub const AMQP_MESSAGES: Figure = Figure {
    metric: metric_names::AMQP_MESSAGES_TOTAL,
    strategy_label: None,
    exported_for: uses_rabbitmq,
};

/// Watchdog renewals of a `lock/*` strategy.
pub const LOCK_RENEWALS: Figure = Figure {
    metric: metric_names::LOCK_RENEWALS_TOTAL,
    strategy_label: Some("strategy"),
    exported_for: takes_a_lock,
};

/// Lock waits of a `lock/*` strategy that ran out.
pub const LOCK_TIMEOUTS: Figure = Figure {
    metric: metric_names::LOCK_TIMEOUTS_TOTAL,
    strategy_label: Some("strategy"),
    exported_for: takes_a_lock,
};

/// Writes of a fenced `lock/*` strategy refused by the fence.
pub const FENCE_REJECTIONS: Figure = Figure {
    metric: metric_names::FENCE_REJECTIONS_TOTAL,
    strategy_label: Some("strategy"),
    exported_for: takes_a_lock,
};

/// Every strategy records the holds of its sale's serial resource.
fn every(_: StrategyName) -> bool {
    true
}

/// Seconds of the sale's serial resource held (the `_sum` of the service's
/// hold histogram, `seckill::strategy::serial`): registered by every
/// strategy.
pub const SERIAL_HOLD: Figure = Figure {
    metric: metric_names::SERIAL_HOLD_DURATION_SECONDS_SUM,
    strategy_label: Some("strategy"),
    exported_for: every,
};

/// Units the holds of [`SERIAL_HOLD`] sold.
pub const SERIAL_UNITS: Figure = Figure {
    metric: metric_names::SERIAL_HOLD_UNITS_TOTAL,
    strategy_label: Some("strategy"),
    exported_for: every,
};

impl Counters {
    /// Scrapes `GET {url}/metrics` of each instance, with the admin token
    /// `token` the service asks for there, and sums the series.
    /// Errors: an instance that does not answer 2xx.
    pub async fn scrape(
        client: &reqwest::Client,
        urls: &[String],
        token: &str,
    ) -> anyhow::Result<Counters> {
        let mut sums = Counters::default();
        for url in urls {
            let response = client.get(format!("{url}/metrics")).bearer_auth(token).send().await?;
            let status = response.status();
            if !status.is_success() {
                bail!("{url}/metrics answered {status}");
            }
            sums.add(&Counters::parse(&response.text().await?));
        }
        Ok(sums)
    }

    /// The samples of one exposition text: every line `series value` that is
    /// not a comment (series repeated in the text are added up).
    pub fn parse(text: &str) -> Counters {
        let mut sums = Counters::default();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            if let Ok(value) = value.parse::<f64>() {
                *sums.0.entry(series.trim_end().to_owned()).or_insert(0.0) += value;
            }
        }
        sums
    }

    fn add(&mut self, other: &Counters) {
        for (series, value) in &other.0 {
            *self.0.entry(series.clone()).or_insert(0.0) += value;
        }
    }

    /// The sum of every series of `metric` whose labels include
    /// `label="value"` (every series of `metric` for `None`); `None` when no
    /// series matches.
    pub fn get(&self, metric: &str, label: Option<(&str, &str)>) -> Option<f64> {
        let needle = label.map(|(label, value)| format!("{label}=\"{value}\""));
        let mut matching = self
            .0
            .iter()
            .filter(|(series, _)| {
                series.strip_prefix(metric).is_some_and(|rest| match &needle {
                    Some(needle) => rest.starts_with(LABELS) && rest.contains(needle.as_str()),
                    None => rest.is_empty() || rest.starts_with(LABELS),
                })
            })
            .map(|(_, v)| *v)
            .peekable();
        matching.peek()?;
        Some(matching.sum())
    }

    /// `after − before` of `figure` for `strategy`: `Ok(None)` when the
    /// figure does not apply to the strategy; an error naming the series
    /// when it applies and `after` has no such series (see the module
    /// documentation).
    pub fn delta(
        before: &Counters,
        after: &Counters,
        figure: &Figure,
        strategy: StrategyName,
    ) -> anyhow::Result<Option<f64>> {
        if !(figure.exported_for)(strategy) {
            return Ok(None);
        }
        let label = figure.strategy_label.map(|label| (label, strategy.as_str()));
        let Some(later) = after.get(figure.metric, label) else {
            let series = match label {
                Some((label, value)) => format!("{}{{{label}=\"{value}\"}}", figure.metric),
                None => figure.metric.to_owned(),
            };
            bail!(
                "/metrics of the instances has no series {series}, which the service exports \
                 for `{strategy}` (was the metric renamed?)"
            );
        };
        Ok(Some(later - before.get(figure.metric, label).unwrap_or(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the service's exporter writes it (abridged).
    const SAMPLE: &str = "\
# TYPE seckill_redis_round_trips_total counter
seckill_redis_round_trips_total{strategy=\"redis-decr\"} 42
seckill_redis_round_trips_total{strategy=\"lock/token\"} 7
# TYPE seckill_amqp_messages_total counter
seckill_amqp_messages_total{direction=\"published\"} 10
seckill_amqp_messages_total{direction=\"consumed\"} 9.5
seckill_lock_renewals_total{strategy=\"lock/watchdog\"} 0

# TYPE seckill_queue_batch_size summary
seckill_queue_batch_size{quantile=\"0.5\"} 3
seckill_queue_batch_size_sum 30
seckill_queue_batch_size_count 10
";

    fn strategy(name: &str) -> StrategyName {
        name.parse().unwrap()
    }

    #[test]
    fn parsing_keys_by_series_and_skips_comments() {
        let counters = Counters::parse(SAMPLE);
        let redis = metric_names::REDIS_ROUND_TRIPS_TOTAL;
        assert_eq!(counters.get(redis, Some(("strategy", "redis-decr"))), Some(42.0));
        assert_eq!(counters.get(redis, None), Some(49.0));
        assert_eq!(counters.get(metric_names::AMQP_MESSAGES_TOTAL, None), Some(19.5));
        // A registered counter at 0 is present, not absent.
        let renewals = metric_names::LOCK_RENEWALS_TOTAL;
        assert_eq!(counters.get(renewals, Some(("strategy", "lock/watchdog"))), Some(0.0));
        assert_eq!(counters.get(redis, Some(("strategy", "sql"))), None);
        // A metric whose name is a prefix of another's is not mixed with it.
        assert_eq!(counters.get("seckill_queue_batch_size", None), Some(3.0));
        assert_eq!(counters.get("seckill_queue_batch_size_sum", None), Some(30.0));
    }

    #[test]
    fn instances_add_up() {
        let mut sums = Counters::parse(SAMPLE);
        sums.add(&Counters::parse(SAMPLE));
        let redis = metric_names::REDIS_ROUND_TRIPS_TOTAL;
        assert_eq!(sums.get(redis, Some(("strategy", "lock/token"))), Some(14.0));
    }

    #[test]
    fn a_delta_counts_a_series_absent_before_the_phase_from_zero() {
        let before = Counters::parse("");
        let after = Counters::parse(SAMPLE);
        let delta = Counters::delta(&before, &after, &REDIS_ROUND_TRIPS, strategy("redis-decr"));
        assert_eq!(delta.unwrap(), Some(42.0));
        let delta = Counters::delta(&after, &after, &AMQP_MESSAGES, strategy("queue"));
        assert_eq!(delta.unwrap(), Some(0.0));
    }

    #[test]
    fn a_series_missing_for_the_strategy_under_test_is_an_error_naming_it() {
        // As if the metric had been renamed: nothing under the expected name.
        let renamed = SAMPLE.replace("seckill_redis_round_trips_total", "seckill_redis_trips");
        let after = Counters::parse(&renamed);
        let err =
            Counters::delta(&after, &after, &REDIS_ROUND_TRIPS, strategy("lock/ttl")).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("seckill_redis_round_trips_total{strategy=\"lock/ttl\"}"),
            "{message}"
        );
        let err = Counters::delta(&after, &Counters::default(), &AMQP_MESSAGES, strategy("queue"));
        assert!(err.unwrap_err().to_string().contains("seckill_amqp_messages_total"));
    }

    #[test]
    fn a_figure_that_does_not_apply_is_none_even_when_absent() {
        let empty = Counters::default();
        for figure in [REDIS_ROUND_TRIPS, AMQP_MESSAGES, LOCK_RENEWALS] {
            assert_eq!(Counters::delta(&empty, &empty, &figure, strategy("sql")).unwrap(), None);
        }
        let lock = Counters::delta(&empty, &empty, &LOCK_TIMEOUTS, strategy("lock/local"));
        assert!(lock.is_err(), "every lock/* strategy registers its lock counters");
    }
}
