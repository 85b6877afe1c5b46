//! Per-process memory of sales known to be sold out, so that the lock
//! strategies answer `SoldOut` without queueing for the lock once nothing is
//! left (the "local sold-out flag" of most flash-sale designs).
//!
//! Invariant: a flag is only set from a read of the units for sale (the
//! row's, and the returns not yet folded in) made inside the critical
//! section, and only if no restock or return was seen since that purchase
//! began (the epoch check), so a restock or return on this instance is never
//! hidden by a purchase that read the old stock. A restock or return handled
//! by *another* instance cannot clear this one's flag; a flag is therefore trusted for
//! [`SOLD_OUT_TRUST`] only, after which one purchase goes through the lock
//! again and re-learns the truth. Nothing here is shared between processes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::sale::SaleId;

/// How long a sold-out flag is trusted before a purchase re-checks the stock
/// under the lock: the bound on how late this instance notices a restock made
/// through another instance. At most one lock acquisition per sale per second
/// per instance is the price.
pub const SOLD_OUT_TRUST: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct SoldOutFlags {
    sales: Mutex<HashMap<SaleId, Flag>>,
}

#[derive(Default, Clone, Copy)]
struct Flag {
    /// Bumped by every restock seen by this process.
    epoch: u64,
    /// When a purchase last found the sale sold out, if it still counts.
    sold_out_at: Option<Instant>,
}

/// The restock epoch a purchase started in; pass it back to
/// [`SoldOutFlags::mark`].
#[derive(Debug, Clone, Copy)]
pub struct Epoch(u64);

impl SoldOutFlags {
    /// `None` when `sale` is known to be sold out; otherwise the epoch to mark
    /// it with if this purchase finds it sold out.
    pub fn open(&self, sale: SaleId) -> Option<Epoch> {
        let sales = self.sales.lock().expect("sold-out flags");
        let flag = sales.get(&sale).copied().unwrap_or_default();
        match flag.sold_out_at {
            Some(at) if at.elapsed() < SOLD_OUT_TRUST => None,
            _ => Some(Epoch(flag.epoch)),
        }
    }

    /// Records that a purchase begun in `epoch` found no stock left.
    /// Ignored when a restock happened since.
    pub fn mark(&self, sale: SaleId, epoch: Epoch) {
        let mut sales = self.sales.lock().expect("sold-out flags");
        let flag = sales.entry(sale).or_default();
        if flag.epoch == epoch.0 {
            flag.sold_out_at = Some(Instant::now());
        }
    }

    /// Forgets that `sale` was sold out (it was restocked).
    pub fn clear(&self, sale: SaleId) {
        let mut sales = self.sales.lock().expect("sold-out flags");
        let flag = sales.entry(sale).or_default();
        flag.epoch += 1;
        flag.sold_out_at = None;
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
}
