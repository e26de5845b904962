//! Conductor tests with in-process doubles: role actors answering from a function, and a
//! Lakebase actor that "runs" tests by reading the work tree. (The real role actors and the real
//! Lakebase actor live in their own crates and are tested there and end to end.)
//!
//! Test semantics of the double: a test file `tests/<x>.sql` containing `need: TOKEN` passes
//! when some file under `src/` contains `TOKEN`.

mod supervision;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr};

use consort_actors::*;
use consort_testkit::actors::{FnActor, FnApprover};
use consort_testkit::artifacts as kit;
use consort_testkit::assert::{denials, undos};
// Not at the crate root today: the orchestrator re-exports them there.
use consort_actors::HumanDecision;
use consort_actors::Ledger;
use consort_actors::{
    APPLY_JOURNAL, DESIGN_FILE, DirectLakebase, DirectRole, RoleEndpoint, SupervisedRole,
    record_gate_decision, record_human_decision,
};
use consort_actors::{ChildSpec, Supervised};
type Answer = Arc<dyn Fn(&Assignment) -> Artifact + Send + Sync>;

/// A role actor playing `id` that answers every assignment with `answer`.
fn fn_role(id: ActorId, answer: Answer) -> FnActor<RoleMsg> {
    consort_testkit::actors::role(id, move |a| Ok(answer(a)))
}

#[derive(Clone, Default)]
struct FakeLakebase {
    served: Arc<Mutex<Vec<RequestId>>>,
    fail_next: Arc<AtomicUsize>,
    /// What those failures are (DatabaseDown unless set).
    fail_with: Arc<Mutex<Option<InfraFault>>>,
    /// The SQL of every migration each verification and promotion was given, in order.
    migrations: Arc<Mutex<Vec<Vec<String>>>>,
}

fn run_tests(root: &Path) -> Vec<TestOutcome> {
    let read_dir = |d: &str| -> Vec<(String, String)> {
        let mut out = vec![];
        if let Ok(rd) = std::fs::read_dir(root.join(d)) {
            for e in rd.flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                out.push((format!("{d}/{}", e.file_name().to_string_lossy()), text));
            }
        }
        out.sort();
        out
    };
    let code: String = read_dir("src").into_iter().map(|(_, t)| t).collect();
    read_dir("tests")
        .into_iter()
        .map(|(name, text)| {
            let ok = text
                .lines()
                .filter_map(|l| l.strip_prefix("need: "))
                .all(|token| code.contains(token.trim()));
            let status = if ok {
                TestStatus::Passed
            } else {
                TestStatus::Failed
            };
            TestOutcome::new(name, status)
        })
        .collect()
}

