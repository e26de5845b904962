//! What judges a feature's runs besides its frozen design and tests: the sections of the
//! project's configuration that say how tests run and what counts as a test — `[runner]`,
//! `[paths]`, `[migrations]` — each recorded by its hash when the feature starts.
//!
//! **Invariant:** a change to them while the feature is open is a person's decision, recorded in
//! the ledger ([`HarnessChange`]) before any later step runs, and named by every receipt that
//! follows (its request carries the hash in force). The machine takes a change only from the
//! harness in force: a record that does not start from it is refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::hash::ContentHash;

/// The configuration sections that judge the runs, each by its hash.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Harness {
    /// Section name (`runner`, `paths`, `migrations`) → the hash of its settings.
    pub sections: BTreeMap<String, ContentHash>,
}

impl Harness {
    /// The harness as one hash (its sections', in name order).
    pub fn hash(&self) -> ContentHash {
        let text: String = self
            .sections
            .iter()
            .map(|(name, h)| format!("{name}={h}\n"))
            .collect();
        ContentHash::of_bytes(text.as_bytes())
    }

    /// The sections that differ between `self` and `before` (added, removed or changed).
    pub fn changed_from(&self, before: &Harness) -> Vec<String> {
        let mut names: Vec<String> = self
            .sections
            .keys()
            .chain(before.sections.keys())
            .filter(|n| self.sections.get(*n) != before.sections.get(*n))
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// A person's change to the harness while the feature was open, as recorded when the run
/// resumed under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HarnessChange {
    /// Who resumed the run under the changed harness.
    pub by: String,
    /// The harness in force before.
    pub from: Harness,
    /// The harness from now on.
    pub to: Harness,
}

impl HarnessChange {
    /// What changed and how, for people: `[runner] 3f2a… → 9c1d…`.
    pub fn summary(&self) -> String {
        self.to
            .changed_from(&self.from)
            .iter()
            .map(|name| {
                let short = |h: Option<&ContentHash>| h.map_or("none".to_string(), |h| h.short());
                format!(
                    "[{name}] {} → {}",
                    short(self.from.sections.get(name)),
                    short(self.to.sections.get(name))
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn harness(pairs: &[(&str, &[u8])]) -> Harness {
        Harness {
            sections: pairs
                .iter()
                .map(|(n, b)| (n.to_string(), ContentHash::of_bytes(b)))
                .collect(),
        }
    }

    #[test]
    fn what_changed_is_named_section_by_section() {
        let before = harness(&[("runner", b"pytest"), ("paths", b"tests/**")]);
        let after = harness(&[("runner", b"pytest --deselect x"), ("paths", b"tests/**")]);
        assert_eq!(after.changed_from(&before), ["runner"]);
        assert_ne!(after.hash(), before.hash());
        assert_eq!(before.changed_from(&before), Vec::<String>::new());
        let change = HarnessChange {
            by: "ada".into(),
            from: before,
            to: after,
        };
        assert!(
            change.summary().starts_with("[runner] "),
            "{}",
            change.summary()
        );
    }
}
