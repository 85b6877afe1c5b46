//! Scheduler: three instances, each on its own runtime and connection, one
//! of them with a clock far behind, run a job exactly once per period; a
//! failed run leaves its period open; a holder cut off from Redis is cut off
//! from its run and another instance runs the period once its lease ended.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use redis_lock::{
    Clock, LockClient, LockConfig, LockName, LossReason, PeriodicJob, RunOutcome, Scheduler,
    SystemClock,
};
use tokio_util::sync::CancellationToken;

use crate::harness::{DelayProxy, cleanup_keys, client_with, shared_client, unique_name};

/// The system clock moved by `offset_ms` (negative: behind).
struct Skewed(i64);

impl Clock for Skewed {
    fn now(&self) -> SystemTime {
        let offset = Duration::from_millis(self.0.unsigned_abs());
        if self.0 < 0 { SystemTime::now() - offset } else { SystemTime::now() + offset }
    }
}

async fn cleanup_job(name: &LockName) {
    cleanup_keys(&[name], &["", ":fence", ":done"]).await;
}

/// What the instances saw: each run as (instance, period), and how often
/// each instance found its period already done.
#[derive(Default)]
struct Log {
    runs: Vec<(usize, u64)>,
    already_done: BTreeMap<usize, u32>,
}

/// Instance `id`: a scheduler with `clock` on a runtime and a lock client of
/// its own, on its own thread, running `job` until `stop`.
fn instance(
    id: usize,
    clock: Arc<dyn Clock>,
    job: PeriodicJob,
    log: Arc<Mutex<Log>>,
    stop: CancellationToken,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let scheduler = Scheduler::new(&shared_client(), clock);
            let runs = log.clone();
            let run = move |run: redis_lock::JobRun| {
                let runs = runs.clone();
                async move {
                    runs.lock().unwrap().runs.push((id, run.period));
                    // The job's work, far shorter than the skew below.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<(), std::convert::Infallible>(())
                }
            };
            let report = |outcome: &Result<RunOutcome<_>, _>| {
                if let Ok(RunOutcome::AlreadyDone { .. }) = outcome {
                    *log.lock().unwrap().already_done.entry(id).or_default() += 1;
                }
            };
            scheduler.run_every(&job, stop, run, report).await;
        });
    })
}

#[test]
fn three_instances_run_each_period_exactly_once_with_one_clock_behind_by_more_than_the_margin() {
    let name = unique_name("scheduler-skew");
    // 400 ms: long enough that a loaded 2-core host, which can stall every
    // instance for 200 ms, does not skip a whole period.
    let period = Duration::from_millis(400);
    let job = PeriodicJob::new(name.clone(), period, Duration::from_secs(1)).unwrap();
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = CancellationToken::new();
    // Instance 2's clock is 130 ms behind: more than the run (20 ms) and any
    // margin a lock released after the run would leave, less than a period.
    // It reaches each period after the others finished it.
    let clocks: [Arc<dyn Clock>; 3] =
        [Arc::new(SystemClock), Arc::new(Skewed(15)), Arc::new(Skewed(-130))];
    let threads: Vec<_> = clocks
        .into_iter()
        .enumerate()
        .map(|(id, clock)| instance(id, clock, job.clone(), log.clone(), stop.clone()))
        .collect();
    std::thread::sleep(period * 12);
    stop.cancel();
    for thread in threads {
        thread.join().expect("an instance ran to its stop");
    }

    let log = log.lock().unwrap();
    let mut per_period: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for &(id, period) in &log.runs {
        per_period.entry(period).or_default().push(id);
    }
    let doubled: Vec<_> = per_period.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(doubled.is_empty(), "periods run more than once: {doubled:?}");
    let (first, last) = (*per_period.keys().next().unwrap(), *per_period.keys().last().unwrap());
    assert_eq!(per_period.len() as u64, last - first + 1, "every period in between ran");
    assert!(per_period.len() >= 9, "{} periods in 12 periods' time", per_period.len());
    assert!(
        log.already_done.get(&2).copied().unwrap_or(0) >= 5,
        "the clock behind kept reaching periods already done: {:?}",
        log.already_done
    );
    drop(log);
    tokio::runtime::Runtime::new().unwrap().block_on(cleanup_job(&name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_leaves_its_period_open_and_a_completed_one_closes_it() {
    let name = unique_name("scheduler-failed");
    // A period of a day: the whole test stays in one period.
    let job = PeriodicJob::new(name.clone(), Duration::from_secs(86_400), Duration::from_secs(1))
        .unwrap();
    let scheduler = Scheduler::new(&shared_client(), Arc::new(SystemClock));
    let failed = scheduler.run_once(&job, |_| async { Err("the job failed") }).await.unwrap();
    assert!(matches!(failed, RunOutcome::Failed { error: "the job failed", .. }), "{failed:?}");
    let ran = scheduler.run_once(&job, |_| async { Ok::<(), &str>(()) }).await.unwrap();
    let RunOutcome::Ran { period, fencing_token } = ran else { panic!("{ran:?}") };
    assert_eq!((period, fencing_token.0), (scheduler.current_period(&job), 2));
    let again = scheduler.run_once(&job, |_| async { Ok::<(), &str>(()) }).await.unwrap();
    assert!(matches!(again, RunOutcome::AlreadyDone { last_done, .. } if last_done == period));
    cleanup_job(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_cut_off_from_redis_loses_its_run_and_another_runs_the_period_after_its_lease() {
    let name = unique_name("scheduler-cut");
    let lease = Duration::from_millis(300);
    let job = PeriodicJob::new(name.clone(), Duration::from_secs(86_400), lease).unwrap();
    let proxy = DelayProxy::start(test_support::redis_addr()).await;
    let config = LockConfig { command_timeout: Duration::from_millis(100), ..Default::default() };
    let cut_off: LockClient = client_with(&proxy.url(), config);
    let doomed = Scheduler::new(&cut_off, Arc::new(SystemClock));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let first = {
        let job = job.clone();
        tokio::spawn(async move {
            doomed
                .run_once(&job, |_| async move {
                    let _ = started_tx.send(());
                    // A run far longer than the lease: only renewals keep it.
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok::<(), ()>(())
                })
                .await
        })
    };
    started_rx.await.unwrap();
    let other = Scheduler::new(&shared_client(), Arc::new(SystemClock));
    let busy = other.run_once(&job, |_| async { Ok::<(), ()>(()) }).await.unwrap();
    assert!(matches!(busy, RunOutcome::Busy { .. }), "{busy:?}");
    drop(proxy);

    let lost = tokio::time::timeout(lease * 2, first).await.expect("the run is cut off");
    let lost = lost.unwrap().unwrap();
    assert!(matches!(lost, RunOutcome::Lost { reason: LossReason::Unreachable, .. }), "{lost:?}");
    let ran = test_support::eventually(lease * 2, || async {
        let outcome = other.run_once(&job, |_| async { Ok::<(), ()>(()) }).await.unwrap();
        matches!(outcome, RunOutcome::Ran { .. })
    })
    .await;
    assert!(ran, "the period ran once the cut-off runner's lease ended");
    cleanup_job(&name).await;
}
