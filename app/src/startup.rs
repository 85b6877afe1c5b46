//! Building and running the service: database, migrations, state, listener,
//! and the server with its connection limits ([`server`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};
use tokio::net::TcpListener;

use crate::backend_probe::BackendProbe;
use crate::backends::BackendSettings;
use crate::backends::{AmqpHandle, RedisHandle};
use crate::config::Config;
use crate::http::{self, AppState};
use crate::sale::SaleCatalog;
use crate::strategy::Strategies;
use crate::telemetry;
use crate::waiting_room::WaitingRoom;
use crate::web::BuyerAuth;

pub mod server;

/// The migrations of `migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Creates the database named in `url` if it does not exist, and applies the
/// migrations (under Postgres's advisory lock, so instances may race safely).
pub async fn prepare_database(url: &str) -> anyhow::Result<()> {
    if !Postgres::database_exists(url).await.context("connecting to Postgres")? {
        // Two instances may both see it missing; the loser's error is harmless.
        if let Err(err) = Postgres::create_database(url).await
            && !Postgres::database_exists(url).await.unwrap_or(false)
        {
            return Err(err).context("creating the database");
        }
    }
    let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
    MIGRATOR.run(&pool).await.context("applying migrations")?;
    pool.close().await;
    Ok(())
}

/// How the service connects to Postgres: `DATABASE_URL`, application name
/// `seckill`.
pub fn connect_options(backends: &BackendSettings) -> anyhow::Result<PgConnectOptions> {
    let options: PgConnectOptions =
        backends.database_url.parse().context("parsing DATABASE_URL")?;
    Ok(options.application_name("seckill"))
}

/// The service's Postgres pool: `SECKILL_DB_POOL_SIZE` connections, failing a
/// request that waits longer than `SECKILL_DB_ACQUIRE_TIMEOUT_MS` for one.
pub fn db_pool(backends: &BackendSettings) -> anyhow::Result<PgPool> {
    let options = connect_options(backends)?;
    Ok(PgPoolOptions::new()
        .max_connections(backends.db_pool_size)
        .acquire_timeout(backends.db_acquire_timeout())
        .idle_timeout(Duration::from_secs(60))
        .connect_lazy_with(options))
}

/// The expiry sweep's own connection: one, apart from the buyers' pool, so
/// that a return never queues behind buyers for a connection (with every
/// connection of [`db_pool`] held by purchases, a sweep sharing it waited for
/// each order's transaction in line with them, and returned units came back
/// seconds late under load). Application name `seckill-sweep`.
pub fn sweep_pool(backends: &BackendSettings) -> anyhow::Result<PgPool> {
    let options = connect_options(backends)?.application_name("seckill-sweep");
    Ok(PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(backends.db_acquire_timeout())
        .idle_timeout(Duration::from_secs(60))
        .connect_lazy_with(options))
}

/// Refuses a `SECKILL_FAILPOINTS` setting in a build without the cargo
/// feature `failpoints` (every release build): such a build has no
/// failpoints, and a fault drill run on it would inject nothing, or a
/// production instance would carry a drill's setting. Errors: the setting is
/// there and not blank.
#[cfg(not(feature = "failpoints"))]
fn refuse_failpoints(config: &Config) -> anyhow::Result<()> {
    match config.failpoints.as_deref().map(str::trim) {
        None | Some("") => Ok(()),
        Some(list) => anyhow::bail!(
            "SECKILL_FAILPOINTS is set (`{list}`), but this build has no failpoints: they are \
             compiled only with the cargo feature `failpoints`, for tests and fault drills. \
             Unset it, or run a build with the feature."
        ),
    }
}

/// The buyer authentication `config` asks for, after saying at start what
/// the admin routes and the buyers are trusted with (a warning in development
/// mode and with buyer authentication off). Errors: an unusable buyer token
/// key.
fn buyer_auth(config: &Config) -> anyhow::Result<BuyerAuth> {
    let (_, dev_token) = config.admin_token();
    if dev_token {
        tracing::warn!(
            "development mode without SECKILL_ADMIN_TOKEN: admin routes accept the \
             development token `{}`",
            crate::config::DEV_ADMIN_TOKEN
        );
    }
    let buyer_auth = BuyerAuth(config.auth.buyer_verifier()?.map(Arc::new));
    match &buyer_auth.0 {
        Some(verifier) => tracing::info!(
            algorithm = ?verifier.algorithm(),
            "buyer authentication on: buyers are the `sub` of verified bearer tokens"
        ),
        None => tracing::warn!(
            "buyer authentication off (SECKILL_BUYER_AUTH=off, or development mode without \
             a buyer token key): the buyer is the request's `user_id`, and anyone can buy \
             or read results as anyone"
        ),
    }
    Ok(buyer_auth)
}

/// A bound, not yet running, service.
pub struct Application {
    listener: TcpListener,
    /// The metrics listener, when `SECKILL_METRICS_ADDR` asks for one.
    metrics_listener: Option<TcpListener>,
    state: AppState,
    config: Arc<Config>,
    /// The failpoints of `SECKILL_FAILPOINTS`, parsed once.
    #[cfg(feature = "failpoints")]
    failpoints: crate::failpoints::Failpoints,
}

