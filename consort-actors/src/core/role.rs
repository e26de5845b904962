//! The eight roles of the ensemble and the identity of the actor that plays one.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

key_type! {
    /// One lifecycle role. Each is played by exactly one actor at a time.
    #[serde(rename_all = "kebab-case")]
    pub enum Role {
        /// Owns the backlog: stories and their acceptance criteria.
        ProductOwner,
        /// Owns the structured, testable specification.
        SpecAuthor,
        /// Owns the architecture verdict: layering, NFRs, persistence invariants.
        ArchitectReviewer,
        /// Owns the physical schema and the per-story migration plan.
        Dba,
        /// Owns the ordered master test list, every test traced to an acceptance criterion.
        TestStrategist,
        /// Owns the interface design for user-facing stories.
        UxDesigner,
        /// Writes the failing test (RED) and reviews the Driver's code.
        Navigator,
        /// Writes the code that passes the test (GREEN), then refactors.
        Driver,
    }
}

impl Role {
    /// All eight roles, in lifecycle order.
    pub const ALL: [Role; 8] = [
        Role::ProductOwner,
        Role::SpecAuthor,
        Role::ArchitectReviewer,
        Role::Dba,
        Role::TestStrategist,
        Role::UxDesigner,
        Role::Navigator,
        Role::Driver,
    ];

    /// The kebab-case name used in files, configuration and the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::ProductOwner => "product-owner",
            Role::SpecAuthor => "spec-author",
            Role::ArchitectReviewer => "architect-reviewer",
            Role::Dba => "dba",
            Role::TestStrategist => "test-strategist",
            Role::UxDesigner => "ux-designer",
            Role::Navigator => "navigator",
            Role::Driver => "driver",
        }
    }
}

display_as_str!(Role);

/// A role name that is not one of the eight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown role `{0}` (expected one of: product-owner, spec-author, architect-reviewer, dba, test-strategist, ux-designer, navigator, driver)"
)]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRole(s.chars().take(64).collect()))
    }
}

/// The identity of one actor instance: the role it plays and a name unique in the ensemble.
///
/// The conductor records an `ActorId` as the author of every artifact, which is how "the author
/// never reviews its own code" is checked.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct ActorId {
    /// The role the actor plays.
    pub role: Role,
    /// The instance name, e.g. `driver` or `driver-claude`.
    pub name: String,
}

impl ActorId {
    /// An identity for `role` with the given instance name.
    pub fn new(role: Role, name: impl Into<String>) -> Self {
        ActorId {
            role,
            name: name.into(),
        }
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_round_trip() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>().expect("known"), r);
            let json = serde_json::to_string(&r).expect("serialise");
            assert_eq!(json, format!("\"{}\"", r.as_str()));
        }
        assert!("conductor".parse::<Role>().is_err());
    }
}
