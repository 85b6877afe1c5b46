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
            env = seckill::backends::DATABASE_URL_ENV,
            default_value = "postgres://postgres@127.0.0.1:5432/seckill",
            hide_env_values = true,
            hide_default_value = true
        )]
        database_url: String,
    },
}

/// The admin token's and the buyer tokens' part of `serve --help`: their
/// keys have no flag.
const ADMIN_TOKEN_HELP: &str = "\
Admin token (environment only, never a flag: a command line is visible in `ps`):
  SECKILL_ADMIN_TOKEN       the bearer token of /admin/*, at least 32 bytes
  SECKILL_ADMIN_TOKEN_FILE  a file holding it instead (a container secret)
Without either the service refuses to start, unless --dev (SECKILL_DEV) is set.

Buyer identity (--buyer-auth, SECKILL_BUYER_AUTH=on|off):
  on   the buyer is the `sub` of a bearer token (JWT, `exp` required) verified with
       SECKILL_BUYER_JWT_KEY             an HS256 secret of at least 32 bytes, or
       SECKILL_BUYER_JWT_KEY_FILE        a file holding it, or
       SECKILL_BUYER_JWT_PUBLIC_KEY_FILE an RS256 or ES256 public key (PEM)
       (environment only); a purchase or result without a valid token is 401
  off  the buyer is the request body's `user_id`, trusted as sent (load tests, demos)
Unset: on when a key is set; without a key, off with --dev, else a refusal to start.
";

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
    let set = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
    seckill::config::refuse_retired(set)?;
    let strategies = strategies_help();
    let command = Cli::command().after_help(strategies.clone()).mut_subcommand("serve", |serve| {
        serve.after_help(format!("{ADMIN_TOKEN_HELP}\n{strategies}"))
    });
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|err| err.exit());
    match cli.command {
        Command::Serve(mut config) => {
            config.auth.admin_token = seckill::config::admin_token_from_env()?;
            config.auth.buyer_key = seckill::config::buyer_key_from_env()?;
            let app = Application::build(config).await?;
            app.run_until(shutdown_signal()).await
        }
        Command::Migrate { database_url } => prepare_database(&database_url).await,
    }
}
