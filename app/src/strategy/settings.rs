//! The strategies' settings: one section per strategy that has any, each
//! defined in its strategy's module and flattened here into the
//! `seckill serve` command line (docs/adding-a-strategy.md).
//!
//! A strategy without settings appears nowhere here. A strategy with
//! settings defines a `Settings` struct (`#[derive(clap::Args)]`) in its
//! module, adds one field to [`StrategySettings`], and its registration's
//! `build` hands that field, and nothing else of the configuration, to its
//! constructor.

use std::time::Duration;

use crate::bounds::MAX_MS;

/// The settings of every strategy that has some, by strategy; what
/// [`super::Deps::settings`] carries.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Strategies")]
pub struct StrategySettings {
    /// `redis-decr` and `queue`: milliseconds an instance answers "sold out"
    /// from its local flag without asking Redis (or Postgres). The bound on
    /// how long a lost "stock returned" broadcast can hide returned stock;
    /// for `queue`, also how old what an instance knows of a sale may be
    /// before a purchase reads `remaining_stock` again (sold out or not).
    #[arg(
        long,
        env = "SECKILL_SOLD_OUT_FLAG_TTL_MS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(1..=MAX_MS)
    )]
    pub sold_out_flag_ttl_ms: u64,

    /// `queue`.
    #[command(flatten)]
    pub queue: super::queue::Settings,

    /// `redis-decr`.
    #[command(flatten)]
    pub redis_decr: super::redis_decr::Settings,

    /// `sql/batched`.
    #[command(flatten)]
    pub sql_batched: super::sql_batched::Settings,

    /// The `lock/*` family.
    #[command(flatten)]
    pub lock: super::lock::Settings,
}

impl StrategySettings {
    /// `SECKILL_SOLD_OUT_FLAG_TTL_MS`, shared by the strategies that keep a
    /// local sold-out flag (`redis-decr`, `queue`).
    pub fn sold_out_flag_ttl(&self) -> Duration {
        Duration::from_millis(self.sold_out_flag_ttl_ms)
    }
}
