//! The admin API of the instances, as the comparison uses it: create a
//! sale, audit it, read its queue, batch and lock statistics. Every call is
//! authenticated with the invocation's admin token; an answer other than
//! the documented success is an error that carries the service's answer.

use std::time::Duration;

use anyhow::{Context, bail};
use seckill::audit::Audit;
use seckill::sale::SaleId;
use seckill::strategy::descriptor::{BatchStats, QueueStats};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::scrape::Counters;

/// The admin API of the first instance.
pub struct Admin {
    client: reqwest::Client,
    base: String,
    token: String,
}

impl Admin {
    pub fn new(base: &str, token: &str) -> Admin {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("a default client builds");
        Admin { client, base: base.to_owned(), token: token.to_owned() }
    }

    /// The counters of every instance at `urls` (their `/metrics`, read
    /// with the admin token), summed.
    pub async fn counters(&self, urls: &[String]) -> anyhow::Result<Counters> {
        Counters::scrape(&self.client, urls, &self.token).await
    }

    pub async fn create_sale(&self, body: Value) -> anyhow::Result<SaleId> {
        let response = self
            .client
            .post(format!("{}/admin/sales", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let answer: Value = response.json().await?;
        if status != reqwest::StatusCode::CREATED {
            bail!("creating a sale answered {status}: {answer}");
        }
        Ok(SaleId(answer["id"].as_i64().context("sale id")?))
    }

    /// `GET url` with the admin token, read as JSON. Errors: the request
    /// failed, or the answer is not a success (`what` answered, with its
    /// body).
    async fn get<T: DeserializeOwned>(&self, url: String, what: &str) -> anyhow::Result<T> {
        let response = self.client.get(url).bearer_auth(&self.token).send().await?;
        let status = response.status();
        if !status.is_success() {
            bail!("{what} answered {status}: {}", response.text().await.unwrap_or_default());
        }
        Ok(response.json().await?)
    }

    /// `max_concurrency` inside the critical section across all instances:
    /// each instance's `lock-stats` call first flushes its own recorded
    /// intervals, so the last answer covers every instance.
    pub async fn max_concurrency(&self, urls: &[String], sale: SaleId) -> anyhow::Result<i64> {
        let mut last = Value::Null;
        for url in urls {
            last =
                self.get(format!("{url}/admin/sales/{}/lock-stats", sale.0), "lock-stats").await?;
        }
        last["max_concurrency"].as_i64().context("lock-stats without max_concurrency")
    }

    /// The batches of `sale` (of a strategy that settles in batches) over all
    /// instances: each instance counts its own.
    pub async fn batch_stats(&self, urls: &[String], sale: SaleId) -> anyhow::Result<BatchStats> {
        let mut all = Vec::with_capacity(urls.len());
        for url in urls {
            let url = format!("{url}/admin/sales/{}/batches", sale.0);
            all.push(self.get(url, "batch statistics").await?);
        }
        Ok(BatchStats::merge(sale, &all))
    }

    /// The settling statistics of `sales` (of a strategy that settles after
    /// its answer) once none has an unresolved request, or as they stand
    /// after `within`.
    pub async fn drained(
        &self,
        sales: &[SaleId],
        within: Duration,
    ) -> anyhow::Result<Vec<QueueStats>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let mut all = Vec::with_capacity(sales.len());
            for &sale in sales {
                all.push(self.queue_stats(sale).await?);
            }
            if all.iter().all(|s| s.accepted_unresolved == 0)
                || tokio::time::Instant::now() >= deadline
            {
                return Ok(all);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn queue_stats(&self, sale: SaleId) -> anyhow::Result<QueueStats> {
        self.get(format!("{}/admin/sales/{}/queue", self.base, sale.0), "settling statistics").await
    }

    pub async fn audit(&self, sale: SaleId) -> anyhow::Result<Audit> {
        self.get(format!("{}/admin/sales/{}/audit", self.base, sale.0), "audit").await
    }
}
