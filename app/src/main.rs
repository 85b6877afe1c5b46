//! `seckill`: the flash-sale service.

use clap::{Parser, Subcommand};
use seckill::config::Config;
use seckill::startup::{Application, prepare_database, shutdown_signal};
use seckill::telemetry;

/// Flash-sale service with interchangeable stock-deduction strategies
/// (naive, sql, sql/for-update, lock/<variant>, redis-decr, queue), backed by Postgres
/// (and Redis or RabbitMQ for the strategies that use them).
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; boxing the configuration would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Create the database if needed, apply migrations, and serve HTTP.
    Serve(Config),
    /// Create the database if needed and apply migrations, then exit.
    Migrate {
        /// Postgres connection URL.
        #[arg(
            long,
            env = "DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/seckill"
        )]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init_tracing();
    match Cli::parse().command {
        Command::Serve(config) => {
            let app = Application::build(config).await?;
            app.run_until(shutdown_signal()).await
        }
        Command::Migrate { database_url } => prepare_database(&database_url).await,
    }
}