impl FakeLakebase {
    /// The verify requests served so far, in order.
    fn served(&self) -> Vec<RequestId> {
        self.served.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn record_migrations(&self, migrations: &[Migration]) {
        let sql = migrations.iter().map(|m| m.sql.clone()).collect();
        self.migrations.lock().map(|mut m| m.push(sql)).ok();
    }

    /// The actor: clones share what it served and the failures still to come.
    fn actor(&self) -> FnActor<LakebaseMsg> {
        let this = self.clone();
        FnActor::new(move |msg| this.serve(msg))
    }

    fn serve(&self, msg: LakebaseMsg) -> Result<(), ActorProcessingErr> {
        match msg {
            LakebaseMsg::Verify(req, port) => {
                if self.fail_next.load(Ordering::SeqCst) > 0 {
                    self.fail_next.fetch_sub(1, Ordering::SeqCst);
                    let fault = self
                        .fail_with
                        .lock()
                        .ok()
                        .and_then(|f| f.clone())
                        .unwrap_or(InfraFault::DatabaseDown);
                    let _ = port.send(Err(InfraError {
                        fault,
                        detail: "down".into(),
                    }));
                    return Ok(());
                }
                self.served.lock().map(|mut s| s.push(req.id)).ok();
                self.record_migrations(&req.migrations);
                let outcomes = run_tests(&req.work_tree);
                let failed = outcomes.iter().any(|o| o.status != TestStatus::Passed);
                let hash = WorkTree::open(&req.work_tree)?
                    .with_filter(consort_actors::TreeFilter::new(&req.caches))
                    .hash()?;
                let mut receipt = kit::receipt_with(req.id, hash, &[], i32::from(failed), "");
                receipt.provider = "fake".into();
                receipt.branch_id = format!("consort-fake-{}", req.id.0);
                receipt.runner = "fake".into();
                receipt.command = "fake".into();
                receipt.outcomes = outcomes;
                let _ = port.send(Ok(receipt));
            }
            LakebaseMsg::Promote(req, port) => {
                self.record_migrations(&req.migrations);
                let _ = port.send(Ok(PromoteReport {
                    request_id: req.id,
                    target: "parent".into(),
                    applied: req.migrations.iter().map(|m| m.version.clone()).collect(),
                    already_applied: vec![],
                    verified: true,
                    merge_check: None,
                }));
            }
        }
        Ok(())
    }
}

/// The honest script: each RED needs a token, each GREEN writes it.
fn honest(a: &Assignment) -> Artifact {
    let test = a.inputs.test.clone();
    match &a.step {
        Step::Stories => Artifact::Stories(kit::stories_of(&[(false, 1), (false, 1)])),
        Step::Spec { .. } => Artifact::Spec(kit::spec_of(&["S1-AC1".to_string()])),
        Step::Architecture { .. } => Artifact::ArchitectureVerdict(kit::approve_architecture()),
        Step::Schema => Artifact::SchemaPlan(kit::schema_of(1)),
        Step::TestList => Artifact::TestList(TestList {
            entries: vec![
                kit::entry("T1", "S1-AC1", "tests/t1.sql"),
                kit::entry("T2", "S2-AC1", "tests/t2.sql"),
            ],
        }),
        Step::Ux => Artifact::UxDesign(kit::ux()),
        Step::Red { test: t } => {
            let path = test.map(|e| e.path).unwrap_or_default();
            Artifact::ChangeSet(ChangeSet {
                summary: "red".into(),
                changes: vec![FileChange::Write {
                    path,
                    content: format!("need: token-{t}\n"),
                }],
            })
        }
        Step::Green { test: t } | Step::Repair { test: t, .. } => Artifact::ChangeSet(ChangeSet {
            summary: "green".into(),
            changes: vec![FileChange::Write {
                path: format!("src/{}.sql", t.to_lowercase()),
                content: format!("-- token-{t}\n"),
            }],
        }),
        Step::Refactor { .. } => Artifact::ChangeSet(ChangeSet::default()),
        Step::Review { .. } => Artifact::ReviewVerdict(ReviewVerdict::Approve { notes: vec![] }),
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    lakebase: FakeLakebase,
    crashes: Arc<AtomicUsize>,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            dir: tempfile::tempdir().expect("tempdir"),
            lakebase: FakeLakebase::default(),
            crashes: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn config(&self) -> ConductorConfig {
        let mut c = ConductorConfig::new(self.root());
        c.step_timeout = Duration::from_secs(10);
        c.verify_timeout = Duration::from_secs(10);
        c.gate_timeout = Duration::from_secs(10);
        c
    }

    async fn wiring(
        &self,
        config: ConductorConfig,
        answer: Answer,
        approver: Arc<dyn Approver>,
    ) -> Wiring {
        let mut roles: BTreeMap<Role, Arc<dyn RoleEndpoint>> = BTreeMap::new();
        for role in Role::ALL {
            let id = ActorId::new(role, role.as_str());
            let actor = fn_role(id.clone(), Arc::clone(&answer));
            let handle = Supervised::start(ChildSpec::for_actor(role.as_str(), actor, ()))
                .await
                .expect("role");
            roles.insert(role, Arc::new(SupervisedRole { id, handle }));
        }
        let (lb, _) = Actor::spawn(None, self.lakebase.actor(), ())
            .await
            .expect("lakebase");
        Wiring {
            config,
            feature: Some(FeatureRequest {
                id: "F1".into(),
                title: "t".into(),
                body: "b".into(),
            }),
            inherited: Default::default(),
            harness: None,
            roles,
            lakebase: Arc::new(DirectLakebase { actor: lb }),
            approver,
        }
    }

    async fn run(
        &self,
        answer: Answer,
        approver: Arc<dyn Approver>,
    ) -> Result<RunReport, ConductorError> {
        let w = self.wiring(self.config(), answer, approver).await;
        Conductor::start(w).await?.run().await
    }

    /// Runs `answer` with no approver: the run stops at the first gate, or before.
    async fn run_to_gate(&self, answer: Answer) -> RunReport {
        self.run(answer, Arc::new(StopAtGates)).await.expect("run")
    }

    /// Runs the conductor wired with `config`, `answer` and `approver` to its end.
    async fn run_with(
        &self,
        config: ConductorConfig,
        answer: Answer,
        approver: Arc<dyn Approver>,
    ) -> RunReport {
        let w = self.wiring(config, answer, approver).await;
        Conductor::start(w)
            .await
            .expect("start")
            .run()
            .await
            .expect("run")
    }

    /// Runs the conductor wired with `config` and `answer`, approving every gate, to done
    /// (`why` says why it gets there); its report and the ledger's events.
    async fn run_to_done(
        &self,
        config: ConductorConfig,
        answer: Answer,
        why: &str,
    ) -> (RunReport, Vec<Event>) {
        let report = self.run_with(config, answer, approve_all()).await;
        assert_eq!(report.outcome, RunOutcome::Done, "{why}");
        (report, self.events())
    }

    /// The default configuration with the design's migrations written to `dir`.
    fn with_migration_files(&self, dir: &str, apply: bool, promote: bool) -> ConductorConfig {
        let mut config = self.config();
        config.machine.migration_files = Some(MigrationFiles {
            dir: dir.into(),
            apply_existing: apply,
            promote_existing: promote,
            lane: None,
            tool: None,
        });
        config
    }

    /// Writes the project's existing migration `migrations/<name>` holding `sql`.
    fn existing_migration(&self, name: &str, sql: &str) {
        std::fs::create_dir_all(self.root().join("migrations")).expect("dir");
        std::fs::write(self.root().join("migrations").join(name), sql).expect("migration");
    }

    /// Writes `content` to `path` in the work tree, making the directories it needs.
    fn seed(&self, path: &str, content: &str) {
        let file = self.root().join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(file, content).expect("seed");
    }

    fn ledger(&self) -> PathBuf {
        self.root().join(consort_actors::DEFAULT_LEDGER_PATH)
    }

    fn events(&self) -> Vec<Event> {
        consort_testkit::ledger::events(&self.ledger())
    }
}

/// The hash the design gate waits for; panics unless the run stopped there.
fn design_gate_hash(report: &RunReport) -> ContentHash {
    match &report.outcome {
        RunOutcome::AtGate {
            gate: GateKind::Design,
            hash,
        } => *hash,
        other => panic!("expected the design gate, got {other:?}"),
    }
}

/// Whether the run stopped at `gate`.
fn stopped_at(report: &RunReport, gate: GateKind) -> bool {
    matches!(report.outcome, RunOutcome::AtGate { gate: at, .. } if at == gate)
}

/// Ada, who approves every gate.
fn ada() -> ApproveAs {
    ApproveAs { name: "ada".into() }
}

/// Ada's approval of the design that hashes to `hash`.
async fn ada_approves_design(hash: ContentHash) -> GateApproval {
    ada().approval(&GateRequest {
        gate: GateKind::Design,
        hash,
        summary: String::new(),
    })
}

fn approve_all() -> Arc<dyn Approver> {
    Arc::new(ada())
}

fn answer(f: fn(&Assignment) -> Artifact) -> Answer {
    Arc::new(f)
}

#[tokio::test]
async fn a_whole_lifecycle_runs_to_done_through_real_actors() {
    let fx = Fixture::new();
    let report = fx.run(answer(honest), approve_all()).await.expect("run");
    assert_eq!(report.outcome, RunOutcome::Done);
    assert_eq!(report.state.build.completed, 2);
    assert_eq!(report.state.approvals.len(), 3);
    assert!(fx.root().join("src/t1.sql").exists() && fx.root().join("tests/t2.sql").exists());
    let verify = Ledger::<Event>::verify(fx.ledger()).expect("the chain verifies");
    assert_eq!(verify.entries as usize, report.events_appended);
    assert_eq!(
        Machine::default().replay(&fx.events()),
        report.state,
        "replay reproduces the final state"
    );
    // Every RED and GREEN ran: 2 RED + 2 GREEN + 1 deploy.
    assert_eq!(fx.lakebase.served().len(), 5);
}

#[tokio::test]
async fn without_an_approver_the_run_stops_at_the_design_gate_and_resumes_after_an_approval() {
    let fx = Fixture::new();
    let report = fx.run_to_gate(answer(honest)).await;
    let hash = design_gate_hash(&report);
    assert!(
        fx.root().join(DESIGN_FILE).exists(),
        "the frozen design is on disk for the human"
    );
    let m = Machine::default();
    let mut wrong = ada_approves_design(hash).await;
    wrong.hash = ContentHash::of_bytes(b"stale");
    let err = record_gate_decision(
        &mut Ledger::<Event>::open(fx.ledger()).expect("ledger"),
        &m,
        wrong.clone(),
    )
    .expect_err("a stale hash is refused");
    assert!(
        err.to_string().contains(&hash.to_hex()),
        "the message names the hash that waits: {err}"
    );
    wrong.hash = hash;
    record_gate_decision(
        &mut Ledger::<Event>::open(fx.ledger()).expect("ledger"),
        &m,
        wrong,
    )
    .expect("the right hash is accepted");
    let report = fx.run_to_gate(answer(honest)).await;
    assert!(stopped_at(&report, GateKind::Deploy));
    assert_eq!(report.state.build.completed, 2);
}

/// Stops the conductor right after its `n`-th append, as a crash there would.
#[derive(Debug)]
struct StopAfter(u64);

impl AppendObserver for StopAfter {
    fn appended(&self, index: u64) -> std::ops::ControlFlow<()> {
        if index == self.0 {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    }
}

#[tokio::test]
async fn a_crash_after_any_event_resumes_to_the_same_end_without_redoing_recorded_work() {
    let reference = Fixture::new();
    let full = reference
        .run(answer(honest), approve_all())
        .await
        .expect("run");
    let total = full.events_appended;
    assert!(total > 20);
    for cut in 1..total {
        let fx = Fixture::new();
        let mut config = fx.config();
        config.append_observer = Some(Arc::new(StopAfter(cut as u64)));
        let w = fx.wiring(config, answer(honest), approve_all()).await;
        let crashed = Conductor::start(w).await.expect("start").run().await;
        assert!(
            matches!(crashed, Err(ConductorError::Stopped { appends }) if appends == cut as u64),
            "cut {cut}: the simulated crash stops the run"
        );
        let prefix = fx.events();
        let served_before = fx.lakebase.served();
        fx.lakebase.served.lock().map(|mut s| s.clear()).ok();
        let resumed = fx.run(answer(honest), approve_all()).await.expect("resume");
        assert_eq!(resumed.outcome, RunOutcome::Done, "cut {cut}");
        assert_eq!(resumed.state.build, full.state.build, "cut {cut}");
        assert_eq!(
            resumed.state.receipts.len(),
            full.state.receipts.len(),
            "cut {cut}"
        );
        let recorded: Vec<RequestId> = prefix
            .iter()
            .filter_map(|e| match e {
                Event::VerifyCompleted { receipt } => Some(receipt.request_id),
                _ => None,
            })
            .collect();
        let served_after = fx.lakebase.served();
        for id in &recorded {
            assert!(
                !served_after.contains(id),
                "cut {cut}: {id} was verified again although its receipt was recorded"
            );
        }
        assert!(
            served_before.len() + served_after.len() <= 5 + 1,
            "cut {cut}: at most one verify repeated"
        );
        Ledger::<Event>::verify(fx.ledger()).expect("the chain verifies");
    }
}

#[tokio::test]
async fn an_edited_ledger_line_is_refused_and_the_run_does_not_resume() {
    let fx = Fixture::new();
    fx.run_to_gate(answer(honest)).await;
    let text = std::fs::read_to_string(fx.ledger()).expect("read");
    let edited = text.replacen("\"S1\"", "\"S9\"", 1);
    assert_ne!(text, edited);
    std::fs::write(fx.ledger(), edited).expect("write");
    let err = fx
        .run(answer(honest), Arc::new(StopAtGates))
        .await
        .expect_err("refused");
    assert!(matches!(err, ConductorError::Ledger(_)), "{err}");
}

/// The honest answers, but the agent asked for `step` panics with `message` the first `times`
/// times it is asked.
fn crashing_at(step: Step, times: usize, message: &'static str) -> Answer {
    let crashed = Arc::new(AtomicUsize::new(0));
    Arc::new(move |a: &Assignment| {
        if a.step == step && crashed.fetch_add(1, Ordering::SeqCst) < times {
            panic!("{message}");
        }
        honest(a)
    })
}

#[tokio::test]
async fn a_role_actor_that_panics_is_restarted_and_the_step_retried() {
    let fx = Fixture::new();
    let report = fx
        .run_to_gate(crashing_at(Step::Schema, 1, "the DBA agent crashed"))
        .await;
    assert!(stopped_at(&report, GateKind::Design));
    assert!(report.state.schema.is_some());
    let _ = &fx.crashes;
}

#[tokio::test]
async fn a_role_actor_that_keeps_panicking_escalates_as_an_infrastructure_fault() {
    let fx = Fixture::new();
    let report = fx
        .run_to_gate(crashing_at(
            Step::Spec { revision: 0 },
            usize::MAX,
            "the spec author always crashes",
        ))
        .await;
    match report.outcome {
        RunOutcome::Halted { escalation } => {
            assert_eq!(
                escalation.reason,
                EscalationReason::Infrastructure(InfraFault::ActorCrashing)
            );
            assert!(escalation.detail.contains("crash"), "{}", escalation.detail);
        }
        other => panic!("expected a halt, got {other:?}"),
    }
}

#[tokio::test]
async fn a_failing_database_is_retried_then_escalated_and_a_human_retry_finishes() {
    let fx = Fixture::new();
    fx.lakebase.fail_next.store(1, Ordering::SeqCst);
    let report = fx
        .run(answer(honest), approve_all())
        .await
        .expect("one failure is retried");
    assert_eq!(report.outcome, RunOutcome::Done);
    let fx = Fixture::new();
    fx.lakebase.fail_next.store(2, Ordering::SeqCst);
    let report = fx.run(answer(honest), approve_all()).await.expect("run");
    let RunOutcome::Halted { escalation } = report.outcome else {
        panic!("expected a halt")
    };
    assert_eq!(
        escalation.reason,
        EscalationReason::Infrastructure(InfraFault::DatabaseDown)
    );
    consort_actors::record_human_decision(
        &mut Ledger::<Event>::open(fx.ledger()).expect("ledger"),
        &Machine::default(),
        HumanDecision::Retry,
        "ada",
    )
    .expect("retry");
    let report = fx.run(answer(honest), approve_all()).await.expect("run");
    assert_eq!(report.outcome, RunOutcome::Done);
}

/// Only a fault a retry can cure is retried: a test command that did not run (or a base whose
/// migrations failed) halts at once, though a second try would have worked.
#[tokio::test]
async fn a_fault_no_retry_cures_is_not_retried() {
    for fault in [InfraFault::TestCommandBroken, InfraFault::MigrationFailed] {
        let fx = Fixture::new();
        fx.lakebase.fail_next.store(1, Ordering::SeqCst);
        *fx.lakebase.fail_with.lock().expect("lock") = Some(fault.clone());
        let report = fx.run(answer(honest), approve_all()).await.expect("run");
        let RunOutcome::Halted { escalation } = report.outcome else {
            panic!("{fault}: expected a halt, got {:?}", report.outcome)
        };
        assert_eq!(escalation.reason, EscalationReason::Infrastructure(fault));
        assert!(fx.lakebase.served().is_empty(), "tried once, not again");
    }
}

fn symlink_cheat(a: &Assignment) -> Artifact {
    match &a.step {
        Step::Green { .. } => Artifact::ChangeSet(ChangeSet {
            summary: "escape".into(),
            changes: vec![FileChange::Write {
                path: "out/evil.sql".into(),
                content: "x".into(),
            }],
        }),
        _ => honest(a),
    }
}

#[tokio::test]
async fn a_change_set_through_a_symlink_out_of_the_tree_is_refused_and_nothing_written() {
    let fx = Fixture::new();
    let outside = tempfile::tempdir().expect("outside");
    std::os::unix::fs::symlink(outside.path(), fx.root().join("out")).expect("symlink");
    let report = fx
        .run(answer(symlink_cheat), approve_all())
        .await
        .expect("run");
    assert!(matches!(report.outcome, RunOutcome::Halted { .. }));
    assert!(
        std::fs::read_dir(outside.path())
            .expect("list")
            .next()
            .is_none(),
        "nothing written outside"
    );
    assert!(fx.events().iter().any(|e| matches!(
        e,
        Event::Refused {
            violation: crate::RuleViolation::PathOutsideWorkTree { .. },
            ..
        }
    )));
}

#[tokio::test]
async fn a_design_edited_after_approval_halts_before_the_next_build_step() {
    let fx = Fixture::new();
    let report = fx.run_to_gate(answer(honest)).await;
    let RunOutcome::AtGate { hash, .. } = report.outcome else {
        panic!("gate")
    };
    let approval = ada_approves_design(hash).await;
    record_gate_decision(
        &mut Ledger::<Event>::open(fx.ledger()).expect("ledger"),
        &Machine::default(),
        approval,
    )
    .expect("approve");
    let design = fx.root().join(DESIGN_FILE);
    let text = std::fs::read_to_string(&design).expect("design");
    assert!(
        text.contains("CREATE TABLE t1"),
        "the design holds the migration"
    );
    std::fs::write(
        &design,
        text.replace("CREATE TABLE t1", "CREATE TABLE hacked"),
    )
    .expect("edit");
    let report = fx.run_to_gate(answer(honest)).await;
    let RunOutcome::Halted { escalation } = report.outcome else {
        panic!("expected a halt")
    };
    assert!(
        escalation
            .detail
            .contains("the frozen design on disk is not the approved one"),
        "{}",
        escalation.detail
    );
    assert!(!fx.root().join("tests").exists(), "no build step ran");
}

#[tokio::test]
async fn the_designs_migrations_are_files_frozen_with_it_and_every_run_reads_them_from_there() {
    let fx = Fixture::new();
    fx.existing_migration("V1__existing.sql", "CREATE TABLE existing (id int);");
    fx.existing_migration("V1__existing.down.sql", "DROP TABLE existing;");
    let config = fx.with_migration_files("migrations", true, true);
    let report = fx
        .run_with(config.clone(), answer(honest), Arc::new(StopAtGates))
        .await;
    design_gate_hash(&report);
    let plan = kit::schema_of(1);
    let file = fx
        .root()
        .join("migrations")
        .join(migration_file_name(0, &plan.migrations[0]));
    assert_eq!(
        std::fs::read_to_string(&file).expect("written at the design gate"),
        plan.migrations[0].sql
    );
    // Approved and run to done: every run got the existing migration first, then the design's,
    // and the promotion the same.
    let report = fx
        .run_with(config.clone(), answer(honest), approve_all())
        .await;
    assert_eq!(report.outcome, RunOutcome::Done);
    let seen = fx.lakebase.migrations.lock().expect("seen").clone();
    assert!(seen.len() >= 3, "{seen:?}");
    for sqls in &seen {
        assert_eq!(
            sqls,
            &vec![
                "CREATE TABLE existing (id int);".to_string(),
                plan.migrations[0].sql.clone()
            ]
        );
    }
    assert!(
        fx.events()
            .iter()
            .any(|e| matches!(e, Event::Observed { migrations, .. } if migrations.len() == 1)),
        "every observation after the freeze checks the file"
    );
}

#[tokio::test]
async fn the_dba_reads_the_projects_existing_migrations_and_nothing_else() {
    let fx = Fixture::new();
    fx.existing_migration("V1__base.sql", "CREATE TABLE base ();");
    std::fs::write(fx.root().join("README.md"), "# readme\n").expect("readme");
    let seen: Arc<Mutex<Vec<Assignment>>> = Arc::default();
    let record = Arc::clone(&seen);
    let answer: Answer = Arc::new(move |a: &Assignment| {
        record.lock().expect("record").push(a.clone());
        honest(a)
    });
    let config = fx.with_migration_files("migrations", true, true);
    fx.run_with(config, answer, Arc::new(StopAtGates)).await;
    let seen = seen.lock().expect("seen").clone();
    let schema = seen
        .iter()
        .find(|a| a.step == Step::Schema)
        .expect("the schema step");
    let files: Vec<(&str, &str)> = schema
        .inputs
        .files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        files,
        [("migrations/V1__base.sql", "CREATE TABLE base ();")]
    );
    assert!(
        schema.inputs.not_included.is_empty(),
        "{:?}",
        schema.inputs.not_included
    );
}

#[tokio::test]
async fn a_parent_that_has_the_existing_migrations_is_promoted_only_the_designs() {
    let fx = Fixture::new();
    fx.existing_migration("V1__base.sql", "CREATE TABLE base ();");
    let config = fx.with_migration_files("migrations", true, false);
    let report = fx.run_with(config, answer(honest), approve_all()).await;
    assert_eq!(report.outcome, RunOutcome::Done);
    let seen = fx.lakebase.migrations.lock().expect("seen").clone();
    let (promoted, runs) = seen.split_last().expect("runs and the promotion");
    let design = kit::schema_of(1).migrations[0].sql.clone();
    assert_eq!(
        promoted,
        &vec![design.clone()],
        "the promotion: the design's only"
    );
    for run in runs {
        assert_eq!(
            run,
            &vec!["CREATE TABLE base ();".to_string(), design.clone()]
        );
    }
}

#[tokio::test]
async fn a_frozen_migration_file_edited_on_disk_halts_before_the_next_build_step() {
    let fx = Fixture::new();
    let config = fx.with_migration_files("db", false, true);
    let hash = design_gate_hash(
        &fx.run_with(config.clone(), answer(honest), Arc::new(StopAtGates))
            .await,
    );
    let approval = ada_approves_design(hash).await;
    record_gate_decision(
        &mut Ledger::<Event>::open(fx.ledger()).expect("ledger"),
        &Machine::new(config.machine.clone()),
        approval,
    )
    .expect("approve");
    let plan = kit::schema_of(1);
    let file = fx
        .root()
        .join("db")
        .join(migration_file_name(0, &plan.migrations[0]));
    std::fs::write(&file, "DROP TABLE everything;").expect("edit");
    let report = fx.run_with(config, answer(honest), approve_all()).await;
    let RunOutcome::Halted { escalation } = report.outcome else {
        panic!("expected a halt, got {:?}", report.outcome)
    };
    assert!(
        escalation.detail.contains("frozen migration db/0001"),
        "{}",
        escalation.detail
    );
    assert!(!fx.root().join("tests").exists(), "no build step ran");
    assert!(fx.lakebase.served().is_empty(), "nothing ran");
}

#[tokio::test]
async fn a_file_in_the_way_of_a_migration_is_never_overwritten() {
    let fx = Fixture::new();
    let plan = kit::schema_of(1);
    let name = migration_file_name(0, &plan.migrations[0]);
    fx.existing_migration(&name, "-- mine");
    let config = fx.with_migration_files("migrations", true, true);
    let w = fx
        .wiring(config, answer(honest), Arc::new(StopAtGates))
        .await;
    let err = Conductor::start(w)
        .await
        .expect("start")
        .run()
        .await
        .expect_err("the design gate cannot write the file");
    assert!(err.to_string().contains("never overwrites"), "{err}");
    assert_eq!(
        std::fs::read_to_string(fx.root().join("migrations").join(&name)).expect("kept"),
        "-- mine"
    );
}

#[tokio::test]
async fn the_same_actor_cannot_be_set_up_as_driver_and_navigator() {
    let fx = Fixture::new();
    let mut w = fx.wiring(fx.config(), answer(honest), approve_all()).await;
    let solo = ActorId::new(Role::Driver, "solo");
    let (actor, _) = Actor::spawn(None, fn_role(solo.clone(), answer(honest)), ())
        .await
        .expect("spawn");
    w.roles.insert(
        Role::Driver,
        Arc::new(DirectRole {
            id: solo,
            actor: actor.clone(),
        }),
    );
    w.roles.insert(
        Role::Navigator,
        Arc::new(DirectRole {
            id: ActorId::new(Role::Navigator, "solo"),
            actor,
        }),
    );
    assert!(matches!(
        Conductor::start(w).await,
        Err(ConductorError::ReviewerIsAuthor(_))
    ));
}

#[tokio::test]
async fn a_refused_live_approval_closes_the_gate_instead_of_asking_again() {
    let fx = Fixture::new();
    // Answers every gate with an approval of another hash, for as long as it is asked.
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let approver = Arc::new(FnApprover(move |request: &GateRequest| {
        counted.fetch_add(1, Ordering::SeqCst);
        let mut approval = ada().approval(request);
        approval.hash = ContentHash::of_bytes(b"an older design");
        Some(approval)
    }));
    let report = tokio::time::timeout(Duration::from_secs(30), fx.run(answer(honest), approver))
        .await
        .expect("the run stops instead of asking the approver forever")
        .expect("run");
    let hash = design_gate_hash(&report);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    let events = fx.events();
    let refused: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::Refused { .. }))
        .collect();
    assert_eq!(
        refused,
        vec![&Event::Refused {
            violation: crate::RuleViolation::GateHashMismatch {
                gate: GateKind::Design,
                expected: hash,
                got: ContentHash::of_bytes(b"an older design"),
            },
            run_output: None
        }]
    );
    assert!(report.state.frozen.is_none() && report.state.approvals.is_empty());
}

