//! Tests of the pure machine: every transition, every rule, and a property test.
//!
//! `Run` below is a tiny in-memory stand-in for the conductor: it keeps the test kit's fake disk,
//! applies change sets to it and answers the machine's commands, so that each test reads like
//! the lifecycle it checks. The artifacts come from `consort_testkit::artifacts`, in the shape
//! these tests use: two stories (three acceptance criteria), one requirement, two migrations and
//! a test list of two entries.

use std::collections::BTreeMap;

use proptest::prelude::*;

use consort_actors::*;
// Not at the crate root today: the orchestrator re-exports them there.
use consort_actors::{HumanDecision, Remedy, check_schema, check_spec, check_test_list};
use consort_testkit::artifacts::{
    self as kit, approval, approve_architecture as approve_arch, author as id, feature,
    receipt_with, ux, write,
};
use consort_testkit::disk::FakeDisk;
use consort_testkit::verify::assert_contains;

mod baseline;
mod harness;
mod layers;
mod regression;

/// Story `S1` (user-facing when asked) with two criteria and story `S2` with one.
fn stories(user_facing: bool) -> Stories {
    kit::stories_of(&[(user_facing, 2), (false, 1)])
}

/// One requirement, for `S1-AC1`.
fn spec() -> Spec {
    kit::spec_of(&["S1-AC1".to_string()])
}

/// Two migrations, one per story.
fn schema() -> SchemaPlan {
    kit::schema_of(2)
}

/// An entry `id` for `ac` at `tests/<id>.sql`.
fn entry(id: &str, ac: &str) -> TestEntry {
    kit::entry(id, ac, &format!("tests/{}.sql", id.to_lowercase()))
}

fn test_list() -> TestList {
    TestList {
        entries: vec![entry("T1", "S1-AC1"), entry("T2", "S2-AC1")],
    }
}

fn cs(changes: Vec<FileChange>) -> Artifact {
    kit::change_set("c", changes)
}
struct Run {
    m: Machine,
    s: State,
    disk: FakeDisk,
    events: Vec<Event>,
    commands: Vec<Command>,
    design_on_disk: Option<ContentHash>,
    /// What the run's start says earlier features left (nothing by default).
    inherited: Inherited,
}

impl Run {
    fn new() -> Self {
        Run::with_paths(PathPolicy::new(&["tests/**"], &["run-tests.sh"]).expect("globs"))
    }

    /// A run at T1's RED: the design approved and observed.
    fn at_build() -> Self {
        let mut r = Run::new();
        r.reach_build();
        r
    }

    /// A run at T1's RED with `tests/t1.sql` written as `test` and applied: its verification
    /// is pending.
    fn with_red_applied(test: &str) -> Self {
        let mut r = Run::at_build();
        r.write_and_apply("tests/t1.sql", test);
        r
    }

    /// A run at T1's GREEN: its RED accepted and frozen.
    fn at_green() -> Self {
        let mut r = Run::new();
        r.reach_green();
        r
    }

    fn with_paths(paths: PathPolicy) -> Self {
        let cfg = MachineConfig {
            paths,
            ..MachineConfig::default()
        };
        Run {
            m: Machine::new(cfg),
            s: State::default(),
            disk: FakeDisk::new(),
            events: vec![],
            commands: vec![],
            design_on_disk: None,
            inherited: Inherited::default(),
        }
    }

    /// Feeds an event as the conductor does: on refusal, records `Refused`.
    fn feed(&mut self, e: Event) -> Result<Vec<Command>, RuleViolation> {
        self.events.push(e.clone());
        match self.m.step(&self.s, &e) {
            Ok((s, cmds)) => {
                self.s = s;
                self.after(&cmds);
                Ok(cmds)
            }
            Err(v) => {
                let refused = Event::refusal(&e, v.clone());
                self.events.push(refused.clone());
                let (s, cmds) = self
                    .m
                    .step(&self.s, &refused)
                    .expect("a refusal is always recorded");
                self.s = s;
                self.after(&cmds);
                Err(v)
            }
        }
    }

    fn after(&mut self, cmds: &[Command]) {
        for c in cmds {
            if let Command::AwaitGate {
                gate: GateKind::Design,
                hash,
            } = c
            {
                self.design_on_disk = Some(*hash);
            }
        }
        self.commands.extend(cmds.iter().cloned());
    }

    fn ok(&mut self, e: Event) -> Vec<Command> {
        let name = e.name();
        self.feed(e)
            .unwrap_or_else(|v| panic!("{name} refused: {v}"))
    }

    /// Asserts the event is refused and leaves the state as it was (before the remedy).
    fn refused(&mut self, e: Event) -> RuleViolation {
        let before = self.s.clone();
        let direct = self.m.step(&before, &e);
        let v = direct.expect_err("event must be refused");
        assert_eq!(self.feed(e).expect_err("refused again"), v);
        v
    }

    fn pending(&self) -> Pending {
        self.s.pending.clone().expect("something pending")
    }

    fn assignment(&self) -> (AssignmentId, Step, u32) {
        match self.pending() {
            Pending::Agent {
                id, step, attempt, ..
            } => (id, step, attempt),
            other => panic!("expected an agent to be pending, got {other:?}"),
        }
    }

    fn produce(&mut self, artifact: Artifact) -> Result<Vec<Command>, RuleViolation> {
        let (aid, step, _) = self.assignment();
        self.feed(Event::Produced {
            assignment: aid,
            author: id(step.role()),
            artifact,
            usage: Default::default(),
            transcript: None,
        })
    }

    fn produce_as(
        &mut self,
        author: ActorId,
        artifact: Artifact,
    ) -> Result<Vec<Command>, RuleViolation> {
        let (aid, _, _) = self.assignment();
        self.feed(Event::Produced {
            assignment: aid,
            author,
            artifact,
            usage: Default::default(),
            transcript: None,
        })
    }

    /// Produces an artifact for the pending step that the machine must refuse: the violation.
    fn produce_refused(&mut self, artifact: Artifact) -> RuleViolation {
        self.produce(artifact).expect_err("refused")
    }

    /// Produces a change set writing `content` to `path` for the pending step and applies it:
    /// the apply's commands (its verify run).
    fn write_and_apply(&mut self, path: &str, content: &str) -> Vec<Command> {
        self.produce(cs(vec![write(path, content)]))
            .expect("change set accepted");
        self.apply()
    }

    /// [`Run::write_and_apply`], then answers its verify run with `tests/t1.sql` as `t1`.
    fn write_apply_and_verify(
        &mut self,
        path: &str,
        content: &str,
        t1: TestStatus,
    ) -> Result<Vec<Command>, RuleViolation> {
        self.write_and_apply(path, content);
        self.verify(&[("tests/t1.sql", t1)])
    }

    fn test_hashes(&self) -> FileHashes {
        self.disk.test_hashes()
    }

    fn workspace_hash(&self) -> ContentHash {
        self.disk.workspace_hash()
    }

    fn observe(&mut self) -> Vec<Command> {
        assert!(
            matches!(self.pending(), Pending::Observe { .. }),
            "expected observe, got {:?}",
            self.pending()
        );
        let e = Event::Observed {
            design_hash: self.design_on_disk,
            tests: self.test_hashes(),
            migrations: Default::default(),
        };
        self.ok(e)
    }

    fn apply(&mut self) -> Vec<Command> {
        let e = self
            .write_pending()
            .expect("an apply or a revert is pending");
        self.ok(e)
    }

    /// Writes the pending change set to the fake disk; returns the `Applied` event.
    fn write_pending(&mut self) -> Option<Event> {
        let set = match self.s.pending.clone()? {
            Pending::Apply { change_set, .. } | Pending::Revert { change_set, .. } => change_set,
            _ => return None,
        };
        Some(self.disk.applied(&set))
    }

    fn receipt(&self, outcomes: &[(&str, TestStatus)], exit: i32) -> TestRunReceipt {
        let (request, hash) = match self.pending() {
            Pending::Verify {
                request,
                workspace_hash,
                ..
            } => (request, workspace_hash),
            other => panic!("expected verify, got {other:?}"),
        };
        receipt_with(request, hash, outcomes, exit, "out")
    }

    fn verify(&mut self, outcomes: &[(&str, TestStatus)]) -> Result<Vec<Command>, RuleViolation> {
        let exit = if outcomes.iter().all(|(_, s)| *s == TestStatus::Passed) {
            0
        } else {
            1
        };
        let r = self.receipt(outcomes, exit);
        self.feed(Event::VerifyCompleted { receipt: r })
    }

    /// Answers the pending verify with these outcomes, which the machine must refuse.
    fn verify_refused(&mut self, outcomes: &[(&str, TestStatus)]) -> RuleViolation {
        self.verify(outcomes).expect_err("refused")
    }

    fn gate_hash(&self) -> (GateKind, ContentHash) {
        self.s.pending_gate().expect("a gate is pending")
    }

    /// Approves the pending gate.
    fn approve(&mut self) -> Vec<Command> {
        let (gate, hash) = self.gate_hash();
        self.ok(Event::Gate {
            approval: approval(gate, hash),
        })
    }

    /// The tree observed before the design gate and, when it holds a test, the baseline run
    /// and finding the project's suite green: the design gate waits (the commands are those
    /// that follow it).
    fn baseline_before_the_gate(&mut self) -> Vec<Command> {
        let commands = self.observe();
        let Pending::Baseline { request, .. } = self.pending() else {
            // No test on disk, none inherited: no baseline; the gate waits.
            return commands;
        };
        let receipt = receipt_with(request, self.workspace_hash(), &[], 0, "baseline");
        self.ok(Event::VerifyCompleted { receipt })
    }

    /// Starts the run and has the Product Owner's stories accepted: the spec is asked for.
    fn start_with_stories(&mut self, user_facing: bool) {
        self.ok(Event::Start {
            feature: feature(),
            inherited: self.inherited.clone(),
            per_step: self.m.config().per_step,
            harness: None,
        });
        self.produce(Artifact::Stories(stories(user_facing)))
            .expect("stories");
    }

    /// The design lane up to the accepted test list: the UX design is asked for next when a
    /// story is user-facing, the design gate otherwise.
    fn design_to_test_list(&mut self, user_facing: bool) {
        self.design_up_to_the_test_list(user_facing);
        self.produce(Artifact::TestList(test_list()))
            .expect("test list");
    }

    /// The design lane up to the test list it asks for.
    fn design_up_to_the_test_list(&mut self, user_facing: bool) {
        self.start_with_stories(user_facing);
        self.produce(Artifact::Spec(spec())).expect("spec");
        self.produce(Artifact::ArchitectureVerdict(approve_arch()))
            .expect("arch");
        self.produce(Artifact::SchemaPlan(schema()))
            .expect("schema");
    }

    /// The design lane to its gate: every artifact accepted, the baseline before the gate.
    fn design_lane(&mut self, user_facing: bool) {
        self.design_to_test_list(user_facing);
        if user_facing {
            self.produce(Artifact::UxDesign(ux())).expect("ux");
        }
        self.baseline_before_the_gate();
    }

    fn reach_build(&mut self) {
        self.design_lane(false);
        self.approve();
        self.observe();
    }

    /// The build lane at T1's GREEN: its RED (`tests/t1.sql`) accepted and frozen.
    fn reach_green(&mut self) {
        self.reach_build();
        self.red("tests/t1.sql", &[]);
    }

    /// RED for the current test: writes its file; the run shows it failing.
    fn red(&mut self, test_path: &str, earlier: &[&str]) {
        self.produce(cs(vec![write(test_path, "assert false;")]))
            .expect("red accepted");
        self.apply();
        let mut outcomes: Vec<(&str, TestStatus)> =
            earlier.iter().map(|e| (*e, TestStatus::Passed)).collect();
        outcomes.push((test_path, TestStatus::Failed));
        self.verify(&outcomes).expect("red verified");
        self.observe();
    }