impl Application {
    /// Prepares the database, builds the state and binds `config.http.addr`.
    pub async fn build(mut config: Config) -> anyhow::Result<Self> {
        config.check()?;
        #[cfg(feature = "failpoints")]
        let failpoints = crate::failpoints::Failpoints::from_setting(config.failpoints.as_deref())?;
        #[cfg(not(feature = "failpoints"))]
        refuse_failpoints(&config)?;
        let buyer_auth = buyer_auth(&config)?;
        prepare_database(&config.backends.database_url).await?;
        let db = db_pool(&config.backends)?;
        let postgres = connect_options(&config.backends)?;
        let listener = TcpListener::bind(config.http.addr)
            .await
            .with_context(|| format!("binding {}", config.http.addr))?;
        let metrics_listener = match config.http.metrics_addr {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding SECKILL_METRICS_ADDR {addr}"))?,
            ),
            None => None,
        };
        if config.instance.is_none() {
            config.instance = Some(listener.local_addr()?.to_string());
        }
        let config = Arc::new(config);
        let backends = &config.backends;
        let redis = RedisHandle::new(&backends.redis_url, backends.redis_prefix.clone())
            .context("parsing REDIS_URL")?;
        let amqp = AmqpHandle::new(backends.amqp_url.clone(), backends.amqp_prefix.clone());
        let probe = BackendProbe::new(
            postgres,
            redis.client().clone(),
            &config.strategies.lock.redlock_urls,
            backends.amqp_url.clone(),
        );
        let catalog = SaleCatalog::default();
        let deps = config.deps(db.clone(), redis.clone(), amqp.clone(), catalog.clone());
        #[cfg(feature = "failpoints")]
        let deps = deps.with_failpoints(failpoints.clone());
        let strategies = Strategies::new(&deps)?;
        strategies.start_background();
        let known_buyers = crate::known_buyers::KnownBuyers::new(config.known_buyers);
        let admin_token = config.auth.admin_token().0;
        let room =
            WaitingRoom::new(&redis, db.clone(), admin_token, config.http.request_timeout())?;
        let state = AppState {
            strategies,
            redis,
            amqp,
            catalog,
            metrics: telemetry::metrics_handle(),
            http: Arc::new(config.http.clone()),
            auth: Arc::new(config.auth.clone()),
            db,
            probe,
            admin_failures: Default::default(),
            known_buyers,
            buyer_auth,
            room,
        };
        Ok(Self {
            listener,
            metrics_listener,
            state,
            config,
            #[cfg(feature = "failpoints")]
            failpoints,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// The metrics listener's address, when `SECKILL_METRICS_ADDR` gave one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        let listener = self.metrics_listener.as_ref()?;
        Some(listener.local_addr().expect("a bound listener has an address"))
    }

    /// Serves until `shutdown` completes, within the configured connection
    /// limits ([`server::serve`]), then drains in-flight requests, closes the
    /// RabbitMQ connections (the `queue` consumers stop, and the broker hands
    /// their unacknowledged messages on at once) and closes the pool.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (db, amqp) = (self.state.db.clone(), self.state.amqp.clone());
        let config = &self.config;
        // The expiry sweep runs while the service serves, and stops before
        // the pool closes.
        let stop_sweep = tokio_util::sync::CancellationToken::new();
        if let Some(period) = config.lifecycle.sweep_period() {
            let sweeper = crate::lifecycle::sweep::Sweeper {
                db: sweep_pool(&config.backends)?,
                catalog: self.state.catalog.clone(),
                strategies: self.state.strategies.clone(),
                period,
                #[cfg(feature = "failpoints")]
                failpoints: self.failpoints.clone(),
            };
            tokio::spawn(sweeper.run(stop_sweep.clone()));
        }
        let limits = server::Limits {
            max_connections: usize::try_from(config.http.max_connections).unwrap_or(usize::MAX),
            header_timeout: Duration::from_millis(config.http.header_timeout_ms),
            idle_timeout: Duration::from_millis(config.http.idle_timeout_ms),
        };
        let metrics = self.state.metrics.clone();
        let app = http::router(self.state);
        tracing::info!(addr = %self.listener.local_addr()?, ?limits, "listening");
        // One shutdown for both listeners: the metrics one stops with the
        // main one, and serves until then with the same limits.
        let stop = tokio_util::sync::CancellationToken::new();
        let metrics_server = self.metrics_listener.map(|listener| {
            let stopped = stop.clone().cancelled_owned();
            let router = http::metrics_router(metrics);
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving /metrics");
            }
            tokio::spawn(server::serve(listener, router, limits, stopped))
        });
        server::serve(self.listener, app, limits, shutdown).await;
        stop.cancel();
        if let Some(metrics_server) = metrics_server {
            let _ = metrics_server.await;
        }
        stop_sweep.cancel();
        amqp.close().await;
        db.close().await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