/// The honest run, but the architect names a persistence invariant and the DBA plans nothing.
fn invariants_without_migrations(a: &Assignment) -> Artifact {
    match &a.step {
        Step::Architecture { .. } => Artifact::ArchitectureVerdict(ArchitectureVerdict::Approve {
            layers: vec![],
            nfrs: vec![],
            invariants: vec![PersistenceInvariant {
                id: "PI1-sku-unique".into(),
                kind: "unique".into(),
                brief: "one row per sku".into(),
            }],
        }),
        Step::Schema => Artifact::SchemaPlan(kit::schema_of(0)),
        _ => honest(a),
    }
}

#[tokio::test]
async fn a_design_with_invariants_and_no_migration_is_named_so_at_its_gates() {
    let fx = Fixture::new();
    // Approves every gate as ada, keeping what each gate's request said.
    let summaries: Arc<Mutex<Vec<(GateKind, String)>>> = Arc::default();
    let seen = summaries.clone();
    let approver = Arc::new(FnApprover(move |request: &GateRequest| {
        if let Ok(mut seen) = seen.lock() {
            seen.push((request.gate, request.summary.clone()));
        }
        Some(ada().approval(request))
    }));
    let report = fx
        .run(answer(invariants_without_migrations), approver)
        .await
        .expect("run");
    assert_eq!(report.outcome, RunOutcome::Done);
    let said = summaries.lock().map(|s| s.clone()).unwrap_or_default();
    let of = |gate| {
        said.iter()
            .find(|(g, _)| *g == gate)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no {gate} gate in {said:?}"))
    };
    let design = of(GateKind::Design);
    assert!(
        design.contains("no migration; warning: no migration, though the architecture names 1 persistence invariant (PI1-sku-unique)"),
        "{design}"
    );
    let promote = of(GateKind::Promote);
    assert!(promote.contains("the design has no migration"), "{promote}");
    let promoted = report.state.promotion.as_ref().expect("promoted");
    assert!(promoted.applied_text().starts_with("no migration"));
}

