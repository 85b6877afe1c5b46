//! Buyers known, in this instance, to hold an order of a sale.
//!
//! Every strategy keeps one order per (sale, buyer) by the unique constraint,
//! but it finds a repeated buyer only when its write reaches Postgres: after
//! the sale's lock (`lock/*`), a Redis script (`redis-decr`) or a publish
//! (`queue`). A repeated buyer — a client retrying, or a bot hammering — would
//! then cost what a real purchase costs and keep real buyers waiting. Once a
//! purchase of this instance was answered `placed` or `already_purchased`,
//! the buyer is remembered here, and the next purchase of the same buyer is
//! answered `already_purchased` before the strategy runs.
//!
//! Orders are final, so a remembered buyer never becomes wrong; an order
//! lifecycle that returns units (cancel, expiry) must forget the buyer when
//! it ends the order. The cache is bounded (`SECKILL_KNOWN_BUYERS` entries,
//! least-recently used evicted first, by `moka`) and per instance: another
//! instance learns a buyer on its own first repeat.

use moka::sync::Cache;

use crate::sale::{SaleId, UserId};

/// `seckill_known_buyer_answers_total{strategy}`: purchases answered
/// `already_purchased` from the cache, without running the strategy.
pub const KNOWN_BUYER_ANSWERS: &str = crate::metric_names::KNOWN_BUYER_ANSWERS_TOTAL;

/// The bounded set of (sale, buyer) known to hold an order.
#[derive(Clone)]
pub struct KnownBuyers {
    buyers: Option<Cache<(SaleId, UserId), ()>>,
}

impl KnownBuyers {
    /// A set of at most `capacity` buyers; 0 remembers none.
    pub fn new(capacity: u64) -> Self {
        Self { buyers: (capacity > 0).then(|| Cache::new(capacity)) }
    }

    /// Whether `user` is known to hold an order of `sale`.
    pub fn holds_order(&self, sale: SaleId, user: UserId) -> bool {
        self.buyers.as_ref().is_some_and(|buyers| buyers.contains_key(&(sale, user)))
    }

    /// Remembers that `user` holds an order of `sale`.
    pub fn remember(&self, sale: SaleId, user: UserId) {
        if let Some(buyers) = &self.buyers {
            buyers.insert((sale, user), ());
        }
    }
}

impl Default for KnownBuyers {
    fn default() -> Self {
        Self::new(200_000)
    }
}