    fn green(&mut self, names: &[&str]) {
        self.produce(cs(vec![write(
            "src/code.sql",
            &format!("-- {}", names.len()),
        )]))
        .expect("green accepted");
        self.apply();
        let outcomes: Vec<(&str, TestStatus)> =
            names.iter().map(|n| (*n, TestStatus::Passed)).collect();
        self.verify(&outcomes).expect("green verified");
        self.observe();
    }

    fn refactor_noop_and_approve(&mut self) {
        self.produce(cs(vec![])).expect("refactor");
        self.observe();
        self.produce(Artifact::ReviewVerdict(ReviewVerdict::Approve {
            notes: vec![],
        }))
        .expect("review");
    }

    fn full_test(&mut self, path: &str, earlier: &[&str]) {
        self.red(path, earlier);
        let mut all: Vec<&str> = earlier.to_vec();
        all.push(path);
        self.green(&all);
        self.refactor_noop_and_approve();
    }

    fn reach_deploy_gate(&mut self) {
        self.reach_build();
        self.full_test("tests/t1.sql", &[]);
        self.observe();
        self.full_test("tests/t2.sql", &["tests/t1.sql"]);
    }

    /// Past the deploy gate: the deploy run is pending.
    fn reach_deploy_run(&mut self) {
        self.reach_deploy_gate();
        self.approve();
        self.observe();
    }

    /// Answers the deploy run: `tests/t1.sql` passed, `tests/t2.sql` as given.
    fn deploy_run(&mut self, t2: TestStatus) -> Result<Vec<Command>, RuleViolation> {
        self.verify(&[("tests/t1.sql", TestStatus::Passed), ("tests/t2.sql", t2)])
    }

    /// Past the promote gate, after a passing deploy run: the promotion is pending.
    fn reach_promote(&mut self) -> RequestId {
        self.reach_deploy_run();
        self.deploy_run(TestStatus::Passed).expect("deploy");
        self.approve();
        self.observe();
        match self.pending() {
            Pending::Promote { request } => request,
            other => panic!("expected promote, got {other:?}"),
        }
    }

    fn reach_done(&mut self) {
        let request = self.reach_promote();
        self.ok(promoted(request, &["0001", "0002"]));
    }

    fn halted_reason(&self) -> EscalationReason {
        match &self.s.status {
            RunStatus::Halted { escalation, .. } => escalation.reason.clone(),
            other => panic!("expected a halt, got {other:?}"),
        }
    }

    /// The verdict the run halted with; panics on a halt for an infrastructure fault.
    fn halted_verdict(&self) -> VerdictReason {
        match self.halted_reason() {
            EscalationReason::Verdict(verdict) => verdict,
            other => panic!("expected a halt with a verdict, got {other:?}"),
        }
    }
}

/// A verified promotion report for `request` that applied these versions.
fn promoted(request: RequestId, applied: &[&str]) -> Event {
    Event::Promoted {
        report: PromoteReport {
            request_id: request,
            target: "parent".into(),
            applied: applied.iter().map(|v| v.to_string()).collect(),
            already_applied: vec![],
            verified: true,
            merge_check: None,
        },
    }
}

/// The run's start: the feature, nothing inherited.
fn start() -> Event {
    Event::Start {
        feature: feature(),
        inherited: Default::default(),
        per_step: Default::default(),
        harness: None,
    }
}

/// The agent of assignment `aid` failed: its model server answered 503.
fn model_unavailable(aid: AssignmentId) -> Event {
    Event::AgentFailed {
        assignment: aid,
        failure: AgentFailure::ModelUnavailable {
            detail: "503".into(),
            usage: Usage::default(),
        },
        role: None,
        usage: Default::default(),
    }
}

/// A human's decision, by `ada`.
fn human(decision: HumanDecision) -> Event {
    Event::Human {
        decision,
        by: "ada".into(),
    }
}

fn last_command(r: &Run) -> Command {
    r.commands.last().cloned().expect("a command")
}

/// Applies the pending change, observes it, and returns the feedback of the assignment that
/// follows (one line a point).
fn feedback_once_observed(r: &mut Run) -> String {
    r.apply();
    r.observe();
    let Command::Assign { feedback, .. } = last_command(r) else {
        panic!("the role is asked again");
    };
    feedback.join("\n")
}

// ---------- design lane ----------

#[test]
fn start_assigns_the_product_owner() {
    let mut r = Run::new();
    let cmds = r.ok(start());
    assert!(matches!(
        &cmds[..],
        [Command::Assign {
            role: Role::ProductOwner,
            step: Step::Stories,
            ..
        }]
    ));
    assert_eq!(r.s.phase(), Phase::Design);
}

#[test]
fn a_feature_request_needs_an_id_and_a_title() {
    let mut r = Run::new();
    let v = r.refused(Event::Start {
        feature: FeatureRequest {
            id: " ".into(),
            title: "t".into(),
            body: String::new(),
        },
        inherited: Default::default(),
        per_step: Default::default(),
        harness: None,
    });
    assert!(matches!(v, RuleViolation::InvalidArtifact { .. }));
    assert_eq!(r.s.phase(), Phase::Idle);
}

#[test]
fn nothing_but_a_feature_request_starts_a_run() {
    let mut r = Run::new();
    let v = r.refused(human(HumanDecision::Retry));
    assert!(matches!(v, RuleViolation::StepOutOfOrder { .. }));
}

#[test]
fn the_design_lane_runs_in_order_to_the_design_gate() {
    let mut r = Run::new();
    r.design_lane(false);
    let roles: Vec<Role> = r
        .commands
        .iter()
        .filter_map(|c| match c {
            Command::Assign { role, .. } => Some(*role),
            _ => None,
        })
        .collect();
    assert_eq!(
        roles,
        vec![
            Role::ProductOwner,
            Role::SpecAuthor,
            Role::ArchitectReviewer,
            Role::Dba,
            Role::TestStrategist
        ]
    );
    let (gate, hash) = r.gate_hash();
    assert_eq!(gate, GateKind::Design);
    assert_eq!(hash, r.s.design_bundle().expect("bundle").hash());
    assert_eq!(r.s.phase(), Phase::DesignGate);
}

#[test]
fn the_ux_designer_works_only_when_a_story_is_user_facing() {
    let mut r = Run::new();
    r.design_lane(true);
    assert!(r.commands.iter().any(|c| matches!(
        c,
        Command::Assign {
            role: Role::UxDesigner,
            ..
        }
    )));
    assert!(r.s.ux.is_some());
    let mut plain = Run::new();
    plain.design_lane(false);
    assert!(!plain.commands.iter().any(|c| matches!(
        c,
        Command::Assign {
            role: Role::UxDesigner,
            ..
        }
    )));
}

#[test]
fn ux_design_must_cover_every_user_facing_story() {
    let mut r = Run::new();
    r.design_to_test_list(true);
    let v = r.produce_refused(Artifact::UxDesign(UxDesign {
        screens: vec![],
        notes: vec![],
    }));
    assert!(matches!(v, RuleViolation::InvalidArtifact { .. }));
}

#[test]
fn a_revise_verdict_sends_the_spec_back_with_its_reasons() {
    let mut r = Run::new();
    r.start_with_stories(false);
    r.produce(Artifact::Spec(spec())).expect("spec");
    let cmds = r
        .produce(Artifact::ArchitectureVerdict(ArchitectureVerdict::Revise {
            reasons: vec!["layering".into()],
        }))
        .expect("revise");
    assert!(
        matches!(&cmds[..], [Command::Assign { step: Step::Spec { revision: 1 }, feedback, .. }] if feedback == &vec!["layering".to_string()])
    );
}

#[test]
fn revisions_are_bounded_then_escalate_as_a_verdict() {
    let mut r = Run::new();
    r.start_with_stories(false);
    for _ in 0..=2 {
        r.produce(Artifact::Spec(spec())).expect("spec");
        r.produce(Artifact::ArchitectureVerdict(ArchitectureVerdict::Revise {
            reasons: vec!["no".into()],
        }))
        .expect("revise");
    }
    assert_eq!(r.halted_verdict(), VerdictReason::RevisionBoundSpent);
    assert!(matches!(last_command(&r), Command::Escalate { .. }));
}

/// A design's migration is SQL: one with a psql meta-command line (which psql would run
/// unconfined, `\\!` a shell command among them) is refused; the same text inside a string
/// or a dollar-quoted body on a line of its own is still refused (no SQL line begins so).
#[test]
fn a_design_migration_that_is_a_psql_script_is_refused() {
    let stories = stories(false);
    let mut plan = schema();
    assert!(check_schema(&plan, &stories, None).is_ok());
    for script in [
        "\\set schema app\nCREATE SCHEMA :\"schema\";",
        "CREATE TABLE t (x int);\n  \\! touch /tmp/owned",
    ] {
        plan.migrations[0].sql = script.into();
        let v = check_schema(&plan, &stories, None).expect_err("refused");
        assert_contains(&format!("{script}: {v}"), "never a psql script");
    }
}

#[test]
fn malformed_design_artifacts_are_refused_and_the_agent_retries() {
    let mut r = Run::new();
    r.ok(start());
    let mut bad = stories(false);
    bad.stories[0].acceptance_criteria[0].id = "AC1".into();
    let v = r.produce_refused(Artifact::Stories(bad));
    assert!(matches!(v, RuleViolation::InvalidArtifact { .. }));
    let (_, step, attempt) = r.assignment();
    assert_eq!((step, attempt), (Step::Stories, 1));
    assert!(
        matches!(last_command(&r), Command::Assign { feedback, .. } if feedback[0].contains("refused"))
    );
}

#[test]
fn design_checks_catch_broken_traces() {
    let st = stories(false);
    let mut sp = spec();
    sp.requirements[0].ac_id = "S9-AC1".into();
    assert!(check_spec(&sp, &st).is_err());
    let mut sc = schema();
    sc.migrations.swap(0, 1);
    assert!(check_schema(&sc, &st, None).is_err());
    // Each edit of the second entry breaks the list's trace or its paths.
    type Edit = fn(&mut TestEntry);
    let broken: [(&str, Edit); 4] = [
        ("not a test path", |e| e.path = "src/t2.sql".into()),
        ("an unknown criterion", |e| e.ac_id = "nope".into()),
        ("a duplicate id", |e| e.id = "T1".into()),
        // A test in a cache directory could never be written (nor hashed): not a test path.
        ("a cache", |e| e.path = "tests/__pycache__/t2.sql".into()),
    ];
    for (case, edit) in broken {
        let mut tl = test_list();
        edit(&mut tl.entries[1]);
        let checked = check_test_list(&tl, &st, &PathPolicy::default());
        assert!(checked.is_err(), "{case}");
    }
    assert!(check_test_list(&test_list(), &st, &PathPolicy::default()).is_ok());
    let mut tl = test_list();
    tl.entries[1].path = "tests/build/t2.sql".into();
    assert!(check_test_list(&tl, &st, &PathPolicy::default()).is_ok());
    assert!(check_test_list(&tl, &st, &PathPolicy::default().with_caches(&["build"])).is_err());
}

/// A test-list entry at a path the runner never collects would fail every RED with nothing to
/// repair: it is refused in the design lane, and the Test Strategist hears why.
#[test]
fn a_test_the_runner_never_collects_is_refused_with_the_reason() {
    let policy = PathPolicy::default()
        .with_collected(&["tests/t1.sql"])
        .expect("glob");
    let mut r = Run::with_paths(policy);
    r.design_up_to_the_test_list(false);
    let v = r.produce_refused(Artifact::TestList(test_list()));
    let text = v.to_string();
    assert!(
        text.contains("tests/t2.sql") && text.contains("never collects"),
        "{text}"
    );
    let (_, step, attempt) = r.assignment();
    assert_eq!((step, attempt), (Step::TestList, 1));
    assert!(
        matches!(last_command(&r), Command::Assign { feedback, .. } if feedback.iter().any(|f| f.contains("never collects"))),
        "the reason is fed back"
    );
    // Once the list names only collected files, it is accepted.
    let mut only_t1 = test_list();
    only_t1.entries.truncate(1);
    r.produce(Artifact::TestList(only_t1)).expect("collected");
}