/// Crashes at the first gate it is asked about.
struct CrashingApprover;

impl Approver for CrashingApprover {
    fn decide<'a>(
        &'a self,
        _: &'a GateRequest,
    ) -> consort_actors::BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async { panic!("the approver crashed") })
    }
}

#[tokio::test]
async fn an_approver_that_crashes_leaves_the_gate_closed_and_the_run_stops_there() {
    let fx = Fixture::new();
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        fx.run(answer(honest), Arc::new(CrashingApprover)),
    )
    .await
    .expect("the run stops instead of waiting for the crashed approver")
    .expect("run");
    assert!(
        matches!(
            report.outcome,
            RunOutcome::AtGate {
                gate: GateKind::Design,
                ..
            }
        ),
        "{:?}",
        report.outcome
    );
    assert!(report.state.frozen.is_none() && report.state.approvals.is_empty());
}

static TAMPER_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A Driver that, asked for GREEN on T1, edits the frozen test on disk behind the conductor's
/// back before answering honestly.
fn tampering_driver(a: &Assignment) -> Artifact {
    if let Step::Green { test } = &a.step
        && test == "T1"
        && let Some(dir) = TAMPER_DIR.lock().ok().and_then(|d| d.clone())
    {
        let _ = std::fs::write(dir.join("tests/t1.sql"), "-- weakened\n");
    }
    honest(a)
}

