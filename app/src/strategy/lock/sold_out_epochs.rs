//! Per-process memory of sales known to be sold out, so that the lock
//! strategies answer `SoldOut` without queueing for the lock once nothing is
//! left (the "local sold-out flag" of most flash-sale designs).
//!
//! Invariant: a flag is only set from a read of the units for sale (the
//! row's, and the returns not yet folded in) made inside the critical
//! section, and only if no restock or return was seen since that purchase
//! began (the epoch check), so a restock or return on this instance is never
//! hidden by a purchase that read the old stock. A restock or return handled
//! by *another* instance cannot clear this one's flag; a flag is therefore
//! trusted for [`SOLD_OUT_TRUST`] only, after which one purchase goes through
//! the lock again and re-learns the truth. Nothing here is shared between
//! processes.
//!
//! Memory: a sale's entry is dropped once its flag is no longer trusted, at
//! the next prune ([`SoldOutFlags::forget_untrusted`], run by
//! [`SoldOutFlags::open`] at most every [`PRUNE_EVERY`]); the map holds the
//! sales touched in about the last `PRUNE_EVERY + SOLD_OUT_TRUST`. Epochs
//! come from one counter for the whole map, and a prune moves a floor up to
//! it: a purchase begun before a prune may not mark its sale (its restock
//! epoch may have gone with the entry), so a dropped entry never lets a
//! purchase that read old stock hide a restock. The price is one more
//! purchase through the lock after a prune.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sale::SaleId;

/// How long a sold-out flag is trusted before a purchase re-checks the stock
/// under the lock: the bound on how late this instance notices a restock made
/// through another instance. At most one lock acquisition per sale per second
/// per instance is the price.
pub const SOLD_OUT_TRUST: Duration = Duration::from_secs(1);

/// How often [`SoldOutFlags::open`] drops the entries no longer trusted.
pub const PRUNE_EVERY: Duration = Duration::from_secs(10);

pub struct SoldOutFlags {
    state: Mutex<State>,
}

struct State {
    sales: HashMap<SaleId, Flag>,
    /// The epoch counter: bumped by every restock (or return) seen by this
    /// process, of any sale, and by every prune.
    epoch: u64,
    /// The epoch of the last prune: a purchase begun before it marks nothing.
    floor: u64,
    pruned_at: Instant,
}

#[derive(Clone, Copy)]
struct Flag {
    /// The epoch of the last restock of this sale seen by this process.
    cleared: u64,
    /// When a purchase last found the sale sold out, if it still counts.
    sold_out_at: Option<Instant>,
}

/// The epoch a purchase started in; pass it back to [`SoldOutFlags::mark`].
#[derive(Debug, Clone, Copy)]
pub struct Epoch(u64);

impl Default for SoldOutFlags {
    fn default() -> Self {
        let state = State { sales: HashMap::new(), epoch: 0, floor: 0, pruned_at: Instant::now() };
        Self { state: Mutex::new(state) }
    }
}

impl SoldOutFlags {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `None` when `sale` is known to be sold out; otherwise the epoch to mark
    /// it with if this purchase finds it sold out.
    pub fn open(&self, sale: SaleId) -> Option<Epoch> {
        let now = Instant::now();
        let mut state = self.state();
        if now.duration_since(state.pruned_at) >= PRUNE_EVERY {
            state.prune(now);
        }
        match state.sales.get(&sale).and_then(|flag| flag.sold_out_at) {
            Some(at) if now.duration_since(at) < SOLD_OUT_TRUST => None,
            _ => Some(Epoch(state.epoch)),
        }
    }

    /// Records that a purchase begun in `epoch` found no stock left.
    /// Ignored when a restock (or return) of the sale, or a prune, happened
    /// since.
    pub fn mark(&self, sale: SaleId, epoch: Epoch) {
        let mut state = self.state();
        if epoch.0 < state.floor {
            return;
        }
        let flag = state.sales.entry(sale).or_insert(Flag { cleared: 0, sold_out_at: None });
        if flag.cleared <= epoch.0 {
            flag.sold_out_at = Some(Instant::now());
        }
    }

    /// Forgets that `sale` was sold out (it was restocked, or units came
    /// back).
    pub fn clear(&self, sale: SaleId) {
        let mut state = self.state();
        state.epoch += 1;
        let cleared = state.epoch;
        state.sales.insert(sale, Flag { cleared, sold_out_at: None });
    }

    /// Drops every entry whose flag is not trusted at `now` (purchases call
    /// this through [`SoldOutFlags::open`]; tests with a later `now`).
    pub fn forget_untrusted(&self, now: Instant) {
        self.state().prune(now);
    }

    /// Sales with an entry.
    pub fn len(&self) -> usize {
        self.state().sales.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl State {
    fn prune(&mut self, now: Instant) {
        self.sales.retain(|_, flag| {
            flag.sold_out_at.is_some_and(|at| now.saturating_duration_since(at) < SOLD_OUT_TRUST)
        });
        self.epoch += 1;
        self.floor = self.epoch;
        self.pruned_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restock_during_a_purchase_keeps_the_sale_open() {
        let flags = SoldOutFlags::default();
        let sale = SaleId(1);
        let epoch = flags.open(sale).expect("open at first");
        flags.clear(sale);
        flags.mark(sale, epoch);
        assert!(flags.open(sale).is_some());
        let epoch = flags.open(sale).unwrap();
        flags.mark(sale, epoch);
        assert!(flags.open(sale).is_none());
    }

    #[test]
    fn the_flags_of_many_sales_are_dropped_once_no_longer_trusted() {
        let flags = SoldOutFlags::default();
        for id in 0..500 {
            let sale = SaleId(id);
            let epoch = flags.open(sale).unwrap();
            if id % 2 == 0 {
                flags.mark(sale, epoch);
            } else {
                flags.clear(sale);
            }
        }
        assert_eq!(flags.len(), 500);
        flags.forget_untrusted(Instant::now());
        assert_eq!(flags.len(), 250, "the trusted flags stay");
        assert!(flags.open(SaleId(0)).is_none());
        flags.forget_untrusted(Instant::now() + SOLD_OUT_TRUST);
        assert!(flags.is_empty());
    }

    #[test]
    fn a_purchase_begun_before_a_prune_does_not_hide_a_restock_it_dropped() {
        let flags = SoldOutFlags::default();
        let sale = SaleId(1);
        let epoch = flags.open(sale).unwrap();
        flags.clear(sale); // restocked while the purchase read the old stock
        flags.forget_untrusted(Instant::now()); // the restock's entry is gone
        flags.mark(sale, epoch);
        assert!(flags.open(sale).is_some(), "still open");
    }
}
