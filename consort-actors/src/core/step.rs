//! Steps: the unit of work the conductor assigns to one role.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::core::artifact::ArtifactKind;
use crate::core::role::Role;

/// One step of the lifecycle that an agent performs.
///
/// Each step has a stable text key (its [`Display`](fmt::Display) form) used by scripted agents
/// and the ledger: `stories`, `spec/r0`, `architecture/r0`, `schema`, `test-list`, `ux`,
/// `red/T1`, `green/T1`, `repair/T1/1`, `refactor/T1/0`, `review/T1/0`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "step", rename_all = "kebab-case")]
pub enum Step {
    /// Product Owner: stories and acceptance criteria.
    Stories,
    /// Spec Author: the spec; `revision` counts architect revisions so far.
    Spec {
        /// 0 for the first spec, n after the n-th revise verdict.
        revision: u32,
    },
    /// Architect Reviewer: verdict on spec revision `revision`.
    Architecture {
        /// The spec revision under review.
        revision: u32,
    },
    /// DBA: schema and migration plan.
    Schema,
    /// Test Strategist: ordered test list.
    TestList,
    /// UX Designer: interface design.
    Ux,
    /// Navigator: the failing test for a test-list entry.
    Red {
        /// The test-list entry id.
        test: String,
    },
    /// Driver: code that makes the test pass.
    Green {
        /// The test-list entry id.
        test: String,
    },
    /// Driver: a repair after a failed GREEN.
    Repair {
        /// The test-list entry id.
        test: String,
        /// 1-based repair round.
        round: u32,
    },
    /// Driver: restructure while staying green.
    Refactor {
        /// The test-list entry id.
        test: String,
        /// 0 for the first refactor, n after the n-th review request.
        round: u32,
    },
    /// Navigator: review of the Driver's code.
    Review {
        /// The test-list entry id.
        test: String,
        /// 0 for the first review, n after n refactor requests.
        round: u32,
    },
}

impl Step {
    /// The role that performs this step.
    pub fn role(&self) -> Role {
        self.row().0
    }

    /// The one artifact kind this step must produce.
    pub fn output_kind(&self) -> ArtifactKind {
        self.row().1
    }

    /// The step's row of the lifecycle table: who performs it and what it must produce.
    fn row(&self) -> (Role, ArtifactKind) {
        use ArtifactKind as Kind;
        match self {
            Step::Stories => (Role::ProductOwner, Kind::Stories),
            Step::Spec { .. } => (Role::SpecAuthor, Kind::Spec),
            Step::Architecture { .. } => (Role::ArchitectReviewer, Kind::ArchitectureVerdict),
            Step::Schema => (Role::Dba, Kind::SchemaPlan),
            Step::TestList => (Role::TestStrategist, Kind::TestList),
            Step::Ux => (Role::UxDesigner, Kind::UxDesign),
            Step::Red { .. } => (Role::Navigator, Kind::ChangeSet),
            Step::Green { .. } | Step::Repair { .. } | Step::Refactor { .. } => {
                (Role::Driver, Kind::ChangeSet)
            }
            Step::Review { .. } => (Role::Navigator, Kind::ReviewVerdict),
        }
    }

    /// Whether this is a build-lane step (answered per test-list entry) rather than a design
    /// step (answered once per run, before the design gate). The match is exhaustive on
    /// purpose: a new kind of step must be placed in a lane here, which keeps
    /// [`Step::design_lane`] complete.
    pub fn is_build(&self) -> bool {
        match self {
            Step::Stories
            | Step::Spec { .. }
            | Step::Architecture { .. }
            | Step::Schema
            | Step::TestList
            | Step::Ux => false,
            Step::Red { .. }
            | Step::Green { .. }
            | Step::Repair { .. }
            | Step::Refactor { .. }
            | Step::Review { .. } => true,
        }
    }

    /// The design lane's steps in the order a run asks them (first revision of spec and
    /// architecture). The UX step is asked only when a story is user-facing.
    pub fn design_lane() -> [Step; 6] {
        [
            Step::Stories,
            Step::Spec { revision: 0 },
            Step::Architecture { revision: 0 },
            Step::Schema,
            Step::TestList,
            Step::Ux,
        ]
    }