#[tokio::test]
async fn a_refused_apply_keeps_its_journal_so_a_retry_records_the_true_undo() {
    let fx = Fixture::new();
    if let Ok(mut d) = TAMPER_DIR.lock() {
        *d = Some(fx.root());
    }
    let report = fx
        .run(answer(tampering_driver), approve_all())
        .await
        .expect("run");
    let RunOutcome::Halted { escalation } = report.outcome else {
        panic!("expected a halt, got {:?}", report.outcome)
    };
    assert!(
        escalation
            .detail
            .contains("tests/t1.sql changed outside Consort"),
        "{}",
        escalation.detail
    );
    assert_eq!(escalation.reason, EscalationReason::ChangedOutsideConsort);
    assert!(
        fx.root().join(APPLY_JOURNAL).exists(),
        "the journal survives the refusal"
    );
    // A human restores the test, stops the tampering, and retries.
    if let Ok(mut d) = TAMPER_DIR.lock() {
        *d = None;
    }
    std::fs::write(fx.root().join("tests/t1.sql"), "need: token-T1\n").expect("restore");
    record_human_decision(
        &mut Ledger::<Event>::open(fx.ledger()).expect("ledger"),
        &Machine::default(),
        HumanDecision::Retry,
        "ada",
    )
    .expect("retry");
    let report = fx
        .run(answer(honest), approve_all())
        .await
        .expect("run again");
    assert_eq!(report.outcome, RunOutcome::Done);
    // The undo is the state before GREEN, not after.
    assert_undo_deletes(&fx.events(), 2, "the re-applied GREEN", "src/t1.sql");
}