/// A test-list entry whose name the runner can never report (a JUnit runner's test named by
/// its file alone) would freeze a design no run can finish: refused in the design lane, the
/// expected form in the refusal, and accepted once named as the runner reports it.
#[test]
fn a_test_named_as_the_runner_never_reports_it_is_refused_with_the_expected_form() {
    let policy = PathPolicy::new(&["test/**"], &[])
        .expect("globs")
        .with_test_identity(TestIdentity::JunitFile);
    let mut r = Run::with_paths(policy);
    r.design_up_to_the_test_list(false);
    let mut list = test_list();
    list.entries.truncate(1);
    list.entries[0].path = "test/orders_place.test.js".into();
    let v = r.produce_refused(Artifact::TestList(list.clone()));
    let text = v.to_string();
    assert!(
        text.contains("never reports")
            && text.contains("\"test/orders_place.test.js::<test name>\""),
        "{text}"
    );
    list.entries[0].test_name = Some("test/orders_place.test.js::places an order".into());
    r.produce(Artifact::TestList(list))
        .expect("named as the runner reports it");
}

#[test]
fn refusals_are_bounded_then_escalate() {
    let mut r = Run::new();
    r.ok(start());
    for _ in 0..=2 {
        let _ = r.produce(Artifact::Stories(Stories {
            feature_id: "F1".into(),
            stories: vec![],
        }));
    }
    assert_eq!(r.halted_verdict(), VerdictReason::RuleViolated);
}

#[test]
fn an_artifact_from_the_wrong_role_is_refused() {
    let mut r = Run::new();
    r.ok(start());
    let v = r
        .produce_as(id(Role::Driver), Artifact::Stories(stories(false)))
        .expect_err("refused");
    assert_eq!(
        v,
        RuleViolation::WrongRole {
            expected: Role::ProductOwner,
            got: Role::Driver
        }
    );
}

#[test]
fn an_artifact_of_the_wrong_kind_is_refused() {
    let mut r = Run::new();
    r.ok(start());
    let v = r.produce_refused(Artifact::Spec(spec()));
    assert_eq!(
        v,
        RuleViolation::WrongArtifactKind {
            expected: ArtifactKind::Stories,
            got: ArtifactKind::Spec
        }
    );
}

#[test]
fn an_agent_made_receipt_is_refused() {
    let mut r = Run::with_red_applied("x");
    let receipt = r.receipt(&[("tests/t1.sql", TestStatus::Passed)], 0);
    // Forge a receipt while the navigator... is not even asked: use the next agent step.
    r.verify(&[("tests/t1.sql", TestStatus::Failed)])
        .expect("red");
    r.observe();
    let v = r.produce_refused(Artifact::TestRunReceipt(Box::new(receipt)));
    assert!(matches!(v, RuleViolation::ForgedReceipt { .. }));
    assert_eq!(r.s.receipts.len(), 1, "the forged receipt was not recorded");
}

#[test]
fn a_stale_answer_is_ignored() {
    let mut r = Run::new();
    r.ok(start());
    let before = r.s.clone();
    let v = r.refused(Event::Produced {
        assignment: AssignmentId(99),
        author: id(Role::ProductOwner),
        artifact: Artifact::Stories(stories(false)),
        usage: Default::default(),
        transcript: None,
    });
    assert!(matches!(v, RuleViolation::UnknownAssignment { .. }));
    assert_eq!(r.s, before, "an ignored refusal changes nothing");
}

// ---------- gates ----------

#[test]
fn the_design_gate_refuses_another_hash_and_keeps_waiting() {
    let mut r = Run::new();
    r.design_lane(false);
    let v = r.refused(Event::Gate {
        approval: approval(GateKind::Design, ContentHash::of_bytes(b"old")),
    });
    assert!(matches!(v, RuleViolation::GateHashMismatch { .. }));
    assert_eq!(r.s.phase(), Phase::DesignGate);
}

#[test]
fn an_approval_for_another_gate_is_refused() {
    let mut r = Run::new();
    r.design_lane(false);
    let (_, hash) = r.gate_hash();
    let v = r.refused(Event::Gate {
        approval: approval(GateKind::Deploy, hash),
    });
    assert_eq!(
        v,
        RuleViolation::GateNotPending {
            gate: GateKind::Deploy
        }
    );
    assert_eq!(r.s.phase(), Phase::DesignGate);
}

#[test]
fn nothing_passes_a_gate_without_approval() {
    let mut r = Run::new();
    r.design_lane(false);
    let v = r.refused(Event::Observed {
        design_hash: None,
        tests: FileHashes::new(),
        migrations: Default::default(),
    });
    assert_eq!(
        v,
        RuleViolation::GateNotApproved {
            gate: GateKind::Design
        }
    );
}

#[test]
fn a_rejection_halts_and_a_retry_reopens_the_gate() {
    let mut r = Run::new();
    r.design_lane(false);
    let (gate, hash) = r.gate_hash();
    let mut a = approval(gate, hash);
    a.decision = GateDecision::Reject {
        reason: "too big".into(),
    };
    r.ok(Event::Gate { approval: a });
    assert_eq!(r.halted_verdict(), VerdictReason::GateRejected);
    r.ok(human(HumanDecision::Retry));
    assert_eq!(r.gate_hash(), (gate, hash));
}

#[test]
fn approving_the_design_freezes_it_and_starts_red() {
    let mut r = Run::new();
    r.design_lane(false);
    let (_, hash) = r.gate_hash();
    r.approve();
    assert_eq!(r.s.frozen.as_ref().map(|f| f.hash), Some(hash));
    let cmds = r.observe();
    assert!(
        matches!(&cmds[..], [Command::Assign { role: Role::Navigator, step: Step::Red { test }, .. }] if test == "T1")
    );
    assert_eq!(r.s.phase(), Phase::Build);
}

#[test]
fn a_design_changed_on_disk_halts_before_the_next_build_step() {
    let mut r = Run::new();
    r.design_lane(false);
    r.approve();
    r.design_on_disk = Some(ContentHash::of_bytes(b"edited"));
    let e = Event::Observed {
        design_hash: r.design_on_disk,
        tests: r.test_hashes(),
        migrations: Default::default(),
    };
    let v = r.refused(e);
    assert!(matches!(v, RuleViolation::DesignHashMismatch { .. }));
    let said = v.to_string();
    assert!(
        said.contains(&ContentHash::of_bytes(b"edited").to_string()) && !said.contains("Some("),
        "{said}"
    );
    assert_eq!(r.halted_verdict(), VerdictReason::RuleViolated);
}

#[test]
fn a_missing_design_file_is_said_in_words() {
    let v = RuleViolation::DesignHashMismatch {
        expected: ContentHash::of_bytes(b"approved"),
        found: None,
    };
    assert!(
        v.to_string().ends_with("found no readable design file"),
        "{v}"
    );
}

// ---------- RED ----------

#[test]
fn red_may_write_only_test_paths() {
    let mut r = Run::at_build();
    let v = r.produce_refused(cs(vec![
        write("tests/t1.sql", "x"),
        write("src/cheat.sql", "y"),
    ]));
    assert_eq!(
        v,
        RuleViolation::NonTestInRed {
            path: "src/cheat.sql".into()
        }
    );
    assert!(r.disk.files.is_empty(), "nothing applied");
}

#[test]
fn no_agent_restores_raw_bytes() {
    let mut r = Run::at_build();
    let v = r.produce_refused(cs(vec![
        write("tests/t1.sql", "x"),
        FileChange::Restore {
            path: "src/blob.bin".into(),
            hex: "ff00".into(),
        },
    ]));
    assert!(matches!(v, RuleViolation::InvalidArtifact { .. }), "{v:?}");
    assert_eq!(v.remedy(), Remedy::RetryAgent);
    assert!(r.disk.files.is_empty(), "nothing applied");
}

#[test]
fn red_must_write_the_entrys_test_file() {
    let v = Run::at_build().produce_refused(cs(vec![write("tests/other.sql", "x")]));
    assert_eq!(
        v,
        RuleViolation::RedMissingTest {
            path: "tests/t1.sql".into()
        }
    );
}

#[test]
fn no_agent_touches_the_harness() {
    let mut r = Run::at_build();
    for harness in ["consort.toml", "run-tests.sh"] {
        let v = r.produce_refused(cs(vec![write("tests/t1.sql", "x"), write(harness, "")]));
        let want = RuleViolation::TouchesHarness {
            path: harness.into(),
        };
        assert_eq!(v, want, "{harness}");
        r.observe();
    }
}

#[test]
fn a_driver_adding_a_dependency_to_a_harness_manifest_is_refused_and_told_it_is_a_human_change() {
    let paths = PathPolicy::new(&["tests/**"], &[])
        .and_then(|p| p.with_harness_outside_tests(&["**/pyproject.toml", "**/conftest.py"]))
        .expect("globs");
    let mut r = Run::with_paths(paths);
    r.reach_green();
    let v = r.produce_refused(cs(vec![
        write("src/a.sql", "select 1;"),
        write(
            "./pyproject.toml",
            "[project]\ndependencies = [\"requests\"]\n",
        ),
    ]));
    assert_eq!(
        v,
        RuleViolation::TouchesHarness {
            path: "pyproject.toml".into()
        }
    );
    assert_eq!(v.remedy(), Remedy::RetryAgent);
    r.observe();
    let (_, step, attempt) = r.assignment();
    assert_eq!((step, attempt), (Step::Green { test: "T1".into() }, 1));
    assert!(
        matches!(last_command(&r), Command::Assign { feedback, .. }
            if feedback[0].contains("pyproject.toml is part of the harness")
                && feedback[0].contains("new dependency")
                && feedback[0].contains("a human's change")),
        "{:?}",
        last_command(&r)
    );
    assert!(
        !r.disk.files.contains_key("pyproject.toml"),
        "nothing was written"
    );
}

#[test]
fn paths_outside_the_work_tree_are_refused() {
    let mut r = Run::at_build();
    for bad in ["../evil.sql", "/etc/passwd"] {
        let v = r.produce_refused(cs(vec![write("tests/t1.sql", "x"), write(bad, "y")]));
        assert!(
            matches!(v, RuleViolation::PathOutsideWorkTree { .. }),
            "{bad}: {v:?}"
        );
        if matches!(r.s.status, RunStatus::Halted { .. }) {
            break;
        }
        r.observe();
    }
}

#[test]
fn a_refused_apply_lets_the_agent_retry() {
    let mut r = Run::at_build();
    r.produce(cs(vec![write("tests/t1.sql", "x")]))
        .expect("red");
    let v = r.refused(Event::ApplyRefused {
        reason: PathError::EscapesThroughLink {
            path: "tests/t1.sql".into(),
        },
    });
    assert!(matches!(v, RuleViolation::PathOutsideWorkTree { .. }));
    r.observe();
    let (_, step, attempt) = r.assignment();
    assert_eq!((step, attempt), (Step::Red { test: "T1".into() }, 1));
}

