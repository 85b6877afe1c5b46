//! `lock/local`: an in-process mutex per sale — generation 2.
//!
//! Fixes the lost update of `naive` within one process: its buyers take turns
//! through the critical section. Breaks as soon as a second instance serves
//! the same sale, because each process has its own mutex and they know
//! nothing of each other (the `synchronized` block of many flash-sale demos;
//! docs/locks.md, generation 2). Costs no round trip; a waiter is woken in FIFO order
//! by Tokio's fair mutex.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::OwnedMutexGuard;

use super::{Release, SaleLock, Shared};
use crate::sale::{Sale, SaleId};
use crate::strategy::{Backend, Registration, StrategyError, StrategyName};

/// Wire name, and the `strategy` label of this variant's metrics.
pub const NAME: StrategyName = StrategyName::declare("lock/local");

/// `lock/local` in the registry.
pub const REGISTRATION: Registration = Registration {
    name: NAME,
    about: "the naive steps inside an in-process mutex per sale",
    // The in-process mutex needs no Redis; its sold-out flag lives in memory.
    needs: &[Backend::Postgres],
    build: |deps| Ok(Shared::of(deps).locked(NAME, LocalLock::default())),
};

#[derive(Default)]
pub struct LocalLock {
    /// One mutex per sale, created on first use and kept for the process's
    /// life (a sale's entry is a few dozen bytes).
    mutexes: Mutex<HashMap<SaleId, Arc<tokio::sync::Mutex<()>>>>,
}

#[async_trait]
impl SaleLock for LocalLock {
    type Held = OwnedMutexGuard<()>;

    async fn acquire(
        &self,
        sale: &Sale,
        wait: Duration,
    ) -> Result<Option<Self::Held>, StrategyError> {
        let mutex = self.mutexes.lock().expect("local locks").entry(sale.id).or_default().clone();
        Ok(tokio::time::timeout(wait, mutex.lock_owned()).await.ok())
    }

    async fn release(&self, _sale: &Sale, held: Self::Held) -> Result<Release, StrategyError> {
        drop(held);
        Ok(Release::Released)
    }
}
