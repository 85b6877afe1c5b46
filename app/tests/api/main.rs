//! HTTP API and strategy tests against a real service and a real Postgres.

#[path = "../support/mod.rs"]
mod support;

mod smoke;
