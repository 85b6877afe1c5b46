//! The machinery behind [`REGISTRY`]: what a strategy is built from
//! ([`Deps`]), the strategies of one process ([`Strategies`]), and the
//! knowledge of which strategy names exist — parsing a [`StrategyName`], the
//! list of every name, the servers a strategy needs.
//!
//! Nothing here names a strategy: adding one is a module and its line in
//! [`REGISTRY`], and everything below follows from that list.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use serde::{Deserialize, Deserializer};
use sqlx::PgPool;

use super::StrategySettings;
use super::{Backend, REFERENCE, REGISTRY, Registration, Strategy, StrategyName, StrategyRoutes};
use crate::backends::{AmqpHandle, BackendSettings, RedisHandle};
use crate::sale::SaleCatalog;

/// A strategy name that no registered strategy has. Its message lists the
/// registered ones (the `422` of `POST /admin/sales` shows it as `detail`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown strategy `{0}`; expected one of: {known}", known = known_names())]
pub struct UnknownStrategy(pub String);

/// `naive, sql, …`: every registered name, in registry order.
fn known_names() -> String {
    StrategyName::ALL.iter().map(|name| name.as_str()).collect::<Vec<_>>().join(", ")
}

impl FromStr for StrategyName {
    type Err = UnknownStrategy;

    /// Accepts exactly the registered wire names (case-sensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategyName::ALL
            .iter()
            .copied()
            .find(|name| name.as_str() == s)
            .ok_or_else(|| UnknownStrategy(s.to_owned()))
    }
}

impl TryFrom<String> for StrategyName {
    type Error = UnknownStrategy;

    /// As [`FromStr`]; how `sales.strategy` is decoded.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl<'de> Deserialize<'de> for StrategyName {
    /// From a JSON string holding a registered name.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for StrategyName {
    /// A string, one of the registered names (in registry order).
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let about: Vec<String> =
            REGISTRY.iter().map(|r| format!("`{}`: {}", r.name, r.about)).collect();
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(StrategyName::ALL.iter().map(|name| name.as_str())))
            .description(Some(format!("A registered strategy:\n\n- {}", about.join("\n- "))))
            .into()
    }
}

impl utoipa::ToSchema for StrategyName {}

/// The names of [`REGISTRY`], computed once at compile time.
const NAMES: [StrategyName; REGISTRY.len()] = {
    // Evaluated with every build: the checks above are part of the names.
    let () = NAMES_ARE_UNIQUE;
    let () = REFERENCE_IS_REGISTERED;
    let mut names = [StrategyName::declare(""); REGISTRY.len()];
    let mut i = 0;
    while i < REGISTRY.len() {
        names[i] = REGISTRY[i].name;
        i += 1;
    }
    names
};

/// Whether two names are the same, at compile time.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Every registration has a name of its own: two registrations with one name
/// (or one left at the empty name of `Registration::DEFAULTS`) fail to
/// compile here.
const NAMES_ARE_UNIQUE: () = {
    let mut i = 0;
    while i < REGISTRY.len() {
        let name = REGISTRY[i].name.as_str();
        assert!(!name.is_empty(), "a registration has an empty name");
        let mut j = i + 1;
        while j < REGISTRY.len() {
            assert!(
                !same(name, REGISTRY[j].name.as_str()),
                "two registrations in REGISTRY share one name"
            );
            j += 1;
        }
        i += 1;
    }
};

/// The reference strategy is registered, and has the transaction that the
/// `sql_tps` ceiling issues.
const REFERENCE_IS_REGISTERED: () = {
    let mut i = 0;
    let mut found = false;
    while i < REGISTRY.len() {
        if same(REGISTRY[i].name.as_str(), REFERENCE.as_str()) {
            assert!(REGISTRY[i].transaction.is_some(), "the reference strategy has no transaction");
            found = true;
        }
        i += 1;
    }
    assert!(found, "the reference strategy is not in REGISTRY");
};

impl StrategyName {
    /// Every registered strategy, in the order of [`REGISTRY`] (the order the
    /// comparison reports them in).
    pub const ALL: &'static [StrategyName] = &NAMES;

    /// The backing servers this strategy needs (its registration's `needs`).
    pub fn needs(self) -> &'static [Backend] {
        registration(self).needs
    }
}

