//! A flash-sale ("seckill") service whose stock deduction is a pluggable
//! strategy, built to compare those strategies honestly under load.
//!
//! - [`strategy`]: one file per stock-deduction strategy behind one trait;
//! - [`audit`]: the correctness figures of a sale, from Postgres alone;
//! - [`http`]: routes, extractors and the problem+json error mapping;
//! - [`sale`]: validated domain types and the sale catalogue;
//! - [`startup`]: database preparation and the server.

pub mod audit;
pub mod backends;
pub mod config;
pub mod http;
pub mod purchase;
pub mod sale;
pub mod startup;
pub mod strategy;
pub mod telemetry;
