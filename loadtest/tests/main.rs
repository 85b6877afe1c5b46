//! The load test's end-to-end tests, one binary (`cargo test -p loadtest
//! --test loadtest`), one module per concern: `cargo test -p loadtest --test
//! loadtest -- compare_queue::` runs one module.
//!
//! Every test that runs `loadtest compare` (seconds of load on every core, and
//! rows in the shared test database that some tests count) takes
//! `test_support::heavy()` first, so no two comparisons run at once, as when
//! each file was a binary of its own run one after another.

mod support;

mod compare;
mod compare_arrival;
mod compare_balanced;
mod compare_budget;
mod compare_cluster;
mod compare_faults;
mod compare_hot_row;
mod compare_interrupted;
mod compare_payment;
mod compare_queue;
mod compare_repeat;
mod compare_sizing;
mod live_view;
mod report_html;
