//! The failure timelines of `docs/locks.md`: a lock holder
//! paused past its lease (T1), a whole process stopped with its watchdog
//! (T2), Redlock giving two clients a majority (T4 early expiry, T5 restart
//! without persistence), and a failover to a replica that never received the
//! lock (T6). Each shows the violation without fencing where it can happen,
//! and that Postgres refuses the stale holder's write with it.
//!
//! The holders of T1 and T4–T6 run the strategies' critical section
//! (`read_check_write`) directly, so the test can put the stale holder's stall
//! exactly where a stop-the-world pause would hit: after its read, before its
//! write ([`StallBeforeWrite`]). No sleep orders anything: each step waits for
//! the previous one to be observable.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::AsyncCommands;
use redis_lock::{LockClient, LockName, LockOptions, Redlock, RedlockConfig};
use reqwest::StatusCode;
use seckill::sale::{Knobs, Sale};
use seckill::strategy::lock::fence::{self, FenceGuard, FenceToken};
use seckill::strategy::lock::{library_lock, library_redlock};
use seckill::strategy::naive::{Attempt, Unguarded, WriteGuard, read_check_write};
use seckill::strategy::{Outcome, StrategyName};
use serde_json::json;
use sqlx::PgPool;
use test_support::{RedisServer, signal};
use tokio::sync::Notify;

use super::harness::{
    BlockingProxy, ChildApp, REDIS_URL, counter, fake_sale, redis_conn, sale_with, spawn,
    unique_prefix, wait_until,
};
use crate::support::TestApp;

/// Admits the write only after the test says so, telling the test when the
/// holder has read and reached its write. Then asks `inner`.
struct StallBeforeWrite {
    reached: Arc<Notify>,
    resume: Arc<Notify>,
    inner: Box<dyn WriteGuard>,
}

#[async_trait]
impl WriteGuard for StallBeforeWrite {
    async fn admits(&self) -> bool {
        self.reached.notify_one();
        self.resume.notified().await;
        self.inner.admits().await
    }

    fn fence(&self) -> Option<FenceToken> {
        self.inner.fence()
    }
}

/// The guard a holder writes behind: the fence when it has a token, nothing
/// otherwise.
fn guard_of(token: Option<FenceToken>) -> Box<dyn WriteGuard> {
    match token {
        Some(token) => Box::new(FenceGuard { token }),
        None => Box::new(Unguarded),
    }
}

/// Claims the sale when `fenced`.
async fn claim_if(db: &PgPool, sale: &Sale, fenced: bool) -> Option<FenceToken> {
    if !fenced {
        return None;
    }
    Some(fence::claim(db, sale.id).await.unwrap().expect("a fresh token claims the sale"))
}

/// Holder A (user 1) reads the stock and stalls before its write; while it
/// stalls, `meanwhile` runs (it lets holder B in and returns once B has its
/// lock); then B (user 2) runs the whole critical section; then A resumes.
/// Each holder claims the sale first when `fenced`. Returns (A, B).
async fn stale_holder_writes_last<F, T>(
    db: &PgPool,
    sale: &Sale,
    fenced: bool,
    meanwhile: F,
) -> (Attempt, Attempt, T)
where
    F: std::future::Future<Output = T>,
{
    let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let token_a = claim_if(db, sale, fenced).await;
    let a = {
        let guard = StallBeforeWrite {
            reached: reached.clone(),
            resume: resume.clone(),
            inner: guard_of(token_a),
        };
        let (db, sale) = (db.clone(), sale.clone());
        tokio::spawn(async move {
            read_check_write(&db, &sale, user(1), seckill::sale::Quantity::ONE, &guard).await
        })
    };
    reached.notified().await;
    let held = meanwhile.await;
    let token_b = claim_if(db, sale, fenced).await;
    let b = read_check_write(db, sale, user(2), seckill::sale::Quantity::ONE, &*guard_of(token_b))
        .await
        .unwrap();
    resume.notify_one();
    (a.await.unwrap().unwrap(), b, held)
}

fn user(id: i64) -> seckill::sale::UserId {
    seckill::sale::UserId::parse(id).unwrap()
}

fn placed(attempt: &Attempt) -> bool {
    matches!(attempt, Attempt::Done(Outcome::Placed { .. }))
}

/// A sale of one unit (a row in Postgres) and its record for direct calls.
async fn one_unit_sale(app: &TestApp, strategy: StrategyName) -> Sale {
    let id = sale_with(app, strategy.as_str(), 1, json!({})).await;
    fake_sale(id, strategy, Knobs { lock_lease_ms: 2000, ..Knobs::default() })
}

/// The library's name for `sale`'s lock under `prefix`.
fn lock_name(prefix: &str, sale: &Sale) -> LockName {
    LockName::new(format!("{prefix}:{{sale:{}}}:lock", sale.id.0)).unwrap()
}

