//! `seckill`: the flash-sale service.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use seckill::config::Config;
use seckill::startup::{Application, prepare_database, shutdown_signal};
use seckill::strategy::REGISTRY;
use seckill::telemetry;

/// Flash-sale service with interchangeable stock-deduction strategies (listed
/// below), backed by Postgres (and Redis or RabbitMQ for the strategies that
/// use them).
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

/// The registered strategies, one per line with its description, for the end
/// of `--help`.
fn strategies_help() -> String {
    let width = REGISTRY.iter().map(|r| r.name.as_str().len()).max().unwrap_or(0);
    let mut help = String::from("Strategies (the `strategy` of a sale, POST /admin/sales):\n");
    for registration in REGISTRY {
        let name = registration.name.as_str();
        help.push_str(&format!("  {name:width$}  {}\n", registration.about));
    }
    help
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init_tracing();
    let strategies = strategies_help();
    let command = Cli::command()
        .after_help(strategies.clone())
        .mut_subcommand("serve", |serve| serve.after_help(strategies));
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|err| err.exit());
    match cli.command {
        Command::Serve(config) => {
            let app = Application::build(config).await?;
            app.run_until(shutdown_signal()).await
        }
        Command::Migrate { database_url } => prepare_database(&database_url).await,
    }
}
