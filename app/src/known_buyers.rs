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
//! Orders of a sale without a payment window are final, so a remembered
//! buyer never becomes wrong; the cache is not used for sales with a window,
//! whose orders may end (`crate::purchase`). The cache is bounded
//! (`SECKILL_KNOWN_BUYERS` entries, least-recently used evicted first, by
//! `moka`) and per instance: another instance learns a buyer on its own
//! first repeat. An entry not used for [`IDLE_SALE_STATE`] is dropped, so
//! the buyers of a sale that ended go that long after its end; a buyer
//! forgotten is told by the strategy instead.

use moka::sync::Cache;

use crate::sale::{IDLE_SALE_STATE, SaleId, UserId};

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
        Self::with_idle(capacity, IDLE_SALE_STATE)
    }

    /// [`KnownBuyers::new`], dropping a buyer not used for `idle`.
    pub fn with_idle(capacity: u64, idle: std::time::Duration) -> Self {
        let buyers = (capacity > 0)
            .then(|| Cache::builder().max_capacity(capacity).time_to_idle(idle).build());
        Self { buyers }
    }

    /// Buyers held (after the pending evictions are applied).
    pub fn len(&self) -> u64 {
        self.buyers.as_ref().map_or(0, |buyers| {
            buyers.run_pending_tasks();
            buyers.entry_count()
        })
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `user` is known to hold an order of `sale`.
    pub fn holds_order(&self, sale: SaleId, user: UserId) -> bool {
        self.buyers.as_ref().is_some_and(|buyers| buyers.get(&(sale, user)).is_some())
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_buyers_of_sales_no_longer_sold_from_are_dropped_after_the_idle_time() {
        let known = KnownBuyers::with_idle(10_000, Duration::from_millis(300));
        for sale in 0..50 {
            for user in 1..=4 {
                known.remember(SaleId(sale), UserId::parse(user).unwrap());
            }
        }
        assert_eq!(known.len(), 200);
        std::thread::sleep(Duration::from_millis(150));
        let still = UserId::parse(1).unwrap();
        assert!(known.holds_order(SaleId(0), still));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(known.len(), 1, "only the buyer asked about meanwhile is left");
        assert!(known.holds_order(SaleId(0), still));
    }
}
