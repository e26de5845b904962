//! The baseline: the project's whole suite, run before the design gate, before any agent of the
//! build lane acts. What fails there halts the run for a person (no agent is charged) and is
//! shown at the gate; a quarantined test's failures judge nothing.

use super::*;

const FLAKY: &str = "tests/test_needs_a_superuser.py::test_it";
const OWN: &str = "tests/test_own.py";

fn quarantine(test: &str) -> Event {
    Event::Quarantined {
        quarantine: Quarantine {
            test: test.into(),
            by: "ada".into(),
            reason: "needs a superuser".into(),
        },
    }
}

/// A run whose test list was just accepted: the baseline is pending, before the design gate.
fn at_baseline() -> (Run, RequestId) {
    at_baseline_after(Inherited::default())
}

/// [`at_baseline`] in a feature whose start inherits `inherited`.
fn at_baseline_after(inherited: Inherited) -> (Run, RequestId) {
    let mut r = Run::new();
    r.inherited = inherited;
    // The project has a test of its own: there is a suite to run before the feature.
    r.disk.apply(&ChangeSet {
        summary: String::new(),
        changes: vec![write(OWN, "def test_ok(): pass")],
    });
    r.design_to_test_list(false);
    r.observe();
    let Pending::Baseline { request, .. } = r.pending() else {
        panic!(
            "the baseline comes before the design gate, got {:?}",
            r.pending()
        )
    };
    (r, request)
}

/// A run whose baseline found the project's suite green, at T1's GREEN (its RED accepted).
fn at_green_after_a_clean_baseline() -> Run {
    let (mut r, request) = at_baseline();
    r.ok(Event::VerifyCompleted {
        receipt: baseline_receipt(&r, request, &[]),
    });
    through_the_gate(&mut r);
    r.red("tests/t1.sql", &[]);
    r
}

/// Approves the design gate the baseline led to; the first RED is observed, then assigned.
fn through_the_gate(r: &mut Run) {
    assert!(r.s.pending_gate().is_some(), "{:?}", r.pending());
    r.approve();
    r.observe();
}

fn baseline_receipt(r: &Run, request: RequestId, failing: &[&str]) -> TestRunReceipt {
    let outcomes: Vec<(&str, TestStatus)> = failing
        .iter()
        .map(|t| (*t, TestStatus::Failed))
        .chain([(OWN, TestStatus::Passed)])
        .collect();
    receipt_with(
        request,
        r.workspace_hash(),
        &outcomes,
        i32::from(!failing.is_empty()),
        "out",
    )
}

#[test]
fn the_baseline_runs_before_any_agent_and_a_test_failing_there_halts_for_a_person() {
    let (mut r, request) = at_baseline();
    let commands = r.ok(Event::VerifyCompleted {
        receipt: baseline_receipt(&r, request, &[FLAKY]),
    });
    assert!(
        matches!(commands.first(), Some(Command::Escalate { .. })),
        "{commands:?}"
    );
    assert_eq!(r.halted_reason(), EscalationReason::FailingBeforeTheFeature);
    let RunStatus::Halted { escalation, .. } = &r.s.status else {
        panic!("halted")
    };
    assert!(escalation.detail.contains(FLAKY), "{}", escalation.detail);
    assert!(
        escalation.detail.contains("consort test quarantine"),
        "{}",
        escalation.detail
    );
    assert_eq!(
        r.s.baseline.as_ref().map(|b| b.failing.clone()),
        Some(vec![FLAKY.to_string()])
    );
    // No agent was asked anything in the build lane, so none is charged.
    assert_eq!(r.s.build.repairs, 0);
    assert!(r.s.receipts.is_empty());

    // Quarantined by a person, a retry runs the baseline again; the test still fails there,
    // but it judges nothing, and the first RED follows.
    r.ok(quarantine(FLAKY));
    assert_eq!(
        r.refused(quarantine(FLAKY)),
        RuleViolation::AlreadyQuarantined { test: FLAKY.into() }
    );
    r.ok(human(HumanDecision::Retry));
    let Pending::Baseline { request: again, .. } = r.pending() else {
        panic!("a retry runs the baseline again, got {:?}", r.pending())
    };
    assert_ne!(again, request, "a fresh request");
    r.ok(Event::VerifyCompleted {
        receipt: baseline_receipt(&r, again, &[FLAKY]),
    });
    // The design gate waits, with the baseline's finding to show.
    assert_eq!(r.s.pending_gate().map(|(g, _)| g), Some(GateKind::Design));
    assert_eq!(
        r.s.baseline.as_ref().map(|b| b.failing.clone()),
        Some(vec![FLAKY.to_string()])
    );
    through_the_gate(&mut r);
    assert!(matches!(
        r.assignment().1,
        Step::Red { ref test } if test == "T1"
    ));
}

