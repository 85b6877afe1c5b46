//! Service configuration: one struct, read from flags or environment
//! variables, with defaults that match the local services of the README.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use ipnet::IpNet;

use crate::buyer_token::BuyerVerifier;

/// The admin token accepted in development mode (`SECKILL_DEV`) when
/// `SECKILL_ADMIN_TOKEN` is unset. The service warns at start when it is in
/// use, and refuses it outside development mode.
pub const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

/// Least length of an admin token, in bytes, outside development mode: 32
/// bytes is 256 bits when random (`openssl rand -hex 32` gives 64
/// characters), the size of a SHA-256 output, beyond any online guessing.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

/// Largest duration setting, in milliseconds (one day): every `*_MS` setting
/// is bounded by it, so that no sum of durations overflows an `Instant`.
const MAX_MS: u64 = 86_400_000;

/// Default of `SECKILL_BATCH_MAX`, the largest `sql/batched` batch.
///
/// Chosen by measurement (docs/hot-row.md): the strategy's batch
/// transaction driven directly against Postgres by two concurrent drivers
/// (`sql_batched::ceiling::units_per_s`, debug build, 3 s per size, two
/// passes on the 2-core development machine) settled 11–16 thousand units/s
/// in batches of 64, 23–25 thousand in batches of 128, 36–38 thousand in
/// batches of 256 and 47–49 thousand in batches of 512, one batch taking
/// 8–11, 10–11, 14 and 21–22 ms. 256 is the smallest of these caps whose
/// rate is above what HTTP delivers to two instances on that machine (the
/// release `http_rps` ceiling of the README's sample run, 33 635 answers/s),
/// so the cap does not hold the strategy below its front end, and a full
/// batch still commits in about 14 ms. Under the default comparison (200
/// clients over 2 instances) no batch reaches it.
pub const DEFAULT_BATCH_MAX: u16 = 256;

/// Configuration of `seckill serve`.
#[derive(Clone, clap::Args)]
pub struct Config {
    /// Postgres connection URL; the database is created if it does not exist.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/seckill",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub database_url: String,

    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SECKILL_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,

    /// Address of a listener of its own for `GET /metrics`, served there
    /// without a token for a scraper on a private network (port 0 picks a
    /// free port); `/metrics` then leaves the main address. Unset: `/metrics`
    /// is served on the main address and asks for the admin token, like
    /// `/admin/*` (docs/security.md).
    #[arg(long, env = "SECKILL_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// The load balancers in front of the service, comma-separated IP
    /// addresses or CIDR blocks (`10.0.0.5,10.1.0.0/24`). Read by the admin
    /// token check alone (`http::auth`): from a peer among them, a request's
    /// client is the rightmost `X-Forwarded-For` address that is not one of
    /// them, and wrong tokens are counted per such client; from any other
    /// peer the header is ignored. Unset: every client is its TCP peer.
    /// Never name a range clients send from: whoever is trusted may name any
    /// client (docs/security.md).
    #[arg(long, env = "SECKILL_TRUSTED_PROXIES", value_delimiter = ',', value_parser = balancer)]
    pub trusted_proxies: Vec<IpNet>,

    /// Open HTTP connections at most; a connection beyond the cap is answered
    /// `503 busy` and closed at once. Keep it under the process's file
    /// descriptor limit (`ulimit -n`), with room for the connection pools.
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Milliseconds a client has to send a complete request head, from its
    /// first byte (from the accept, for a connection's first request); then
    /// the connection is closed.
    #[arg(long, env = "SECKILL_HEADER_TIMEOUT_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub header_timeout_ms: u64,

    /// Milliseconds a kept-alive connection may stay open with no request in
    /// progress and no byte read or written; then it is closed.
    #[arg(long, env = "SECKILL_IDLE_TIMEOUT_MS", default_value_t = 60_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub idle_timeout_ms: u64,

    /// Milliseconds a request may run, reading its body included, before it
    /// is answered `504 timeout`. What it set in motion may still complete
    /// (a purchase is never placed twice for one buyer, so a retry is safe).
    #[arg(long, env = "SECKILL_REQUEST_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub request_timeout_ms: u64,

