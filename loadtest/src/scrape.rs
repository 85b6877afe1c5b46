//! Reads counters from every instance's `/metrics` (Prometheus text format),
//! for figures the app counts itself, such as Redis round trips.

use std::collections::BTreeMap;

/// Counter values summed over every instance, keyed by
/// `name{label="value",…}` exactly as the exposition writes the series.
#[derive(Debug, Default, Clone)]
pub struct Counters(BTreeMap<String, f64>);

impl Counters {
    /// Scrapes `GET {url}/metrics` of each instance and sums the series.
    pub async fn scrape(client: &reqwest::Client, urls: &[String]) -> anyhow::Result<Counters> {
        let mut sums = BTreeMap::new();
        for url in urls {
            let text = client.get(format!("{url}/metrics")).send().await?.text().await?;
            for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
                let Some((series, value)) = line.rsplit_once(' ') else { continue };
                if let Ok(value) = value.parse::<f64>() {
                    *sums.entry(series.to_owned()).or_insert(0.0) += value;
                }
            }
        }
        Ok(Counters(sums))
    }

    /// The sum of every series of counter `name` whose labels include
    /// `label="value"`.
    pub fn sum(&self, name: &str, label: &str, value: &str) -> f64 {
        let needle = format!("{label}=\"{value}\"");
        self.0
            .iter()
            .filter(|(series, _)| {
                series
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') && rest.contains(&needle))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// The sum of every series of counter `name`, whatever its labels.
    pub fn total(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(series, _)| {
                series
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// `after − before` for the same selection.
    pub fn delta(before: &Counters, after: &Counters, name: &str, label: &str, value: &str) -> f64 {
        after.sum(name, label, value) - before.sum(name, label, value)
    }
}