    /// The build steps a test-list entry `test` is asked on a run without repairs or change
    /// requests: RED, GREEN, the first REFACTOR and the first REVIEW.
    pub fn build_cycle(test: &str) -> [Step; 4] {
        let test = test.to_string();
        [
            Step::Red { test: test.clone() },
            Step::Green { test: test.clone() },
            Step::Refactor {
                test: test.clone(),
                round: 0,
            },
            Step::Review { test, round: 0 },
        ]
    }

    /// The test-list entry a build step works on.
    pub fn test(&self) -> Option<&str> {
        match self {
            Step::Red { test }
            | Step::Green { test }
            | Step::Repair { test, .. }
            | Step::Refactor { test, .. }
            | Step::Review { test, .. } => Some(test),
            _ => None,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Stories => f.write_str("stories"),
            Step::Spec { revision } => write!(f, "spec/r{revision}"),
            Step::Architecture { revision } => write!(f, "architecture/r{revision}"),
            Step::Schema => f.write_str("schema"),
            Step::TestList => f.write_str("test-list"),
            Step::Ux => f.write_str("ux"),
            Step::Red { test } => write!(f, "red/{test}"),
            Step::Green { test } => write!(f, "green/{test}"),
            Step::Repair { test, round } => write!(f, "repair/{test}/{round}"),
            Step::Refactor { test, round } => write!(f, "refactor/{test}/{round}"),
            Step::Review { test, round } => write!(f, "review/{test}/{round}"),
        }
    }
}

/// A step key that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a step key: `{0}` (examples: stories, spec/r0, red/T1, repair/T1/1, review/T2/0)")]
pub struct ParseStepError(pub String);

impl FromStr for Step {
    type Err = ParseStepError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseStepError(s.chars().take(64).collect());
        let parts: Vec<&str> = s.split('/').collect();
        let revision = |p: &str| p.strip_prefix('r').and_then(|n| n.parse::<u32>().ok());
        let test = |p: &str| {
            (!p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .then(|| p.to_string())
        };
        let step = match parts.as_slice() {
            ["stories"] => Step::Stories,
            ["schema"] => Step::Schema,
            ["test-list"] => Step::TestList,
            ["ux"] => Step::Ux,
            ["spec", r] => Step::Spec {
                revision: revision(r).ok_or_else(err)?,
            },
            ["architecture", r] => Step::Architecture {
                revision: revision(r).ok_or_else(err)?,
            },
            ["red", t] => Step::Red {
                test: test(t).ok_or_else(err)?,
            },
            ["green", t] => Step::Green {
                test: test(t).ok_or_else(err)?,
            },
            [kind, t, n] => {
                let test = test(t).ok_or_else(err)?;
                let round = n.parse::<u32>().map_err(|_| err())?;
                match *kind {
                    "repair" => Step::Repair { test, round },
                    "refactor" => Step::Refactor { test, round },
                    "review" => Step::Review { test, round },
                    _ => return Err(err()),
                }
            }
            _ => return Err(err()),
        };
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_keys_round_trip() {
        let later_rounds = [
            Step::Spec { revision: 1 },
            Step::Repair {
                test: "T1".into(),
                round: 2,
            },
            Step::Review {
                test: "T3".into(),
                round: 1,
            },
        ];
        let steps = Step::design_lane()
            .into_iter()
            .chain(Step::build_cycle("T1"))
            .chain(later_rounds);
        for s in steps {
            assert_eq!(s.to_string().parse::<Step>().expect("parses"), s);
        }
        for bad in [
            "",
            "red",
            "red/",
            "spec/1",
            "repair/T1/x",
            "review/T/1/2",
            "red/../x",
        ] {
            assert!(bad.parse::<Step>().is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn steps_belong_to_their_roles() {
        assert_eq!(
            Step::Review {
                test: "T1".into(),
                round: 0
            }
            .role(),
            Role::Navigator
        );
        assert_eq!(
            Step::Repair {
                test: "T1".into(),
                round: 1
            }
            .role(),
            Role::Driver
        );
        assert_eq!(Step::Schema.output_kind(), ArtifactKind::SchemaPlan);
    }
}
