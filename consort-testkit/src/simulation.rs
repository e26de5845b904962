//! A scripted lifecycle: valid answers for every step and a simulated conductor over the pure
//! machine that answers each of its commands (a fake disk, receipts, approvals, a promote).

use consort_actors::{
    ArchitectureVerdict, Artifact, ChangeSet, Command, ContentHash, Event, GateKind, Machine,
    MachineConfig, PathPolicy, PromoteReport, RequestId, RunStatus, State, Step, TestEntry,
    TestRunReceipt, TestStatus, VerifyPurpose,
};

use crate::artifacts::{
    approval, approve_architecture, approve_review, author, change, feature, receipt_with, schema,
    spec, stories, test_list, ux,
};
use crate::disk::FakeDisk;

/// The shape of a scripted run.
#[derive(Debug, Clone, Copy)]
pub struct Script {
    /// Entries in the test list (each goes RED → GREEN → REFACTOR → REVIEW).
    pub tests: usize,
    /// Architect revise verdicts before the approval.
    pub revisions: u32,
    /// Whether a story is user-facing (adds the UX step).
    pub user_facing: bool,
    /// Whether REFACTOR changes code (apply + verify) or returns an empty change set.
    pub real_refactors: bool,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            tests: 6,
            revisions: 1,
            user_facing: true,
            real_refactors: true,
        }
    }
}

/// The machine configuration the scripts assume (tests under `tests/`).
pub fn machine_config(script: &Script) -> MachineConfig {
    MachineConfig {
        paths: PathPolicy::new(&["tests/**"], &["run-tests.sh"]).expect("globs"),
        max_revisions: script.revisions + 1,
        ..MachineConfig::default()
    }
}

fn code(test: &str, prefix: &str) -> Artifact {
    let name = test.to_lowercase();
    change(
        &format!("src/{name}.sql"),
        &format!("{prefix}CREATE FUNCTION f_{name}() RETURNS int LANGUAGE sql AS 'SELECT 1';\n"),
    )
}

/// The artifact a role answers `step` with. `entry` is the current test-list entry (build steps).
pub fn artifact_for(step: &Step, script: &Script, entry: Option<&TestEntry>) -> Artifact {
    let entry_path = entry.map_or("tests/t01.sql", |e| e.path.as_str());
    match step {
        Step::Stories => Artifact::Stories(stories(script.user_facing)),
        Step::Spec { .. } => Artifact::Spec(spec()),
        Step::Architecture { revision } if *revision < script.revisions => {
            Artifact::ArchitectureVerdict(ArchitectureVerdict::Revise {
                reasons: vec![format!("revision {revision}: name the invariants")],
            })
        }
        Step::Architecture { .. } => Artifact::ArchitectureVerdict(approve_architecture()),
        Step::Schema => Artifact::SchemaPlan(schema()),
        Step::TestList => Artifact::TestList(test_list(script.tests)),
        Step::Ux => Artifact::UxDesign(ux()),
        Step::Red { test } => change(
            entry_path,
            &format!("-- {test}\nSELECT 1/0 AS not_yet_implemented;\n"),
        ),
        Step::Green { test } | Step::Repair { test, .. } => code(test, ""),
        Step::Refactor { test, .. } if script.real_refactors => code(test, "-- refactored\n"),
        Step::Refactor { .. } => Artifact::ChangeSet(ChangeSet {
            summary: "nothing to refactor".into(),
            changes: vec![],
        }),
        Step::Review { .. } => approve_review(),
    }
}

