//! The configuration that judges the runs: recorded at the start, changed only by a person's
//! recorded decision made from the harness in force, and named by every request after it.

use super::*;
use consort_actors::{Harness, HarnessChange};

fn harness(runner: &str) -> Harness {
    Harness {
        sections: [
            (
                "runner".to_string(),
                ContentHash::of_bytes(runner.as_bytes()),
            ),
            ("paths".to_string(), ContentHash::of_bytes(b"tests/**")),
        ]
        .into_iter()
        .collect(),
    }
}

fn changed(by: &str, from: Harness, to: Harness) -> Event {
    Event::HarnessChanged {
        change: HarnessChange {
            by: by.into(),
            from,
            to,
        },
    }
}

#[test]
fn a_harness_change_is_taken_only_from_the_harness_in_force() {
    let mut r = Run::new();
    let first = harness("pytest -q");
    r.ok(Event::Start {
        feature: feature(),
        inherited: Default::default(),
        per_step: Default::default(),
        harness: Some(first.clone()),
    });
    assert_eq!(r.s.harness.as_ref(), Some(&first));
    let second = harness("pytest -q --deselect tests/test_slow.py");
    // A record made against another harness, one that changes nothing, one by nobody: refused.
    for bad in [
        changed("ada", second.clone(), harness("x")),
        changed("ada", first.clone(), first.clone()),
        changed(" ", first.clone(), second.clone()),
    ] {
        assert!(matches!(
            r.refused(bad),
            RuleViolation::InvalidArtifact { .. }
        ));
    }
    r.ok(changed("ada", first.clone(), second.clone()));
    assert_eq!(r.s.harness.as_ref(), Some(&second));
    assert_eq!(r.s.harness_changes.len(), 1);
    assert_eq!(r.s.harness_changes[0].by, "ada");
    // The same change again no longer starts from the harness in force.
    r.refused(changed("ada", first, second));
}
