//! The settings of authentication ([`AuthSettings`]): the admin token of
//! `/admin/*` (this module's parent), the buyer tokens (`crate::buyer_token`),
//! development mode, and the load balancers whose `X-Forwarded-For` the admin
//! token check believes. The keys are read from the environment only
//! ([`admin_token_from_env`], [`buyer_key_from_env`]): a command line is
//! visible to every user in `ps`.

use std::net::SocketAddr;

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

/// `SECKILL_ADMIN_TOKEN`: the admin token (environment only).
pub const ADMIN_TOKEN_ENV: &str = "SECKILL_ADMIN_TOKEN";
/// `SECKILL_ADMIN_TOKEN_FILE`: a file holding the admin token (environment only).
pub const ADMIN_TOKEN_FILE_ENV: &str = "SECKILL_ADMIN_TOKEN_FILE";
/// `SECKILL_BUYER_AUTH`: buyer identity, `on` or `off` (also `--buyer-auth`).
pub const BUYER_AUTH_ENV: &str = "SECKILL_BUYER_AUTH";
/// `SECKILL_BUYER_JWT_KEY`: the HMAC secret of buyer tokens (environment only).
pub const BUYER_JWT_KEY_ENV: &str = "SECKILL_BUYER_JWT_KEY";
/// `SECKILL_BUYER_JWT_KEY_FILE`: a file holding it (environment only).
pub const BUYER_JWT_KEY_FILE_ENV: &str = "SECKILL_BUYER_JWT_KEY_FILE";
/// `SECKILL_BUYER_JWT_PUBLIC_KEY_FILE`: a PEM public key (environment only).
pub const BUYER_JWT_PUBLIC_KEY_FILE_ENV: &str = "SECKILL_BUYER_JWT_PUBLIC_KEY_FILE";

/// The variables of this section that have no flag, secrets all: what
/// `seckill serve --help` lists apart and the README's configuration table
/// lists besides the flags.
pub const ENV_ONLY: &[&str] = &[
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_FILE_ENV,
    BUYER_JWT_KEY_ENV,
    BUYER_JWT_KEY_FILE_ENV,
    BUYER_JWT_PUBLIC_KEY_FILE_ENV,
];

/// Authentication settings of `seckill serve`.
#[derive(Clone, clap::Args)]
#[command(next_help_heading = "Authentication")]
pub struct AuthSettings {
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
    /// start otherwise. See [`AuthSettings::buyer_verifier`].
    #[arg(long, env = BUYER_AUTH_ENV, value_enum)]
    pub buyer_auth: Option<BuyerAuthMode>,

    /// The key that verifies buyer tokens, read from the environment only
    /// (see [`buyer_key_from_env`]).
    #[arg(skip)]
    pub buyer_key: Option<BuyerKey>,
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

impl AuthSettings {
    /// Checks what the flags' own parsers cannot check alone: the admin token
    /// is at least [`MIN_ADMIN_TOKEN_BYTES`] long, unless `dev` is set and the
    /// service listens (`addr`, the HTTP server's address) on a loopback
    /// address only; and buyer authentication can work
    /// ([`Self::buyer_verifier`]).
    ///
    /// Errors: a missing or short token outside development mode; development
    /// mode on an address other than loopback. No message contains a token.
    pub fn check(&self, addr: SocketAddr) -> anyhow::Result<()> {
        let long_enough =
            self.admin_token.as_deref().is_some_and(|token| token.len() >= MIN_ADMIN_TOKEN_BYTES);
        if self.dev && !addr.ip().is_loopback() {
            bail!(
                "SECKILL_DEV (development mode) is allowed on a loopback address only, not on {}",
                addr
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

    /// The admin token in force, and whether it is the development default.
    pub fn admin_token(&self) -> (&str, bool) {
        match self.admin_token.as_deref() {
            Some(token) if !token.is_empty() => (token, false),
            _ => (DEV_ADMIN_TOKEN, true),
        }
    }
}

/// The admin token from the environment: `SECKILL_ADMIN_TOKEN` when set and
/// not empty, else the contents of the file named by
/// `SECKILL_ADMIN_TOKEN_FILE` without trailing whitespace, else `None`.
///
/// Errors: both variables are set; the file cannot be read or holds only
/// whitespace. No message contains the token.
pub fn admin_token_from_env() -> anyhow::Result<Option<String>> {
    let value = std::env::var(ADMIN_TOKEN_ENV).ok().filter(|token| !token.is_empty());
    let file = std::env::var_os(ADMIN_TOKEN_FILE_ENV).filter(|path| !path.is_empty());
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
    let secret = set(BUYER_JWT_KEY_ENV);
    let secret_file = set(BUYER_JWT_KEY_FILE_ENV);
    let public_file = set(BUYER_JWT_PUBLIC_KEY_FILE_ENV);
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
        (None, Some(path), None) => Ok(Some(BuyerKey::Secret(read(BUYER_JWT_KEY_FILE_ENV, path)?))),
        (None, None, Some(path)) => {
            Ok(Some(BuyerKey::PublicPem(read(BUYER_JWT_PUBLIC_KEY_FILE_ENV, path)?.into_bytes())))
        }
        _ => bail!(
            "set one of SECKILL_BUYER_JWT_KEY, SECKILL_BUYER_JWT_KEY_FILE and \
             SECKILL_BUYER_JWT_PUBLIC_KEY_FILE, not several"
        ),
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

impl std::fmt::Debug for AuthSettings {
    /// Leaves the admin token and the buyer token key out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("dev", &self.dev)
            .field("buyer_auth", &self.buyer_auth)
            .field("trusted_proxies", &self.trusted_proxies)
            .finish_non_exhaustive()
    }
}
