//! Service configuration: [`Config`], the command line of `seckill serve`,
//! read from flags or environment variables, with defaults that match the
//! local services of the README.
//!
//! Each part of the service owns its settings and defines them next to its
//! code, as a `#[derive(clap::Args)]` struct flattened here under a heading
//! of its own in `--help`: the HTTP server (`crate::http::settings`),
//! authentication (`crate::http::auth_settings`), the backing servers
//! (`crate::backends`), the order lifecycle (`crate::lifecycle`), and the
//! strategies (`crate::strategy::StrategySettings`, one section per strategy
//! that has settings, each in its strategy's module). A strategy receives
//! its own section only. This module sits at the top of the layering (with
//! `crate::startup`), since it names every part.
//!
//! Names: `SECKILL_<OWNER>_<SETTING>`, where the owner is the strategy
//! (`QUEUE`, `REDIS_DECR`, `SQL_BATCHED`, `LOCK`) or the part of the service
//! (`DB`, `REDIS`, `AMQP`, `EXPIRY_SWEEP`, `BUYER`, `ADMIN_TOKEN`, …); the
//! HTTP server's settings and a few of the whole instance's are
//! `SECKILL_<SETTING>` (`SECKILL_ADDR`, `SECKILL_INSTANCE`), and the three
//! server URLs keep the names their tools read (`DATABASE_URL`,
//! `REDIS_URL`, `AMQP_URL`). A flag is its variable without `SECKILL_`, in
//! lower case with `-` (`SECKILL_QUEUE_BATCH_MAX`, `--queue-batch-max`).
//! Durations are milliseconds (`_MS`) unless a finer unit is needed, said
//! where it is; counts have no unit suffix. A variable renamed or retired is
//! listed in [`RETIRED`], and the service refuses to start while it is set.

use anyhow::bail;

pub use crate::backends::redacted;
use crate::backends::{AmqpHandle, BackendSettings, RedisHandle};
pub use crate::http::auth_settings::{
    ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_ENV, AuthSettings, BUYER_AUTH_ENV, BUYER_JWT_KEY_ENV,
    BUYER_JWT_KEY_FILE_ENV, BUYER_JWT_PUBLIC_KEY_FILE_ENV, BuyerAuthMode, BuyerKey,
    DEV_ADMIN_TOKEN, MIN_ADMIN_TOKEN_BYTES, admin_token_from_env, buyer_key_from_env,
};
use crate::http::settings::HttpSettings;
use crate::sale::SaleCatalog;
use crate::strategy::{Deps, StrategySettings};

pub use crate::bounds::MAX_MS;

/// The variables the service reads that have no flag: the secrets of
/// authentication (a command line is visible to every user in `ps`) and
/// the log filter (`RUST_LOG`, read by `crate::telemetry`).
pub const ENV_ONLY: &[&str] = &[
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_FILE_ENV,
    BUYER_JWT_KEY_ENV,
    BUYER_JWT_KEY_FILE_ENV,
    BUYER_JWT_PUBLIC_KEY_FILE_ENV,
    "RUST_LOG",
];

/// A variable the service no longer reads.
#[derive(Debug, Clone, Copy)]
pub struct Retired {
    /// The old name.
    pub name: &'static str,
    /// The variable that took its place.
    pub replaced_by: &'static str,
    /// What else changed (a unit), or empty.
    pub change: &'static str,
}

/// Every variable renamed or retired, with its replacement. While one of
/// them is set, the service refuses to start ([`refuse_retired`]): a
/// deployment written for an earlier release must not lose a setting
/// silently.
pub const RETIRED: &[Retired] = &[
    Retired {
        name: "SECKILL_QUEUE_BATCH_SIZE",
        replaced_by: "SECKILL_QUEUE_BATCH_MAX",
        change: "",
    },
    Retired { name: "SECKILL_BATCH_MAX", replaced_by: "SECKILL_SQL_BATCHED_BATCH_MAX", change: "" },
    Retired {
        name: "SECKILL_BATCH_WINDOW_US",
        replaced_by: "SECKILL_SQL_BATCHED_BATCH_WINDOW_US",
        change: "",
    },
    Retired {
        name: "SECKILL_RECONCILE_INTERVAL_MS",
        replaced_by: "SECKILL_REDIS_DECR_RECONCILE_INTERVAL_MS",
        change: "",
    },
    Retired {
        name: "SECKILL_RECONCILE_GRACE_MS",
        replaced_by: "SECKILL_REDIS_DECR_RECONCILE_GRACE_MS",
        change: "",
    },
    Retired {
        name: "SECKILL_REDIS_KEY_TTL_MS",
        replaced_by: "SECKILL_REDIS_DECR_KEY_TTL_MS",
        change: "",
    },
    Retired {
        name: "SECKILL_LOCK_INTERVALS_RETENTION_S",
        replaced_by: "SECKILL_LOCK_INTERVALS_RETENTION_MS",
        change: "in milliseconds, the old value times 1000",
    },
    Retired { name: "REDLOCK_URLS", replaced_by: "SECKILL_LOCK_REDLOCK_URLS", change: "" },
];

