//! The service's integration tests, one binary (`cargo test -p seckill --test
//! app`), one module per concern: a test is named after its module path, e.g.
//! `api::admin::…`, and `cargo test --test app -- queue::` runs one module.
//!
//! They run against real servers: the Postgres of `TEST_DATABASE_URL`, the
//! Redis of `TEST_REDIS_URL` and the RabbitMQ of `TEST_AMQP_URL` (defaults in
//! `test_support`), plus servers a test starts for itself. The tests of the
//! binary run on parallel threads; those that must not run beside one
//! another (they restart a server of their own for seconds, run a browser,
//! a fuzzer or the README's scripts) take `test_support::heavy()` first
//! (docs/testing.md, "One binary per crate").

mod support;

mod api;
mod architecture;
mod contract;
mod failover;
mod hot_row;
mod lock_strategies;
mod orders;
mod queue;
mod queue_broker;
mod readme;
mod redis_decr;
mod storefront;
mod waiting_room;