    /// Development mode, for a try on one's own machine: the service starts
    /// without `SECKILL_ADMIN_TOKEN` (then the admin routes accept
    /// `dev-admin-token`) or with a token shorter than 32 bytes, and only on
    /// a loopback address. Without it the service refuses to start with
    /// either.
    #[arg(long, env = "SECKILL_DEV", value_parser = clap::builder::BoolishValueParser::new())]
    pub dev: bool,

    /// The bearer token of the `/admin/*` routes, at least 32 bytes: read
    /// from the environment only (a command line is visible to every user in
    /// `ps`), `SECKILL_ADMIN_TOKEN`, or the file `SECKILL_ADMIN_TOKEN_FILE`
    /// (a container secret; trailing whitespace removed). See
    /// [`admin_token_from_env`].
    #[arg(skip)]
    pub admin_token: Option<String>,

    /// Buyer identity: `on`, purchases and their results take the buyer from
    /// a verified bearer token (`sub`); `off`, from the request body's
    /// `user_id` (load tests and demos). Unset: `on` when a buyer token key
    /// is configured; without one, `off` in development mode and a refusal to
    /// start otherwise. See [`Config::buyer_verifier`].
    #[arg(long, env = "SECKILL_BUYER_AUTH", value_enum)]
    pub buyer_auth: Option<BuyerAuthMode>,

    /// The key that verifies buyer tokens, read from the environment only
    /// (see [`buyer_key_from_env`]).
    #[arg(skip)]
    pub buyer_key: Option<BuyerKey>,

    /// Postgres connections in this instance's pool.
    #[arg(long, env = "SECKILL_DB_POOL_SIZE", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub db_pool_size: u32,

    /// Redis connection URL (lock and redis-decr strategies): one node,
    /// `redis://[user:pass@]host:port[/db]`, or a Redis Cluster by its seed
    /// nodes, `redis+cluster://[user:pass@]h1:p1,h2:p2,...` (every key of a
    /// sale shares one hash slot; docs/scaling.md).
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// Namespace in front of every Redis key this service writes.
    /// Letters, digits, `_`, `.` and `-`, 1 to 64 of them (no `{` or `}`:
    /// the hash tags of a sale's keys must stay the sale's own).
    #[arg(long, env = "SECKILL_REDIS_PREFIX", default_value = "seckill", value_parser = prefix)]
    pub redis_key_prefix: String,

