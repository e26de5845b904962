//! A later feature of a project: the earlier features' tests are its regression suite, frozen
//! for every agent and expected in every run, and only a human's retirement releases one.

use super::*;

const OLD: &str = "tests/old.sql";
const OLD_SQL: &str = "select 'old';";

/// A run whose start inherits test `f0/T9` (in `tests/old.sql`, already on disk) and one
/// migration, at T1's RED.
fn later_feature() -> Run {
    later_feature_scoped(StepScope::Whole)
}

/// [`later_feature`] with each build step's run covering `per_step`.
fn later_feature_scoped(per_step: StepScope) -> Run {
    let mut r = Run::new();
    r.m = Machine::new(MachineConfig {
        per_step,
        ..r.m.config().clone()
    });
    r.inherited = Inherited {
        tests: vec![EarlierTest {
            feature: "f0".into(),
            test: "T9".into(),
            path: OLD.into(),
            runner_name: OLD.into(),
            hash: Some(ContentHash::of_bytes(OLD_SQL.as_bytes())),
        }],
        migrations: vec![],
        numbering: None,
        quarantined: vec![],
        catalog: None,
    };
    r.disk.applied(&ChangeSet {
        summary: "the earlier feature's work".into(),
        changes: vec![write(OLD, OLD_SQL)],
    });
    r.reach_build();
    r
}

fn retirement(feature: &str, test: &str) -> Event {
    Event::Retired {
        retirement: Retirement {
            feature: feature.into(),
            test: test.into(),
            by: "ana".into(),
            reason: "reorder points replace fixed thresholds".into(),
        },
    }
}

/// T1's RED also rewriting the earlier test.
fn red_rewriting_old() -> Artifact {
    cs(vec![
        write("tests/t1.sql", "assert false;"),
        write(OLD, "select 'changed';"),
    ])
}

#[test]
fn a_red_changing_an_earlier_features_test_halts_naming_the_test_and_its_feature() {
    let mut r = later_feature();
    assert!(
        r.s.build.frozen_tests.contains_key(OLD),
        "the earlier test is frozen when the build lane opens"
    );
    let v = r.produce_refused(red_rewriting_old());
    assert_eq!(
        v,
        RuleViolation::EarlierTestFrozen {
            path: OLD.into(),
            feature: "f0".into(),
            test: "T9".into(),
        }
    );
    assert!(v.to_string().contains("consort test retire f0/T9"));
    assert_eq!(r.halted_verdict(), VerdictReason::EarlierTestContradicted);
    // Deleting it is the same change.
    let mut r = later_feature();
    let v = r.produce_refused(cs(vec![
        write("tests/t1.sql", "assert false;"),
        FileChange::Delete { path: OLD.into() },
    ]));
    assert!(matches!(v, RuleViolation::EarlierTestFrozen { .. }));
    // A retry alone does not release it: the same answer halts again.
    r.ok(human(HumanDecision::Retry));
    let v = r.produce_refused(red_rewriting_old());
    assert!(matches!(v, RuleViolation::EarlierTestFrozen { .. }));
}

#[test]
fn a_retirement_releases_the_test_and_a_red_may_then_replace_it() {
    let mut r = later_feature();
    r.produce_refused(red_rewriting_old());
    assert_eq!(
        r.refused(retirement("f0", "T1")),
        RuleViolation::NotAnEarlierTest {
            feature: "f0".into(),
            test: "T1".into()
        }
    );
    r.ok(retirement("f0", "T9"));
    assert_eq!(
        r.s.phase(),
        Phase::Halted,
        "a retirement decides nothing else"
    );
    assert!(!r.s.build.frozen_tests.contains_key(OLD));
    assert!(matches!(
        r.refused(retirement("f0", "T9")),
        RuleViolation::AlreadyRetired { .. }
    ));
    r.ok(human(HumanDecision::Retry));
    r.produce(red_rewriting_old())
        .expect("the retired test's file may be replaced");
    r.apply();
    // The retired test is no longer expected; T1 must fail alone.
    r.verify(&[("tests/t1.sql", TestStatus::Failed)])
        .expect("a RED on its own test");
    assert_eq!(r.s.retired.len(), 1);
    // Replayed from the ledger, the same state.
    assert_eq!(r.m.replay(&r.events), r.s);
}

