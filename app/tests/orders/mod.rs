//! The order lifecycle of sales with a payment window: payment, cancel,
//! expiry, and the units that come back exactly once, against a real service
//! and a real Postgres.

mod crash;
mod full_pool;
mod harness;
mod lifecycle;
mod lock_returns;
mod races;
mod returns;
mod sweep;
mod unread_sale;
