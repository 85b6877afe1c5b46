//! A flash-sale ("seckill") service whose stock deduction is a pluggable
//! strategy, built to compare those strategies honestly under load.
//!
//! - [`strategy`]: one module per stock-deduction strategy behind one trait,
//!   and the one registry of them (the Redis lock library they use is the
//!   `redis-lock` crate, which knows nothing about sales);
//! - [`audit`]: the correctness figures of a sale, from Postgres alone;
//! - [`http`]: the router, its state and the service's own handlers;
//! - [`web`]: what every route shares: the problem+json error mapping and
//!   extractors;
//! - [`sale`], [`strategy_name`], [`outcome`]: the vocabulary at the bottom —
//!   validated domain types and the sale catalogue, the name of a strategy,
//!   what a strategy answers;
//! - [`backend_probe`]: a timeout of a backing server told apart as
//!   overload (`busy`) or outage (`unavailable`);
//! - [`startup`]: database preparation and the server;
//! - [`config`]: the command line of `seckill serve`, composed of the
//!   settings each part defines next to its code.
//! - `failpoints` (cargo feature `failpoints`, tests and fault drills only):
//!   every fault the service can be made to show, in-process pauses and the
//!   `SECKILL_FAILPOINTS` list.
//!
//! Modules import only from their own layer or below (vocabulary, then
//! `web`, then the strategies, then the purchase path and the audit, then
//! `http`, then `startup`); `app/tests/architecture.rs` checks it.

pub mod audit;
pub mod backend_probe;
pub mod backends;
pub mod bounds;
pub mod buyer_token;
pub mod config;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod http;
pub mod known_buyers;
pub mod lifecycle;
pub mod metric_names;
pub mod outcome;
pub mod purchase;
pub mod sale;
pub mod startup;
pub mod strategy;
pub mod strategy_name;
pub mod telemetry;
pub mod unit_return;
pub mod waiting_room;
pub mod web;