/// Asserts the books of a one-unit sale after the two holders: without
/// fencing both orders stand (an oversell); with it, only B's.
async fn assert_outcome(app: &TestApp, sale: &Sale, fenced: bool, a: &Attempt, b: &Attempt) {
    let audit = app.audit(sale.id.0).await;
    assert!(placed(b), "B, the current holder, sells: {b:?}");
    if fenced {
        assert_eq!(*a, Attempt::Refused, "the stale holder's write is fenced off");
        assert_eq!((audit.units_sold, audit.oversold, audit.ledger_drift), (1, 0, 0), "{audit:?}");
    } else {
        assert!(placed(a), "without fencing the stale holder writes too: {a:?}");
        assert_eq!(audit.oversold, 1, "one unit sold twice: {audit:?}");
    }
}

/// T1: A holds a lease lock without renewal, stalls past its lease, B takes
/// the lock and sells, A resumes and writes.
async fn t1(fenced: bool) {
    let prefix = unique_prefix();
    let app = spawn(&prefix, 1000).await;
    let sale = one_unit_sale(&app, library_lock::FENCED_NAME).await;
    let name = lock_name(&prefix, &sale);
    let client = || LockClient::new(redis::Client::open(REDIS_URL.as_str()).unwrap());
    let (client_a, client_b) = (client(), client());
    let lease = Duration::from_millis(100);
    let guard_a = client_a.try_lock(&name, Duration::ZERO, lease).await.unwrap();

    let (a, b, _guard_b) = stale_holder_writes_last(&app.db, &sale, fenced, async {
        // B waits for A's lease to run out (woken by the lease, not a sleep).
        client_b.try_lock(&name, Duration::from_secs(5), Duration::from_secs(10)).await.unwrap()
    })
    .await;

    assert!(guard_a.lost().is_cancelled(), "the library knew A's lease had run out");
    assert_outcome(&app, &sale, fenced, &a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t1_without_fencing_a_holder_paused_past_its_lease_oversells() {
    t1(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t1_fencing_refuses_the_write_of_a_holder_paused_past_its_lease() {
    t1(true).await;
}

/// A restock is an administrative write that no purchase lock covers: when it
/// lands while a holder is between its read and its write, the holder's
/// write must carry the restocked units forward, not overwrite them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_between_a_holders_read_and_write_is_not_lost() {
    for fenced in [false, true] {
        let app = spawn(&unique_prefix(), 1000).await;
        let id = sale_with(&app, library_lock::FENCED_NAME.as_str(), 10, json!({})).await;
        let sale = fake_sale(id, library_lock::FENCED_NAME, Knobs::default());
        let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let guard = StallBeforeWrite {
            reached: reached.clone(),
            resume: resume.clone(),
            inner: guard_of(claim_if(&app.db, &sale, fenced).await),
        };
        let holder = {
            let (db, sale) = (app.db.clone(), sale.clone());
            tokio::spawn(async move {
                read_check_write(&db, &sale, user(1), seckill::sale::Quantity::ONE, &guard).await
            })
        };
        reached.notified().await;
        let restocked = app.restock(id, json!({ "units": 5 })).await;
        assert_eq!(restocked.status(), StatusCode::OK);
        resume.notify_one();
        assert!(placed(&holder.await.unwrap().unwrap()), "fenced: {fenced}");

        let audit = app.audit(id).await;
        assert_eq!(
            (audit.total_stock, audit.remaining_stock, audit.units_sold, audit.ledger_drift),
            (15, 14, 1, 0),
            "fenced: {fenced}: {audit:?}"
        );
    }
}

/// T2: a `seckill` process holding a `lock/fenced` lock (watchdog included)
/// is SIGSTOPped inside its critical section; its lease runs out, another
/// instance sells; the process is continued and must not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t2_a_process_stopped_past_its_watchdog_lease_is_fenced_off() {
    let prefix = unique_prefix();
    let app = spawn(&prefix, 3000).await;
    // Two units: whenever A reads, its write would go through unfenced.
    let knobs = json!({ "lock_lease_ms": 300, "work_ms": 200 });
    let sale = sale_with(&app, "lock/fenced", 2, knobs).await;
    let holder = ChildApp::start(&prefix, &[]).await;

    let buying = {
        let (client, url) = (holder.client.clone(), format!("{}/sales/{sale}/orders", holder.base));
        tokio::spawn(async move {
            let response = client.post(url).json(&json!({ "user_id": 1 })).send().await.unwrap();
            response.status()
        })
    };
    let claimed = || async {
        sqlx::query("SELECT 1 FROM sale_fences WHERE sale_id = $1")
            .bind(sale)
            .fetch_optional(&app.db)
            .await
            .unwrap()
            .is_some()
    };
    wait_until("the child has claimed the sale", Duration::from_secs(5), claimed).await;
    signal(holder.pid(), "STOP");

    let key = format!("{prefix}:{{sale:{sale}}}:lock");
    let redis = redis_conn(&REDIS_URL).await;
    wait_until("the stopped holder's lease runs out", Duration::from_secs(5), || {
        let (mut redis, key) = (redis.clone(), key.clone());
        async move { !redis.exists::<_, bool>(&key).await.unwrap() }
    })
    .await;
    assert_eq!(app.buy(sale, 2).await.status(), StatusCode::CREATED, "B sells meanwhile");
    signal(holder.pid(), "CONT");

    assert_eq!(buying.await.unwrap(), StatusCode::SERVICE_UNAVAILABLE, "A's write is refused");
    let audit = app.audit(sale).await;
    assert_eq!((audit.units_sold, audit.remaining_stock, audit.ledger_drift), (1, 1, 0));
    let metrics = holder.metrics().await;
    let refused = counter(&metrics, "seckill_fence_rejections_total", "lock/fenced")
        + counter(&metrics, "seckill_lock_losses_total", "lock/fenced");
    assert_eq!(refused, 1, "A counted its refusal (fence, or the watchdog's loss signal)");
}

/// Three Redlock nodes with the third down while A acquires: A holds a bare
/// majority (nodes 1 and 2). `lose_a_vote` then takes A's key off node 2 and
/// the third node comes back empty, so B can win nodes 2 and 3.
async fn redlock_double_hold(
    nodes: &mut [RedisServer],
    name: &LockName,
    lose_a_vote: impl AsyncFnOnce(&mut RedisServer),
) -> (redis_lock::RedlockGuard, redis_lock::RedlockGuard) {
    let redlock = |nodes: &[RedisServer]| {
        let clients = nodes.iter().map(|n| redis::Client::open(n.url()).unwrap()).collect();
        Redlock::new(clients, RedlockConfig::default()).unwrap()
    };
    let options = LockOptions::new(Duration::ZERO, Duration::from_secs(10));
    nodes[2].kill();
    let a = redlock(nodes).try_lock(name, options).await.expect("2 of 3 is a quorum");
    nodes[2].restart().await;
    lose_a_vote(&mut nodes[1]).await;
    let b = redlock(nodes).try_lock(name, options).await.expect("B wins nodes 2 and 3");
    (a, b)
}

async fn three_nodes() -> Vec<RedisServer> {
    vec![RedisServer::start().await, RedisServer::start().await, RedisServer::start().await]
}

/// T4 or T5 on a fresh sale: both clients hold the Redlock, A stalls before
/// its write while B sells.
async fn redlock_timeline(restart_instead_of_expiry: bool, fenced: bool) {
    let prefix = unique_prefix();
    let app = spawn(&prefix, 1000).await;
    let sale = one_unit_sale(&app, library_redlock::NAME).await;
    let name = lock_name(&prefix, &sale);
    let mut nodes = three_nodes().await;
    let (_a, _b) = redlock_double_hold(&mut nodes, &name, async |node: &mut RedisServer| {
        if restart_instead_of_expiry {
            node.restart().await; // T5: a crash and restart without persistence
        } else {
            // T4: the key expires early on one node (a clock jump, an eviction)
            let _: () = redis_conn(&node.url()).await.del(name.key()).await.unwrap();
        }
    })
    .await;
    let (a, b, ()) = stale_holder_writes_last(&app.db, &sale, fenced, async {}).await;
    assert_outcome(&app, &sale, fenced, &a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t4_redlock_early_expiry_on_one_node_gives_two_holders_who_oversell_without_fencing() {
    redlock_timeline(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t4_redlock_early_expiry_on_one_node_is_caught_by_fencing() {
    redlock_timeline(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t5_redlock_node_restarted_empty_gives_two_holders_who_oversell_without_fencing() {
    redlock_timeline(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t5_redlock_node_restarted_empty_is_caught_by_fencing() {
    redlock_timeline(true, true).await;
}

/// T6: A locks on a master whose replication link is cut; the master dies;
/// its replica, promoted, never saw A's lock, and B takes it there.
async fn t6(fenced: bool) {
    let prefix = unique_prefix();
    let app = spawn(&prefix, 1000).await;
    let sale = one_unit_sale(&app, library_lock::FENCED_NAME).await;
    let name = lock_name(&prefix, &sale);
    let mut master = RedisServer::start().await;
    let link = BlockingProxy::start(master.port).await;
    let replica = RedisServer::start_replica_of(link.port).await;

    link.block();
    let client_a = LockClient::new(redis::Client::open(master.url()).unwrap());
    let lease = Duration::from_secs(10);
    let _a = client_a.try_lock(&name, Duration::ZERO, lease).await.unwrap();
    master.kill();
    let mut promote = redis_conn(&replica.url()).await;
    let _: () =
        redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut promote).await.unwrap();
    let client_b = LockClient::new(redis::Client::open(replica.url()).unwrap());
    let _b =
        client_b.try_lock(&name, Duration::ZERO, lease).await.expect("the new master is empty");

    let (a, b, ()) = stale_holder_writes_last(&app.db, &sale, fenced, async {}).await;
    assert_outcome(&app, &sale, fenced, &a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t6_failover_to_a_replica_without_the_lock_gives_two_holders_who_oversell_without_fencing()
{
    t6(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t6_failover_to_a_replica_without_the_lock_is_caught_by_fencing() {
    t6(true).await;
}
