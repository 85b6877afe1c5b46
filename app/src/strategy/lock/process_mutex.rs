//! `lock/local`: an in-process mutex per sale — generation 2.
//!
//! Fixes the lost update of `naive` within one process: its buyers take turns
//! through the critical section. Breaks as soon as a second instance serves
//! the same sale, because each process has its own mutex and they know
//! nothing of each other (the `synchronized` block of many flash-sale demos;
//! docs/locks.md, generation 2). Costs no round trip; a waiter is woken in FIFO order
//! by Tokio's fair mutex.
//!
//! Memory: a sale's mutex exists while someone holds or waits for it, and is
//! dropped when its last holder or waiter lets go (a release, a wait that
//! ran out); the next purchase makes a new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OwnedMutexGuard;

use super::{Release, SaleLock, Shared};
use crate::sale::{Sale, SaleId};
use crate::strategy::{Backend, Expectation, Registration, StrategyError, StrategyName};

/// Wire name, and the `strategy` label of this variant's metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/local");

/// `lock/local` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the naive steps inside an in-process mutex per sale",
    // The in-process mutex needs no Redis; its sold-out flag lives in memory.
    needs: &[Backend::Postgres],
    build: |deps| Ok(Shared::of(deps).locked(NAME, LocalLock::default())),
    // One mutex per process: two instances hold "the" lock at once.
    expect: |on| if on.instances > 1 { Expectation::Breaks } else { Expectation::Correct },
    takes_a_lock: true,
    ..Registration::DEFAULTS
};

#[derive(Default)]
pub struct LocalLock {
    /// One mutex per sale while it is held or waited for. Every clone of
    /// an entry is taken under this map's lock, so an entry with no clone
    /// outside the map has no holder and no waiter, and may go.
    mutexes: Mutex<HashMap<SaleId, Arc<tokio::sync::Mutex<()>>>>,
}

impl LocalLock {
    fn mutexes(&self) -> std::sync::MutexGuard<'_, HashMap<SaleId, Arc<tokio::sync::Mutex<()>>>> {
        self.mutexes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Drops `sale`'s mutex if nobody holds or waits for it.
    fn forget_if_unused(&self, sale: SaleId) {
        let mut mutexes = self.mutexes();
        if mutexes.get(&sale).is_some_and(|mutex| Arc::strong_count(mutex) == 1) {
            mutexes.remove(&sale);
        }
    }

    /// Sales with a mutex: those held or waited for.
    pub fn len(&self) -> usize {
        self.mutexes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl SaleLock for LocalLock {
    type Held = OwnedMutexGuard<()>;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let mutex = self.mutexes().entry(sale.id).or_default().clone();
        let held = tokio::time::timeout(wait, mutex.lock_owned()).await.ok();
        if held.is_none() {
            self.forget_if_unused(sale.id);
        }
        Ok(held)
    }

    async fn release(&self, sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        drop(held);
        self.forget_if_unused(sale.id);
        Ok(Release::Released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sale::Knobs;

    fn sale(id: i64) -> Sale {
        Sale {
            id: SaleId(id),
            name: "local".to_owned(),
            per_user_limit: 1,
            strategy: NAME,
            starts_at: None,
            ends_at: None,
            knobs: Knobs::default(),
            buckets: None,
            payment_window_ms: None,
            waiting_room: Default::default(),
            created_at: chrono::Utc::now(),
        }
    }

    #[tokio::test]
    async fn a_sales_mutex_goes_when_its_last_holder_or_waiter_lets_go() {
        let lock = LocalLock::default();
        let wait = Duration::from_millis(20);
        for id in 0..200 {
            let held = lock.acquire(&sale(id), wait).await.unwrap().expect("free");
            lock.release(&sale(id), held).await.unwrap();
        }
        assert!(lock.is_empty(), "{} mutexes left", lock.len());

        let held = lock.acquire(&sale(1), wait).await.unwrap().expect("free");
        assert!(lock.acquire(&sale(1), wait).await.unwrap().is_none(), "held");
        assert_eq!(lock.len(), 1, "kept while held, after a wait ran out");
        lock.release(&sale(1), held).await.unwrap();
        assert!(lock.is_empty());
    }
}