#[test]
fn a_red_that_already_passes_is_refused_reverted_and_retried() {
    let mut r = Run::with_red_applied("select 1;");
    assert_eq!(
        r.verify_refused(&[("tests/t1.sql", TestStatus::Passed)]),
        RuleViolation::RedPassedWithoutCode {
            test: "tests/t1.sql".into()
        }
    );
    assert!(matches!(r.pending(), Pending::Revert { .. }));
    r.apply();
    assert!(r.disk.files.is_empty(), "the passing test was taken back");
    r.observe();
    assert_eq!(r.assignment().2, 1);
    assert!(r.s.build.frozen_tests.is_empty(), "nothing frozen");
    assert!(
        r.s.build.since_review.is_empty(),
        "the refused RED is not among the changes the review sees"
    );
}

/// The feedback the Navigator gets after a RED of `tests/t2.sql` that broke the green
/// `tests/t1.sql`, its receipt shaped by `edit` first.
fn feedback_after_a_broken_red(edit: impl FnOnce(&mut TestRunReceipt)) -> String {
    let mut r = Run::at_build();
    r.full_test("tests/t1.sql", &[]);
    r.observe();
    r.write_and_apply("tests/t2.sql", "x");
    let mut receipt = r.receipt(
        &[
            ("tests/t1.sql", TestStatus::Failed),
            ("tests/t2.sql", TestStatus::Failed),
        ],
        1,
    );
    edit(&mut receipt);
    r.feed(Event::VerifyCompleted { receipt })
        .expect_err("a RED that breaks a green test is refused");
    let text = feedback_once_observed(&mut r);
    assert!(text.contains("RED broke tests"), "{text}");
    text
}

/// A refused RED run is fed back with its output: the lines about passing tests left out.
#[test]
fn a_refused_red_run_feeds_its_output_back() {
    let text = feedback_after_a_broken_red(|receipt| {
        receipt.output_excerpt =
            "== tests/t0.sql: passed ==\nERROR: relation \"stock\" does not exist\n".into();
        receipt
            .outcomes
            .push(TestOutcome::new("tests/t0.sql", TestStatus::Passed));
    });
    assert!(
        text.contains("relation \"stock\" does not exist"),
        "the run's output: {text}"
    );
    assert!(
        !text.contains("t0.sql: passed"),
        "passing tests' lines are left out: {text}"
    );
    assert!(
        text.contains("1 line(s) about passing tests left out"),
        "{text}"
    );
}

/// What a failing test said (its report's message and location) reaches the agent ahead of
/// the output, also when the output itself says nothing about it (a JUnit-only reporter).
#[test]
fn what_the_failing_test_said_reaches_the_agent() {
    let text = feedback_after_a_broken_red(|receipt| {
        receipt.output_excerpt = "JUNIT report written to /tmp/x/reports/junit.xml\n".into();
        receipt.outcomes[0] = TestOutcome::new("tests/t1.sql", TestStatus::Failed)
            .with_message("AssertionError: expected 2 to be 3\n at tests/t1.sql:7:17");
    });
    let said = text
        .find("expected 2 to be 3")
        .expect("the message reaches the agent");
    let output = text.find("JUNIT report written").expect("and the output");
    assert!(said < output, "the message comes first: {text}");
    assert!(text.contains("tests/t1.sql:7:17"), "its location: {text}");
}

/// A RED whose run breaks an earlier green test is refused. T2 is the first test of story S2,
/// so its run is the first with S2's migration: the refusal names it, for what no RED can
/// mend is a person's to decide. A RED later in a story applies no migration anew and names
/// none.
#[test]
fn a_red_that_breaks_a_green_test_is_refused() {
    for t2_in_s1 in [false, true] {
        let mut r = Run::at_build();
        if t2_in_s1 {
            let mut list = (**r.s.test_list.as_ref().expect("a test list")).clone();
            list.entries[1].ac_id = list.entries[0].ac_id.clone();
            r.s.test_list = Some(std::sync::Arc::new(list));
        }
        r.full_test("tests/t1.sql", &[]);
        r.observe();
        r.write_and_apply("tests/t2.sql", "x");
        let v = r.verify_refused(&[
            ("tests/t1.sql", TestStatus::Failed),
            ("tests/t2.sql", TestStatus::Failed),
        ]);
        let migrations = if t2_in_s1 {
            vec![]
        } else {
            vec!["0002".into()]
        };
        assert_eq!(
            v,
            RuleViolation::RedBrokeGreenTest {
                tests: vec!["tests/t1.sql".into()],
                migrations,
            }
        );
        let text = v.to_string();
        assert_eq!(
            text.contains("the first with the design's migrations 0002"),
            !t2_in_s1,
            "{text}"
        );
        assert_eq!(text.contains("`consort test quarantine NAME"), !t2_in_s1);
    }
}

#[test]
fn a_red_whose_test_did_not_run_is_refused() {
    let mut r = Run::with_red_applied("x");
    let v = r.verify_refused(&[("tests/zzz.sql", TestStatus::Failed)]);
    assert_eq!(
        v,
        RuleViolation::RedTestNotRun {
            test: "tests/t1.sql".into(),
            failed_elsewhere: vec!["tests/zzz.sql".into()],
        }
    );
    let told = v.to_string();
    assert!(
        told.contains("failed to load (an import or collection error"),
        "a failure under another name is named as a load failure: {told}"
    );
    let mut quiet = Run::with_red_applied("x");
    let v = quiet.verify_refused(&[("tests/zzz.sql", TestStatus::Passed)]);
    assert_eq!(
        v.to_string(),
        "the run did not report the new test tests/t1.sql"
    );
}

/// A RED stopped at its time limit is named as a time-out, never as a file that failed to
/// load, and the Navigator is told the end of the output (where a fixture that waited said
/// why), not its beginning.
#[test]
fn a_red_that_timed_out_is_named_so_with_the_end_of_its_output() {
    let mut r = Run::with_red_applied("x");
    let mut receipt = r.receipt(&[("(exit)", TestStatus::Errored)], 1);
    receipt.exit = ExitRecord {
        code: None,
        signal: Some(9),
        timed_out: true,
    };
    receipt.timings.run_ms = 600_204;
    let filler = "collecting ... waiting for the worker\n".repeat(400);
    receipt.output_excerpt = format!(
        "START OF OUTPUT\n{filler}OSError: [Errno 38] Function not implemented: /dev/shm\n[consort: time limit of 600 s reached; the process group was killed]\n"
    );
    let v = r.refused(Event::VerifyCompleted { receipt });
    assert_eq!(
        v,
        RuleViolation::RedRunTimedOut {
            test: "tests/t1.sql".into(),
            ran_ms: 600_204
        }
    );
    let told = v.to_string();
    assert!(
        told.contains("ran 600 s and was stopped at its time limit"),
        "{told}"
    );
    assert!(!told.contains("failed to load"), "{told}");
    let text = feedback_once_observed(&mut r);
    assert!(text.contains("Errno 38"), "the end of the output: {text}");
    assert!(text.contains("time limit of 600 s reached"), "{text}");
    assert!(
        !text.contains("START OF OUTPUT"),
        "not its beginning: {text}"
    );
}

/// The first test of a new module, written as people write it: its file failed to load because
/// the module it imports, a code path, does not exist yet. That is a RED, and the load failure
/// is no earlier test it broke. A missing module that is no code (a test path, the harness),
/// or another file's load failure, is not; nor is any earlier test failing beside it.
#[test]
fn a_test_file_that_fails_to_load_for_a_missing_module_of_the_code_is_a_red() {
    let load = "tests/t1.sql::(load)";
    let missing = |test_file: &str, module: &str| MissingModule {
        outcome: load.into(),
        test_file: test_file.into(),
        module: module.into(),
        stops_every_test: false,
    };
    let red = |module: MissingModule, outcomes: &[(&str, TestStatus)]| {
        let mut r = Run::with_red_applied("x");
        let mut receipt = r.receipt(outcomes, 1);
        receipt.missing_modules = vec![module];
        (r.feed(Event::VerifyCompleted { receipt }), r)
    };
    let (accepted, mut r) = red(
        missing("tests/t1.sql", "src/orders.js"),
        &[(load, TestStatus::Failed)],
    );
    accepted.expect("a RED");
    r.observe();
    assert!(matches!(r.assignment().1, Step::Green { .. }));

    for (module, why) in [
        (missing("tests/t1.sql", "tests/helpers.js"), "a test path"),
        (missing("tests/t1.sql", "consort.toml"), "the harness"),
        (
            missing("tests/t1.sql", "node_modules/x/index.js"),
            "a dependency",
        ),
        (missing("tests/t0.sql", "src/orders.js"), "another file's"),
    ] {
        let (v, _) = red(module, &[(load, TestStatus::Failed)]);
        assert_eq!(
            v.expect_err(why),
            RuleViolation::RedTestNotRun {
                test: "tests/t1.sql".into(),
                failed_elsewhere: vec![load.into()],
            },
            "{why}"
        );
    }
    let (v, _) = red(
        missing("tests/t1.sql", "src/orders.js"),
        &[
            (load, TestStatus::Failed),
            ("tests/t0.sql", TestStatus::Failed),
        ],
    );
    assert_eq!(
        v.expect_err("an earlier test broke"),
        RuleViolation::RedBrokeGreenTest {
            tests: vec!["tests/t0.sql".into()],
            migrations: vec!["0001".into()],
        }
    );
}

/// A load failure that keeps every test from running (cargo builds every test target before it
/// runs one) leaves the earlier tests not run because of the RED; one that stops only its own
/// file does not excuse an earlier test in another file that did not run.
#[test]
fn a_load_failure_that_stops_every_test_leaves_every_test_not_run_because_of_the_red() {
    let red_of_t2 = |stops_every_test: bool| {
        let mut r = Run::at_build();
        r.full_test("tests/t1.sql", &[]);
        r.observe();
        r.write_and_apply("tests/t2.sql", "x");
        let mut receipt = r.receipt(&[(TestOutcome::WHOLE_RUN, TestStatus::Errored)], 101);
        receipt.missing_modules = vec![MissingModule {
            outcome: TestOutcome::WHOLE_RUN.into(),
            test_file: "tests/t2.sql".into(),
            module: "src/lib.rs".into(),
            stops_every_test,
        }];
        r.feed(Event::VerifyCompleted { receipt })
    };
    red_of_t2(true).expect("a RED: nothing ran because of it");
    assert_eq!(
        red_of_t2(false).expect_err("T1 did not run"),
        RuleViolation::RedBrokeGreenTest {
            tests: vec!["tests/t1.sql".into()],
            migrations: vec!["0002".into()],
        }
    );
}

#[test]
fn an_accepted_red_freezes_its_test_files() {
    let r = Run::at_green();
    assert_eq!(
        r.s.build.frozen_tests.keys().collect::<Vec<_>>(),
        vec!["tests/t1.sql"]
    );
    assert!(matches!(r.assignment().1, Step::Green { .. }));
}

// ---------- paths as they resolve on disk ----------

fn set(changes: Vec<FileChange>) -> ChangeSet {
    ChangeSet {
        summary: "c".into(),
        changes,
    }
}

#[test]
fn a_change_set_is_judged_again_by_the_files_its_paths_reach() {
    let mut r = Run::at_green();
    r.produce(cs(vec![write("src/link/t1.sql", "weakened")]))
        .expect("spelled, it is code");
    assert!(matches!(r.pending(), Pending::Apply { .. }));
    // What the conductor finds each path reaching on disk, and what the machine says of it:
    // exactly what a direct write of that file gets.
    for (reached, want) in [
        (
            "tests/t1.sql",
            RuleViolation::FrozenTestModified {
                path: "tests/t1.sql".into(),
            },
        ),
        (
            "tests/new.sql",
            RuleViolation::TouchesTests {
                path: "tests/new.sql".into(),
            },
        ),
        (
            "consort.toml",
            RuleViolation::TouchesHarness {
                path: "consort.toml".into(),
            },
        ),
        (
            "run-tests.sh",
            RuleViolation::TouchesHarness {
                path: "run-tests.sh".into(),
            },
        ),
        (
            ".git/hooks/pre-commit",
            RuleViolation::TouchesHarness {
                path: ".git/hooks/pre-commit".into(),
            },
        ),
        (
            "src/__pycache__/a.pyc",
            RuleViolation::TouchesUnhashed {
                path: "src/__pycache__/a.pyc".into(),
                dir: "__pycache__".into(),
            },
        ),
    ] {
        let resolved = set(vec![write("src/a.sql", "ok"), write(reached, "x")]);
        assert_eq!(
            r.m.check_resolved(&r.s, &resolved, &Default::default()),
            Err(want),
            "{reached}"
        );
    }
    let fine = set(vec![write("src/real/t1.sql", "code")]);
    assert_eq!(
        r.m.check_resolved(&r.s, &fine, &Default::default()),
        Ok(fine.clone())
    );
}

