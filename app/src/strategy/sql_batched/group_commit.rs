//! The group-commit queue of one sale in one process: purchases that arrive
//! while a batch of the sale is settling wait here, and become the next
//! batch when it is done.
//!
//! Leader and followers: a purchase that finds no batch running becomes the
//! leader — it starts [`lead`] as a task of its own and waits for its answer
//! like any other purchase. The leader takes everything that waits (at most
//! `max`) as one batch, settles it, hands each purchase its answer through
//! its own channel, and takes the next batch, until none waits; then it
//! steps down, in the same critical section that finds the queue empty, so
//! a purchase that arrives just then becomes the next leader. A purchase of
//! an idle sale is therefore settled at once, alone (group commit, no
//! timer); under load each batch is whatever arrived during the previous
//! one. An optional window makes the leader wait before taking a batch.
//!
//! The leader is a spawned task, not the purchase that started it: a
//! client that disconnects drops only its own wait for the answer, never the
//! batch, so its order is written (and counted) or not, as decided for the
//! whole batch, exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use metrics::histogram;
use sqlx::PgPool;
use tokio::sync::oneshot;

use super::settle::{self, Answer, Purchase};
use crate::metric_names::{
    GROUP_COMMIT_BATCH_SIZE, GROUP_COMMIT_QUEUE_WAIT_DURATION_SECONDS,
    GROUP_COMMIT_TRANSACTION_DURATION_SECONDS,
};
use crate::outcome::StrategyError;
use crate::sale::SaleId;

/// How batches are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most purchases in one batch (`SECKILL_SQL_BATCHED_BATCH_MAX`).
    pub max: usize,
    /// How long the leader waits before taking a batch that is not full
    /// (`SECKILL_SQL_BATCHED_BATCH_WINDOW_US`); zero takes at once what waits.
    pub window: Duration,
}

/// A purchase waiting for its batch.
pub struct Waiter {
    pub purchase: Purchase,
    /// When it joined the queue.
    pub since: Instant,
    /// Where its answer goes; the purchase waits on the other end.
    pub answer: oneshot::Sender<Answer>,
}

struct State {
    waiting: VecDeque<Waiter>,
    /// A leader task runs for this sale.
    leading: bool,
    /// Batch size → batches of that size, since the queue was made.
    sizes: BTreeMap<u32, u64>,
    /// When a purchase last joined or a batch was last taken.
    used_at: Instant,
}

/// The queue of one sale in this process.
pub struct SaleQueue {
    state: Mutex<State>,
}

impl Default for SaleQueue {
    fn default() -> Self {
        let state = State {
            waiting: VecDeque::new(),
            leading: false,
            sizes: BTreeMap::new(),
            used_at: Instant::now(),
        };
        Self { state: Mutex::new(state) }
    }
}

impl SaleQueue {
    /// The state; never poisoned in practice (no code panics while holding
    /// it), and a poisoned lock still holds a consistent queue.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `waiter`. `true` when no leader runs: the caller must start one
    /// ([`lead`]).
    pub fn join(&self, waiter: Waiter) -> bool {
        let mut state = self.state();
        state.waiting.push_back(waiter);
        state.used_at = Instant::now();
        !std::mem::replace(&mut state.leading, true)
    }

    /// Since when the queue has been idle — no leader, nothing waiting —
    /// or `None` while it is in use.
    pub fn idle_since(&self) -> Option<Instant> {
        let state = self.state();
        (!state.leading && state.waiting.is_empty()).then_some(state.used_at)
    }

    /// Purchases waiting now.
    fn waiting(&self) -> usize {
        self.state().waiting.len()
    }

    /// The next batch: up to `max` waiters, oldest first. When none waits
    /// the leader steps down, in the same critical section.
    fn next_batch(&self, max: usize) -> Vec<Waiter> {
        let mut state = self.state();
        let n = state.waiting.len().min(max);
        if n == 0 {
            state.leading = false;
            return Vec::new();
        }
        state.used_at = Instant::now();
        *state.sizes.entry(u32::try_from(n).unwrap_or(u32::MAX)).or_default() += 1;
        state.waiting.drain(..n).collect()
    }

    /// Batch size → batches of that size settled for this sale by this
    /// process.
    pub fn sizes(&self) -> BTreeMap<u32, u64> {
        self.state().sizes.clone()
    }
}