/// Refuses a retired variable ([`RETIRED`]): `set(name)` tells whether the
/// variable `name` is set to a non-empty value (the process environment, in
/// `seckill`'s `main`).
///
/// Errors: one or more retired variables are set; the message names each
/// with the variable to set instead.
pub fn refuse_retired(set: impl Fn(&str) -> bool) -> anyhow::Result<()> {
    let found: Vec<String> = RETIRED
        .iter()
        .filter(|retired| set(retired.name))
        .map(|retired| {
            let change = if retired.change.is_empty() {
                String::new()
            } else {
                format!(" ({})", retired.change)
            };
            format!(
                "{} is no longer read: set {}{change} instead, and unset {}",
                retired.name, retired.replaced_by, retired.name
            )
        })
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    bail!("renamed settings: {}", found.join("; "))
}

/// Configuration of `seckill serve`: the sections of the parts of the
/// service, and the settings of the instance as a whole.
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "Instance")]
pub struct Config {
    /// Names this instance in the `instance` label of its metrics
    /// (`seckill_scheduled_job_runs_total`). Unset: the address it listens
    /// on, as bound (`127.0.0.1:8080`).
    #[arg(long, env = "SECKILL_INSTANCE")]
    pub instance: Option<String>,

    /// Buyers this instance remembers as holding an order of a sale, at most:
    /// a purchase by one of them is answered `409 already-purchased` before
    /// the strategy runs (no lock, no publish, no statement). 0 turns it off.
    #[arg(
        long,
        env = "SECKILL_KNOWN_BUYERS",
        default_value_t = 200_000,
        value_parser = clap::value_parser!(u64).range(0..=100_000_000)
    )]
    pub known_buyers: u64,

    /// Test-only fault injection, e.g. `redis-decr-after-reserve=exit`
    /// (comma-separated `name=action`), parsed at start by the `failpoints`
    /// module. Honoured only by a build with the cargo feature `failpoints`;
    /// any other build refuses to start when it is set. See docs/testing.md
    /// for the failpoints and their actions.
    #[arg(long, env = "SECKILL_FAILPOINTS", hide = true)]
    pub failpoints: Option<String>,

    /// The HTTP server.
    #[command(flatten)]
    pub http: HttpSettings,

    /// Authentication: the admin token, buyer tokens, development mode.
    #[command(flatten)]
    pub auth: AuthSettings,

    /// Postgres, Redis and RabbitMQ.
    #[command(flatten)]
    pub backends: BackendSettings,

    /// The order lifecycle (the expiry sweep).
    #[command(flatten)]
    pub lifecycle: crate::lifecycle::Settings,

    /// The strategies, one section each.
    #[command(flatten)]
    pub strategies: StrategySettings,
}

/// [`Config`] as a whole command line.
#[derive(clap::Parser)]
struct Wrapper {
    #[command(flatten)]
    config: Config,
}

impl Config {
    /// The configuration from environment variables and defaults alone, as
    /// `seckill serve` with no flags would read it.
    pub fn from_env() -> Config {
        let mut config = <Wrapper as clap::Parser>::parse_from(["seckill"]).config;
        config.auth.admin_token = admin_token_from_env().ok().flatten();
        config.auth.buyer_key = buyer_key_from_env().ok().flatten();
        config
    }

    /// The configuration from its defaults alone, every environment variable
    /// ignored: what a test starts from, so that a stray `SECKILL_*` (or
    /// `REDIS_URL`, …) in its environment changes nothing.
    pub fn defaults() -> Config {
        use clap::{CommandFactory, FromArgMatches};
        let command = Wrapper::command().mut_args(|arg| arg.env(None::<&str>));
        let matches = command.get_matches_from(["seckill"]);
        Wrapper::from_arg_matches(&matches).expect("the defaults parse").config
    }

    /// The whole command line of `seckill serve` as a `clap` command: every
    /// flag with its variable and default (what `--help` shows).
    pub fn command() -> clap::Command {
        <Wrapper as clap::CommandFactory>::command()
    }

    /// Checks what the flags' own parsers cannot check alone
    /// ([`AuthSettings::check`]).
    ///
    /// Errors: as [`AuthSettings::check`]. No message contains a token.
    pub fn check(&self) -> anyhow::Result<()> {
        self.auth.check(self.http.addr)
    }

    /// The admin token in force, and whether it is the development default.
    pub fn admin_token(&self) -> (&str, bool) {
        self.auth.admin_token()
    }

    /// The `instance` label of this instance's metrics (`SECKILL_INSTANCE`;
    /// set to the bound address at start when unset).
    pub fn instance(&self) -> &str {
        self.instance.as_deref().unwrap_or("unnamed")
    }

    /// What the strategies of this instance are built from: the
    /// connections given, and of the configuration only the strategies'
    /// settings, the backing servers', the instance's name and the
    /// failpoints.
    pub fn deps(
        &self,
        db: sqlx::PgPool,
        redis: RedisHandle,
        amqp: AmqpHandle,
        catalog: SaleCatalog,
    ) -> Deps {
        let deps =
            Deps::new(db, redis, amqp, catalog, self.strategies.clone(), self.backends.clone());
        deps.for_instance(self.instance())
    }
}

impl std::fmt::Debug for Config {
    /// Leaves the admin token, the buyer token key and the URLs out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("instance", &self.instance)
            .field("known_buyers", &self.known_buyers)
            .field("failpoints", &self.failpoints)
            .field("http", &self.http)
            .field("auth", &self.auth)
            .field("backends", &self.backends)
            .field("lifecycle", &self.lifecycle)
            .field("strategies", &self.strategies)
            .finish()
    }
}

#[cfg(test)]
mod tests;