#[test]
fn a_red_through_a_link_to_a_non_test_is_non_test_in_red() {
    let mut r = Run::at_build();
    r.produce(cs(vec![
        write("tests/t1.sql", "x"),
        write("tests/lib/helper.sql", "y"),
    ]))
    .expect("spelled, both are tests");
    let resolved = set(vec![
        write("tests/t1.sql", "x"),
        write("src/helper.sql", "y"),
    ]);
    assert_eq!(
        r.m.check_resolved(&r.s, &resolved, &Default::default()),
        Err(RuleViolation::NonTestInRed {
            path: "src/helper.sql".into()
        })
    );
    // The entry's test file itself reaching another test file is not writing it.
    let resolved = set(vec![write("tests/t9.sql", "x")]);
    assert_eq!(
        r.m.check_resolved(&r.s, &resolved, &Default::default()),
        Err(RuleViolation::RedMissingTest {
            path: "tests/t1.sql".into()
        })
    );
}

#[test]
fn a_denied_apply_lets_the_agent_retry_with_feedback_then_escalates() {
    let mut r = Run::at_green();
    let disk = r.disk.clone();
    let violation = RuleViolation::FrozenTestModified {
        path: "tests/t1.sql".into(),
    };
    let resolved: BTreeMap<String, String> =
        [("src/link/t1.sql".to_string(), "tests/t1.sql".to_string())].into();
    for attempt in 0..=2 {
        let (_, step, got) = r.assignment();
        assert_eq!((step, got), (Step::Green { test: "T1".into() }, attempt));
        r.produce(cs(vec![write("src/link/t1.sql", "weakened")]))
            .expect("spelled, it is code");
        r.ok(Event::ApplyDenied {
            violation: violation.clone(),
            resolved: resolved.clone(),
        });
        assert_eq!(r.disk, disk, "nothing applied");
        if attempt < 2 {
            r.observe();
            let Pending::Agent { feedback, .. } = r.pending() else {
                panic!("expected the Driver again")
            };
            assert!(feedback[0].contains("frozen test"), "{feedback:?}");
            assert!(
                feedback[0].contains("src/link/t1.sql -> tests/t1.sql"),
                "{feedback:?}"
            );
        }
    }
    assert_eq!(r.halted_verdict(), VerdictReason::RuleViolated);
    assert!(
        r.s.receipts.len() == 1 && r.s.build.frozen_tests.len() == 1,
        "only RED's run"
    );
    assert_eq!(r.m.replay(&r.events), r.s, "the ledger alone rebuilds it");
}

#[test]
fn a_path_the_file_system_refuses_is_retried_and_a_refused_revert_halts() {
    let mut r = Run::at_build();
    r.produce(cs(vec![write("tests/t1.sql", "select 1;")]))
        .expect("red");
    r.ok(Event::ApplyDenied {
        violation: RuleViolation::PathNotWritable {
            path: "tests/t1.sql".into(),
            problem: WriteProblem::NameTooLong { len: 300, max: 255 },
        },
        resolved: BTreeMap::new(),
    });
    r.observe();
    assert_eq!(r.assignment().2, 1, "the Navigator tries again");
    // A revert is the machine's own undo: not re-checked, and a refusal of it halts.
    r.write_apply_and_verify("tests/t1.sql", "select 1;", TestStatus::Passed)
        .expect_err("passes without code");
    assert!(matches!(r.pending(), Pending::Revert { .. }));
    let anything = set(vec![write("consort.toml", "x")]);
    assert_eq!(
        r.m.check_resolved(&r.s, &anything, &Default::default()),
        Ok(anything.clone())
    );
    let v = r.refused(Event::ApplyDenied {
        violation: RuleViolation::PathNotWritable {
            path: "tests/t1.sql".into(),
            problem: WriteProblem::Refused {
                op: "delete".into(),
                detail: "permission denied".into(),
            },
        },
        resolved: BTreeMap::new(),
    });
    assert!(matches!(v, RuleViolation::PathNotWritable { .. }));
    assert!(matches!(r.s.status, RunStatus::Halted { .. }));
}

#[test]
fn a_denied_apply_answers_only_a_pending_apply() {
    let mut r = Run::at_build();
    let v = r.refused(Event::ApplyDenied {
        violation: RuleViolation::TouchesTests {
            path: "tests/x.sql".into(),
        },
        resolved: BTreeMap::new(),
    });
    assert!(matches!(v, RuleViolation::StepOutOfOrder { .. }), "{v:?}");
    assert_eq!(r.assignment().2, 0, "the pending RED is untouched");
}

// ---------- receipts ----------

#[test]
fn a_receipt_for_another_request_is_ignored() {
    let mut r = Run::with_red_applied("x");
    let mut receipt = r.receipt(&[("tests/t1.sql", TestStatus::Failed)], 1);
    receipt.request_id = RequestId(77);
    let before = r.s.clone();
    let v = r.refused(Event::VerifyCompleted { receipt });
    assert!(matches!(v, RuleViolation::ReceiptNotForRequest { .. }));
    assert_eq!(r.s, before);
}

/// A receipt for another tree than the one asked for halts as a change outside Consort (no
/// agent is charged), naming the paths that differ when the verifier could tell them, and
/// counting those past the first ten.
#[test]
fn a_receipt_for_another_work_tree_halts_naming_what_changed() {
    let many: Vec<String> = (1..=12).map(|i| format!("logs/run{i:02}.log")).collect();
    for (paths, named) in [
        (Vec::new(), "request and its run: something besides Consort"),
        (vec!["app.log".to_string()], "its run (app.log): something"),
        (many, "logs/run10.log and 2 more)"),
    ] {
        let mut r = Run::with_red_applied("x");
        let mut receipt = r.receipt(&[("tests/t1.sql", TestStatus::Failed)], 1);
        receipt.workspace_hash = ContentHash::of_bytes(b"tampered");
        receipt.changed_since_request = paths.clone();
        let v = r.refused(Event::VerifyCompleted { receipt });
        assert!(
            matches!(&v, RuleViolation::ReceiptWorkspaceMismatch { paths: p, .. } if *p == paths),
            "{v:?}"
        );
        let text = v.to_string();
        assert_contains(&text, named);
        assert_contains(&text, "`consort retry --by NAME`");
        assert!(!text.contains("logs/run11.log"), "{text}");
        assert_eq!(r.halted_reason(), EscalationReason::ChangedOutsideConsort);
    }
}

/// No receipt without a run: a receipt that names no branch or no command (as a base whose
/// migrations failed once produced: "(not run: migrations failed)", its new test "errored")
/// is never a RED nor a GREEN; the run halts as the runner's fault, nothing is frozen or
/// counted, and no agent is charged.
#[test]
fn a_receipt_without_a_run_is_no_red_and_no_green() {
    for missing in ["branch", "command"] {
        let mut r = Run::with_red_applied("x");
        let mut receipt = r.receipt(&[("tests/t1.sql", TestStatus::Errored)], 1);
        match missing {
            "branch" => receipt.branch_id = String::new(),
            _ => receipt.command = " ".into(),
        }
        let request = receipt.request_id;
        let v = r.refused(Event::VerifyCompleted { receipt });
        assert_eq!(
            v,
            RuleViolation::ReceiptWithoutRun {
                request,
                missing: missing.into(),
            }
        );
        let RunStatus::Halted { escalation, .. } = &r.s.status else {
            panic!("a receipt without a run halts, got {:?}", r.s.status);
        };
        assert_eq!(
            escalation.reason,
            EscalationReason::Infrastructure(InfraFault::RunnerFailed),
            "the runner's fault, not the Navigator's"
        );
        assert!(!escalation.reason.is_verdict());
        assert!(r.s.receipts.is_empty(), "no receipt counted");
        assert!(r.s.build.frozen_tests.is_empty(), "nothing frozen");
    }
}

#[test]
fn green_comes_only_from_a_verify_run() {
    let mut r = Run::at_green();
    r.produce(cs(vec![write("src/a.sql", "x")])).expect("green");
    // Skipping the apply and the run: a receipt cannot be accepted while nothing was verified.
    let passed = [("tests/t1.sql", TestStatus::Passed)];
    let receipt = receipt_with(RequestId(99), r.workspace_hash(), &passed, 0, "");
    let v = r.refused(Event::VerifyCompleted { receipt });
    assert!(matches!(
        v,
        RuleViolation::ReceiptNotForRequest { expected: None, .. }
    ));
}

// ---------- GREEN ----------

#[test]
fn green_may_not_touch_tests() {
    let mut r = Run::at_green();
    let v = r.produce_refused(cs(vec![write("tests/t1.sql", "select 1;")]));
    assert_eq!(
        v,
        RuleViolation::FrozenTestModified {
            path: "tests/t1.sql".into()
        }
    );
    r.observe();
    let v = r.produce_refused(cs(vec![FileChange::Delete {
        path: "tests/t1.sql".into(),
    }]));
    assert_eq!(
        v,
        RuleViolation::FrozenTestModified {
            path: "tests/t1.sql".into()
        }
    );
    r.observe();
    let v = r.produce_refused(cs(vec![write("tests/new.sql", "select 1;")]));
    assert_eq!(
        v,
        RuleViolation::TouchesTests {
            path: "tests/new.sql".into()
        }
    );
    assert_eq!(r.halted_verdict(), VerdictReason::RuleViolated);
    assert_eq!(
        r.disk.files.get("tests/t1.sql").map(Vec::as_slice),
        Some(b"assert false;".as_slice())
    );
}

#[test]
fn a_failing_green_goes_to_repair_and_a_passing_repair_to_refactor() {
    let mut r = Run::at_green();
    r.write_apply_and_verify("src/a.sql", "bad", TestStatus::Failed)
        .expect("a red green is a result, not a violation");
    r.observe();
    let (_, step, _) = r.assignment();
    assert_eq!(
        step,
        Step::Repair {
            test: "T1".into(),
            round: 1
        }
    );
    assert!(
        matches!(last_command(&r), Command::Assign { feedback, .. } if feedback[0].contains("tests/t1.sql"))
    );
    r.green(&["tests/t1.sql"]);
    assert_eq!(
        r.assignment().1,
        Step::Refactor {
            test: "T1".into(),
            round: 0
        }
    );
}

/// At T1's GREEN, code that keeps failing until the repair bound is spent: the run halts with
/// that verdict.
fn spend_the_repairs(r: &mut Run) {
    for round in 0..=3 {
        r.write_and_apply("src/a.sql", &format!("bad {round}"));
        r.verify(&[("tests/t1.sql", TestStatus::Failed)])
            .expect("verified");
        if round < 3 {
            r.observe();
        }
    }
    assert_eq!(r.halted_verdict(), VerdictReason::RepairBoundSpent);
}

#[test]
fn the_repair_loop_is_bounded_and_escalates_with_a_verdict() {
    spend_the_repairs(&mut Run::at_green());
}

