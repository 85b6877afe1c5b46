//! Test helpers: unique lock names, raw connections for inspecting keys,
//! and a TCP proxy that delays replies or stops answering altogether.
//! `redis-server` children come from `test_support`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis_lock::{LockClient, LockConfig, LockError, LockName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// The shared Redis of the development machine and CI (`TEST_REDIS_URL`,
/// else the service's default).
pub static SHARED_REDIS: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(test_support::redis_url);

/// The address of [`SHARED_REDIS`], for a proxy in front of it.
pub fn shared_addr() -> SocketAddr {
    test_support::redis_addr()
}

/// A lock name no other test or run uses: `locktest:{<test>:<uuid>}:lock`.
pub fn unique_name(test: &str) -> LockName {
    LockName::new(format!("locktest:{{{test}:{}}}:lock", uuid::Uuid::new_v4().simple()))
        .expect("a hash-tagged name")
}

/// A lock client on the shared Redis (each call: a new "process").
pub fn shared_client() -> LockClient {
    LockClient::new(redis::Client::open(SHARED_REDIS.as_str()).expect("a valid URL"))
}

/// A lock client on `url` with `config`.
pub fn client_with(url: &str, config: LockConfig) -> LockClient {
    LockClient::with_config(redis::Client::open(url).expect("a valid URL"), config)
        .expect("a valid config")
}

/// `n` lock names sharing the test's prefix, in the byte order of their keys
/// (`…{<test>:<uuid>:0}…`, `…:1}…`): each its own hash tag.
pub fn unique_names(test: &str, n: usize) -> Vec<LockName> {
    let run = uuid::Uuid::new_v4().simple();
    (0..n)
        .map(|i| LockName::new(format!("locktest:{{{test}:{run}:{i}}}:lock")).expect("tagged"))
        .collect()
}

/// A lock client on the shared Redis whose waiters (fair lock, waiting
/// writer) are dropped `waiter_timeout` after their last attempt.
pub fn client_with_waiter_timeout(waiter_timeout: Duration) -> LockClient {
    client_with(&SHARED_REDIS, LockConfig { waiter_timeout, ..LockConfig::default() })
}

/// Whether `key` exists on the shared Redis.
pub async fn exists(conn: &mut MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query_async(conn).await.expect("EXISTS")
}

/// Deletes, for each of `names`, the key `<name><suffix>` of every suffix
/// (`""` for the name itself): the keys a primitive derives from its name.
pub async fn cleanup_keys(names: &[&LockName], suffixes: &[&str]) {
    let mut conn = raw(&SHARED_REDIS).await;
    let keys: Vec<String> = names
        .iter()
        .flat_map(|name| suffixes.iter().map(move |suffix| format!("{}{suffix}", name.key())))
        .collect();
    let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await.expect("DEL");
}

/// Asserts that a wait that began with a dead holder's `lease` ended with
/// that lease: after half of it at least, and at most 400 ms after its end.
pub fn assert_ended_with_the_lease(waited: Duration, lease: Duration) {
    assert!(waited >= lease / 2, "waited {waited:?}: served before the dead holder's lease ended");
    assert!(waited < lease + Duration::from_millis(400), "waited {waited:?}, lease {lease:?}");
}

/// Asserts that a wait of `wait` that ran out lasted `wait`, and at most
/// 300 ms more.
pub fn assert_bounded(waited: Duration, wait: Duration) {
    assert!(waited >= wait && waited < wait + Duration::from_millis(300), "waited {waited:?}");
}

/// Awaits every "process" (a task looping over holds), failing on the first
/// that ended in an error or a panic.
pub async fn join_processes(tasks: Vec<tokio::task::JoinHandle<Result<(), LockError>>>) {
    for task in tasks {
        task.await.expect("no panic").expect("every hold within its wait");
    }
}

/// A plain connection to inspect keys behind the library's back.
pub async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable")
}

/// The hold count of `owner` in the lock hash (`None`: no such field).
pub async fn holds(conn: &mut MultiplexedConnection, name: &LockName, owner: &str) -> Option<u64> {
    redis::cmd("HGET").arg(name.key()).arg(owner).query_async(conn).await.expect("HGET")
}

/// `PTTL` of the lock hash (−2: no key).
pub async fn pttl(conn: &mut MultiplexedConnection, name: &LockName) -> i64 {
    redis::cmd("PTTL").arg(name.key()).query_async(conn).await.expect("PTTL")
}

/// Deletes the lock's keys (the fencing counter never expires).
pub async fn cleanup(conn: &mut MultiplexedConnection, name: &LockName) {
    let _: i64 = redis::cmd("DEL")
        .arg(name.key())
        .arg(name.fence_key())
        .query_async(conn)
        .await
        .unwrap_or(0);
}

/// A TCP proxy in front of a Redis server that can hold back the next reply
/// chunk for a while (later chunks queue behind it, as on a slow link), or
/// stop answering: new connections hang (accepted, never served), and, once
/// [`blackhole`](Self::blackhole)d, so do replies on the open ones.
pub struct DelayProxy {
    pub addr: SocketAddr,
    armed_ms: Arc<AtomicU64>,
    hang_new: Arc<AtomicBool>,
    hang_replies: Arc<AtomicBool>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl DelayProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let armed_ms = Arc::new(AtomicU64::new(0));
        let (hang_new, hang_replies) =
            (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (armed, spawned) = (armed_ms.clone(), tasks.clone());
        let (hanging, silent) = (hang_new.clone(), Arc::clone(&hang_replies));
        let accept = tokio::spawn(async move {
            let mut parked = Vec::new();
            while let Ok((inbound, _)) = listener.accept().await {
                if hanging.load(Ordering::SeqCst) {
                    parked.push(inbound);
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(upstream).await else { continue };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (mut in_read, mut in_write) = inbound.into_split();
                let (mut out_read, mut out_write) = outbound.into_split();
                let requests = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut in_read, &mut out_write).await;
                });
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
                let armed = armed.clone();
                let replies_in = tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = out_read.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let delay = Duration::from_millis(armed.swap(0, Ordering::SeqCst));
                        if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                });
                let silent = silent.clone();
                let replies_out = tokio::spawn(async move {
                    while let Some((at, bytes)) = rx.recv().await {
                        tokio::time::sleep_until(at.into()).await;
                        if silent.load(Ordering::SeqCst) {
                            std::future::pending::<()>().await;
                        }
                        if in_write.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                });
                spawned.lock().unwrap().extend([
                    requests.abort_handle(),
                    replies_in.abort_handle(),
                    replies_out.abort_handle(),
                ]);
            }
        });
        tasks.lock().unwrap().push(accept.abort_handle());
        Self { addr, armed_ms, hang_new, hang_replies, tasks }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Holds back the next reply chunk (from any connection) by `delay`.
    pub fn delay_next_reply(&self, delay: Duration) {
        self.armed_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// From now on, new connections are accepted and never served (their
    /// handshake hangs); open connections keep working.
    pub fn hang_new_connections(&self) {
        self.hang_new.store(true, Ordering::SeqCst);
    }

    /// From now on, nothing answers: new connections hang and no reply of
    /// an open connection comes back (requests still reach the server).
    pub fn blackhole(&self) {
        self.hang_new_connections();
        self.hang_replies.store(true, Ordering::SeqCst);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}