#[test]
fn a_quarantined_test_failing_judges_no_red_and_no_green() {
    let (mut r, request) = at_baseline();
    r.ok(quarantine(FLAKY));
    r.ok(Event::VerifyCompleted {
        receipt: baseline_receipt(&r, request, &[FLAKY]),
    });
    through_the_gate(&mut r);
    // RED: the new test fails, and so does the quarantined one: a RED all the same.
    with_flaky_failing(
        &mut r,
        ("tests/t1.sql", "assert false;"),
        TestStatus::Failed,
        "the quarantined failure is no broken test",
    );
    // GREEN: every test passes but the quarantined one, and the run's exit says it failed.
    green_with_flaky_failing(&mut r);
    assert!(
        matches!(r.assignment().1, Step::Refactor { .. }),
        "{:?}",
        r.pending()
    );
    // What people are shown judges the receipts the same way: the GREEN's passed, the RED's
    // did not, though both runs' exits failed.
    let [.., red, green] = r.s.receipts.as_slice() else {
        panic!("a RED's and a GREEN's receipt")
    };
    assert!(!red.exit.success() && !green.exit.success());
    assert!(r.s.passed(green) && !r.s.passed(red));
    let mut unquarantined = r.s.clone();
    unquarantined.quarantined.clear();
    assert!(!unquarantined.passed(green));
}

/// T1's GREEN, its run passing T1 and failing [`FLAKY`]; the next step is observed.
fn green_with_flaky_failing(r: &mut Run) {
    with_flaky_failing(r, ("src/code.sql", "-- 1"), TestStatus::Passed, "verified");
}

/// Writes `(path, content)` for the pending step and applies it; its run ends with T1 as
/// `t1` and [`FLAKY`] failing, which the machine accepts (`why`); the next step is observed.
fn with_flaky_failing(r: &mut Run, (path, content): (&str, &str), t1: TestStatus, why: &str) {
    r.write_and_apply(path, content);
    r.verify(&[("tests/t1.sql", t1), (FLAKY, TestStatus::Failed)])
        .expect(why);
    r.observe();
}

#[test]
fn a_test_not_quarantined_still_judges_a_green() {
    let mut r = at_green_after_a_clean_baseline();
    green_with_flaky_failing(&mut r);
    assert!(
        matches!(r.assignment().1, Step::Repair { .. }),
        "a failure of a test no person quarantined is the Driver's to repair: {:?}",
        r.pending()
    );
}

#[test]
fn a_project_without_a_test_has_no_baseline_to_run() {
    let mut r = Run::new();
    r.design_to_test_list(false);
    r.observe();
    assert!(r.s.pending_gate().is_some(), "the gate, no baseline");
    through_the_gate(&mut r);
    assert!(matches!(r.assignment().1, Step::Red { .. }));
    assert!(r.s.baseline.is_none());
}

#[test]
fn a_receipt_for_another_request_is_no_baseline() {
    let (mut r, request) = at_baseline();
    let receipt = baseline_receipt(&r, RequestId(request.0 + 7), &[]);
    assert!(matches!(
        r.refused(Event::VerifyCompleted { receipt }),
        RuleViolation::ReceiptNotForRequest { .. }
    ));
}

/// A quarantine outlives its feature: the next feature starts with it (what `inherit` carries
/// forward), so the same test failing in its baseline judges nothing and no person is asked
/// again; quarantining it once more is refused as already done.
#[test]
fn a_quarantine_made_in_an_earlier_feature_holds_in_the_next() {
    let (mut r, request) = at_baseline_after(Inherited {
        quarantined: vec![Quarantine {
            test: FLAKY.into(),
            by: "ada".into(),
            reason: "needs a superuser".into(),
        }],
        ..Inherited::default()
    });
    assert!(r.s.is_quarantined(FLAKY));
    assert_eq!(r.s.quarantined_names(), vec![FLAKY.to_string()]);
    r.ok(Event::VerifyCompleted {
        receipt: baseline_receipt(&r, request, &[FLAKY]),
    });
    through_the_gate(&mut r);
    assert!(matches!(r.assignment().1, Step::Red { .. }), "not halted");
    assert_eq!(
        r.refused(quarantine(FLAKY)),
        RuleViolation::AlreadyQuarantined { test: FLAKY.into() }
    );
}