    /// RabbitMQ connection URL (queue strategy).
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true,
        hide_default_value = true
    )]
    pub amqp_url: String,

    /// Namespace in front of every queue and exchange this service declares
    /// (`PREFIX.orders.N`, …); instances that share a sale share a prefix.
    /// Letters, digits, `_`, `.` and `-`, 1 to 64 of them (AMQP names are at
    /// most 255 bytes).
    #[arg(long, env = "SECKILL_AMQP_PREFIX", default_value = "seckill", value_parser = prefix)]
    pub amqp_prefix: String,

    /// `queue`: partition queues; sale `id` goes to partition `id mod N`.
    /// Every instance must use the same number.
    #[arg(long, env = "SECKILL_QUEUE_PARTITIONS", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub queue_partitions: u16,

    /// `queue`: messages a partition queue holds at most (`x-max-length`);
    /// beyond it the broker refuses publishes (`x-overflow = reject-publish`)
    /// and purchases are answered `503 busy`.
    #[arg(long, env = "SECKILL_QUEUE_MAX_LENGTH", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub queue_max_length: u32,

    /// `queue`: most messages the consumer settles in one Postgres
    /// transaction. The prefetch is twice this.
    #[arg(long, env = "SECKILL_QUEUE_BATCH_SIZE", default_value_t = 200,
          value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub queue_batch_size: u16,

    /// `queue`: after a batch's first message, how long the consumer waits
    /// for more before settling what it has, in milliseconds.
    #[arg(long, env = "SECKILL_QUEUE_BATCH_WINDOW_MS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub queue_batch_window_ms: u64,

    /// `queue`: failed settlements of one request before it is rejected and
    /// its message dead-lettered. The consumer counts them itself; the
    /// broker's `x-delivery-limit` is a separate backstop (1000), since
    /// RabbitMQ before 4.3 also counts the returns of a fail-over.
    #[arg(long, env = "SECKILL_QUEUE_DELIVERY_LIMIT", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub queue_delivery_limit: u32,

    /// `queue`: milliseconds a resolved request row is kept after it was
    /// accepted; a periodic job deletes older ones (pending requests are
    /// never deleted). 0 keeps them forever. Default: 7 days.
    #[arg(long, env = "SECKILL_QUEUE_RETENTION_MS", default_value_t = 604_800_000)]
    pub queue_retention_ms: u64,

    /// `queue`: milliseconds a request may stay `pending` before a periodic
    /// job publishes its message again — for a request whose instance died,
    /// or lost Postgres' reply, between registering it and publishing it. The
    /// consumer settles a request id once, so a request still queued costs a
    /// second delivery, never a second order. 0 turns the job off. Default:
    /// 10 s, twice the publisher's 5 s confirm timeout, so that a publish
    /// waiting for its confirm is rarely doubled.
    #[arg(long, env = "SECKILL_QUEUE_REPUBLISH_AFTER_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub queue_republish_after_ms: u64,

    /// `queue`: whether this instance runs a consumer per partition (every
    /// instance does by default; single active consumer picks one).
    #[arg(long, env = "SECKILL_QUEUE_CONSUME", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub queue_consume: bool,

    /// `sql/batched`: most purchases of one sale this instance settles in one
    /// transaction; purchases beyond it wait for the next batch.
    #[arg(long, env = "SECKILL_BATCH_MAX", default_value_t = DEFAULT_BATCH_MAX,
          value_parser = clap::value_parser!(u16).range(1..=10_000))]
    pub batch_max: u16,

    /// `sql/batched`: microseconds a batch waits for more purchases before it
    /// settles; 0 settles at once what has gathered (group commit, no timer).
    #[arg(long, env = "SECKILL_BATCH_WINDOW_US", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub batch_window_us: u64,

    /// How long a request waits for a pool connection, in milliseconds; then
    /// it is answered 503 `busy` if Postgres answers a probe connection (the
    /// pool is exhausted by slow work), 503 `unavailable` if it does not.
    #[arg(long, env = "SECKILL_DB_ACQUIRE_TIMEOUT_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub db_acquire_timeout_ms: u64,

    /// `redis-decr`: the period of the background reconciliation, in
    /// milliseconds: one pass over the sales this Redis prefix holds per
    /// period, run by one instance of those sharing the prefix; 0 turns the
    /// background job off (`POST /admin/sales/{id}/reconcile` still works).
    #[arg(long, env = "SECKILL_RECONCILE_INTERVAL_MS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(0..=MAX_MS))]
    pub reconcile_interval_ms: u64,

    /// The period of the expiry sweep, in milliseconds: every instance looks
    /// this often for orders still unpaid at the end of their payment window
    /// and expires them, returning their units (`FOR UPDATE SKIP LOCKED`, so
    /// instances sweeping at once share the work); 0 turns this instance's
    /// sweep off.
    #[arg(long, env = "SECKILL_EXPIRY_SWEEP_INTERVAL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(0..=MAX_MS))]
    pub expiry_sweep_interval_ms: u64,

    /// `redis-decr`: milliseconds the Redis keys of a sale are kept once the
    /// reconciler found it ended or sold out with its books settled; it then
    /// stops visiting the sale. A restock or a purchase that warms the
    /// counter again keeps the keys. Default: 1 hour.
    #[arg(long, env = "SECKILL_REDIS_KEY_TTL_MS", default_value_t = 3_600_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub redis_key_ttl_ms: u64,

    /// Names this instance in the `instance` label of its metrics
    /// (`seckill_scheduled_job_runs_total`). Unset: the address it listens
    /// on, as bound (`127.0.0.1:8080`).
    #[arg(long, env = "SECKILL_INSTANCE")]
    pub instance: Option<String>,

    /// `redis-decr`: age in milliseconds after which a reservation without an
    /// order counts as abandoned and is returned. Must exceed the longest
    /// purchase (pool wait `SECKILL_DB_ACQUIRE_TIMEOUT_MS` plus the
    /// transaction), or a slow purchase's unit is returned while it commits.
    #[arg(long, env = "SECKILL_RECONCILE_GRACE_MS", default_value_t = 15000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub reconcile_grace_ms: u64,

    /// `redis-decr` and `queue`: milliseconds an instance answers "sold out"
    /// from its local flag without asking Redis (or Postgres). The bound on
    /// how long a lost "stock returned" broadcast can hide returned stock;
    /// for `queue`, also how old what an instance knows of a sale may be
    /// before a purchase reads `remaining_stock` again (sold out or not).
    #[arg(long, env = "SECKILL_SOLD_OUT_FLAG_TTL_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub sold_out_flag_ttl_ms: u64,

    /// Test-only fault injection, e.g. `redis-decr-after-reserve=exit`
    /// (comma-separated `name=action`), parsed at start by the `failpoints`
    /// module. Honoured only by a build with the cargo feature `failpoints`;
    /// any other build refuses to start when it is set. See docs/testing.md
    /// for the failpoints and their actions.
    #[arg(long, env = "SECKILL_FAILPOINTS", hide = true)]
    pub failpoints: Option<String>,

    /// Independent Redis nodes of the `lock/redlock` strategy, comma-separated
    /// (quorum = N/2 + 1): plain `redis://` masters, never a cluster (a
    /// `redis+cluster://` URL is refused; `REDIS_URL` may still be one).
    #[arg(
        long,
        env = "REDLOCK_URLS",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:6380,redis://127.0.0.1:6381,redis://127.0.0.1:6382",
        hide_env_values = true
    )]
    pub redlock_urls: Vec<String>,

    /// How long a `lock/*` purchase waits for its sale's lock before it is
    /// answered 503 `busy`, in milliseconds.
    #[arg(long, env = "SECKILL_LOCK_WAIT_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub lock_wait_ms: u64,

    /// How long a `lock/*` purchase may hold its sale's lock, in
    /// milliseconds: its critical section is cut off after this and answered
    /// 503 `busy`, and the library locks' watchdog stops renewing there
    /// (`max_hold`). The default is the default pool wait: a section that
    /// spent that long is hung or overloaded either way, and with the
    /// default lock wait (1 s) and release (at most 1 s) the purchase is
    /// answered well within the request timeout (10 s), by the lock's `busy`
    /// rather than a `504`. Keep wait + hold + 1 s under the request
    /// timeout.
    #[arg(long, env = "SECKILL_LOCK_HOLD_MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_MS))]
    pub lock_hold_ms: u64,

    /// `lock/*`: seconds a critical section stays in `lock_intervals` (what
    /// `GET /admin/sales/{id}/lock-stats` reads) after it ended; older ones
    /// are deleted about once a minute, so the table does not grow forever.
    #[arg(long, env = "SECKILL_LOCK_INTERVALS_RETENTION_S", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(60..=31_536_000))]
    pub lock_intervals_retention_s: u64,

    /// Buyers this instance remembers as holding an order of a sale, at most:
    /// a purchase by one of them is answered `409 already-purchased` before
    /// the strategy runs (no lock, no publish, no statement). 0 turns it off.
    #[arg(long, env = "SECKILL_KNOWN_BUYERS", default_value_t = 200_000,
          value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub known_buyers: u64,
}