/// The registration of `name`.
///
/// Panics when `name` was declared by a module but never registered — a
/// programming error; parsed names are always registered.
pub fn registration(name: StrategyName) -> &'static Registration {
    REGISTRY
        .iter()
        .find(|registration| registration.name == name)
        .unwrap_or_else(|| panic!("strategy `{name}` is declared but not in the registry"))
}

/// Connections and settings the strategies are built from.
#[derive(Clone)]
pub struct Deps {
    /// The service's Postgres pool (`SECKILL_DB_POOL_SIZE` connections).
    pub db: PgPool,
    /// The process's Redis handle, connected on first use.
    pub redis: RedisHandle,
    /// The process's RabbitMQ handle, connected on first use.
    pub amqp: AmqpHandle,
    /// The strategies' settings; a strategy reads its own section.
    pub settings: Arc<StrategySettings>,
    /// Where the backing servers are, for a strategy that opens connections
    /// of its own (`queue`'s second pool), and their namespaces.
    pub backends: Arc<BackendSettings>,
    /// This instance's name (`SECKILL_INSTANCE`), the `instance` label of
    /// per-instance metrics; `unnamed` unless [`Deps::for_instance`] says.
    pub instance: String,
    /// The process's sale catalogue (routes of a strategy answer `404` for an
    /// unknown sale from it).
    pub catalog: SaleCatalog,
    /// The configured failpoints ([`Deps::with_failpoints`]); none unless
    /// set.
    #[cfg(feature = "failpoints")]
    pub failpoints: crate::failpoints::Failpoints,
    /// Parts several strategies of this process share, by type.
    shared: Arc<Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>>,
}

impl Deps {
    /// Dependencies with no shared part made yet: the connections, the
    /// strategies' `settings` and the `backends` they were made from
    /// (`crate::config::Config::deps` makes them from the configuration).
    pub fn new(
        db: PgPool,
        redis: RedisHandle,
        amqp: AmqpHandle,
        catalog: SaleCatalog,
        settings: StrategySettings,
        backends: BackendSettings,
    ) -> Self {
        Self {
            db,
            redis,
            amqp,
            settings: Arc::new(settings),
            backends: Arc::new(backends),
            instance: "unnamed".to_owned(),
            catalog,
            #[cfg(feature = "failpoints")]
            failpoints: Default::default(),
            shared: Default::default(),
        }
    }

    /// These dependencies for the instance named `instance`.
    pub fn for_instance(self, instance: &str) -> Self {
        Self { instance: instance.to_owned(), ..self }
    }

    /// These dependencies with `failpoints` configured (the service's
    /// `SECKILL_FAILPOINTS`, parsed once at start).
    #[cfg(feature = "failpoints")]
    pub fn with_failpoints(mut self, failpoints: crate::failpoints::Failpoints) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// The one `T` that the strategies built from these dependencies share
    /// (e.g. the `lock/*` variants' sold-out flags and critical-section
    /// recorder): made by `init` for the first strategy that asks, the same
    /// `Arc` for every later one. `init` must not ask for another part.
    pub fn shared<T: Send + Sync + 'static>(&self, init: impl FnOnce() -> Arc<T>) -> Arc<T> {
        let mut shared = self.shared.lock().expect("shared strategy parts");
        let part = shared
            .entry(TypeId::of::<T>())
            .or_insert_with(|| init() as Arc<dyn Any + Send + Sync>)
            .clone();
        part.downcast::<T>().expect("entries are keyed by their own type")
    }
}

/// The strategies of one process, built once at start-up from [`REGISTRY`].
/// Cheap to clone.
#[derive(Clone)]
pub struct Strategies {
    built: Arc<HashMap<StrategyName, Arc<dyn Strategy>>>,
    routes: Arc<Vec<StrategyRoutes>>,
}

impl Strategies {
    /// Builds every registered strategy, then collects their routes (those
    /// of one key once).
    ///
    /// Errors: a strategy that cannot be built from its settings (e.g. a
    /// malformed `SECKILL_LOCK_REDLOCK_URLS`), named in the message.
    pub fn new(deps: &Deps) -> anyhow::Result<Self> {
        // The strategies list their series at /metrics when built, which
        // only sticks once the process's recorder exists.
        crate::telemetry::metrics_handle();
        let mut built = HashMap::with_capacity(REGISTRY.len());
        let mut routes: Vec<StrategyRoutes> = Vec::new();
        for registration in REGISTRY {
            let strategy = (registration.build)(deps)
                .with_context(|| format!("building the `{}` strategy", registration.name))?;
            super::serial::register(registration.name);
            if let Some(own) = strategy.clone().routes(deps)
                && !routes.iter().any(|known| known.key == own.key)
            {
                routes.push(own);
            }
            built.insert(registration.name, strategy);
        }
        Ok(Self { built: Arc::new(built), routes: Arc::new(routes) })
    }

