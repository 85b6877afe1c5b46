//! The Redis lock library (`redis_lock`) against real Redis servers: the
//! shared one for single-node behaviour, and `redis-server` child processes
//! (killed on drop) for Redlock, restarts, partitions and Redis Cluster
//! slots. Each test names its own locks, so runs never see each other's keys.
//!
//! One test per failure timeline of the README's "Failure timelines" that
//! the library alone can show (T3, T7–T15, and the lock-only half of T5),
//! plus reentrancy, the watchdog and mutual exclusion; then the rest of the
//! family (multi-lock, fair lock, read-write lock, semaphore, scheduler):
//! exclusion or the permit count across clients, bounded waits, holder
//! death and lease expiry. A "process" is a `LockClient` of its own (its
//! own connections and local queues); the scheduler's instances also run
//! on Tokio runtimes of their own.

mod harness;

mod cluster;
mod costs;
mod dropped;
mod fair;
mod faults;
mod left_behind;
mod multi;
mod ownership;
mod redlock;
mod rwlock;
mod scheduler;
mod semaphore;
mod waiting;
mod watchdog;