/// Checks that the undo of the `nth` change set applied (`what` names it) deletes `path`, and
/// nothing else: there was no file at `path` before it.
fn assert_undo_deletes(events: &[Event], nth: usize, what: &str, path: &str) {
    let undo = undos(events).get(nth).cloned().expect(what);
    assert_eq!(
        undo.changes,
        vec![FileChange::Delete { path: path.into() }],
        "the undo of {what}"
    );
}

/// The honest GREEN write for T1 (what [`honest`] writes).
fn t1_green() -> FileChange {
    kit::write("src/t1.sql", "-- token-T1\n")
}

/// The Driver's GREEN for T1 answered with `cheats[attempt]` while there is one, honestly after.
fn green_t1_cheats(cheats: Vec<Vec<FileChange>>) -> Answer {
    Arc::new(move |a: &Assignment| match &a.step {
        Step::Green { test } if test == "T1" && (a.attempt as usize) < cheats.len() => {
            Artifact::ChangeSet(ChangeSet {
                summary: "cheat".into(),
                changes: cheats[a.attempt as usize].clone(),
            })
        }
        _ => honest(a),
    })
}

#[tokio::test]
async fn a_write_through_a_link_is_judged_by_the_file_it_reaches_before_anything_is_written() {
    let fx = Fixture::new();
    let root = fx.root();
    std::fs::create_dir_all(root.join("src")).expect("src");
    fx.seed("consort.toml", "# the harness\n");
    std::os::unix::fs::symlink("../tests", root.join("src/link")).expect("link");
    std::os::unix::fs::symlink("../consort.toml", root.join("src/cfg")).expect("link");
    std::os::unix::fs::symlink("../.git", root.join("src/g")).expect("link");
    let answer = green_t1_cheats(vec![
        vec![t1_green(), kit::write("src/link/t1.sql", "weakened")],
        vec![kit::write("src/link/t9.sql", "a test of my own")],
        vec![kit::write("src/cfg", "[paths]\ntests = []\n")],
        vec![kit::write("src/g/hooks/pre-commit", "#!/bin/sh\n")],
    ]);
    let mut config = fx.config();
    config.machine.max_agent_retries = 4;
    let machine = Machine::new(config.machine.clone());
    let (report, events) = fx
        .run_to_done(config, answer, "the honest retry finishes")
        .await;
    assert_eq!(
        denials(&events),
        vec![
            crate::RuleViolation::FrozenTestModified {
                path: "tests/t1.sql".into()
            },
            crate::RuleViolation::TouchesTests {
                path: "tests/t9.sql".into()
            },
            crate::RuleViolation::TouchesHarness {
                path: "consort.toml".into()
            },
            crate::RuleViolation::TouchesHarness {
                path: ".git/hooks/pre-commit".into()
            },
        ]
    );
    assert!(events.iter().any(|e| matches!(
        e,
        Event::ApplyDenied { resolved, .. }
            if resolved.get("src/link/t1.sql").map(String::as_str) == Some("tests/t1.sql")
    )));
    // Nothing of any cheat was written: the frozen test, the harness, and no hook.
    assert_eq!(
        std::fs::read_to_string(root.join("tests/t1.sql")).expect("t1"),
        "need: token-T1\n"
    );
    assert!(!root.join("tests/t9.sql").exists());
    assert_eq!(
        std::fs::read_to_string(root.join("consort.toml")).expect("harness"),
        "# the harness\n"
    );
    assert!(!root.join(".git").exists());
    // Two REDs and two GREENs (T1's the honest retry); the empty REFACTORs apply nothing.
    assert_eq!(undos(&events).len(), 4);
    assert_eq!(machine.replay(&events), report.state);
}