    /// Starts the background work of every strategy that has some (see
    /// [`Strategy::start_background`]). Call once, from inside the Tokio
    /// runtime.
    pub fn start_background(&self) {
        for name in StrategyName::ALL {
            self.built[name].clone().start_background();
        }
    }

    /// The strategy that serves sales named `name`.
    pub fn get(&self, name: StrategyName) -> &dyn Strategy {
        self.built[&name].as_ref()
    }

    /// The routes the strategies serve besides the purchase, one entry per
    /// key; the HTTP layer mounts them.
    pub fn routes(&self) -> &[StrategyRoutes] {
        &self.routes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_registered_name_parses_back_to_itself() {
        for entry in REGISTRY {
            let name = entry.name;
            assert_eq!(name.as_str().parse::<StrategyName>().unwrap(), name);
            assert_eq!(StrategyName::try_from(name.as_str().to_owned()).unwrap(), name);
            let json = serde_json::to_string(&name).unwrap();
            assert_eq!(serde_json::from_str::<StrategyName>(&json).unwrap(), name);
            assert_eq!(registration(name).name, name);
        }
    }

    #[test]
    fn an_unknown_name_is_rejected_with_the_list_of_known_ones() {
        for unknown in ["optimistic", "SQL", "sql ", "", "lock", "lock/"] {
            let err = unknown.parse::<StrategyName>().unwrap_err();
            assert_eq!(err.0, unknown);
            let message = err.to_string();
            assert!(
                message.starts_with(&format!("unknown strategy `{unknown}`; expected one of: "))
            );
            assert!(message.ends_with(&known_names()), "{message}");
        }
        assert!(serde_json::from_str::<StrategyName>(r#""optimistic""#).is_err());
        assert!(known_names().starts_with("naive, sql, sql/for-update, "), "{}", known_names());
    }

    #[test]
    fn names_are_unique_and_all_lists_them_in_registry_order() {
        let names: Vec<StrategyName> = REGISTRY.iter().map(|r| r.name).collect();
        assert_eq!(StrategyName::ALL, names.as_slice());
        let unique: HashSet<&str> = names.iter().map(|name| name.as_str()).collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        let slugs: HashSet<String> = names.iter().map(|name| name.slug()).collect();
        assert_eq!(slugs.len(), names.len(), "slugs name report files: {slugs:?}");
    }

    #[test]
    fn the_defaults_describe_a_plain_correct_postgres_strategy() {
        let d = Registration::DEFAULTS;
        let anywhere = super::super::Conditions {
            stalls_past_lease: true,
            instances: 4,
            fault: Some(super::super::Fault::KillInstance),
        };
        assert_eq!((d.expect)(&anywhere), super::super::Expectation::Correct);
        assert_eq!(d.settles, super::super::Settles::BeforeTheAnswer);
        assert!(d.ceiling.is_per_unit_transaction());
        assert_eq!(d.kill, super::super::KillTarget::First);
        assert!(!d.takes_a_lock && !d.redlock_nodes && d.transaction.is_none());
        assert!(d.queues.is_none() && d.needs == [Backend::Postgres]);
    }

    #[test]
    fn a_registration_that_kills_a_lock_holder_takes_a_lock_and_the_reference_has_a_transaction() {
        for registration in REGISTRY {
            if let super::super::KillTarget::LockHolder { key } = registration.kill {
                assert!(registration.takes_a_lock && !key.is_empty(), "{}", registration.name);
            }
        }
        assert!(super::registration(REFERENCE).transaction.is_some());
    }

    #[test]
    fn every_registration_is_described_and_names_its_servers() {
        for registration in REGISTRY {
            let name = registration.name.as_str();
            assert!(
                !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_lowercase() || "0123456789/-".contains(c)),
                "wire names are lowercase words, `-` and `/`: {name:?}"
            );
            let about = registration.about;
            assert!(!about.is_empty() && !about.contains('\n'), "{name}: one line: {about:?}");
            assert!(
                registration.needs.contains(&Backend::Postgres),
                "{name}: every sale is in Postgres"
            );
            assert_eq!(registration.name.needs(), registration.needs);
        }
    }
}