#[test]
fn every_run_must_keep_the_earlier_tests_passing() {
    let mut r = later_feature();
    r.write_and_apply("tests/t1.sql", "assert false;");
    let v = r.verify_refused(&[
        (OLD, TestStatus::Failed),
        ("tests/t1.sql", TestStatus::Failed),
    ]);
    assert_eq!(
        v,
        RuleViolation::RedBrokeGreenTest {
            tests: vec![OLD.to_string()],
            migrations: vec!["0001".into()],
        }
    );

    let mut r = later_feature();
    r.red("tests/t1.sql", &[OLD]);
    r.write_and_apply("src/code.sql", "-- breaks the old rule");
    r.verify(&[
        (OLD, TestStatus::Failed),
        ("tests/t1.sql", TestStatus::Passed),
    ])
    .expect("a receipt is recorded");
    assert!(
        matches!(r.s.pending, Some(Pending::Observe { .. })),
        "a GREEN that breaks an earlier test is not green: a repair follows"
    );
    assert_eq!(r.s.build.repairs, 1);
    // A run that does not report the earlier test is not green either.
    r.observe();
    r.write_and_apply("src/code.sql", "-- drops the old test");
    r.verify(&[("tests/t1.sql", TestStatus::Passed)])
        .expect("recorded");
    assert_eq!(r.s.build.repairs, 2);
}

#[test]
fn a_later_schema_plan_builds_on_the_earlier_migrations() {
    let mut r = Run::new();
    r.inherited = Inherited {
        tests: vec![],
        migrations: vec![EarlierMigration {
            feature: "f0".into(),
            migration: Migration {
                version: "0001_items".into(),
                story_id: "S1".into(),
                description: "items".into(),
                sql: "create table items (id int);".into(),
            },
            path: None,
        }],
        numbering: None,
        quarantined: vec![],
        catalog: None,
    };
    r.start_with_stories(false);
    r.produce(Artifact::Spec(spec())).expect("spec");
    r.produce(Artifact::ArchitectureVerdict(approve_arch()))
        .expect("arch");
    let v = r.produce_refused(Artifact::SchemaPlan(schema()));
    assert!(
        v.to_string().contains("must come after") && v.to_string().contains("0001_items of f0"),
        "{v}"
    );
}

/// The design's versions follow the project's own numbering, recorded when the feature
/// started: the width of its files' numbers, after the last one; the DBA is told it and a plan
/// that does not follow it is refused (the DBA tries again).
#[test]
fn a_schema_plan_follows_the_projects_migration_numbering() {
    let mut r = Run::new();
    r.inherited = Inherited {
        numbering: Some(MigrationNumbering {
            width: 3,
            last: 1,
            example: "001_products.sql".into(),
        }),
        ..Inherited::default()
    };
    r.start_with_stories(false);
    r.produce(Artifact::Spec(spec())).expect("spec");
    r.produce(Artifact::ArchitectureVerdict(approve_arch()))
        .expect("arch");
    let Command::Assign { .. } = last_command(&r) else {
        panic!("the DBA is asked");
    };
    let told = context::artifacts(&r.s, &Step::Schema).migration_numbering;
    assert_eq!(told.map(|n| n.width), Some(3), "the DBA is told the form");
    let v = r.produce_refused(Artifact::SchemaPlan(schema()));
    assert!(
        v.to_string()
            .contains("its migration files take 3 digits (like 001_products.sql)"),
        "{v}"
    );
    let mut plan = schema();
    for (i, m) in plan.migrations.iter_mut().enumerate() {
        m.version = format!("{:03}_step{i}", i + 2);
    }
    r.produce(Artifact::SchemaPlan(plan))
        .expect("a plan in the project's form");
}