fn redo(test: &str) -> Event {
    Event::Redone {
        redo: Redo {
            test: test.into(),
            by: "ada".into(),
            reason: "it asks for a total the spec never promised".into(),
        },
    }
}

/// A wrong test the Navigator wrote, accepted because it failed, is written again without
/// redoing the feature: a person sets it aside while the run is halted (here after the
/// repairs were spent on it), the Navigator is asked for T1's RED again with the reason, and
/// may rewrite that frozen file; the redone RED is judged as any RED.
#[test]
fn a_person_has_the_running_entrys_wrong_test_written_again() {
    let mut r = Run::at_green();
    assert_eq!(
        r.refused(redo("T1")),
        RuleViolation::NotHalted,
        "only a halted run takes a redo"
    );
    spend_the_repairs(&mut r);
    let v = r.refused(redo("T2"));
    assert_contains(&v.to_string(), "not the entry the build lane is on");
    r.ok(redo("T1"));
    assert_eq!(r.s.redone.len(), 1);
    r.observe();
    let Command::Assign { step, feedback, .. } = last_command(&r) else {
        panic!("the Navigator is asked again");
    };
    assert_eq!(step, Step::Red { test: "T1".into() });
    assert!(feedback[0].contains("set aside your accepted test of T1"));
    assert!(feedback[0].contains("a total the spec never promised"));
    r.write_and_apply("tests/t1.sql", "assert the right thing;");
    r.verify(&[("tests/t1.sql", TestStatus::Failed)])
        .expect("the redone RED is a RED");
    assert_eq!(r.s.build.redo, None, "set aside no more");
    assert_eq!(
        r.s.build.frozen_tests.get("tests/t1.sql"),
        Some(&ContentHash::of_bytes(b"assert the right thing;")),
        "frozen again, as written again"
    );
    r.observe();
    assert_eq!(r.assignment().1, Step::Green { test: "T1".into() });
}

/// At T1's GREEN, a run with these outcomes and this exit code is no pass: a repair is asked for.
fn assert_green_run_is_not_a_pass(outcomes: &[(&str, TestStatus)], exit: i32) {
    let mut r = Run::at_green();
    r.write_and_apply("src/a.sql", "x");
    let receipt = r.receipt(outcomes, exit);
    r.ok(Event::VerifyCompleted { receipt });
    r.observe();
    assert!(matches!(r.assignment().1, Step::Repair { .. }));
}

#[test]
fn exit_zero_with_a_failing_test_is_not_a_pass() {
    assert_green_run_is_not_a_pass(&[("tests/t1.sql", TestStatus::Failed)], 0);
}

#[test]
fn a_run_that_reports_nothing_is_not_a_pass() {
    assert_green_run_is_not_a_pass(&[], 0);
}

#[test]
fn a_test_file_planted_on_disk_halts_before_the_run() {
    let mut r = Run::at_green();
    r.produce(cs(vec![write("src/a.sql", "x")])).expect("green");
    let original = r.disk.files["tests/t1.sql"].clone();
    r.disk
        .files
        .insert("tests/t1.sql".into(), "edited by someone else".into());
    let e = Event::Applied {
        workspace_hash: r.workspace_hash(),
        tests: r.test_hashes(),
        inverse: ChangeSet::default(),
    };
    let v = r.refused(e);
    let frozen = r.s.build.frozen_tests["tests/t1.sql"];
    assert_eq!(
        v,
        RuleViolation::ChangedOutsideConsort {
            path: "tests/t1.sql".into(),
            expected: frozen,
            found: Some(ContentHash::of_bytes(b"edited by someone else")),
        }
    );
    let told = v.to_string();
    assert!(
        told.contains("tests/t1.sql changed outside Consort")
            && told.contains("git checkout -- tests/t1.sql"),
        "named as a hand edit, with the command that restores it: {told}"
    );
    // Never charged to the Driver whose change set was applied: the halt says whose it is.
    let RunStatus::Halted { escalation, .. } = &r.s.status else {
        panic!("halted");
    };
    assert_eq!(escalation.reason, EscalationReason::ChangedOutsideConsort);
    assert!(!escalation.reason.is_verdict());
    // The human puts the file back and retries: the step goes on where it stopped.
    r.disk.files.insert("tests/t1.sql".into(), original);
    let cmds = r.ok(human(HumanDecision::Retry));
    assert!(!cmds.is_empty(), "the retry issues the step again");
    assert!(!matches!(r.s.status, RunStatus::Halted { .. }));
}

#[test]
fn an_unexpected_test_file_halts_at_observation() {
    let mut r = Run::at_green();
    r.write_apply_and_verify("src/a.sql", "x", TestStatus::Passed)
        .expect("green");
    r.disk.files.insert("tests/sneaky.sql".into(), "x".into());
    let e = Event::Observed {
        design_hash: r.design_on_disk,
        tests: r.test_hashes(),
        migrations: Default::default(),
    };
    assert_eq!(
        r.refused(e),
        RuleViolation::UnexpectedTestFile {
            path: "tests/sneaky.sql".into()
        }
    );
}

#[test]
fn the_projects_own_tests_are_frozen_when_the_build_lane_opens() {
    let mut r = Run::new();
    r.design_lane(false);
    r.approve();
    r.disk
        .files
        .insert("tests/t0_existing.sql".into(), "select 1;".into());
    r.observe();
    assert!(
        r.s.build.frozen_tests.contains_key("tests/t0_existing.sql"),
        "the existing test is frozen"
    );
    let v = r.produce_refused(cs(vec![
        write("tests/t1.sql", "assert false;"),
        write("tests/t0_existing.sql", "-- weakened"),
    ]));
    assert!(
        matches!(v, RuleViolation::FrozenTestModified { ref path } if path == "tests/t0_existing.sql"),
        "{v:?}"
    );
    // Once the lane is open, a test file that appears outside RED still halts:
    // an_unexpected_test_file_halts_at_observation.
}

// ---------- REFACTOR and REVIEW ----------

#[test]
fn a_failing_refactor_is_dropped_and_the_green_code_kept() {
    let mut r = Run::at_green();
    r.green(&["tests/t1.sql"]);
    let green_code = r.disk.files.get("src/code.sql").cloned();
    r.write_apply_and_verify("src/code.sql", "broken refactor", TestStatus::Failed)
        .expect("a failing refactor is a result");
    assert!(matches!(r.pending(), Pending::Revert { .. }));
    r.apply();
    assert_eq!(r.disk.files.get("src/code.sql").cloned(), green_code);
    r.observe();
    assert_eq!(
        r.assignment().1,
        Step::Review {
            test: "T1".into(),
            round: 0
        }
    );
}

/// The review judges what changed since the last review (a reverted refactor is not part of
/// it), and the Driver hears that its refactor was reverted in its next assignment.
#[test]
fn a_reverted_refactor_is_told_to_the_driver_and_left_out_of_the_review() {
    let mut r = Run::at_green();
    r.green(&["tests/t1.sql"]);
    let before = r.s.build.since_review.len();
    assert!(before >= 2, "RED and GREEN change sets: {before}");
    r.write_and_apply("src/code.sql", "broken refactor");
    let mut receipt = r.receipt(&[("tests/t1.sql", TestStatus::Failed)], 1);
    receipt.output_excerpt = "ERROR: function adjust_stock does not exist".into();
    r.feed(Event::VerifyCompleted { receipt })
        .expect("a failing refactor is a result");
    r.apply();
    r.observe();
    assert_eq!(
        r.s.build.since_review.len(),
        before,
        "the reverted refactor is left out"
    );
    let reasons = vec!["name the function after what it does".to_string()];
    r.produce(Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested {
        reasons: reasons.clone(),
    }))
    .expect("changes requested");
    r.observe();
    let Command::Assign { step, feedback, .. } = last_command(&r) else {
        panic!("the Driver is asked to refactor again");
    };
    assert_eq!(
        step,
        Step::Refactor {
            test: "T1".into(),
            round: 1
        }
    );
    let text = feedback.join("\n");
    assert!(text.contains("refactor was reverted"), "{text}");
    assert!(text.contains("adjust_stock does not exist"), "{text}");
    assert!(text.contains(&reasons[0]), "{text}");
    assert!(r.s.build.driver_notes.is_empty(), "told once");
}

#[test]
fn the_author_never_reviews_its_own_code() {
    let mut r = Run::at_green();
    // One actor instance, "solo", is set up to play both the Driver and the Navigator.
    r.produce_as(
        ActorId::new(Role::Driver, "solo"),
        cs(vec![write("src/a.sql", "x")]),
    )
    .expect("green");
    r.apply();
    r.verify(&[("tests/t1.sql", TestStatus::Passed)])
        .expect("green");
    r.observe();
    r.produce(cs(vec![])).expect("refactor");
    r.observe();
    let review = Artifact::ReviewVerdict(ReviewVerdict::Approve { notes: vec![] });
    let v = r
        .produce_as(ActorId::new(Role::Navigator, "solo"), review)
        .expect_err("refused");
    assert_eq!(
        v,
        RuleViolation::ReviewerIsAuthor {
            reviewer: ActorId::new(Role::Navigator, "solo")
        }
    );
    assert!(matches!(r.s.status, RunStatus::Halted { .. }));
    assert_eq!(r.s.build.completed, 0, "the review did not count");
}

#[test]
fn a_change_request_sends_the_driver_back_to_refactor_a_bounded_number_of_times() {
    let mut r = Run::at_green();
    r.green(&["tests/t1.sql"]);
    r.produce(cs(vec![])).expect("refactor");
    r.observe();
    for round in 1..=3 {
        r.produce(Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested {
            reasons: vec!["naming".into()],
        }))
        .expect("review");
        if round <= 2 {
            r.observe();
            assert_eq!(
                r.assignment().1,
                Step::Refactor {
                    test: "T1".into(),
                    round
                }
            );
            r.produce(cs(vec![])).expect("refactor");
            r.observe();
        }
    }
    assert_eq!(r.halted_verdict(), VerdictReason::ReviewBoundSpent);
}

#[test]
fn an_approved_review_moves_to_the_next_test() {
    let mut r = Run::at_build();
    r.full_test("tests/t1.sql", &[]);
    let cmds = r.observe();
    assert!(
        matches!(&cmds[..], [Command::Assign { step: Step::Red { test }, .. }] if test == "T2")
    );
    assert_eq!(r.s.build.completed, 1);
    assert!(r.s.build.code_authors.is_empty());
}

// ---------- deploy, promote, done ----------

#[test]
fn after_the_last_test_the_deploy_gate_waits_for_the_release_evidence_hash() {
    let mut r = Run::new();
    r.reach_deploy_gate();
    let (gate, hash) = r.gate_hash();
    assert_eq!(gate, GateKind::Deploy);
    assert_eq!(
        hash,
        ContentHash::of(&r.s.release_evidence().expect("evidence"))
    );
}

#[test]
fn the_deploy_run_covers_every_test_and_every_migration() {
    let mut r = Run::new();
    r.reach_deploy_gate();
    r.approve();
    let cmds = r.observe();
    match &cmds[..] {
        [
            Command::Verify {
                purpose: VerifyPurpose::Deploy,
                migrations,
                tests,
                ..
            },
        ] => {
            assert_eq!(migrations.len(), 2);
            assert_eq!(tests.len(), 2);
        }
        other => panic!("expected the deploy verify, got {other:?}"),
    }
}

#[test]
fn a_build_run_gets_only_the_migrations_of_stories_so_far() {
    let mut r = Run::at_build();
    let cmds = r.write_and_apply("tests/t1.sql", "x");
    match &cmds[..] {
        [
            Command::Verify {
                migrations, focus, ..
            },
        ] => {
            assert_eq!(
                migrations
                    .iter()
                    .map(|m| m.version.as_str())
                    .collect::<Vec<_>>(),
                vec!["0001"]
            );
            assert_eq!(focus.as_deref(), Some("tests/t1.sql"));
        }
        other => panic!("expected verify, got {other:?}"),
    }
}

