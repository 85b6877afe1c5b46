//! The drain that the load test's `queue_drain_units_per_s` ceiling drives
//! through the strategy's registration (`Ceiling::Drain`): it settles every
//! message it was given, in batches no larger than asked, and accounts for
//! where its time went.

use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};
use seckill::sale::{Quantity, SaleId, UserId};
use seckill::strategy::descriptor::{Batching, DrainRun};
use seckill::strategy::queue;

use super::{Broker, SHARED_AMQP, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_settles_every_message_in_full_batches_and_accounts_its_time() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |config| config.strategies.queue.consume = false).await;
    let sale = app.sale("queue", 110).await;
    let hooks = queue::REGISTRATION.ceiling.drain().expect("queue's ceiling is its drain");
    let broker = Broker::connect(&prefix).await;
    for user in 1..=110 {
        let body = (hooks.message)(SaleId(sale), UserId::parse(user).unwrap(), Quantity::ONE);
        broker.publish_raw(sale, &body).await;
    }
    // 110 messages waiting, batches of at most 10: 11 full batches. The
    // window is long so that a batch never closes short on a slow machine
    // (the queue holds every message before the drain starts).
    let batching = Batching { batch_size: 10, window: Duration::from_secs(2) };
    let conn = Connection::connect(&SHARED_AMQP, ConnectionProperties::default()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    let queue = broker.topology.queue_of(SaleId(sale));
    let run = DrainRun { db: &app.db, channel: &channel, queue: &queue, batching, expected: 110 };
    let start = Instant::now();
    let times = (hooks.drain)(run).await.unwrap();
    let elapsed = start.elapsed().as_secs_f64();

    assert_eq!((times.settled, times.batches), (110, 11), "{times:?}");
    let parts = [times.waiting_s, times.collecting_s, times.settling_s, times.acking_s];
    assert!(parts.iter().all(|&part| part > 0.0), "every part took some time: {times:?}");
    assert!(parts.iter().sum::<f64>() <= elapsed, "{times:?} within {elapsed} s");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (110, 0, 0));
    broker.delete_queues().await;
}
