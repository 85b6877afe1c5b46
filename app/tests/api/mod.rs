//! HTTP API, strategy and audit tests against a real service and a real
//! Postgres, one module per concern.

mod admin;
mod audit;
mod buyer_auth;
mod connections;
mod edge;
mod errors;
mod floods;
mod fragmented_stock;
pub(crate) mod health;
mod misconfigured;
mod openapi;
mod outage;
mod purchase_rules;
mod slow_redis;
mod start_config;
mod strategies;