#[test]
fn promotion_needs_the_promote_gate() {
    let mut r = Run::new();
    r.reach_deploy_run();
    r.deploy_run(TestStatus::Passed).expect("deploy");
    let v = r.refused(promoted(RequestId(1), &[]));
    assert_eq!(
        v,
        RuleViolation::GateNotApproved {
            gate: GateKind::Promote
        }
    );
}

#[test]
fn an_unverified_promotion_halts() {
    let mut r = Run::new();
    let request = r.reach_promote();
    let v = r.refused(promoted(request, &["0001"]));
    assert!(matches!(v, RuleViolation::PromoteUnverified { .. }));
    assert!(matches!(r.s.status, RunStatus::Halted { .. }));
}

#[test]
fn a_red_deploy_run_halts_with_a_verdict() {
    let mut r = Run::new();
    r.reach_deploy_run();
    r.deploy_run(TestStatus::Failed).expect("a result");
    assert_eq!(r.halted_verdict(), VerdictReason::TestsRed);
}

#[test]
fn the_whole_lifecycle_reaches_done() {
    let mut r = Run::new();
    r.reach_done();
    assert_eq!(r.s.phase(), Phase::Done);
    assert_eq!(r.s.approvals.len(), 3);
    assert!(matches!(last_command(&r), Command::Finish));
    assert_eq!(r.refused(start()), RuleViolation::Finished);
}

// ---------- infrastructure faults and humans ----------

#[test]
fn an_infrastructure_fault_escalates_as_such_and_a_retry_reissues_the_step() {
    let mut r = Run::with_red_applied("x");
    let Pending::Verify { request, .. } = r.pending() else {
        panic!("verify pending")
    };
    r.ok(Event::VerifyFailed {
        request,
        error: InfraError {
            fault: InfraFault::DatabaseDown,
            detail: "refused".into(),
        },
    });
    assert_eq!(
        r.halted_reason(),
        EscalationReason::Infrastructure(InfraFault::DatabaseDown)
    );
    assert_eq!(r.s.phase(), Phase::Halted);
    let cmds = r.ok(human(HumanDecision::Retry));
    assert!(matches!(&cmds[..], [Command::Verify { request: again, .. }] if *again == request));
}

#[test]
fn an_agent_failure_escalates_and_a_human_can_stop_the_run() {
    let mut r = Run::new();
    r.ok(start());
    let (aid, _, _) = r.assignment();
    r.ok(model_unavailable(aid));
    assert_eq!(
        r.halted_reason(),
        EscalationReason::Infrastructure(InfraFault::ModelServerFailing)
    );
    let v = r.refused(Event::Gate {
        approval: approval(GateKind::Design, ContentHash::of_bytes(b"")),
    });
    assert!(matches!(v, RuleViolation::StepOutOfOrder { .. }));
    r.ok(human(HumanDecision::Stop));
    assert_eq!(r.s.phase(), Phase::Stopped);
}

#[test]
fn a_retry_needs_a_halt() {
    let mut r = Run::new();
    r.ok(start());
    assert_eq!(
        r.refused(human(HumanDecision::Retry)),
        RuleViolation::NotHalted
    );
    assert_eq!(
        r.s.phase(),
        Phase::Design,
        "a refused retry changes nothing"
    );
}

#[test]
fn a_human_can_stop_a_run_that_was_interrupted_mid_step_or_waits_at_a_gate() {
    // Interrupted in the build lane, a verification in flight: the ledger shows it running.
    let mut r = Run::with_red_applied("x");
    assert!(
        matches!(r.pending(), Pending::Verify { .. }),
        "verify pending"
    );
    assert_eq!(r.s.phase(), Phase::Build);
    // The answer the interrupted step would have had.
    let late = r.receipt(&[("tests/t1.sql", TestStatus::Failed)], 1);
    let cmds = r.ok(human(HumanDecision::Stop));
    assert_eq!(cmds, vec![Command::Finish]);
    assert_eq!(r.s.phase(), Phase::Stopped);
    assert_eq!(r.s.pending, None, "nothing pending is performed any more");
    // It arrives late and no longer counts.
    assert_eq!(
        r.refused(Event::VerifyCompleted { receipt: late }),
        RuleViolation::Finished
    );
    assert_eq!(
        r.refused(human(HumanDecision::Retry)),
        RuleViolation::Finished
    );

    // Waiting at the design gate.
    let mut r = Run::new();
    r.design_lane(false);
    assert!(r.s.pending_gate().is_some());
    r.ok(human(HumanDecision::Stop));
    assert_eq!(r.s.phase(), Phase::Stopped);
    assert_eq!(r.s.pending_gate(), None, "the gate no longer waits");
    assert!(r.s.approvals.is_empty(), "a stop approves nothing");
    let replayed = r.m.replay(&r.events);
    assert_eq!(replayed, r.s, "a replay stops the run the same way");
    let stop = r.events.len() - 1;
    assert_eq!(
        r.m.ended_at(&r.events),
        Some(stop),
        "the run ended at the stop"
    );
    assert_eq!(r.m.ended_at(&r.events[..stop]), None, "not before it");
}

/// Once the promotion is approved it may be under way (the merge pushed to the base, the
/// migrations not yet applied): a stop then is refused, and the promotion is finished, never cut
/// in two. At the promote gate, before the approval, a stop still ends the run.
#[test]
fn an_approved_promotion_is_finished_never_stopped_half_way() {
    let mut r = Run::new();
    r.reach_deploy_run();
    r.deploy_run(TestStatus::Passed).expect("deploy");
    let stop = human(HumanDecision::Stop);
    let at_gate =
        r.m.step(&r.s, &stop)
            .expect("at the gate, a stop ends the run");
    assert_eq!(at_gate.0.phase(), Phase::Stopped);
    r.approve();
    // Approved (the tree is observed first, then the promotion asked for), and asked for.
    for observed in [false, true] {
        if observed {
            r.observe();
        }
        let before = r.s.clone();
        let v = r.refused(stop.clone());
        assert_eq!(v, RuleViolation::PromotionUnderWay);
        assert_contains(&v.to_string(), "`consort run` finishes it");
        assert_eq!(r.s, before, "the refused stop changes nothing");
    }
    let Pending::Promote { request } = r.pending() else {
        panic!("the promotion is pending");
    };
    r.ok(promoted(request, &["0001", "0002"]));
    assert_eq!(r.s.phase(), Phase::Done);
}

#[test]
fn rows_after_a_stop_are_found_where_a_replay_would_skip_them() {
    let mut r = Run::with_red_applied("x");
    let late = r.receipt(&[("tests/t1.sql", TestStatus::Failed)], 1);
    r.ok(human(HumanDecision::Stop));
    let stop = r.events.len() - 1;
    // Another process that never read the stop goes on: its rows change no replayed state,
    // but they are there for `consort verify` to fail on.
    let mut events = r.events.clone();
    events.push(Event::VerifyCompleted { receipt: late });
    events.push(human(HumanDecision::Retry));
    assert_eq!(r.m.replay(&events), r.s);
    assert_eq!(r.m.ended_at(&events), Some(stop));
    assert!(events.len() > stop + 1);
}

// ---------- replay and resume ----------

#[test]
fn replaying_the_events_reproduces_the_final_state() {
    let mut r = Run::new();
    r.reach_done();
    let replayed = r.m.replay(&r.events);
    assert_eq!(replayed, r.s);
}

#[test]
fn after_a_crash_at_any_event_the_pending_command_is_the_one_without_a_result() {
    let mut r = Run::new();
    r.reach_deploy_gate();
    for cut in 1..r.events.len() {
        let state = r.m.replay(&r.events[..cut]);
        let Some(cmd) = state.pending_command() else {
            continue;
        };
        // The command a resumed run issues is the last one the uninterrupted run issued for that
        // prefix: recorded results are never asked for again.
        let mut s = State::default();
        let mut last = None;
        for e in &r.events[..cut] {
            if let Ok((next, cmds)) = r.m.step(&s, e) {
                s = next;
                if let Some(c) = cmds
                    .into_iter()
                    .rev()
                    .find(|c| !matches!(c, Command::Escalate { .. } | Command::Finish))
                {
                    last = Some(c);
                }
            }
        }
        assert_eq!(Some(cmd), last, "cut at {cut}");
    }
}

// ---------- property: no done without evidence ----------

fn done_has_its_evidence(s: &State) -> bool {
    if s.status != RunStatus::Done {
        return true;
    }
    let gates_ok = [GateKind::Design, GateKind::Deploy, GateKind::Promote]
        .iter()
        .all(|g| {
            s.approvals
                .iter()
                .any(|a| a.gate == *g && a.decision == GateDecision::Approve)
        });
    let tests_ok = s.test_list.as_ref().is_some_and(|l| {
        l.entries.iter().all(|e| {
            s.receipts.iter().any(|r| {
                r.exit.success() && r.status_of(e.runner_name()) == Some(TestStatus::Passed)
            })
        })
    });
    gates_ok && tests_ok && s.promotion.as_ref().is_some_and(|p| p.verified)
}

/// Produces a plausible next event for the pending state, perturbed by `choice`.
fn next_event(r: &Run, choice: u8) -> Event {
    let bad_hash = ContentHash::of_bytes(&[choice]);
    match (&r.s.status, r.s.pending.clone()) {
        (RunStatus::Idle, _) => start(),
        (RunStatus::Halted { .. }, _) => Event::Human {
            decision: if choice.is_multiple_of(4) {
                HumanDecision::Stop
            } else {
                HumanDecision::Retry
            },
            by: "p".into(),
        },
        (_, None) => start(),
        (_, Some(Pending::Agent { id: aid, step, .. })) => {
            let artifact = agent_artifact(r, &step, choice);
            let role = if choice.is_multiple_of(11) {
                Role::Driver
            } else {
                step.role()
            };
            Event::Produced {
                assignment: aid,
                author: id(role),
                artifact,
                usage: Default::default(),
                transcript: None,
            }
        }
        (_, Some(Pending::Observe { .. })) => Event::Observed {
            design_hash: if choice.is_multiple_of(13) {
                Some(bad_hash)
            } else {
                r.design_on_disk
            },
            tests: r.test_hashes(),
            migrations: Default::default(),
        },
        (_, Some(Pending::Apply { .. } | Pending::Revert { .. })) => Event::Applied {
            workspace_hash: r.workspace_hash(),
            tests: r.test_hashes(),
            inverse: ChangeSet::default(),
        },
        (_, Some(Pending::Verify { .. })) => Event::VerifyCompleted {
            receipt: perturbed_receipt(r, choice),
        },
        (_, Some(Pending::Baseline { request, .. })) => Event::VerifyCompleted {
            receipt: receipt_with(request, r.workspace_hash(), &[], 0, "baseline"),
        },
        (_, Some(Pending::Gate { gate, hash })) => {
            let hash = if choice.is_multiple_of(7) {
                bad_hash
            } else {
                hash
            };
            Event::Gate {
                approval: approval(gate, hash),
            }
        }
        (_, Some(Pending::Promote { request })) => Event::Promoted {
            report: PromoteReport {
                request_id: request,
                target: "p".into(),
                applied: if choice.is_multiple_of(3) {
                    vec![]
                } else {
                    vec!["0001".into(), "0002".into()]
                },
                already_applied: vec![],
                verified: !choice.is_multiple_of(5),
                merge_check: None,
            },
        },
    }
}