/// A receipt as the Lakebase side would write it: every expected test passes, except the
/// focus of a RED run, which fails. The excerpt is about 1 KB, like a short psql run.
pub fn receipt(
    request: RequestId,
    workspace_hash: ContentHash,
    purpose: VerifyPurpose,
    tests: &[String],
    focus: Option<&str>,
) -> TestRunReceipt {
    let mut outcomes: Vec<(&str, TestStatus)> = tests
        .iter()
        .map(|t| (t.as_str(), TestStatus::Passed))
        .collect();
    if let (VerifyPurpose::Red, Some(f)) = (purpose, focus) {
        match outcomes.iter_mut().find(|o| o.0 == f) {
            Some(o) => o.1 = TestStatus::Failed,
            None => outcomes.push((f, TestStatus::Failed)),
        }
    }
    let failed = outcomes.iter().any(|o| o.1 != TestStatus::Passed);
    let excerpt: String = outcomes
        .iter()
        .map(|(name, status)| format!("== test {name} ==\n{status:?}\n"))
        .collect::<String>()
        + &"psql:tests/t.sql:2: ERROR:  division by zero\n".repeat(16);
    receipt_with(
        request,
        workspace_hash,
        &outcomes,
        i32::from(failed),
        &excerpt,
    )
}

/// A simulated conductor over the pure machine: a fake disk, answers to every command.
#[derive(Debug)]
pub struct Simulation {
    /// The machine.
    pub machine: Machine,
    /// The run's shape.
    pub script: Script,
    /// The machine's state.
    pub state: State,
    /// The work tree.
    pub disk: FakeDisk,
    /// The design hash on disk (once the design gate was asked for).
    pub design_on_disk: Option<ContentHash>,
    /// Every event fed, in order.
    pub events: Vec<Event>,
}

impl Simulation {
    /// A simulation of `script`, not started.
    pub fn new(script: Script) -> Self {
        Simulation {
            machine: Machine::new(machine_config(&script)),
            script,
            state: State::default(),
            disk: FakeDisk::new(),
            design_on_disk: None,
            events: Vec::new(),
        }
    }

    /// Feeds `e` to the machine, which must accept it, and keeps it.
    pub fn feed(&mut self, e: Event) {
        let (next, _) = self
            .machine
            .step(&self.state, &e)
            .unwrap_or_else(|v| panic!("{} refused: {v}", e.name()));
        self.state = next;
        self.events.push(e);
    }

    /// The event that answers `cmd`, with its side effects on the fake disk.
    pub fn answer(&mut self, cmd: Command) -> Event {
        match cmd {
            Command::Assign { id, role, step, .. } => Event::Produced {
                assignment: id,
                author: author(role),
                artifact: artifact_for(&step, &self.script, self.state.current_test()),
                usage: Default::default(),
                transcript: None,
            },
            Command::Observe => Event::Observed {
                design_hash: self.design_on_disk,
                tests: self.disk.test_hashes(),
                migrations: Default::default(),
            },
            Command::Apply { change_set } => self.disk.applied(&change_set),
            Command::Verify {
                request,
                purpose,
                workspace_hash,
                tests,
                focus,
                ..
            } => Event::VerifyCompleted {
                receipt: receipt(request, workspace_hash, purpose, &tests, focus.as_deref()),
            },
            Command::Baseline { request, tests } => Event::VerifyCompleted {
                receipt: receipt(
                    request,
                    self.disk.workspace_hash(),
                    VerifyPurpose::Baseline,
                    &tests,
                    None,
                ),
            },
            Command::AwaitGate { gate, hash } => {
                if gate == GateKind::Design {
                    self.design_on_disk = Some(hash);
                }
                Event::Gate {
                    approval: approval(gate, hash),
                }
            }
            Command::Promote {
                request,
                migrations,
            } => Event::Promoted {
                report: PromoteReport {
                    request_id: request,
                    target: "consort".into(),
                    applied: migrations.iter().map(|m| m.version.clone()).collect(),
                    already_applied: vec![],
                    verified: true,
                    merge_check: None,
                },
            },
            other => panic!("the scripted run never needs {other:?}"),
        }
    }

    /// Drives the whole lifecycle to `Done` and returns every event fed, in order.
    pub fn run(mut self) -> (Vec<Event>, State) {
        self.feed(Event::Start {
            feature: feature(),
            inherited: Default::default(),
            per_step: Default::default(),
            harness: None,
        });
        while self.state.status == RunStatus::Running {
            let cmd = self.state.pending_command().expect("a pending command");
            let e = self.answer(cmd);
            self.feed(e);
        }
        assert_eq!(
            self.state.status,
            RunStatus::Done,
            "the script reaches done"
        );
        (self.events, self.state)
    }
}