/// `SECKILL_BUYER_AUTH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BuyerAuthMode {
    /// The buyer is the `sub` of a verified bearer token.
    On,
    /// The buyer is the request body's `user_id`, trusted as sent.
    Off,
}

/// A key that verifies buyer tokens (`crate::buyer_token`).
#[derive(Clone)]
pub enum BuyerKey {
    /// An `HS256` secret: `SECKILL_BUYER_JWT_KEY` or the contents of
    /// `SECKILL_BUYER_JWT_KEY_FILE`.
    Secret(String),
    /// An RSA or EC public key in PEM form: the contents of
    /// `SECKILL_BUYER_JWT_PUBLIC_KEY_FILE`.
    PublicPem(Vec<u8>),
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
        config.admin_token = admin_token_from_env().ok().flatten();
        config.buyer_key = buyer_key_from_env().ok().flatten();
        config
    }

    /// Checks what the flags' own parsers cannot check alone: the admin token
    /// is at least [`MIN_ADMIN_TOKEN_BYTES`] long, unless `dev` is set and the
    /// service listens on a loopback address only.
    ///
    /// Errors: a missing or short token outside development mode; development
    /// mode on an address other than loopback. No message contains a token.
    pub fn check(&self) -> anyhow::Result<()> {
        let long_enough =
            self.admin_token.as_deref().is_some_and(|token| token.len() >= MIN_ADMIN_TOKEN_BYTES);
        if self.dev && !self.addr.ip().is_loopback() {
            bail!(
                "SECKILL_DEV (development mode) is allowed on a loopback address only, not on {}",
                self.addr
            );
        }
        if !long_enough && !self.dev {
            let problem = match &self.admin_token {
                None => "SECKILL_ADMIN_TOKEN is not set".to_owned(),
                Some(token) => format!(
                    "the admin token is {} bytes long, shorter than {MIN_ADMIN_TOKEN_BYTES}",
                    token.len()
                ),
            };
            bail!(
                "{problem}: set SECKILL_ADMIN_TOKEN (or SECKILL_ADMIN_TOKEN_FILE) to a random \
                 string of at least {MIN_ADMIN_TOKEN_BYTES} bytes, e.g. `openssl rand -hex 32`; \
                 for a try on this machine only, SECKILL_DEV=1 accepts the development token \
                 on a loopback address"
            );
        }
        self.buyer_verifier()?;
        Ok(())
    }

    /// Whether buyer tokens are checked, and with which key: `Some` when
    /// buyer authentication is on, `None` when the buyer comes from the
    /// request body.
    ///
    /// `SECKILL_BUYER_AUTH=on` needs a key; `off` is off whatever the key;
    /// unset, a key turns it on, and without a key it is off in development
    /// mode (`SECKILL_DEV`) only.
    ///
    /// Errors: on (set or implied) without a key; unset without a key outside
    /// development mode; an HMAC secret shorter than 32 bytes or a public key
    /// that is not RSA or EC PEM. No message contains the key.
    pub fn buyer_verifier(&self) -> anyhow::Result<Option<BuyerVerifier>> {
        const HOW: &str = "set SECKILL_BUYER_JWT_KEY (or SECKILL_BUYER_JWT_KEY_FILE) to a random \
                           string of at least 32 bytes shared with what signs the buyer tokens, \
                           or SECKILL_BUYER_JWT_PUBLIC_KEY_FILE to its RS256/ES256 public key";
        let verifier = || match &self.buyer_key {
            Some(BuyerKey::Secret(secret)) => BuyerVerifier::hs256(secret.as_bytes()),
            Some(BuyerKey::PublicPem(pem)) => BuyerVerifier::public_key_pem(pem),
            None => unreachable!("checked before"),
        };
        match (self.buyer_auth, &self.buyer_key) {
            (Some(BuyerAuthMode::Off), _) => Ok(None),
            (Some(BuyerAuthMode::On) | None, Some(_)) => verifier().map(Some),
            (Some(BuyerAuthMode::On), None) => {
                bail!("SECKILL_BUYER_AUTH=on needs a buyer token key: {HOW}")
            }
            (None, None) if self.dev => Ok(None),
            (None, None) => bail!(
                "no buyer token key, so buyers could not be authenticated: {HOW}; or set \
                 SECKILL_BUYER_AUTH=off to take the buyer from the request body's `user_id` \
                 (load tests and demos: anyone can then buy as anyone)"
            ),
        }
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

    /// The admin token in force, and whether it is the development default.
    pub fn admin_token(&self) -> (&str, bool) {
        match self.admin_token.as_deref() {
            Some(token) if !token.is_empty() => (token, false),
            _ => (DEV_ADMIN_TOKEN, true),
        }
    }

    /// The `instance` label of this instance's metrics (`SECKILL_INSTANCE`;
    /// set to the bound address at start when unset).
    pub fn instance(&self) -> &str {
        self.instance.as_deref().unwrap_or("unnamed")
    }

    pub fn db_acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.db_acquire_timeout_ms)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    pub fn lock_wait(&self) -> Duration {
        Duration::from_millis(self.lock_wait_ms)
    }

    pub fn lock_hold(&self) -> Duration {
        Duration::from_millis(self.lock_hold_ms)
    }

    pub fn queue_batch_window(&self) -> Duration {
        Duration::from_millis(self.queue_batch_window_ms)
    }

    pub fn batch_window(&self) -> Duration {
        Duration::from_micros(self.batch_window_us)
    }
}