/// A plausible (or perturbed) answer of the agent assigned `step`.
fn agent_artifact(r: &Run, step: &Step, choice: u8) -> Artifact {
    match (step, choice % 5) {
        (_, 0) => Artifact::Spec(spec()),
        (Step::Stories, _) => Artifact::Stories(stories(choice.is_multiple_of(2))),
        (Step::Spec { .. }, _) => Artifact::Spec(spec()),
        (Step::Architecture { .. }, 1) => {
            Artifact::ArchitectureVerdict(ArchitectureVerdict::Revise {
                reasons: vec!["r".into()],
            })
        }
        (Step::Architecture { .. }, _) => Artifact::ArchitectureVerdict(approve_arch()),
        (Step::Schema, _) => Artifact::SchemaPlan(schema()),
        (Step::TestList, _) => Artifact::TestList(test_list()),
        (Step::Ux, _) => Artifact::UxDesign(ux()),
        (Step::Red { .. }, 1) => cs(vec![write("src/x.sql", "x")]),
        (Step::Red { .. }, _) => {
            let path =
                r.s.current_test()
                    .map(|e| e.path.clone())
                    .unwrap_or_default();
            cs(vec![write(&path, "t")])
        }
        (Step::Review { .. }, 1) => Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested {
            reasons: vec!["x".into()],
        }),
        (Step::Review { .. }, _) => {
            Artifact::ReviewVerdict(ReviewVerdict::Approve { notes: vec![] })
        }
        (_, 1) => cs(vec![write("tests/t1.sql", "cheat")]),
        (_, _) => cs(vec![write("src/x.sql", &format!("{choice}"))]),
    }
}

/// A receipt for the pending verify run, its outcomes (and sometimes its request) perturbed.
fn perturbed_receipt(r: &Run, choice: u8) -> TestRunReceipt {
    let names: Vec<String> =
        r.s.test_list
            .as_ref()
            .map(|l| {
                l.entries
                    .iter()
                    .map(|e| e.runner_name().to_string())
                    .collect()
            })
            .unwrap_or_default();
    let status = |i: usize| {
        if (choice as usize >> (i % 8)) & 1 == 1 {
            TestStatus::Passed
        } else {
            TestStatus::Failed
        }
    };
    let outcomes: Vec<(&str, TestStatus)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), status(i)))
        .collect();
    let mut receipt = r.receipt(&outcomes, if choice.is_multiple_of(3) { 1 } else { 0 });
    if choice.is_multiple_of(17) {
        receipt.request_id = RequestId(9999);
    }
    receipt
}

impl Run {
    /// Feeds an event, applying change sets to the fake disk as the conductor would.
    fn feed_any(&mut self, e: Event) {
        let e = match e {
            Event::Applied { .. } => self.write_pending().unwrap_or(e),
            other => other,
        };
        let _ = self.feed(e);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_runs_never_panic_and_never_finish_without_evidence(choices in proptest::collection::vec(any::<u8>(), 1..400)) {
        let mut r = Run::new();
        for c in choices {
            let e = next_event(&r, c);
            r.feed_any(e);
            prop_assert!(done_has_its_evidence(&r.s), "done without evidence");
            if matches!(r.s.status, RunStatus::Done | RunStatus::Stopped) {
                break;
            }
        }
        prop_assert_eq!(r.m.replay(&r.events), r.s.clone());
    }

    #[test]
    fn arbitrary_events_in_any_state_never_panic(kinds in proptest::collection::vec((0u8..14, any::<u64>()), 1..60)) {
        let m = Machine::default();
        let mut s = State::default();
        for (k, n) in kinds {
            let h = ContentHash::of_bytes(&n.to_le_bytes());
            let e = match k {
                0 => Event::Start { feature: feature(), inherited: Default::default(), per_step: Default::default(), harness: None },
                1 => Event::Produced { assignment: AssignmentId(n % 5), author: id(Role::ALL[(n % 8) as usize]), artifact: Artifact::Stories(stories(n % 2 == 0)), usage: Default::default(), transcript: None },
                2 => Event::AgentFailed { assignment: AssignmentId(n % 5), failure: AgentFailure::Timeout { secs: n }, role: None, usage: Default::default() },
                3 => Event::Refused { violation: RuleViolation::NotHalted, run_output: None },
                4 => Event::Observed { design_hash: Some(h), tests: FileHashes::new(), migrations: Default::default() },
                5 => Event::Applied { workspace_hash: h, tests: FileHashes::new(), inverse: ChangeSet::default() },
                6 => Event::ApplyRefused { reason: PathError::Empty },
                7 => Event::VerifyFailed { request: RequestId(n % 4), error: InfraError { fault: InfraFault::DatabaseDown, detail: String::new() } },
                8 => Event::Gate { approval: approval(GateKind::Design, h) },
                9 => Event::Promoted { report: PromoteReport { request_id: RequestId(n % 4), target: String::new(), applied: vec![], already_applied: vec![], verified: n % 2 == 0, merge_check: None } },
                10 => Event::PromoteFailed { request: RequestId(n % 4), error: InfraError { fault: InfraFault::DatabaseDown, detail: String::new() } },
                11 => Event::Human { decision: HumanDecision::Retry, by: String::new() },
                12 => Event::ApplyDenied { violation: RuleViolation::TouchesTests { path: "tests/x".into() }, resolved: BTreeMap::new() },
                _ => Event::Refused { violation: RuleViolation::FrozenTestModified { path: "x".into() }, run_output: None },
            };
            if let Ok((next, _)) = m.step(&s, &e) {
                s = next;
            }
            prop_assert!(s.status != RunStatus::Done);
        }
    }
}

// ---------- invariants ----------

#[test]
fn an_impossible_state_halts_with_a_typed_internal_reason() {
    let m = Machine::default();
    // Running with nothing pending: no lifecycle leads there.
    let nothing = State {
        status: RunStatus::Running,
        ..State::default()
    };
    let v = m.step(&nothing, &start()).expect_err("refused");
    assert!(matches!(v, RuleViolation::Invariant { .. }), "{v:?}");
    assert_eq!(v.remedy(), Remedy::Halt);

    // Stories assigned although no feature request was accepted: the answer cannot be judged.
    let no_feature = State {
        status: RunStatus::Running,
        pending: Some(Pending::Agent {
            id: AssignmentId(1),
            step: Step::Stories,
            attempt: 0,
            feedback: Vec::new(),
        }),
        next_assignment: 1,
        ..State::default()
    };
    let v = m
        .step(
            &no_feature,
            &Event::Produced {
                assignment: AssignmentId(1),
                author: id(Role::ProductOwner),
                artifact: Artifact::Stories(stories(false)),
                usage: Default::default(),
                transcript: None,
            },
        )
        .expect_err("refused");
    assert!(matches!(v, RuleViolation::Invariant { .. }), "{v:?}");
    // The refusal halts (instead of re-issuing the same assignment for ever), and says the
    // fault is Consort's own, not the work's.
    let (halted, commands) = m
        .step(
            &no_feature,
            &Event::Refused {
                violation: v,
                run_output: None,
            },
        )
        .expect("the refusal is recorded");
    let RunStatus::Halted { escalation, .. } = &halted.status else {
        panic!("expected a halt, got {:?}", halted.status);
    };
    assert_eq!(
        escalation.reason,
        EscalationReason::Infrastructure(InfraFault::InvariantBroken)
    );
    assert!(matches!(commands.as_slice(), [Command::Escalate { .. }]));
}

#[test]
fn a_resume_point_names_the_assignment_its_retry_issues() {
    let mut r = Run::new();
    r.feed(start()).expect("start");
    let (aid, step, _) = r.assignment();
    r.ok(model_unavailable(aid));
    let RunStatus::Halted { resume, .. } = r.s.status.clone() else {
        panic!("expected a halt");
    };
    let Pending::Agent { id: resumed, .. } = *resume else {
        panic!("expected an agent to resume");
    };
    r.ok(human(HumanDecision::Retry));
    let (retried, again, attempt) = r.assignment();
    assert_eq!((retried, again, attempt), (resumed, step, 0));
    assert_ne!(retried, aid, "a retry is a new assignment");
}

#[test]
fn a_phase_reads_as_its_serialised_name() {
    for phase in Phase::ALL {
        let json = serde_json::to_value(phase).expect("serialises");
        assert_eq!(json.as_str(), Some(phase.to_string().as_str()), "{phase:?}");
    }
}

/// The phase before and after each event of `events`, replayed by `machine`.
fn phase_changes(machine: &Machine, events: &[Event]) -> Vec<(Phase, Phase)> {
    let mut state = State::default();
    let mut out = Vec::new();
    for e in events {
        let (next, _) = machine.step(&state, e).expect("the run replays");
        out.push((state.phase(), next.phase()));
        state = next;
    }
    out
}

fn assert_edges(changes: &[(Phase, Phase)]) {
    let edges = lifecycle_edges();
    for (from, to) in changes.iter().filter(|(from, to)| from != to) {
        assert!(
            edges.iter().any(|e| e.from == *from && e.to == *to),
            "the machine moved from {from} to {to}, which is no edge of the lifecycle"
        );
    }
}

#[test]
fn every_phase_change_of_a_simulated_run_is_an_edge_of_the_lifecycle() {
    use consort_testkit::simulation::{Script, Simulation};
    let mut taken = Vec::new();
    for script in [
        Script::default(),
        Script {
            tests: 2,
            revisions: 0,
            user_facing: false,
            real_refactors: false,
        },
    ] {
        let sim = Simulation::new(script);
        let machine = sim.machine.clone();
        let (events, _) = sim.run();
        let changes = phase_changes(&machine, &events);
        assert_edges(&changes);
        taken.extend(changes);
    }
    // The happy path takes every edge between two phases that neither halts nor stops.
    for e in lifecycle_edges() {
        let side = |p: Phase| matches!(p, Phase::Halted | Phase::Stopped);
        if e.from != e.to && !side(e.from) && !side(e.to) {
            assert!(
                taken.contains(&(e.from, e.to)),
                "no simulated run took the edge {} → {} ({})",
                e.from,
                e.to,
                e.label
            );
        }
    }
}

#[test]
fn a_rejection_a_retry_and_a_stop_are_edges_of_the_lifecycle() {
    use consort_testkit::simulation::{Script, Simulation};
    let mut sim = Simulation::new(Script {
        tests: 1,
        revisions: 0,
        user_facing: false,
        real_refactors: false,
    });
    sim.feed(start());
    let mut rejected = false;
    while sim.state.status == RunStatus::Running {
        let cmd = sim.state.pending_command().expect("a pending command");
        match &cmd {
            Command::AwaitGate { gate, hash } if !rejected => {
                sim.design_on_disk = Some(*hash);
                let mut no = approval(*gate, *hash);
                no.decision = GateDecision::Reject {
                    reason: "name the invariants".into(),
                };
                sim.feed(Event::Gate { approval: no });
                assert_eq!(sim.state.phase(), Phase::Halted);
                sim.feed(human(HumanDecision::Retry));
                rejected = true;
            }
            Command::AwaitGate {
                gate: GateKind::Deploy,
                ..
            } => sim.feed(human(HumanDecision::Stop)),
            _ => {
                let e = sim.answer(cmd);
                sim.feed(e);
            }
        }
    }
    assert_eq!(sim.state.status, RunStatus::Stopped);
    let changes = phase_changes(&sim.machine, &sim.events);
    for expected in [
        (Phase::DesignGate, Phase::Halted),
        (Phase::Halted, Phase::DesignGate),
        (Phase::DeployGate, Phase::Stopped),
    ] {
        assert!(changes.contains(&expected), "{expected:?} not taken");
    }
    assert_edges(&changes);
}

#[test]
fn the_lifecycle_has_every_phase() {
    let edges = lifecycle_edges();
    for phase in Phase::ALL {
        assert!(
            edges.iter().any(|e| e.from == phase || e.to == phase),
            "{phase} is on no edge"
        );
    }
}