#[test]
fn an_earlier_test_changed_by_hand_before_the_build_lane_halts_and_a_retirement_lets_it_go() {
    let mut r = Run::new();
    r.inherited = later_feature().inherited;
    r.disk.applied(&ChangeSet {
        summary: "edited by hand".into(),
        changes: vec![write(OLD, "select 'weakened';")],
    });
    r.design_lane(false);
    let (gate, hash) = r.gate_hash();
    r.ok(Event::Gate {
        approval: approval(gate, hash),
    });
    let v = r
        .feed(Event::Observed {
            design_hash: r.design_on_disk,
            tests: r.test_hashes(),
            migrations: Default::default(),
        })
        .expect_err("refused");
    assert!(matches!(v, RuleViolation::EarlierTestFrozen { ref path, .. } if path == OLD));
    assert_eq!(r.halted_verdict(), VerdictReason::EarlierTestContradicted);
    r.ok(retirement("f0", "T9"));
    r.ok(human(HumanDecision::Retry));
    r.observe();
    assert!(
        !r.s.build.frozen_tests.contains_key(OLD),
        "a retired test is not frozen"
    );
}

/// The pending run's command, as the conductor would send it.
fn verify_command(r: &Run) -> (Vec<String>, Vec<String>) {
    match r.s.pending_command() {
        Some(Command::Verify { tests, select, .. }) => (tests, select),
        other => panic!("a verify run is pending, not {other:?}"),
    }
}

#[test]
fn per_step_feature_runs_the_feature_s_tests_and_the_whole_suite_at_a_story_s_end() {
    let mut r = later_feature_scoped(StepScope::Feature);
    assert_eq!(
        r.s.per_step,
        StepScope::Feature,
        "taken from the start event"
    );
    assert!(
        r.events.iter().any(|e| matches!(
            e,
            Event::Start {
                per_step: StepScope::Feature,
                ..
            }
        )),
        "recorded in the ledger's start"
    );
    // T1's RED: only the feature's tests are asked for and expected, not the earlier one.
    r.write_and_apply("tests/t1.sql", "assert false;");
    let (tests, select) = verify_command(&r);
    assert_eq!(select, vec!["tests/t1.sql"]);
    assert_eq!(tests, vec!["tests/t1.sql"]);
    let mut receipt = r.receipt(&[("tests/t1.sql", TestStatus::Failed)], 1);
    receipt.selection = vec!["tests/t1.sql".into()];
    r.ok(Event::VerifyCompleted { receipt });
    r.observe();
    // T1 is its story's last entry: its GREEN runs the whole suite, the earlier test too, and
    // a receipt of a selection is refused for it.
    r.write_and_apply("src/code.sql", "-- 1");
    let (tests, select) = verify_command(&r);
    assert!(select.is_empty(), "whole at the story's end: {select:?}");
    assert_eq!(tests, vec![OLD, "tests/t1.sql"]);
    let mut partial = r.receipt(&[("tests/t1.sql", TestStatus::Passed)], 0);
    partial.selection = vec!["tests/t1.sql".into()];
    let request = partial.request_id;
    let v = r.refused(Event::VerifyCompleted { receipt: partial });
    assert_eq!(
        v,
        RuleViolation::ReceiptWithoutRun {
            request,
            missing: "the whole suite".into(),
        }
    );
}

#[test]
fn per_step_whole_asks_every_run_for_the_whole_suite() {
    let mut r = later_feature();
    r.write_and_apply("tests/t1.sql", "assert false;");
    let (tests, select) = verify_command(&r);
    assert!(select.is_empty());
    assert_eq!(tests, vec![OLD, "tests/t1.sql"]);
}
