//! The name of a stock-deduction strategy, as it travels: in `POST
//! /admin/sales {"strategy": …}`, in `sales.strategy`, in the `strategy` label
//! of the metrics and in the load test's reports.
//!
//! This module holds only the type, so that the bottom of the service (the
//! sale record, the error vocabulary) can name a strategy without knowing the
//! strategies. Which names exist is the knowledge of the registry
//! (`crate::strategy::REGISTRY`, one line per strategy): parsing a name
//! (`FromStr`, `TryFrom<String>`, `Deserialize`), the list of every name
//! (`StrategyName::ALL`) and the servers a strategy needs
//! (`StrategyName::needs`) are implemented next to it, and this module imports
//! nothing of the service.

use std::fmt;

use serde::{Serialize, Serializer};

/// The wire name of a registered strategy: `naive`, `sql`, `sql/for-update`,
/// `lock/<variant>`, `redis-decr`, `queue`. Names use the field's terms, and a
/// `/` marks a family.
///
/// A value is made either by parsing (which only accepts registered names) or
/// by a strategy module declaring its own name next to its registration, so a
/// `StrategyName` always names a registered strategy. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrategyName(&'static str);

impl StrategyName {
    /// Declares the wire name of a strategy. Called once per strategy, by its
    /// own module, for the `name` of its registration; everything else gets
    /// names by parsing.
    pub(crate) const fn declare(name: &'static str) -> Self {
        Self(name)
    }

    /// The wire name, e.g. `sql/for-update`.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// A file-name-safe form: `sql/for-update` → `sql-for-update`.
    pub fn slug(self) -> String {
        self.0.replace('/', "-")
    }
}

impl fmt::Display for StrategyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for StrategyName {
    /// As the wire name, a JSON string.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl From<StrategyName> for String {
    fn from(name: StrategyName) -> String {
        name.0.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_prints_and_serializes_as_its_wire_name() {
        let name = StrategyName::declare("sql/for-update");
        assert_eq!(name.to_string(), "sql/for-update");
        assert_eq!(serde_json::to_string(&name).unwrap(), r#""sql/for-update""#);
        assert_eq!(String::from(name), "sql/for-update");
    }

    #[test]
    fn the_slug_has_no_slash() {
        assert_eq!(StrategyName::declare("lock/ttl").slug(), "lock-ttl");
        assert_eq!(StrategyName::declare("redis-decr").slug(), "redis-decr");
    }
}