/// The admin token from the environment: `SECKILL_ADMIN_TOKEN` when set and
/// not empty, else the contents of the file named by
/// `SECKILL_ADMIN_TOKEN_FILE` without trailing whitespace, else `None`.
///
/// Errors: both variables are set; the file cannot be read or holds only
/// whitespace. No message contains the token.
pub fn admin_token_from_env() -> anyhow::Result<Option<String>> {
    let value = std::env::var("SECKILL_ADMIN_TOKEN").ok().filter(|token| !token.is_empty());
    let file = std::env::var_os("SECKILL_ADMIN_TOKEN_FILE").filter(|path| !path.is_empty());
    match (value, file) {
        (Some(_), Some(_)) => {
            bail!("set SECKILL_ADMIN_TOKEN or SECKILL_ADMIN_TOKEN_FILE, not both")
        }
        (Some(token), None) => Ok(Some(token)),
        (None, Some(path)) => {
            let path = std::path::PathBuf::from(path);
            let contents = std::fs::read_to_string(&path)
                .with_context(|| format!("reading SECKILL_ADMIN_TOKEN_FILE {}", path.display()))?;
            let token = contents.trim_end();
            if token.is_empty() {
                bail!("SECKILL_ADMIN_TOKEN_FILE {} is empty", path.display());
            }
            Ok(Some(token.to_owned()))
        }
        (None, None) => Ok(None),
    }
}

