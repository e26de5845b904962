//! The frozen design as text a person reads at a gate: what each story asks, what the spec
//! requires, the migrations and the tests, in the order a reviewer takes them in.

use std::fmt::Write;

use consort_actors::{ArchitectureVerdict, DesignBundle};

/// The design bundle as plain text (no markup), for the terminal's approval prompt and for
/// MCP clients. Every field of the bundle that a human approves is in it.
pub fn design_text(bundle: &DesignBundle) -> String {
    let mut out = String::new();
    let f = &bundle.feature;
    line(&mut out, format!("Feature {}: {}", f.id, f.title));
    stories(&mut out, bundle);
    spec(&mut out, bundle);
    architecture(&mut out, &bundle.architecture);
    migrations(&mut out, bundle);
    tests(&mut out, bundle);
    if let Some(ux) = &bundle.ux {
        heading(&mut out, "Screens");
        for s in &ux.screens {
            line(
                &mut out,
                format!("  {} ({}): {}", s.name, s.story_id, s.elements.join(", ")),
            );
        }
        for n in &ux.notes {
            line(&mut out, format!("  note: {n}"));
        }
    }
    out
}

fn heading(out: &mut String, title: &str) {
    line(out, format!("\n{title}"));
}

fn line(out: &mut String, text: String) {
    let _ = writeln!(out, "{text}");
}

fn stories(out: &mut String, bundle: &DesignBundle) {
    heading(out, "Stories");
    for s in &bundle.stories.stories {
        let facing = if s.user_facing { " (user-facing)" } else { "" };
        line(out, format!("  {} {}{facing}", s.id, s.title));
        line(
            out,
            format!(
                "    as {}, I want {}, so that {}",
                s.as_a, s.i_want, s.so_that
            ),
        );
        for ac in &s.acceptance_criteria {
            line(
                out,
                format!(
                    "    {}: given {}, when {}, then {}",
                    ac.id, ac.given, ac.when, ac.then
                ),
            );
        }
    }
}

fn spec(out: &mut String, bundle: &DesignBundle) {
    let spec = &bundle.spec;
    heading(out, "Spec");
    line(out, format!("  {}", spec.summary));
    for r in &spec.requirements {
        line(out, format!("  {} ({}): {}", r.id, r.ac_id, r.statement));
    }
    for o in &spec.out_of_scope {
        line(out, format!("  out of scope: {o}"));
    }
    for q in &spec.open_questions {
        line(out, format!("  open question: {q}"));
    }
}

fn architecture(out: &mut String, verdict: &ArchitectureVerdict) {
    heading(out, "Architecture");
    match verdict {
        ArchitectureVerdict::Approve {
            layers,
            nfrs,
            invariants,
        } => {
            line(out, "  approved".into());
            if !layers.is_empty() {
                line(out, format!("  layers: {}", layers.join(", ")));
            }
            for n in nfrs {
                line(out, format!("  requirement: {n}"));
            }
            for i in invariants {
                line(out, format!("  {} ({}): {}", i.id, i.kind, i.brief));
            }
        }
        ArchitectureVerdict::Revise { reasons } => {
            line(out, format!("  revise: {}", reasons.join("; ")));
        }
    }
}

fn migrations(out: &mut String, bundle: &DesignBundle) {
    heading(out, "Migrations");
    if bundle.schema.migrations.is_empty() {
        let why = consort_actors::unrealised_invariants(&bundle.architecture, &bundle.schema);
        line(
            out,
            format!("  none{}", why.map_or(String::new(), |w| format!(" — {w}"))),
        );
    }
    for m in &bundle.schema.migrations {
        line(
            out,
            format!("  {} ({}): {}", m.version, m.story_id, m.description),
        );
        for sql in m.sql.lines() {
            line(out, format!("      {sql}"));
        }
    }
}

fn tests(out: &mut String, bundle: &DesignBundle) {
    heading(out, "Tests, in build order");
    for t in &bundle.test_list.entries {
        line(
            out,
            format!("  {} ({}) {}: {}", t.id, t.ac_id, t.path, t.description),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_a_human_approves_is_in_the_text() {
        let text = include_str!("../tests/fixtures/design_bundle.json");
        let bundle: DesignBundle = match serde_json::from_str(text) {
            Ok(b) => b,
            Err(e) => panic!("fixture: {e}"),
        };
        let said = design_text(&bundle);
        for s in &bundle.stories.stories {
            assert!(said.contains(&s.title), "{said}");
            for ac in &s.acceptance_criteria {
                assert!(said.contains(&ac.id), "{said}");
            }
        }
        for m in &bundle.schema.migrations {
            assert!(said.contains(&m.version), "{said}");
        }
        for t in &bundle.test_list.entries {
            assert!(said.contains(&t.path), "{said}");
        }
        assert!(!said.contains('{'), "no JSON in the text: {said}");
    }

    #[test]
    fn a_design_with_invariants_and_no_migration_says_so() {
        let text = include_str!("../tests/fixtures/design_bundle.json");
        let mut bundle: DesignBundle = match serde_json::from_str(text) {
            Ok(b) => b,
            Err(e) => panic!("fixture: {e}"),
        };
        assert!(!design_text(&bundle).contains("no migration"));
        bundle.schema.migrations.clear();
        let said = design_text(&bundle);
        let ids = bundle.architecture.invariants();
        assert!(!ids.is_empty(), "the fixture names invariants");
        assert!(
            said.contains("none — no migration, though the architecture names"),
            "{said}"
        );
        for i in ids {
            assert!(said.contains(&i.id), "{said}");
        }
    }
}