#[tokio::test]
async fn a_red_that_writes_a_test_path_through_a_link_to_code_is_non_test_in_red() {
    let fx = Fixture::new();
    let root = fx.root();
    std::fs::create_dir_all(root.join("tests")).expect("tests");
    std::os::unix::fs::symlink("../src", root.join("tests/lib")).expect("link");
    let answer: Answer = Arc::new(|a: &Assignment| match &a.step {
        Step::Red { test } if test == "T1" && a.attempt == 0 => Artifact::ChangeSet(ChangeSet {
            summary: "red, and some code on the side".into(),
            changes: vec![
                kit::write("tests/t1.sql", "need: token-T1\n"),
                kit::write("tests/lib/t1.sql", "-- token-T1\n"),
            ],
        }),
        _ => honest(a),
    });
    let report = fx.run(answer, approve_all()).await.expect("run");
    assert_eq!(report.outcome, RunOutcome::Done);
    let events = fx.events();
    assert_eq!(
        denials(&events),
        vec![crate::RuleViolation::NonTestInRed {
            path: "src/t1.sql".into()
        }]
    );
    // The denied RED wrote nothing: the first Applied is the honest RED, and its undo deletes
    // only the test file.
    assert_undo_deletes(&events, 0, "an applied RED", "tests/t1.sql");
}