/// The buyer token key from the environment: `SECKILL_BUYER_JWT_KEY` (an
/// HMAC secret), else the contents of `SECKILL_BUYER_JWT_KEY_FILE` without
/// trailing whitespace, else the contents of
/// `SECKILL_BUYER_JWT_PUBLIC_KEY_FILE` (a PEM public key), else `None`.
/// Empty variables count as unset.
///
/// Errors: more than one is set; a file cannot be read or is empty. No
/// message contains the key.
pub fn buyer_key_from_env() -> anyhow::Result<Option<BuyerKey>> {
    let set = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    let secret = set("SECKILL_BUYER_JWT_KEY");
    let secret_file = set("SECKILL_BUYER_JWT_KEY_FILE");
    let public_file = set("SECKILL_BUYER_JWT_PUBLIC_KEY_FILE");
    let read = |name: &str, path: std::ffi::OsString| -> anyhow::Result<String> {
        let path = std::path::PathBuf::from(path);
        let contents = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {name} {}", path.display()))?;
        let trimmed = contents.trim_end();
        if trimmed.is_empty() {
            bail!("{name} {} is empty", path.display());
        }
        Ok(trimmed.to_owned())
    };
    match (secret, secret_file, public_file) {
        (None, None, None) => Ok(None),
        (Some(secret), None, None) => Ok(Some(BuyerKey::Secret(
            secret
                .into_string()
                .map_err(|_| anyhow::anyhow!("SECKILL_BUYER_JWT_KEY is not UTF-8"))?,
        ))),
        (None, Some(path), None) => {
            Ok(Some(BuyerKey::Secret(read("SECKILL_BUYER_JWT_KEY_FILE", path)?)))
        }
        (None, None, Some(path)) => Ok(Some(BuyerKey::PublicPem(
            read("SECKILL_BUYER_JWT_PUBLIC_KEY_FILE", path)?.into_bytes(),
        ))),
        _ => bail!(
            "set one of SECKILL_BUYER_JWT_KEY, SECKILL_BUYER_JWT_KEY_FILE and \
             SECKILL_BUYER_JWT_PUBLIC_KEY_FILE, not several"
        ),
    }
}

/// Parser of `SECKILL_REDIS_PREFIX` and `SECKILL_AMQP_PREFIX`: 1 to 64
/// letters, digits, `_`, `.` or `-`.
fn prefix(value: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if (1..=64).contains(&value.len()) && value.chars().all(allowed) {
        Ok(value.to_owned())
    } else {
        Err("1 to 64 letters, digits, `_`, `.` or `-` expected".to_owned())
    }
}

/// Parser of one `SECKILL_TRUSTED_PROXIES` entry: a CIDR block, or one
/// address (a block of that address alone).
fn balancer(value: &str) -> Result<IpNet, String> {
    let value = value.trim();
    value
        .parse::<IpNet>()
        .or_else(|_| value.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| "an IP address or a CIDR block (e.g. 10.0.0.0/24) expected".to_owned())
}