/// A person's change to the harness (`[runner]` from `from` to `to`).
fn harness_change(from: &str, to: &str) -> Event {
    let harness = |h: &str| Harness {
        sections: [("runner".to_string(), ContentHash::of_bytes(h.as_bytes()))].into(),
    };
    Event::HarnessChanged {
        change: HarnessChange {
            by: "ada".into(),
            from: harness(from),
            to: harness(to),
        },
    }
}

/// After a harness change mid-feature the baseline runs again before the run goes on: the
/// feature's own tests (T1, a RED waiting for its GREEN) are the lane's to judge, a project
/// test that fails under the new harness halts for a person, and once it is quarantined the
/// run goes on with what was pending when the harness changed.
#[test]
fn a_harness_change_runs_the_baseline_again_before_the_run_goes_on() {
    let mut r = at_green_after_a_clean_baseline();
    let green = r.pending();
    assert!(matches!(r.assignment().1, Step::Green { .. }));

    r.ok(harness_change("a", "b"));
    let Pending::Baseline {
        request,
        then: Some(then),
    } = r.pending()
    else {
        panic!("the baseline again, got {:?}", r.pending())
    };
    assert_eq!(*then, green, "then what was pending");
    let outcomes = [
        ("tests/t1.sql", TestStatus::Failed),
        (FLAKY, TestStatus::Failed),
        (OWN, TestStatus::Passed),
    ];
    let receipt = |r: &Run, request| receipt_with(request, r.workspace_hash(), &outcomes, 1, "o");
    r.ok(Event::VerifyCompleted {
        receipt: receipt(&r, request),
    });
    assert_eq!(r.halted_reason(), EscalationReason::FailingBeforeTheFeature);
    assert_eq!(
        r.s.baseline.as_ref().map(|b| b.failing.clone()),
        Some(vec![FLAKY.to_string()]),
        "T1 is the feature's own"
    );
    let RunStatus::Halted { escalation, .. } = &r.s.status else {
        panic!("halted")
    };
    assert!(
        escalation.detail.contains("a person changed the harness"),
        "{}",
        escalation.detail
    );
    // Another change while halted there still runs the baseline once, then the GREEN.
    r.ok(harness_change("b", "c"));
    r.ok(quarantine(FLAKY));
    r.ok(human(HumanDecision::Retry));
    let Pending::Baseline {
        request: again,
        then: Some(_),
    } = r.pending()
    else {
        panic!("a retry runs the baseline again, got {:?}", r.pending())
    };
    r.ok(Event::VerifyCompleted {
        receipt: receipt(&r, again),
    });
    assert!(
        matches!(r.assignment(), (_, Step::Green { .. }, 0)),
        "{:?}",
        r.pending()
    );
}

/// Once the promotion is approved it may be under way, and no run is judged in it any more: a
/// harness change then is recorded but asks for no baseline, which could halt the promotion
/// between its merge and its migrations. At the promote gate, before the approval, it still
/// does.
#[test]
fn a_harness_change_in_an_approved_promotion_asks_for_no_baseline() {
    let mut r = Run::new();
    r.disk.apply(&ChangeSet {
        summary: String::new(),
        changes: vec![write(OWN, "def test_ok(): pass")],
    });
    r.reach_deploy_run();
    r.deploy_run(TestStatus::Passed).expect("deploy");
    assert!(
        r.s.baseline.is_some(),
        "a baseline ran before the design gate"
    );
    let at_gate = r.m.step(&r.s, &harness_change("a", "b")).expect("taken").0;
    assert!(
        matches!(at_gate.pending, Some(Pending::Baseline { .. })),
        "at the gate, the baseline again: {:?}",
        at_gate.pending
    );
    r.approve();
    r.observe();
    let Pending::Promote { request } = r.pending() else {
        panic!("the promotion is pending, got {:?}", r.pending())
    };
    r.ok(harness_change("a", "b"));
    assert_eq!(r.pending(), Pending::Promote { request });
    assert_eq!(r.s.harness_changes.len(), 1);
    r.ok(promoted(request, &["0001", "0002"]));
    assert_eq!(r.s.phase(), Phase::Done);
}

/// Where no baseline ran (a project with no test yet, at its design gate), a harness change
/// asks for none: nothing pending changes.
#[test]
fn a_harness_change_where_no_baseline_ran_asks_for_none() {
    let mut r = Run::new();
    r.design_lane(false);
    let before = r.pending();
    r.ok(harness_change("a", "b"));
    assert_eq!(r.pending(), before);
}