#[tokio::test]
async fn a_path_the_file_system_refuses_is_a_retry_and_nothing_is_left_half_applied() {
    let fx = Fixture::new();
    let root = fx.root();
    fx.seed("src/notes.txt", "notes\n");
    let long = format!("src/{}.sql", "n".repeat(300));
    let answer = green_t1_cheats(vec![
        vec![t1_green(), kit::write(&long, "x")],
        vec![t1_green(), kit::write("src/notes.txt/x.sql", "x")],
        // Each path is fine on the tree as it is; the last collides with the one before it, so
        // the OS refuses it mid-way and the first two writes are undone.
        vec![
            t1_green(),
            kit::write("src/gen/a.sql", "a"),
            kit::write("src/gen", "a file where the directory now is"),
        ],
    ]);
    let mut config = fx.config();
    config.machine.max_agent_retries = 3;
    let (_, events) = fx
        .run_to_done(config, answer, "the run goes on to the honest retry")
        .await;
    let problems: Vec<consort_actors::WriteProblem> = denials(&events)
        .into_iter()
        .map(|v| match v {
            crate::RuleViolation::PathNotWritable { problem, .. } => problem,
            other => panic!("expected a path the file system refuses, got {other:?}"),
        })
        .collect();
    assert_eq!(
        problems,
        vec![
            consort_actors::WriteProblem::NameTooLong { len: 304, max: 255 },
            consort_actors::WriteProblem::NotADirectory {
                path: "src/notes.txt".into()
            },
            consort_actors::WriteProblem::IsADirectory {
                path: "src/gen".into()
            },
        ]
    );
    assert!(
        !root.join("src/gen").exists(),
        "the mid-way write was undone"
    );
    // The honest GREEN's undo is the tree before any cheat: src/t1.sql did not exist.
    assert_undo_deletes(&events, 1, "T1's GREEN", "src/t1.sql");
}

#[tokio::test]
async fn caches_are_not_test_files_not_hashed_and_not_writable() {
    let fx = Fixture::new();
    let root = fx.root();
    for planted in [
        "tests/__pycache__/t1.cpython-311.pyc",
        "tests/build/stale.sql",
        "sub/target/x",
    ] {
        let full = root.join(planted);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(&full, "need: never-written\n").expect("plant");
    }
    let answer = green_t1_cheats(vec![vec![
        t1_green(),
        kit::write("src/__pycache__/t1.cpython-311.pyc", "bytecode"),
    ]]);
    let mut config = fx.config();
    // `build` is the project's own cache name: it must reach the verifier's hash too, or the
    // receipts would be for another work tree.
    config.machine.paths = crate::PathPolicy::default().with_caches(&["build"]);
    let (_, events) = fx
        .run_to_done(
            config,
            answer,
            "no unexpected test file, no receipt for another tree",
        )
        .await;
    let refused: Vec<crate::RuleViolation> = events
        .iter()
        .filter_map(|e| match e {
            Event::Refused { violation, .. } => Some(violation.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        refused,
        vec![crate::RuleViolation::TouchesUnhashed {
            path: "src/__pycache__/t1.cpython-311.pyc".into(),
            dir: "__pycache__".into()
        }]
    );
    assert!(!root.join("src/__pycache__").exists());
    let observed_tests: Vec<&FileHashes> = events
        .iter()
        .filter_map(|e| match e {
            Event::Observed { tests, .. } | Event::Applied { tests, .. } => Some(tests),
            _ => None,
        })
        .collect();
    assert!(
        observed_tests
            .iter()
            .all(|t| t.keys().all(|p| p == "tests/t1.sql" || p == "tests/t2.sql")),
        "a planted cache file is never a test file"
    );
}

/// Each step gets its context pack: runner facts only where tests and code are the work,
/// files by the pack's rule, everything else listed with its size and why, and the change sets
/// since the last review for the review.
#[tokio::test]
async fn every_assignment_carries_its_context_pack_and_lists_what_it_leaves_out() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.root().join("src")).expect("src");
    std::fs::write(fx.root().join("README.md"), "# readme\n").expect("readme");
    std::fs::write(fx.root().join("src/big.sql"), "-- big\n".repeat(400)).expect("big");
    let seen: Arc<Mutex<Vec<Assignment>>> = Arc::default();
    let record = Arc::clone(&seen);
    let answer: Answer = Arc::new(move |a: &Assignment| {
        record.lock().expect("record").push(a.clone());
        honest(a)
    });
    let mut config = fx.config();
    config.max_input_bytes = 1000;
    config.runner = Some(Arc::new(RunnerFacts {
        runner: "psql".into(),
        loads: vec!["src/**/*.sql".into()],
        collects: vec!["tests/**/*.sql".into()],
        ..RunnerFacts::default()
    }));
    let report = fx.run_with(config, answer, approve_all()).await;
    assert_eq!(report.outcome, RunOutcome::Done);
    let seen = seen.lock().expect("seen").clone();
    let of = |key: &str| {
        seen.iter()
            .find(|a| a.step.to_string() == key)
            .unwrap_or_else(|| panic!("no assignment for {key}"))
            .clone()
    };
    let stories = of("stories");
    assert!(stories.runner.is_none() && stories.inputs.files.is_empty());
    assert!(stories.inputs.not_included.is_empty() && stories.inputs.spec.is_none());
    assert!(
        of("test-list").runner.is_some(),
        "the Test Strategist hears how tests run"
    );
    let green = of("green/T2");
    assert!(green.runner.is_some() && green.writes.is_some());
    let files: Vec<&str> = green.inputs.files.keys().map(String::as_str).collect();
    assert_eq!(
        files,
        vec!["src/t1.sql", "tests/t2.sql"],
        "code and the entry's test"
    );
    let why = |path: &str| {
        green
            .inputs
            .not_included
            .iter()
            .find(|n| n.path == path)
            .map(|n| (n.why, n.bytes))
    };
    assert_eq!(why("README.md"), Some((Omission::NotInPack, 9)));
    assert_eq!(why("tests/t1.sql"), Some((Omission::NotInPack, 15)));
    assert_eq!(why("src/big.sql"), Some((Omission::OverLimit, 2800)));
    // Traced: the entry's story with only its criterion, nothing of the other story.
    let traced = green.inputs.stories.as_deref().expect("stories");
    assert_eq!(traced.stories.len(), 1);
    assert_eq!(traced.stories[0].acceptance_criteria.len(), 1);
    assert!(green.inputs.test_list.is_none() && green.inputs.feature.is_none());
    let review = of("review/T2/0");
    assert!(
        review.inputs.changes.len() >= 2,
        "the review sees RED's and GREEN's change sets"
    );
    assert_eq!(
        review.inputs.files.keys().collect::<Vec<_>>(),
        vec!["tests/t2.sql"]
    );
}
