//! The sold-out flag: once Redis has answered "sold out" for a sale, this
//! instance answers `409 sold out` from memory, without a Redis round trip.
//!
//! Stock can come back (a compensation, a reconciliation, a restock), so the
//! flag must not outlive it. Two mechanisms clear it:
//! - every script that returns units publishes the sale id on the
//!   `stock-returned` channel, and [`listen`] clears the flag on every
//!   instance that hears it;
//! - pub/sub is at-most-once (a message sent while an instance is
//!   reconnecting is simply lost), so a flag also expires after `ttl`: a lost
//!   message hides returned stock for at most that long. After a reconnect
//!   the listener clears every flag, since it cannot know what it missed.
//!
//! One race is closed here: a request that read "sold out" from Redis may set
//! its flag *after* the broadcast that undoes it was already processed. Each
//! clear bumps a generation number; a request remembers the generation from
//! before it asked Redis, and its flag is set only if no clear happened
//! since (checked under the same lock that clears).
//!
//! The flag is a shortcut, never the only way to learn the state: without
//! one (an instance started after the sale sold out, or whose flags were
//! cleared on reconnection) a purchase asks Redis, whose counter holds what
//! Postgres holds (warmed from it, reconciled with it), and sets the flag
//! from that answer. So a flag is at most `ttl` behind stock that came back
//! unannounced, and a missing flag costs one Redis round trip, not a wrong
//! answer. Expired flags are dropped, at most once per `ttl`, when another
//! is set: the map holds only the sales that sold out within the last two
//! periods.

use std::collections::HashMap;
use std::sync::{RwLock, Weak};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use futures_util::StreamExt;

use crate::sale::SaleId;

/// Per-instance sold-out flags, each with an expiry.
pub struct SoldOutFlags {
    ttl: Duration,
    inner: RwLock<Flags>,
}

#[derive(Default)]
struct Flags {
    /// Bumped by every clear.
    generation: u64,
    /// Sale → when its flag expires.
    until: HashMap<SaleId, Instant>,
    /// When expired flags were last dropped (`None`: never).
    pruned: Option<Instant>,
}

impl SoldOutFlags {
    /// Flags that expire `ttl` after being set; a zero `ttl` disables them.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, inner: RwLock::default() }
    }

    /// True while `sale` is flagged sold out on this instance.
    pub fn is_set(&self, sale: SaleId) -> bool {
        let flags = self.inner.read().expect("sold-out flags lock");
        flags.until.get(&sale).is_some_and(|until| Instant::now() < *until)
    }

    /// The generation to pass to [`SoldOutFlags::set`]; read it before asking
    /// Redis.
    pub fn generation(&self) -> u64 {
        self.inner.read().expect("sold-out flags lock").generation
    }

    /// Flags `sale` as sold out, unless a clear happened after `generation`
    /// was read.
    pub fn set(&self, sale: SaleId, generation: u64) {
        self.set_at(sale, generation, Instant::now());
    }

    /// [`SoldOutFlags::set`] at `now`, dropping the flags expired by then
    /// if none were dropped for one `ttl`.
    fn set_at(&self, sale: SaleId, generation: u64, now: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let mut flags = self.inner.write().expect("sold-out flags lock");
        if flags.pruned.is_none_or(|at| now.duration_since(at) >= self.ttl) {
            flags.until.retain(|_, until| now < *until);
            flags.pruned = Some(now);
        }
        if flags.generation == generation {
            flags.until.insert(sale, now + self.ttl);
        }
    }

    /// How many sales hold a flag, expired ones not yet dropped included.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.read().expect("sold-out flags lock").until.len()
    }

    /// Stock came back for `sale`.
    pub fn clear(&self, sale: SaleId) {
        let mut flags = self.inner.write().expect("sold-out flags lock");
        flags.generation += 1;
        flags.until.remove(&sale);
    }

    /// Clears every flag (after missing broadcasts).
    pub fn clear_all(&self) {
        let mut flags = self.inner.write().expect("sold-out flags lock");
        flags.generation += 1;
        flags.until.clear();
    }
}

/// Subscribes to `channel` on a dedicated connection to one of `nodes` (the
/// Redis node, or the seeds of a cluster, whose every node hears every
/// `PUBLISH`) and clears the flag of each sale announced there. Subscribes
/// again [`RESUBSCRIBE_PAUSE`] after a subscription is lost, then with
/// exponential back-off while Redis does not answer (100 ms doubling to 5 s,
/// each pause plus a random jitter of up to its own length: at most 10 s),
/// each attempt on the next node in turn, so that a cluster node taken down
/// is left for another; clears all flags on every (re)subscription. Ends
/// when the flags are dropped. `nodes` must not be empty.
pub async fn listen(nodes: Vec<redis::Client>, channel: String, flags: Weak<SoldOutFlags>) {
    let attempts = std::sync::atomic::AtomicUsize::new(0);
    let next_node = || {
        let i = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &nodes[i % nodes.len()]
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times();
    loop {
        let subscribed = (|| subscribe(next_node(), &channel))
            .retry(backoff)
            .sleep(tokio::time::sleep)
            .when(|_| flags.strong_count() > 0)
            .notify(|err, _| tracing::debug!(error = %err, "cannot subscribe to stock-returned"))
            .await;
        // Only a dropped owner ends the retries: the listener ends with it.
        let Ok((mut messages, node)) = subscribed else { return };
        let Some(strong) = flags.upgrade() else { return };
        strong.clear_all();
        drop(strong);
        tracing::debug!(%channel, %node, "listening for stock-returned broadcasts");
        while let Some(message) = messages.next().await {
            let Some(flags) = flags.upgrade() else { return };
            match message.get_payload::<i64>() {
                Ok(sale) => flags.clear(SaleId(sale)),
                Err(err) => tracing::warn!(error = %err, "malformed stock-returned message"),
            }
        }
        tracing::warn!(%channel, "stock-returned subscription lost; reconnecting");
        tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
    }
}

/// The pause between a lost subscription and the next, so that one that
/// keeps dropping right after it is made does not loop at once.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_millis(100);

/// A subscription to `channel` on `client`'s node, and that node's address.
async fn subscribe(
    client: &redis::Client,
    channel: &str,
) -> anyhow::Result<(redis::aio::PubSubStream, String)> {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let connect = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        anyhow::Ok((pubsub.into_on_message(), client.get_connection_info().addr().to_string()))
    };
    tokio::time::timeout(TIMEOUT, connect).await?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_flags_are_dropped_and_the_map_shrinks() {
        let ttl = Duration::from_millis(1000);
        let flags = SoldOutFlags::new(ttl);
        let start = Instant::now();
        for id in 0..1000 {
            flags.set_at(SaleId(id), flags.generation(), start);
        }
        assert_eq!(flags.len(), 1000);
        // Within a period nothing is dropped; once they expired, all are.
        flags.set_at(SaleId(5000), flags.generation(), start + ttl / 2);
        assert_eq!(flags.len(), 1001);
        flags.set_at(SaleId(7000), flags.generation(), start + ttl * 2);
        assert_eq!(flags.len(), 1, "only the flag just set");
    }

    #[test]
    fn a_clear_since_the_question_keeps_the_sale_open() {
        let flags = SoldOutFlags::new(Duration::from_secs(60));
        let generation = flags.generation();
        flags.clear(SaleId(1));
        flags.set(SaleId(1), generation);
        assert!(!flags.is_set(SaleId(1)));
        flags.set(SaleId(1), flags.generation());
        assert!(flags.is_set(SaleId(1)));
    }
}
