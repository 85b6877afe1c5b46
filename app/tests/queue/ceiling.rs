//! The `queue_drain_units_per_s` ceiling's measurement (`ceiling::drain`):
//! it settles every message it was given, in batches no larger than the
//! consumer's, and accounts for where its time went.

use std::time::{Duration, Instant};

use seckill::sale::SaleId;
use seckill::strategy::queue::ceiling;
use seckill::strategy::queue::consumer::ConsumerSettings;

use super::{SHARED_AMQP, spawn_app, unique_prefix};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_settles_every_message_in_full_batches_and_accounts_its_time() {
    let prefix = unique_prefix();
    let app = spawn_app(&prefix, |config| config.queue_consume = false).await;
    let sale = app.sale("queue", 110).await;
    // 110 messages waiting, batches of at most 10: 11 full batches. The
    // window is long so that a batch never closes short on a slow machine
    // (the queue holds every message before the drain starts).
    let settings = ConsumerSettings {
        batch_size: 10,
        window: Duration::from_secs(2),
        delivery_limit: 5,
        failpoints: Default::default(),
    };
    let start = Instant::now();
    let drain =
        ceiling::drain(&app.db, &SHARED_AMQP, &prefix, SaleId(sale), 1, 110, settings).await;
    let elapsed = start.elapsed().as_secs_f64();
    let drain = drain.unwrap();

    let times = drain.times;
    assert_eq!((drain.units, times.settled, times.batches), (110, 110, 11), "{drain:?}");
    let parts = [times.waiting_s, times.collecting_s, times.settling_s, times.acking_s];
    assert!(parts.iter().all(|&part| part > 0.0), "every part took some time: {times:?}");
    assert!(parts.iter().sum::<f64>() <= elapsed, "{times:?} within {elapsed} s");
    assert!(drain.units_per_s > 0.0 && drain.units_per_s <= 110.0 / parts.iter().sum::<f64>());
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (110, 0, 0));
}
