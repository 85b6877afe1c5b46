//! What each primitive costs in round trips when nobody else holds it, as
//! docs/lock-library.md states: the client's own count of commands sent.

use std::sync::Arc;
use std::time::Duration;

use redis_lock::{
    FairLock, LockClient, LockName, LockOptions, MultiLock, PeriodicJob, RunOutcome, RwLock,
    Scheduler, Semaphore, SystemClock,
};

use crate::harness::{cleanup_keys, shared_client, unique_name, unique_names};

/// Round trips `client` sent while `step` ran.
async fn cost<F: Future<Output = ()>>(client: &LockClient, step: F) -> u64 {
    let before = client.stats().round_trips;
    step.await;
    client.stats().round_trips - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_uncontended_primitive_costs_the_round_trips_documented() {
    let client = shared_client();
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(5));
    let fair = FairLock::new(&client, unique_name("cost-fair"));
    let rw = RwLock::new(&client, unique_name("cost-rw"));
    let semaphore = Semaphore::new(&client, unique_name("cost-semaphore"), 3).unwrap();
    let multi = MultiLock::new(&client, unique_names("cost-multi", 3)).unwrap();

    let take_and_release = [
        cost(&client, async {
            fair.try_lock(options).await.unwrap().release().await.unwrap();
        })
        .await,
        cost(&client, async {
            rw.read(options).await.unwrap().release().await.unwrap();
        })
        .await,
        cost(&client, async {
            rw.write(options).await.unwrap().release().await.unwrap();
        })
        .await,
        cost(&client, async {
            semaphore.acquire(options).await.unwrap().release().await.unwrap();
        })
        .await,
    ];
    assert_eq!(take_and_release, [2, 2, 2, 2], "fair, read, write, permit");
    let three = cost(&client, async {
        multi.try_lock(options).await.unwrap().release().await.unwrap();
    });
    assert_eq!(three.await, 6, "a multi-lock of 3: one per member to take, one to release");

    let job = PeriodicJob::new(unique_name("cost-job"), Duration::from_secs(86_400), options.lease)
        .unwrap();
    let scheduler = Scheduler::new(&client, Arc::new(SystemClock));
    let run = || scheduler.run_once(&job, |_| async { Ok::<(), ()>(()) });
    let ran = cost(&client, async { assert!(matches!(run().await, Ok(RunOutcome::Ran { .. }))) });
    assert_eq!(ran.await, 2, "claim, then mark done");
    let skipped = cost(&client, async {
        assert!(matches!(run().await, Ok(RunOutcome::AlreadyDone { .. })));
    });
    assert_eq!(skipped.await, 1, "a period already done: the claim alone");

    let names = [fair.name(), rw.name(), semaphore.name(), job.name()];
    let all: Vec<&LockName> = names.into_iter().chain(multi.names()).collect();
    cleanup_keys(&all, &["", ":fence", ":done", ":pace"]).await;
}