/// Answers every waiting purchase `internal` and steps down, when a leader
/// ends without stepping down itself (it panicked, or the runtime is
/// shutting down): no purchase waits for a leader that is gone.
struct StepDown {
    queue: Arc<SaleQueue>,
    done: bool,
}

impl Drop for StepDown {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let waiting: Vec<Waiter> = {
            let mut state = self.queue.state();
            state.leading = false;
            state.waiting.drain(..).collect()
        };
        for waiter in waiting {
            let lost = anyhow::anyhow!("the batch leader of this sale stopped");
            let _ = waiter.answer.send(Err(StrategyError::Internal(lost)));
        }
    }
}

/// The leader of `sale`'s queue: settles batch after batch until none waits.
pub async fn lead(queue: Arc<SaleQueue>, db: PgPool, sale: SaleId, batching: Batching) {
    let mut step_down = StepDown { queue: queue.clone(), done: false };
    loop {
        if !batching.window.is_zero() && queue.waiting() < batching.max {
            tokio::time::sleep(batching.window).await;
        }
        let batch = queue.next_batch(batching.max);
        if batch.is_empty() {
            step_down.done = true;
            return;
        }
        settle_batch(&db, sale, batch).await;
    }
}

/// Settles one batch and answers each of its purchases.
async fn settle_batch(db: &PgPool, sale: SaleId, batch: Vec<Waiter>) {
    let started = Instant::now();
    for waiter in &batch {
        histogram!(GROUP_COMMIT_QUEUE_WAIT_DURATION_SECONDS)
            .record(started.duration_since(waiter.since).as_secs_f64());
    }
    histogram!(GROUP_COMMIT_BATCH_SIZE).record(batch.len() as f64);
    let purchases: Vec<Purchase> = batch.iter().map(|waiter| waiter.purchase).collect();
    let settled = settle::settle(db, sale, &purchases).await;
    histogram!(GROUP_COMMIT_TRANSACTION_DURATION_SECONDS).record(started.elapsed().as_secs_f64());
    match settled {
        Ok(answers) => {
            for (waiter, answer) in batch.into_iter().zip(answers) {
                // A purchase whose client left no longer listens.
                let _ = waiter.answer.send(answer);
            }
        }
        Err(err) => {
            tracing::warn!(sale_id = sale.0, purchases = purchases.len(), error = %err,
                           "a batch failed; each of its purchases is answered with the error");
            for waiter in batch {
                let _ = waiter.answer.send(Err(err.duplicate()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sale::{Quantity, UserId};

    fn waiter(user: i64) -> (Waiter, oneshot::Receiver<Answer>) {
        let (answer, answered) = oneshot::channel();
        let purchase = Purchase { user: UserId::parse(user).unwrap(), quantity: Quantity::ONE };
        (Waiter { purchase, since: Instant::now(), answer }, answered)
    }

    #[test]
    fn the_first_purchase_of_an_idle_sale_leads_and_later_ones_follow() {
        let queue = SaleQueue::default();
        assert!(queue.join(waiter(1).0), "an idle sale: lead");
        assert!(!queue.join(waiter(2).0), "a leader runs: follow");
        assert!(!queue.join(waiter(3).0));
        let users = |batch: Vec<Waiter>| -> Vec<i64> {
            batch.iter().map(|w| w.purchase.user.get()).collect()
        };
        assert_eq!(users(queue.next_batch(2)), [1, 2], "oldest first, at most max");
        assert!(!queue.join(waiter(4).0), "the leader has not stepped down");
        assert_eq!(users(queue.next_batch(2)), [3, 4]);
        assert!(queue.next_batch(2).is_empty(), "nothing waits: the leader steps down");
        assert!(queue.join(waiter(5).0), "the next purchase leads again");
        assert_eq!(queue.sizes(), BTreeMap::from([(2, 2)]));
    }

    #[test]
    fn a_leader_that_ends_without_stepping_down_answers_the_waiting_purchases() {
        let queue = Arc::new(SaleQueue::default());
        let (first, mut first_answer) = waiter(1);
        assert!(queue.join(first));
        drop(StepDown { queue: queue.clone(), done: false });
        let answer = first_answer.try_recv().expect("answered");
        assert!(matches!(answer, Err(StrategyError::Internal(_))), "{answer:?}");
        assert!(queue.join(waiter(2).0), "the sale has no leader any more");
    }
}
