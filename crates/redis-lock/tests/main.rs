//! The Redis lock library (`redis_lock`) against real Redis servers: the
//! shared one for single-node behaviour, and `redis-server` child processes
//! (killed on drop) for Redlock, restarts, partitions and Redis Cluster
//! slots. Each test names its own locks, so runs never see each other's keys.
//!
//! One test per failure timeline of the README's "Failure timelines" that
//! the library alone can show (T3, T7–T15, and the lock-only half of T5),
//! plus reentrancy, the watchdog and mutual exclusion.

mod harness;

mod cluster;
mod faults;
mod ownership;
mod redlock;
mod waiting;
mod watchdog;
