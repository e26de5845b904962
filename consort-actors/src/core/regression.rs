//! What the earlier features of a project leave to a later one: the tests they accepted (the
//! later feature's regression suite) and the migrations they promoted (which it builds on).
//!
//! **Invariant:** a feature learns what it inherits once, in its [`Event::Start`]
//! (`crate::Event::Start`), so that replaying its ledger rebuilds exactly the suite it was held
//! to. Only a human's [`Retirement`], itself a ledger event, takes a test out of that suite;
//! nothing else unfreezes an earlier feature's test.

use serde::{Deserialize, Serialize};

use crate::core::artifact::Migration;

/// One test an earlier feature accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EarlierTest {
    /// The feature that accepted it.
    pub feature: String,
    /// Its id in that feature's test list, such as `T2`.
    pub test: String,
    /// Its file, relative to the work tree.
    pub path: String,
    /// The name the runner reports it under.
    pub runner_name: String,
    /// Its file's content hash when that feature froze it (None in records written without
    /// it): the file must still hold exactly this when the later feature's build lane opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<crate::core::hash::ContentHash>,
}

impl EarlierTest {
    /// `feature/test`, the name a human retires it by.
    pub fn key(&self) -> String {
        format!("{}/{}", self.feature, self.test)
    }
}

/// One migration an earlier feature promoted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EarlierMigration {
    /// The feature that promoted it.
    pub feature: String,
    /// The migration as its design froze it.
    pub migration: Migration,
    /// Its file in the project, when migrations are written as files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Everything a feature inherits from the features done before it, in their order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Inherited {
    /// The earlier features' accepted tests that no later decision retired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tests: Vec<EarlierTest>,
    /// The earlier features' promoted migrations, in the order they were promoted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrations: Vec<EarlierMigration>,
    /// How the project numbers the files in its migrations directory, as they were when the
    /// feature started (None: no numbered file there, or no migrations directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numbering: Option<crate::core::migration_files::MigrationNumbering>,
    /// The tests people quarantined in the earlier features, in order: a test that cannot pass
    /// where Consort runs it cannot pass in the next feature either, so the decision holds for
    /// the project until it is made anew.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<Quarantine>,
    /// The database's tables as they stand when the feature starts, after the project's
    /// migrations (None: not read), which the DBA is shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<crate::core::catalog::SchemaCatalog>,
}

/// A human's recorded decision that an earlier feature's test no longer holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retirement {
    /// The feature whose test is retired.
    pub feature: String,
    /// The test's id in that feature's test list.
    pub test: String,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
}

/// A person's recorded decision that a test which cannot pass where Consort runs it (it failed
/// in the baseline: it needs a superuser, a device, a service the machine lacks) judges nothing
/// from now on: its failures are not counted against a RED, a GREEN or the deploy run, and no
/// agent is charged for them. Named in every later run's request and in `verify`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    /// The test, by the name the runner reports it under.
    pub test: String,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
}

impl Retirement {
    /// Whether this decision retires `test`.
    pub fn retires(&self, test: &EarlierTest) -> bool {
        self.feature == test.feature && self.test == test.test
    }
}

impl Inherited {
    /// Whether nothing is inherited (the first feature of a project whose migrations directory
    /// numbers nothing yet).
    pub fn is_empty(&self) -> bool {
        self.tests.is_empty()
            && self.migrations.is_empty()
            && self.numbering.is_none()
            && self.quarantined.is_empty()
            && self.catalog.is_none()
    }

    /// The inherited tests still in force after `retired`.
    pub fn live<'a>(
        &'a self,
        retired: &'a [Retirement],
    ) -> impl Iterator<Item = &'a EarlierTest> + 'a {
        self.tests
            .iter()
            .filter(|t| !retired.iter().any(|r| r.retires(t)))
    }

    /// The test in force that owns `path`, if any.
    pub fn owner<'a>(&'a self, path: &str, retired: &'a [Retirement]) -> Option<&'a EarlierTest> {
        self.live(retired).find(|t| t.path == path)
    }

    /// Whether `path` belonged to an inherited test that is now retired and to none in force:
    /// a file a later RED may replace.
    pub fn released(&self, path: &str, retired: &[Retirement]) -> bool {
        self.owner(path, retired).is_none()
            && self
                .tests
                .iter()
                .any(|t| t.path == path && retired.iter().any(|r| r.retires(t)))
    }

    /// The inherited test named `feature/test`, whether in force or not.
    pub fn find(&self, feature: &str, test: &str) -> Option<&EarlierTest> {
        self.tests
            .iter()
            .find(|t| t.feature == feature && t.test == test)
    }

    /// The inherited migration with `version`, if any.
    pub fn migration(&self, version: &str) -> Option<&EarlierMigration> {
        self.migrations
            .iter()
            .find(|m| m.migration.version == version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test(feature: &str, id: &str, path: &str) -> EarlierTest {
        EarlierTest {
            feature: feature.into(),
            test: id.into(),
            path: path.into(),
            runner_name: path.into(),
            hash: None,
        }
    }

    fn retire(feature: &str, id: &str) -> Retirement {
        Retirement {
            feature: feature.into(),
            test: id.into(),
            by: "ana".into(),
            reason: "the rule changed".into(),
        }
    }

    #[test]
    fn a_retired_test_releases_its_file_only_when_no_test_in_force_shares_it() {
        let inherited = Inherited {
            tests: vec![
                test("f1", "T1", "tests/a.sql"),
                test("f1", "T2", "tests/shared.sql"),
                test("f2", "T1", "tests/shared.sql"),
            ],
            ..Inherited::default()
        };
        let retired = vec![retire("f1", "T1"), retire("f1", "T2")];
        assert!(inherited.released("tests/a.sql", &retired));
        assert!(!inherited.released("tests/shared.sql", &retired));
        assert_eq!(
            inherited
                .owner("tests/shared.sql", &retired)
                .map(EarlierTest::key),
            Some("f2/T1".to_string())
        );
        assert!(!inherited.released("tests/other.sql", &retired));
        assert_eq!(inherited.live(&retired).count(), 1);
    }
}
