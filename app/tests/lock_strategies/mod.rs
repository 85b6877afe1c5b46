//! The `lock/*` strategies against real Redis and Postgres: what each lock
//! generation is known to do (including how the broken ones break), mutual
//! exclusion measured across instances, the failure timelines of
//! `docs/locks.md` (T1, T2, T4, T5, T6) with fencing, the bound on a
//! critical section, every `lock/*` strategy on a 3-master Redis Cluster, and
//! `lock/fair`'s arrival order.
//!
//! Every test uses its own Redis key prefix and its own sales; extra Redis
//! nodes and app processes are children of the test, stopped when it ends.

mod cluster;
mod exclusion;
mod fair;
mod generations;
mod harness;
mod hold;
mod late_instance;
mod refusals;
mod timelines;