/// `url` with its password (the user information before `@`) replaced by
/// `***`, for error messages.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

impl std::fmt::Debug for Config {
    /// Leaves the admin token, the buyer token key and the database password
    /// out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("addr", &self.addr)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("dev", &self.dev)
            .field("buyer_auth", &self.buyer_auth)
            .field("max_connections", &self.max_connections)
            .field("header_timeout_ms", &self.header_timeout_ms)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("db_pool_size", &self.db_pool_size)
            .field("db_acquire_timeout_ms", &self.db_acquire_timeout_ms)
            .field("reconcile_interval_ms", &self.reconcile_interval_ms)
            .field("expiry_sweep_interval_ms", &self.expiry_sweep_interval_ms)
            .field("reconcile_grace_ms", &self.reconcile_grace_ms)
            .field("instance", &self.instance)
            .field("sold_out_flag_ttl_ms", &self.sold_out_flag_ttl_ms)
            .field("failpoints", &self.failpoints)
            .field("amqp_prefix", &self.amqp_prefix)
            .field("queue_partitions", &self.queue_partitions)
            .field("queue_max_length", &self.queue_max_length)
            .field("queue_batch_size", &self.queue_batch_size)
            .field("queue_batch_window_ms", &self.queue_batch_window_ms)
            .field("queue_delivery_limit", &self.queue_delivery_limit)
            .field("queue_consume", &self.queue_consume)
            .field("queue_retention_ms", &self.queue_retention_ms)
            .field("queue_republish_after_ms", &self.queue_republish_after_ms)
            .field("redis_key_ttl_ms", &self.redis_key_ttl_ms)
            .field("batch_max", &self.batch_max)
            .field("batch_window_us", &self.batch_window_us)
            .field("lock_intervals_retention_s", &self.lock_intervals_retention_s)
            .field("known_buyers", &self.known_buyers)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Cli::try_parse_from(std::iter::once("seckill").chain(args.iter().copied()))
            .map(|cli| cli.config)
    }

    fn with_token(token: Option<&str>, dev: bool, addr: &str) -> Config {
        let mut config = parse(&["--addr", addr]).expect("valid");
        config.admin_token = token.map(str::to_owned);
        config.dev = dev;
        // The admin token's tests: buyer authentication explicitly off.
        config.buyer_auth = Some(BuyerAuthMode::Off);
        config
    }

    #[test]
    fn the_service_refuses_a_missing_or_short_admin_token_outside_development_mode() {
        let long = "x".repeat(MIN_ADMIN_TOKEN_BYTES);
        assert!(with_token(Some(&long), false, "0.0.0.0:8080").check().is_ok());
        let missing = with_token(None, false, "127.0.0.1:8080").check().unwrap_err();
        assert!(missing.to_string().contains("SECKILL_ADMIN_TOKEN is not set"), "{missing}");
        let short = &long[1..];
        let error = with_token(Some(short), false, "127.0.0.1:8080").check().unwrap_err();
        assert!(error.to_string().contains("31 bytes long"), "{error}");
        assert!(!error.to_string().contains(short), "the message shows the token: {error}");
    }

    #[test]
    fn development_mode_accepts_no_token_on_loopback_only() {
        assert!(with_token(None, true, "127.0.0.1:8080").check().is_ok());
        assert!(with_token(Some("short"), true, "[::1]:8080").check().is_ok());
        let long = "x".repeat(MIN_ADMIN_TOKEN_BYTES);
        for config in
            [with_token(None, true, "0.0.0.0:8080"), with_token(Some(&long), true, "10.1.2.3:80")]
        {
            let error = config.check().unwrap_err();
            assert!(error.to_string().contains("loopback"), "{error}");
        }
    }

    fn with_buyer(mode: Option<BuyerAuthMode>, key: Option<&str>, dev: bool) -> Config {
        let mut config = with_token(None, dev, "127.0.0.1:8080");
        config.buyer_auth = mode;
        config.buyer_key = key.map(|key| BuyerKey::Secret(key.to_owned()));
        config
    }

    #[test]
    fn buyer_auth_is_on_with_a_key_and_off_only_when_asked_or_in_development_mode() {
        use BuyerAuthMode::{Off, On};
        let key = "k".repeat(32);
        let on = |config: Config| config.buyer_verifier().unwrap().is_some();
        assert!(on(with_buyer(None, Some(&key), false)), "a key turns it on");
        assert!(on(with_buyer(None, Some(&key), true)), "in development mode too");
        assert!(on(with_buyer(Some(On), Some(&key), false)));
        assert!(!on(with_buyer(Some(Off), Some(&key), false)), "off is off whatever the key");
        assert!(!on(with_buyer(Some(Off), None, false)));
        assert!(!on(with_buyer(None, None, true)), "development mode without a key");
    }

    #[test]
    fn buyer_auth_without_a_key_or_with_a_short_one_refuses_to_start() {
        use BuyerAuthMode::On;
        let unset = with_buyer(None, None, false).buyer_verifier().unwrap_err().to_string();
        assert!(unset.contains("SECKILL_BUYER_AUTH=off"), "{unset}");
        let on = with_buyer(Some(On), None, true).buyer_verifier().unwrap_err().to_string();
        assert!(on.contains("SECKILL_BUYER_AUTH=on needs a buyer token key"), "{on}");
        let short = with_buyer(None, Some("short-buyer-key"), false);
        let error = short.buyer_verifier().unwrap_err().to_string();
        assert!(error.contains("15 bytes long") && !error.contains("short-buyer-key"), "{error}");
        let pem = Config { buyer_key: Some(BuyerKey::PublicPem(b"junk".to_vec())), ..short };
        assert!(pem.buyer_verifier().unwrap_err().to_string().contains("PEM"));
    }

    #[test]
    fn prefixes_are_names_without_braces_or_spaces_of_at_most_64_characters() {
        for good in ["seckill", "test-1f.a_B", &"a".repeat(64)] {
            assert!(parse(&["--redis-key-prefix", good, "--amqp-prefix", good]).is_ok(), "{good}");
        }
        for bad in ["", "{sale}", "a b", "é", &"a".repeat(65), "x:y"] {
            assert!(parse(&["--redis-key-prefix", bad]).is_err(), "{bad:?}");
            assert!(parse(&["--amqp-prefix", bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_and_sizes_out_of_range_are_refused() {
        let max = u64::MAX.to_string();
        for flag in [
            "--sold-out-flag-ttl-ms",
            "--lock-wait-ms",
            "--lock-hold-ms",
            "--db-acquire-timeout-ms",
            "--reconcile-grace-ms",
            "--reconcile-interval-ms",
            "--request-timeout-ms",
            "--header-timeout-ms",
            "--idle-timeout-ms",
            "--queue-batch-window-ms",
        ] {
            let error =
                parse(&[flag, &max]).err().unwrap_or_else(|| panic!("{flag} accepted u64::MAX"));
            assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation, "{flag}");
        }
        for (flag, value) in
            [("--db-pool-size", "0"), ("--queue-max-length", "0"), ("--sold-out-flag-ttl-ms", "0")]
        {
            assert!(parse(&[flag, value]).is_err(), "{flag} {value}");
        }
        assert!(parse(&["--reconcile-interval-ms", "0"]).is_ok(), "0 turns reconciliation off");
    }

    #[test]
    fn trusted_proxies_are_addresses_or_blocks_and_none_by_default() {
        assert!(parse(&[]).unwrap().trusted_proxies.is_empty());
        let config = parse(&["--trusted-proxies", "10.0.0.5, 10.1.0.0/24,fd00::/8"]).unwrap();
        let nets: Vec<String> = config.trusted_proxies.iter().map(ToString::to_string).collect();
        assert_eq!(nets, ["10.0.0.5/32", "10.1.0.0/24", "fd00::/8"]);
        for bad in ["lb", "10.0.0.0/33", "10.0.0.5:8080", ""] {
            assert!(parse(&["--trusted-proxies", bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_url_in_an_error_message_has_no_password() {
        assert_eq!(redacted("redis://:s3cret@node-1:6380"), "redis://***@node-1:6380");
        assert_eq!(redacted("amqp://user:pw@host:5672/%2f"), "amqp://***@host:5672/%2f");
        assert_eq!(redacted("redis://node-1:6380"), "redis://node-1:6380");
        assert_eq!(redacted("no-scheme@host"), "no-scheme@host");
    }
}
