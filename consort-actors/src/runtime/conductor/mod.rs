//! The conductor actor: owns the state machine, the ledger and the work tree, and drives a run.
//!
//! One loop, always the same: take the machine's pending command, perform it (ask a role, read
//! the disk, apply a change set, ask the Lakebase actor for a verified run, wait at a gate),
//! turn the result into an [`Event`], **append it to the ledger (fsynced) before it takes
//! effect**, and step the machine. A refused event is followed by [`Event::Refused`] in the
//! ledger, so the audit trail shows every refusal and a replay refuses it the same way. A change
//! set the conductor will not apply — re-checked by the machine with the paths as they resolve
//! on disk, or refused by the file system — is recorded as [`Event::ApplyDenied`], itself the
//! record of that refusal; nothing of it is left written.
//!
//! **Architecture invariant:** the conductor is the only writer of the work tree, and it writes
//! only change sets the machine accepted. Agents see files only as text in their assignment.

mod budget;
mod endpoints;
mod migrations;
mod workbench;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::core::artifact::{
    ChangeSet, DesignBundle, Escalation, FeatureRequest, FileHashes, GateApproval, GateKind,
    Migration, SchemaPlan, TestStatus,
};
use crate::core::hash::ContentHash;
use crate::core::machine::{Command, Event, Machine, MachineConfig, Phase, RunStatus, State};
use crate::core::protocol::{PromoteRequest, RunnerFacts, VerifyRequest, WriteRules};
use crate::core::role::Role;
use crate::core::step::Step;
use crate::core::test_outline::{FrozenChange, TestFileVerdicts, judge};
use crate::event_log::{EventLog, FileEventLog};
use crate::ledger::{Entry, Ledger, LedgerError};
use crate::runtime::gate::{Approver, GateRequest};
use crate::runtime::messages::Assignment;
use crate::worktree::{PathIoError, WorkTree, WorkTreeError};

pub use endpoints::{
    DirectLakebase, DirectRole, LakebaseEndpoint, RoleEndpoint, SupervisedLakebase, SupervisedRole,
};
pub use migrations::existing_migrations;

/// Where the frozen design is written, relative to the work tree, by a conductor with the
/// default [`ConductorConfig::record_dir`].
pub const DESIGN_FILE: &str = ".consort/design.json";
/// Where the undo of an in-flight change set is journaled, relative to the work tree, by a
/// conductor with the default [`ConductorConfig::record_dir`].
pub const APPLY_JOURNAL: &str = ".consort/apply-journal.json";

/// Timeouts, bounds and paths of a conductor.
#[derive(Debug, Clone)]
pub struct ConductorConfig {
    /// The project's work tree.
    pub work_tree: PathBuf,
    /// The ledger file (default `<work tree>/.consort/ledger.jsonl`), where the events are
    /// kept unless [`ConductorConfig::event_log`] says otherwise.
    pub ledger_path: PathBuf,
    /// Where the events are kept instead of the ledger file (a store machines share); none:
    /// the file ledger at [`ConductorConfig::ledger_path`].
    pub event_log: Option<crate::event_log::EventLogOpener>,
    /// Where the frozen design (`design.json`) and the apply journal (`apply-journal.json`)
    /// are kept (default `<work tree>/.consort`; a project's feature keeps its own,
    /// `<project>/.consort/features/<id>`, which lies outside the work tree of a lane).
    pub record_dir: PathBuf,
    /// More paths a verification run may not read, on top of its work tree's `.consort/`:
    /// a lane's project records, which lie outside its work tree (none by default).
    pub hidden: Vec<PathBuf>,
    /// The machine's bounds and path rules.
    pub machine: MachineConfig,
    /// Deadline of one agent step (per attempt).
    pub step_timeout: Duration,
    /// Deadline of one verification.
    pub verify_timeout: Duration,
    /// How long a live approver may take to decide.
    pub gate_timeout: Duration,
    /// Retries of a verification that failed for infrastructure reasons a retry may cure
    /// ([`crate::InfraFault::is_transient`]), before escalating.
    pub verify_retries: u32,
    /// Most bytes of work-tree files handed to an agent with a build step.
    pub max_input_bytes: usize,
    /// How the project's tests run, told to the roles whose work is tests and code (none: they
    /// are told only the path rules).
    pub runner: Option<Arc<RunnerFacts>>,
    /// Told of every durable ledger append, and may stop the conductor right after one (see
    /// [`AppendObserver`]); none by default.
    pub append_observer: Option<Arc<dyn AppendObserver>>,
    /// Where every [`RunEvent`] is published, for any number of subscribers; none by default.
    pub events: Option<tokio::sync::broadcast::Sender<RunEvent>>,
    /// Budgets of the run and its roles, checked against the ledger before every assignment
    /// (none by default).
    pub budgets: crate::core::budget::Budgets,
    /// The bounds of the tools handed to build steps ([`crate::runtime::workbench`]); none: build steps
    /// get no tools.
    pub workbench: Option<crate::runtime::workbench::WorkbenchLimits>,
}

/// Watches the conductor's ledger appends. Tests implement it to stop a run after any event,
/// exactly where a crash would.
pub trait AppendObserver: Send + Sync + std::fmt::Debug {
    /// Called right after this conductor's `index`-th append (1 for its first) is durable
    /// (fsynced), before the event takes effect. [`ControlFlow::Break`] stops the conductor
    /// dead: it writes nothing more (no further line, no journal clean-up) and answers the run
    /// with [`ConductorError::Stopped`] — what a crash at that point would leave on disk.
    fn appended(&self, index: u64) -> ControlFlow<()>;
}

impl ConductorConfig {
    /// The frozen design file.
    pub fn design_file(&self) -> PathBuf {
        self.record_dir.join("design.json")
    }

    /// The apply journal.
    pub fn apply_journal(&self) -> PathBuf {
        self.record_dir.join("apply-journal.json")
    }

    /// The files of the tree as the last applied change set left it (path to content hash):
    /// what a verification's request names, so that a run finding another tree can say which
    /// paths differ.
    pub fn applied_tree(&self) -> PathBuf {
        self.record_dir.join("applied-tree.json")
    }

    /// Defaults for a work tree: ledger in `.consort/`, 10-minute steps and verifications.
    pub fn new(work_tree: impl Into<PathBuf>) -> Self {
        let work_tree = work_tree.into();
        ConductorConfig {
            ledger_path: work_tree.join(crate::ledger::DEFAULT_LEDGER_PATH),
            event_log: None,
            record_dir: work_tree.join(crate::core::paths::STATE_DIR),
            hidden: Vec::new(),
            work_tree,
            machine: MachineConfig::default(),
            step_timeout: Duration::from_secs(600),
            verify_timeout: Duration::from_secs(900),
            gate_timeout: Duration::from_secs(24 * 3600),
            verify_retries: 1,
            max_input_bytes: 512 * 1024,
            runner: None,
            append_observer: None,
            events: None,
            budgets: crate::core::budget::Budgets::default(),
            workbench: None,
        }
    }
}

/// Everything a conductor is wired to.
pub struct Wiring {
    /// Configuration.
    pub config: ConductorConfig,
    /// The feature request, for a new run (ignored when the ledger already has a run).
    pub feature: Option<FeatureRequest>,
    /// What the project's earlier features leave to a new run (recorded in its start).
    pub inherited: crate::core::regression::Inherited,
    /// The configuration that judges the runs (recorded in a new run's start; a resumed run
    /// whose recorded harness differs has the change recorded first, by its owner: see
    /// [`record_decision`]).
    pub harness: Option<crate::core::harness::Harness>,
    /// One endpoint per role.
    pub roles: BTreeMap<Role, Arc<dyn RoleEndpoint>>,
    /// The Lakebase side.
    pub lakebase: Arc<dyn LakebaseEndpoint>,
    /// Who decides gates while the run is live.
    pub approver: Arc<dyn Approver>,
}

impl std::fmt::Debug for Wiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wiring")
            .field("config", &self.config)
            .field("roles", &self.roles.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// What a run's subscribers are told, in the order it happened: each ledger entry once it
/// is durable, and each progress report (phases, steps, tests, receipts, gate waits, the
/// end). Published on a `tokio::sync::broadcast` channel ([`ConductorConfig::events`]): the
/// run never waits for a subscriber; one that falls more than the channel's capacity behind
/// gets `RecvError::Lagged(n)` (n events it missed) and goes on from the oldest kept — the
/// ledger, read again, has everything it missed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RunEvent {
    /// A ledger entry, durable (fsynced, or committed in the shared store).
    Recorded(Arc<Entry<Event>>),
    /// A progress report.
    Progress(Progress),
}

/// A progress report for embedders and the terminal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "progress", rename_all = "kebab-case")]
pub enum Progress {
    /// The run moved to another phase.
    Phase {
        /// The new phase.
        phase: Phase,
    },
    /// A role was asked for a step.
    Step {
        /// The step key.
        step: String,
        /// The role.
        role: Role,
        /// 1-based index of the current test in the build lane (0 in design).
        test: usize,
        /// Number of tests in the list (0 before it exists).
        of: usize,
    },
    /// A verified run came back.
    Receipt {
        /// The request it answers.
        request: crate::RequestId,
        /// Tests passed.
        passed: usize,
        /// Tests not passed.
        failed: usize,
        /// The branch it ran on.
        branch: String,
    },
    /// An event was refused.
    Refused {
        /// The violation.
        violation: String,
    },
    /// A gate waits for a decision.
    GateWaiting {
        /// Which gate.
        gate: GateKind,
        /// The hash to approve.
        hash: ContentHash,
        /// What the gate approves, in words (the approver's
        /// [`GateRequest::summary`](crate::GateRequest)): for the design gate, what it holds and
        /// what the baseline found.
        summary: String,
    },
    /// The run stopped.
    Stopped {
        /// Why.
        outcome: String,
    },
}

/// How a run ended this time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum RunOutcome {
    /// Done: every test green, every gate approved, migrations promoted.
    Done,
    /// Waiting at a gate for an approval of this hash.
    AtGate {
        /// The gate.
        gate: GateKind,
        /// The hash to approve.
        hash: ContentHash,
    },
    /// Halted for a human.
    Halted {
        /// Why.
        escalation: Escalation,
    },
    /// Stopped by a human.
    Stopped,
}

/// In a line, for people: `done`, `waiting at the design gate`, `halted`, `stopped`.
impl std::fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunOutcome::Done => f.write_str("done"),
            RunOutcome::AtGate { gate, .. } => write!(f, "waiting at the {gate} gate"),
            RunOutcome::Halted { .. } => f.write_str("halted"),
            RunOutcome::Stopped => f.write_str("stopped"),
        }
    }
}

/// The result of driving a run.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// How it ended.
    pub outcome: RunOutcome,
    /// The machine's final state.
    pub state: State,
    /// Wall time spent per phase in this process.
    pub phase_times: BTreeMap<String, Duration>,
    /// Events appended to the ledger by this process.
    pub events_appended: usize,
    /// The ledger file.
    pub ledger_path: PathBuf,
}

/// Why a conductor could not drive.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConductorError {
    /// The ledger could not be opened, verified or appended to; the run refuses to resume.
    #[error("ledger")]
    Ledger(#[from] LedgerError),
    /// The shared store the events are kept in could not be opened, read or appended to; the
    /// run refuses to resume.
    #[error("the store")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A person's decision was judged on fewer entries than the ledger holds by now: nothing
    /// was recorded.
    #[error(transparent)]
    MovedOn(crate::event_log::LedgerMovedOn),
    /// The work tree could not be read or written.
    #[error("work tree")]
    WorkTree(#[from] WorkTreeError),
    /// A new run needs a feature request.
    #[error("the ledger is empty and no feature request was given")]
    MissingFeature,
    /// A role has no endpoint.
    #[error("no actor plays the {0} role")]
    MissingRole(Role),
    /// The same actor is set up to write code and to review it.
    #[error("{0} is set up as both Driver and Navigator; the author never reviews its own code")]
    ReviewerIsAuthor(String),
    /// The conductor actor could not be spawned, or stopped before answering.
    #[error("conductor actor: {0}")]
    Actor(String),
    /// [`ConductorHandle::run`] was called while a run is being driven.
    #[error("a run is already being driven")]
    AlreadyDriving,
    /// The conductor stopped on an error earlier; start a new one to resume.
    #[error("the conductor failed earlier; start a new one to resume")]
    FailedEarlier,
    /// The machine is running but asks for nothing: a bug in Consort.
    #[error("internal invariant broken: the run is running without a pending command")]
    NoPendingCommand,
    /// Something the conductor must write could not be serialised; nothing of it was written.
    #[error("could not serialise {what}")]
    Serialise {
        /// What was being written.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
    /// The [`AppendObserver`] stopped the conductor right after its `appends`-th append.
    #[error("stopped by the append observer after {appends} ledger appends")]
    Stopped {
        /// Appends this conductor made, the last one included.
        appends: u64,
    },
    /// A gate decision does not fit the run (from [`record_gate_decision`]).
    #[error("{0}")]
    Gate(String),
    /// A migration file of the frozen design could not be written or does not hold the
    /// design's SQL; nothing was run from it.
    #[error("migration file {path} {problem}")]
    MigrationFile {
        /// The file (or the migration's version), relative to the work tree.
        path: String,
        /// What is wrong, in a sentence.
        problem: String,
    },
}

impl From<crate::event_log::EventLogError> for ConductorError {
    fn from(e: crate::event_log::EventLogError) -> Self {
        match e {
            crate::event_log::EventLogError::Ledger(e) => ConductorError::Ledger(e),
            crate::event_log::EventLogError::Store(e) => ConductorError::Store(e),
            crate::event_log::EventLogError::MovedOn(moved) => ConductorError::MovedOn(moved),
        }
    }
}

/// Replays a ledger and returns the machine state it records (no actor, no side effects).
pub fn replay_ledger(path: &Path, machine: &Machine) -> Result<State, ConductorError> {
    let entries = Ledger::<Event>::read(path)?;
    Ok(machine.replay(entries.iter().map(|e| &e.event)))
}

/// Records a human's gate decision in the ledger of a stopped run, after checking that the run
/// waits at that gate for exactly that hash. A wrong or stale hash is refused with a message
/// naming the hash that waits.
pub fn record_gate_decision(
    log: &mut dyn EventLog,
    machine: &Machine,
    approval: GateApproval,
) -> Result<(), ConductorError> {
    let state = machine.replay(log.entries().iter().map(|e| &e.event));
    match state.pending_gate() {
        Some((gate, hash)) if gate == approval.gate && hash == approval.hash => {
            log.append(&Event::Gate { approval })?;
            Ok(())
        }
        Some((gate, hash)) if gate == approval.gate => Err(ConductorError::Gate(format!(
            "refused: the {gate} gate waits for hash {hash}, not {}",
            approval.hash
        ))),
        Some((gate, hash)) => Err(ConductorError::Gate(format!(
            "refused: the run waits at the {gate} gate (hash {hash}), not at the {} gate",
            approval.gate
        ))),
        None => Err(ConductorError::Gate(format!(
            "refused: the run is not waiting at any gate (it is in the {} phase)",
            state.phase()
        ))),
    }
}

/// Records a human's decision about a run that no process is driving: retry the step a halted
/// run stopped at, or stop the run (a halted one, one waiting at a gate, or one that was
/// interrupted mid-step). The machine decides whether the decision fits the run; a decision it
/// refuses is not recorded.
pub fn record_human_decision(
    log: &mut dyn EventLog,
    machine: &Machine,
    decision: crate::core::machine::HumanDecision,
    by: &str,
) -> Result<(), ConductorError> {
    let event = Event::Human {
        decision,
        by: by.to_string(),
    };
    record_offline(log, machine, event)
}

/// A person's decision about the tests or the harness of a run, recorded by
/// [`record_decision`] in the ledger of a run that no process is driving.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OfflineDecision {
    /// Retires an earlier feature's test (see [`crate::Retirement`]); refused when the test is
    /// not inherited or is retired already, or the run is not started or is over.
    Retire(crate::core::regression::Retirement),
    /// Changes the configuration that judges the runs (see [`crate::HarnessChange`]), before
    /// the run resumes; refused when it is not from the harness in force, changes nothing, or
    /// the run is over.
    ChangeHarness(crate::core::harness::HarnessChange),
    /// Quarantines a test (see [`crate::Quarantine`]) of a run halted, interrupted or at a gate;
    /// refused when it is quarantined already or the run is over.
    Quarantine(crate::core::regression::Quarantine),
    /// Sets aside the running entry's accepted test, to be written again (see [`crate::Redo`]);
    /// refused when the run is not halted, it is not the running entry's, or its RED was not
    /// accepted.
    Redo(crate::Redo),
}

/// Records a person's `decision` in the ledger of a run that no process is driving; one the
/// machine refuses (see [`OfflineDecision`]) is not recorded.
pub fn record_decision(
    log: &mut dyn EventLog,
    machine: &Machine,
    decision: OfflineDecision,
) -> Result<(), ConductorError> {
    let event = match decision {
        OfflineDecision::Retire(retirement) => Event::Retired { retirement },
        OfflineDecision::ChangeHarness(change) => Event::HarnessChanged { change },
        OfflineDecision::Quarantine(quarantine) => Event::Quarantined { quarantine },
        OfflineDecision::Redo(redo) => Event::Redone { redo },
    };
    record_offline(log, machine, event)
}

/// Appends a human's `event` to `log` when the machine accepts it there.
fn record_offline(
    log: &mut dyn EventLog,
    machine: &Machine,
    event: Event,
) -> Result<(), ConductorError> {
    let state = machine.replay(log.entries().iter().map(|e| &e.event));
    match machine.step(&state, &event) {
        Ok(_) => {
            log.append(&event)?;
            Ok(())
        }
        Err(crate::core::machine::RuleViolation::NotHalted) => Err(ConductorError::Gate(format!(
            "refused: the run is not halted (phase: {})",
            state.phase()
        ))),
        Err(violation) => Err(ConductorError::Gate(format!(
            "refused: {violation} (phase: {})",
            state.phase()
        ))),
    }
}

/// The hash of the design file on disk, as the machine compares it (None: missing, unreadable
/// or not a design bundle).
pub fn design_hash_on_disk(design_file: &Path) -> Option<ContentHash> {
    let text = std::fs::read_to_string(design_file).ok()?;
    let bundle: DesignBundle = serde_json::from_str(&text).ok()?;
    Some(bundle.hash())
}

/// Messages of the conductor actor.
#[derive(Debug)]
pub enum ConductorMsg {
    /// Drive until done, a gate, a halt or a stop, then answer.
    Run(RpcReplyPort<Result<RunReport, ConductorError>>),
    /// The machine's current state.
    State(RpcReplyPort<State>),
    /// Internal: the result of a command performed in a task.
    Result(Box<Event>),
    /// Internal: the live approver did not decide.
    GateUnanswered,
}

/// The conductor actor.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conductor;

/// The conductor's mutable state (held by the actor).
pub struct ConductorState {
    wiring: Wiring,
    machine: Machine,
    ledger: Box<dyn EventLog>,
    work: WorkTree,
    state: State,
    waiter: Option<RpcReplyPort<Result<RunReport, ConductorError>>>,
    /// Set after a fatal error: late results are dropped, nothing more is driven.
    failed: bool,
    appended: usize,
    phase: Phase,
    phase_since: Instant,
    phase_times: BTreeMap<String, Duration>,
    /// Numbers the scratch runs of every step's tools.
    scratch_ids: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for ConductorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConductorState")
            .field("phase", &self.phase)
            .field("appended", &self.appended)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// A handle on a started conductor.
#[derive(Debug, Clone)]
pub struct ConductorHandle {
    actor: ActorRef<ConductorMsg>,
}

impl ConductorHandle {
    /// Drives the run until it is done, waits at a gate, halts or stops.
    pub async fn run(&self) -> Result<RunReport, ConductorError> {
        match self.actor.call(ConductorMsg::Run, None).await {
            Ok(ractor::rpc::CallResult::Success(r)) => r,
            Ok(_) | Err(_) => Err(ConductorError::Actor(
                "the conductor stopped before answering".into(),
            )),
        }
    }

    /// The machine's current state.
    pub async fn state(&self) -> Result<State, ConductorError> {
        match self.actor.call(ConductorMsg::State, None).await {
            Ok(ractor::rpc::CallResult::Success(s)) => Ok(s),
            Ok(_) | Err(_) => Err(ConductorError::Actor("the conductor is gone".into())),
        }
    }

    /// Stops the conductor actor.
    pub fn stop(&self) {
        self.actor.stop(None);
    }

    /// The actor.
    pub fn actor(&self) -> &ActorRef<ConductorMsg> {
        &self.actor
    }
}

impl Conductor {
    /// Opens and verifies the ledger, replays it, checks the wiring, and spawns the actor.
    /// A ledger whose chain is broken is refused here: the run does not resume.
    pub async fn start(wiring: Wiring) -> Result<ConductorHandle, ConductorError> {
        for role in Role::ALL {
            if !wiring.roles.contains_key(&role) {
                return Err(ConductorError::MissingRole(role));
            }
        }
        if let (Some(d), Some(n)) = (
            wiring.roles.get(&Role::Driver),
            wiring.roles.get(&Role::Navigator),
        ) && d.identity().name == n.identity().name
        {
            return Err(ConductorError::ReviewerIsAuthor(d.identity().name.clone()));
        }
        let filter = wiring.config.machine.paths.tree_filter().clone();
        let work = WorkTree::open(&wiring.config.work_tree)?.with_filter(filter);
        // Opening verifies the whole chain and takes the file lock: blocking work, off the
        // runtime's async workers.
        let opener = wiring
            .config
            .event_log
            .clone()
            .unwrap_or_else(|| Arc::new(FileEventLog(wiring.config.ledger_path.clone())));
        let ledger = tokio::task::spawn_blocking(move || opener.open())
            .await
            .map_err(|e| ConductorError::Actor(format!("opening the ledger: {e}")))??;
        let machine = Machine::new(wiring.config.machine.clone());
        let state = machine.replay(ledger.entries().iter().map(|e| &e.event));
        if ledger.is_empty() && wiring.feature.is_none() {
            return Err(ConductorError::MissingFeature);
        }
        let phase = state.phase();
        let args = ConductorState {
            wiring,
            machine,
            ledger,
            work,
            state,
            waiter: None,
            failed: false,
            appended: 0,
            scratch_ids: Arc::default(),
            phase,
            phase_since: Instant::now(),
            phase_times: BTreeMap::new(),
        };
        let (actor, _join) = Actor::spawn(None, Conductor, Some(args))
            .await
            .map_err(|e| ConductorError::Actor(e.to_string()))?;
        Ok(ConductorHandle { actor })
    }
}

impl Actor for Conductor {
    type Msg = ConductorMsg;
    type State = ConductorState;
    type Arguments = Option<ConductorState>;

    async fn pre_start(
        &self,
        _: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.ok_or_else(|| "the conductor needs its wiring".into())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ConductorMsg::State(port) => {
                let _ = port.send(st.state.clone());
            }
            ConductorMsg::Run(port) => {
                if st.failed {
                    let _ = port.send(Err(ConductorError::FailedEarlier));
                    return Ok(());
                }
                if st.waiter.is_some() {
                    let _ = port.send(Err(ConductorError::AlreadyDriving));
                    return Ok(());
                }
                st.waiter = Some(port);
                if st.ledger.is_empty()
                    && st.appended == 0
                    && let Some(feature) = st.wiring.feature.clone()
                    && let Err(e) = st.feed(Event::Start {
                        feature,
                        inherited: st.wiring.inherited.clone(),
                        per_step: st.wiring.config.machine.per_step,
                        harness: st.wiring.harness.clone(),
                    })
                {
                    st.finish_err(e);
                    return Ok(());
                }
                st.drive(&myself);
            }
            ConductorMsg::Result(_) | ConductorMsg::GateUnanswered if st.failed => {}
            ConductorMsg::Result(event) => {
                let gate_decision = matches!(*event, Event::Gate { .. });
                if let Err(e) = st.feed(*event) {
                    st.finish_err(e);
                    return Ok(());
                }
                // Gates fail closed: a live decision the machine refused (another hash, another
                // gate) leaves the gate closed for this run; the approver is not asked again.
                if gate_decision && let Some((gate, hash)) = st.state.pending_gate() {
                    st.finish(RunOutcome::AtGate { gate, hash });
                    return Ok(());
                }
                st.drive(&myself);
            }
            ConductorMsg::GateUnanswered => {
                if let Some((gate, hash)) = st.state.pending_gate() {
                    st.finish(RunOutcome::AtGate { gate, hash });
                }
            }
        }
        Ok(())
    }
}

impl ConductorState {
    fn progress(&self, p: Progress) {
        if let Some(events) = &self.wiring.config.events {
            // No subscriber is no error: there is nobody to tell.
            let _ = events.send(RunEvent::Progress(p));
        }
    }

    /// Appends the event (fsynced), then steps the machine; a refusal is recorded too.
    fn feed(&mut self, event: Event) -> Result<(), ConductorError> {
        self.append(&event)?;
        match self.machine.step(&self.state, &event) {
            Ok((next, _)) => {
                self.state = next;
                if let Event::ApplyDenied { violation, .. } = &event {
                    tracing::warn!(%violation, "apply denied");
                    self.progress(Progress::Refused {
                        violation: violation.to_string(),
                    });
                }
                if let Event::Applied { .. } = &event {
                    // The undo is in the ledger and accepted; the journal has done its job. (A
                    // refused `Applied` keeps it: a retry re-applies with the recorded undo.)
                    let _ = std::fs::remove_file(self.wiring.config.apply_journal());
                }
            }
            Err(violation) => {
                tracing::warn!(%violation, event = event.name(), "refused");
                self.progress(Progress::Refused {
                    violation: violation.to_string(),
                });
                let refused = Event::refusal(&event, violation);
                self.append(&refused)?;
                if let Ok((next, _)) = self.machine.step(&self.state, &refused) {
                    self.state = next;
                }
            }
        }
        if let Event::VerifyCompleted { receipt } = &event {
            let passed = receipt
                .outcomes
                .iter()
                .filter(|o| o.status == TestStatus::Passed)
                .count();
            self.progress(Progress::Receipt {
                request: receipt.request_id,
                passed,
                failed: receipt.outcomes.len() - passed,
                branch: receipt.branch_id.clone(),
            });
        }
        self.track_phase();
        Ok(())
    }

    fn append(&mut self, event: &Event) -> Result<(), ConductorError> {
        // Durable before it takes effect: the append (lock, write, fsync) completes here, on
        // this thread, before the caller steps the machine. Inline, not through `blocking`: it
        // is bounded (one line, one fsync), and a hand-over per event would cost more than it
        // spares (BENCHMARKS.md, "where the conductor's I/O runs").
        let entry = self.ledger.append(event)?;
        if let Some(events) = &self.wiring.config.events {
            let _ = events.send(RunEvent::Recorded(Arc::new(entry.clone())));
        }
        self.appended += 1;
        if let Some(observer) = &self.wiring.config.append_observer {
            let index = self.appended as u64;
            if observer.appended(index).is_break() {
                return Err(ConductorError::Stopped { appends: index });
            }
        }
        Ok(())
    }

    fn track_phase(&mut self) {
        let now_phase = self.state.phase();
        if now_phase != self.phase {
            let spent = self.phase_since.elapsed();
            *self.phase_times.entry(self.phase.to_string()).or_default() += spent;
            self.phase = now_phase;
            self.phase_since = Instant::now();
            self.progress(Progress::Phase { phase: now_phase });
        }
    }

    fn finish(&mut self, outcome: RunOutcome) {
        let spent = self.phase_since.elapsed();
        *self.phase_times.entry(self.phase.to_string()).or_default() += spent;
        self.phase_since = Instant::now();
        self.progress(Progress::Stopped {
            outcome: outcome.to_string(),
        });
        let report = RunReport {
            outcome,
            state: self.state.clone(),
            phase_times: std::mem::take(&mut self.phase_times),
            events_appended: self.appended,
            ledger_path: self.wiring.config.ledger_path.clone(),
        };
        if let Some(port) = self.waiter.take() {
            let _ = port.send(Ok(report));
        }
    }

    fn finish_err(&mut self, e: ConductorError) {
        tracing::error!(error = %crate::core::text::error_chain(&e), "the conductor stops");
        self.failed = true;
        if let Some(port) = self.waiter.take() {
            let _ = port.send(Err(e));
        }
    }

    /// Performs pending commands until one must wait for another actor or a human.
    fn drive(&mut self, myself: &ActorRef<ConductorMsg>) {
        loop {
            match &self.state.status {
                RunStatus::Done => return self.finish(RunOutcome::Done),
                RunStatus::Stopped => return self.finish(RunOutcome::Stopped),
                RunStatus::Halted { escalation, .. } => {
                    let escalation = escalation.clone();
                    return self.finish(RunOutcome::Halted { escalation });
                }
                RunStatus::Idle => return self.finish_err(ConductorError::MissingFeature),
                RunStatus::Running => {}
            }
            let Some(command) = self.state.pending_command() else {
                return self.finish_err(ConductorError::NoPendingCommand);
            };
            let event = match command {
                Command::Observe => blocking(|| self.observe()),
                Command::Apply { change_set } => blocking(|| self.apply(&change_set)),
                Command::Assign {
                    id,
                    role,
                    step,
                    attempt,
                    feedback,
                } => match budget::before_assign(self, id, role) {
                    Err(spent) => Ok(*spent),
                    Ok(remaining) => match self.assignment(id, role, step, attempt, feedback) {
                        Ok(Some(mut a)) => {
                            a.budget = remaining;
                            self.spawn_assign(myself, a);
                            return;
                        }
                        Ok(None) => continue,
                        Err(e) => return self.finish_err(e),
                    },
                },
                cmd @ (Command::Verify { .. } | Command::Baseline { .. }) => {
                    match self.verify_request(cmd) {
                        Ok(req) => self.spawn_verify(myself, req),
                        Err(e) => self.finish_err(e),
                    }
                    return;
                }
                Command::AwaitGate { gate, hash } => {
                    if let Err(e) = self.await_gate(myself, gate, hash) {
                        return self.finish_err(e);
                    }
                    return;
                }
                Command::Promote {
                    request,
                    migrations,
                } => {
                    let migrations = match self.migrations_from_disk(migrations, true) {
                        Ok(m) => m,
                        Err(e) => return self.finish_err(e),
                    };
                    self.spawn_promote(
                        myself,
                        PromoteRequest {
                            id: request,
                            work_tree: Some(self.work.root().to_path_buf()),
                            tool_records: self.tool_records(&migrations),
                            migrations,
                        },
                    );
                    return;
                }
                Command::Escalate { .. } | Command::Finish => continue,
            };
            match event {
                Ok(event) => {
                    if let Err(e) = self.feed(event) {
                        return self.finish_err(e);
                    }
                }
                Err(e) => return self.finish_err(e),
            }
        }
    }

    fn observe(&self) -> Result<Event, ConductorError> {
        let migrations = match (self.migration_files(), &self.state.frozen) {
            (Some((files, plan)), Some(_)) => migrations::observe(&self.work, files, plan),
            _ => BTreeMap::new(),
        };
        Ok(Event::Observed {
            design_hash: design_hash_on_disk(&self.wiring.config.design_file()),
            tests: self.test_hashes()?,
            migrations,
        })
    }

    /// Where the design's migrations are written, with the plan they come from (None: not
    /// configured, or no schema plan yet).
    fn migration_files(
        &self,
    ) -> Option<(&crate::core::migration_files::MigrationFiles, &SchemaPlan)> {
        let files = self.wiring.config.machine.migration_files.as_ref()?;
        Some((files, self.state.schema.as_deref()?))
    }

    /// The migrations a run or (`promote`) the promotion applies: read from the design's files
    /// (and the project's existing migrations before them) when they are configured, else as
    /// the machine gave them.
    fn migrations_from_disk(
        &self,
        requested: Vec<Migration>,
        promote: bool,
    ) -> Result<Vec<Migration>, ConductorError> {
        match self.migration_files() {
            Some((files, plan)) => blocking(|| {
                migrations::from_disk(
                    &self.work,
                    (files, &self.state.inherited.migrations),
                    plan,
                    (&requested, promote),
                )
            }),
            None => Ok(requested),
        }
    }

    /// What a run that applies `migrations` may not see: Consort's configured private paths,
    /// and with the project's migration tool the design's files of the migrations it does not
    /// apply (see [`migrations::unseen_by_tool`]).
    fn hidden_from(&self, migrations: &[Migration]) -> Vec<std::path::PathBuf> {
        let mut hidden = self.wiring.config.hidden.clone();
        if let Some((files, plan)) = self.migration_files() {
            hidden.extend(migrations::unseen_by_tool(
                &self.work, files, plan, migrations,
            ));
        }
        hidden
    }

    /// With the project's migration tool, what its bookkeeping holds once it applied
    /// `migrations` (see [`migrations::tool_records`]).
    fn tool_records(&self, migrations: &[Migration]) -> Vec<String> {
        match self.migration_files() {
            Some((files, plan)) => migrations::tool_records(files, plan, migrations),
            None => Vec::new(),
        }
    }

    fn test_hashes(&self) -> Result<FileHashes, ConductorError> {
        Ok(self.tests_among(self.work.file_hashes()?))
    }

    /// The test files' hashes among the tree's.
    fn tests_among(&self, files: FileHashes) -> FileHashes {
        let policy = &self.wiring.config.machine.paths;
        files
            .into_iter()
            .filter(|(p, _)| policy.is_test(p))
            .collect()
    }

    /// Applies a change set with a journaled undo, so a crash between the write and the ledger
    /// entry resumes with the right undo.
    ///
    /// Before anything is written, every path is resolved to the file it physically reaches
    /// (through symbolic links) and the machine re-checks the change set with those paths
    /// ([`Machine::check_resolved`]); what the file system would refuse is found then too. A
    /// refusal is an [`Event::ApplyRefused`] (a path leaving the tree) or an
    /// [`Event::ApplyDenied`] (a rule broken through a link, a path the file system cannot
    /// take), and the agent may retry. A write the OS refuses mid-way is undone before the
    /// refusal; only an I/O failure of the machine itself (a full disk, …) ends the run.
    fn apply(&self, set: &ChangeSet) -> Result<Event, ConductorError> {
        let set_hash = ContentHash::of(set);
        let journaled: Option<ChangeSet> =
            std::fs::read_to_string(self.wiring.config.apply_journal())
                .ok()
                .and_then(|t| serde_json::from_str::<(ContentHash, ChangeSet)>(&t).ok())
                .and_then(|(h, inverse)| (h == set_hash).then_some(inverse));
        let (resolved, moved) = match self.work.resolve_set(set) {
            Ok(r) => r,
            Err(e) => return self.refuse_apply(e, BTreeMap::new(), journaled.as_ref()),
        };
        let verdicts = self.judge_frozen_writes(&resolved)?;
        let resolved = match self
            .machine
            .check_resolved(&self.state, &resolved, &verdicts)
        {
            Ok(r) => r,
            Err(violation) => {
                self.restore(journaled.as_ref())?;
                return Ok(Event::ApplyDenied {
                    violation,
                    resolved: moved,
                });
            }
        };
        let inverse = match journaled {
            Some(inverse) => inverse,
            None => {
                // Check every path and compute the undo before anything is written.
                let inverse = match self.work.undo(&resolved) {
                    Ok(inv) => inv,
                    Err(e) => return self.refuse_apply(e, moved, None),
                };
                let journal = serde_json::to_string(&(set_hash, &inverse)).map_err(|source| {
                    ConductorError::Serialise {
                        what: "the apply journal",
                        source,
                    }
                })?;
                write_file(&self.wiring.config.apply_journal(), &journal)?;
                inverse
            }
        };
        if let Err(e) = self.work.apply(&resolved) {
            return self.refuse_apply(e, moved, Some(&inverse));
        }
        // One pass over the tree gives both the tree's hash and the tests'.
        let files = self.work.file_hashes()?;
        self.keep_applied_tree(&files)?;
        Ok(Event::Applied {
            workspace_hash: ContentHash::of(&files),
            tests: self.tests_among(files),
            inverse,
        })
    }

    /// Keeps the files of the tree a change set left ([`ConductorConfig::applied_tree`]).
    fn keep_applied_tree(&self, files: &FileHashes) -> Result<(), ConductorError> {
        let text = serde_json::to_string(files).map_err(|source| ConductorError::Serialise {
            what: "the applied tree",
            source,
        })?;
        write_file(&self.wiring.config.applied_tree(), &text)
    }

    /// The files of the tree whose hash is `hash`, when the last change set applied left it
    /// (None: another tree, such as one applied before a resume from another machine, or
    /// none kept).
    fn applied_tree(&self, hash: ContentHash) -> Option<FileHashes> {
        let path = self.wiring.config.applied_tree();
        let unreadable = |e: &dyn std::fmt::Display| {
            tracing::warn!(path = %path.display(), error = %e, "the applied tree is unreadable");
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                unreadable(&e);
                return None;
            }
        };
        let files: FileHashes = serde_json::from_str(&text)
            .inspect_err(|e| unreadable(e))
            .ok()?;
        (ContentHash::of(&files) == hash).then_some(files)
    }

    /// The request of a verify run or of the baseline: what the Lakebase side runs.
    fn verify_request(&self, command: Command) -> Result<VerifyRequest, ConductorError> {
        match command {
            Command::Verify {
                request,
                purpose,
                workspace_hash,
                migrations,
                tests,
                focus,
                select,
            } => {
                let migrations = self.migrations_from_disk(migrations, false)?;
                let tool_records = self.tool_records(&migrations);
                Ok(VerifyRequest {
                    id: request,
                    purpose,
                    work_tree: self.work.root().to_path_buf(),
                    files: self.applied_tree(workspace_hash),
                    workspace_hash,
                    hidden: self.hidden_from(&migrations),
                    migrations,
                    tests,
                    focus,
                    caches: self.work.filter().extra().to_vec(),
                    select,
                    quarantined: self.state.quarantined_names(),
                    harness: self.state.harness.as_ref().map(crate::Harness::hash),
                    tool_records,
                })
            }
            Command::Baseline { request, tests } => self.baseline_request(request, tests),
            _ => Err(ConductorError::NoPendingCommand),
        }
    }

    /// The baseline's request: the project's whole suite on the work tree as it stands (its
    /// hash taken now), with the migrations every run of the feature starts from and none of
    /// the design's.
    fn baseline_request(
        &self,
        request: crate::RequestId,
        tests: Vec<String>,
    ) -> Result<VerifyRequest, ConductorError> {
        let migrations = self.migrations_from_disk(Vec::new(), false)?;
        let files = self.work.file_hashes()?;
        Ok(VerifyRequest {
            id: request,
            purpose: crate::VerifyPurpose::Baseline,
            work_tree: self.work.root().to_path_buf(),
            workspace_hash: ContentHash::of(&files),
            files: Some(files),
            hidden: self.hidden_from(&migrations),
            migrations,
            tests,
            focus: None,
            caches: self.work.filter().extra().to_vec(),
            select: Vec::new(),
            quarantined: self.state.quarantined_names(),
            harness: self.state.harness.as_ref().map(crate::Harness::hash),
            tool_records: Vec::new(),
        })
    }

    /// Judges, on its syntax tree, each file holding frozen tests that the change set writes (a
    /// RED adding tests beside accepted ones): the file as it stands (the frozen version, as the
    /// last observation checked) against the version the change set writes.
    fn judge_frozen_writes(&self, set: &ChangeSet) -> Result<TestFileVerdicts, ConductorError> {
        let mut verdicts = TestFileVerdicts::new();
        for write in self.machine.frozen_files_written(&self.state, set) {
            let new = set
                .changes
                .iter()
                .find(|c| c.path() == write.path)
                .and_then(|c| c.bytes());
            let verdict = match (self.work.read(&write.path)?, new) {
                (Some(old), Some(new)) => match std::str::from_utf8(&new) {
                    Ok(new) => judge(&write.path, &old, new, write.open.as_deref()),
                    Err(_) => Err(FrozenChange("the new version is not UTF-8 text".into())),
                },
                _ => Err(FrozenChange(
                    "the frozen file is not on disk to compare with".into(),
                )),
            };
            verdicts.insert(write.path, verdict);
        }
        Ok(verdicts)
    }

    /// Turns a work-tree refusal into the event that records it, after putting back what the
    /// change set may have left written (its journaled undo) and dropping the journal. An I/O
    /// failure that is not the path's fault ends the run.
    fn refuse_apply(
        &self,
        error: WorkTreeError,
        moved: BTreeMap<String, String>,
        undo: Option<&ChangeSet>,
    ) -> Result<Event, ConductorError> {
        let event = match error {
            WorkTreeError::Path(reason) => Event::ApplyRefused { reason },
            WorkTreeError::NotWritable { path, problem } => Event::ApplyDenied {
                violation: crate::core::machine::RuleViolation::PathNotWritable { path, problem },
                resolved: moved,
            },
            other => return Err(other.into()),
        };
        self.restore(undo)?;
        Ok(event)
    }

    /// Applies the undo of an interrupted apply (if any) and drops the journal.
    fn restore(&self, undo: Option<&ChangeSet>) -> Result<(), ConductorError> {
        if let Some(undo) = undo {
            self.work.apply(undo)?;
            let journal = self.wiring.config.apply_journal();
            match std::fs::remove_file(&journal) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    let failed = PathIoError::new("remove", journal.display(), source);
                    return Err(WorkTreeError::from(failed).into());
                }
            }
        }
        Ok(())
    }

    fn assignment(
        &mut self,
        id: crate::core::protocol::AssignmentId,
        role: Role,
        step: Step,
        attempt: u32,
        feedback: Vec<String>,
    ) -> Result<Option<Assignment>, ConductorError> {
        let s = &self.state;
        let total = s.test_list.as_ref().map_or(0, |l| l.entries.len());
        self.progress(Progress::Step {
            step: step.to_string(),
            role,
            test: if step.is_build() {
                s.build.current + 1
            } else {
                0
            },
            of: total,
        });
        // The author never reviews: refuse before the reviewer even starts.
        if let Step::Review { .. } = step {
            let reviewer = self.wiring.roles.get(&role).map(|r| r.identity().clone());
            if let Some(reviewer) = reviewer
                && s.build.code_authors.iter().any(|a| a.name == reviewer.name)
            {
                let violation = crate::core::machine::RuleViolation::ReviewerIsAuthor { reviewer };
                self.feed(Event::Refused {
                    violation,
                    run_output: None,
                })?;
                return Ok(None);
            }
        }
        let mut inputs = crate::core::context::artifacts(s, &step);
        if step == Step::Schema {
            inputs.migration_tool = self
                .wiring
                .config
                .machine
                .migration_files
                .as_ref()
                .and_then(|f| f.tool.clone());
        }
        let pack = crate::core::context::pack(&step);
        let runner = self.wiring.config.runner.clone();
        let existing = self.existing_migration_globs();
        let loads = match pack.files {
            crate::core::context::Files::Migrations => existing.as_slice(),
            _ => runner.as_ref().map_or(&[][..], |h| h.loads.as_slice()),
        };
        let scope = crate::core::context::FileScope::new(&step, s.current_test(), loads);
        if scope.lists() {
            let policy = &self.wiring.config.machine.paths;
            let limit = self.wiring.config.max_input_bytes;
            (inputs.files, inputs.not_included) = blocking(|| {
                self.work.read_scoped(
                    |p| scope.listed(p, policy.is_harness(p)),
                    |p| scope.includes(p, policy.is_test(p)),
                    limit,
                )
            })?;
            crate::core::context::cap_listing(&mut inputs);
        }
        let (runner, writes) = if pack.runner {
            (runner, Some(self.write_rules(&step)))
        } else {
            (None, None)
        };
        let tools = self.tools(&step);
        Ok(Some(Assignment {
            id,
            role,
            step,
            attempt,
            runner,
            writes,
            inputs,
            feedback,
            budget: None,
            tools,
        }))
    }

    /// The globs of the project's existing migrations, which the DBA reads: its tool's files,
    /// or the SQL files when they are applied (none otherwise).
    fn existing_migration_globs(&self) -> Vec<String> {
        match &self.wiring.config.machine.migration_files {
            Some(f) => match &f.tool {
                Some(tool) => vec![format!("{}/*.{}", f.dir, tool.extension)],
                None if f.apply_existing => vec![format!("{}/*.sql", f.dir)],
                None => Vec::new(),
            },
            None => Vec::new(),
        }
    }

    /// The tools of a build step (RED, GREEN, repair, REFACTOR, REVIEW), when configured.
    fn tools(&self, step: &Step) -> Option<crate::runtime::workbench::Tools> {
        let limits = self.wiring.config.workbench?;
        if !step.is_build() {
            return None;
        }
        Some(crate::runtime::workbench::Tools::new(
            workbench::StepBench {
                step: step.to_string(),
                work: self.work.clone(),
                policy: self.wiring.config.machine.paths.clone(),
                plan: self
                    .machine
                    .scratch_plan(&self.state, step)
                    .and_then(|mut plan| {
                        // The files a real run would read; a scratch run is not made without them.
                        plan.migrations = self
                            .migrations_from_disk(std::mem::take(&mut plan.migrations), false)
                            .ok()?;
                        Some(plan)
                    }),
                lakebase: Arc::clone(&self.wiring.lakebase),
                timeout: self.wiring.config.verify_timeout,
                limits,
                runs: std::sync::atomic::AtomicU32::new(0),
                ids: Arc::clone(&self.scratch_ids),
                hidden: std::iter::once(self.work.root().join(crate::core::paths::STATE_DIR))
                    .chain(self.wiring.config.hidden.iter().cloned())
                    .collect(),
            },
        ))
    }

    /// What the role of `step` may write, in a sentence and as the machine's path rules.
    fn write_rules(&self, step: &Step) -> WriteRules {
        let inherited = &self.state.inherited;
        let policy = &self.wiring.config.machine.paths;
        let tests = policy.test_globs().join(", ");
        let summary = match step {
            Step::TestList => format!(
                "You write no files. Every test-list path must be a test path ({tests}) that the runner collects."
            ),
            Step::Red { .. } => format!(
                "Only new test files ({tests}); you must write the entry's test file. Never a frozen test or a harness path. The earlier features' tests (earlier_tests) are the regression suite: they must keep passing, and changing one halts the run until a human retires it."
            ),
            Step::Review { .. } => "You write no files: you judge the changes.".to_string(),
            _ => format!("Code only: no test path ({tests}), no harness path, no frozen test."),
        };
        WriteRules {
            summary,
            paths: policy.rules(),
            // The Driver may write no test path at all; only RED needs the frozen ones named.
            // An earlier feature's test is named as such: the machine, not the agent's own
            // check, refuses a change to it, since that refusal halts for a human.
            frozen_tests: match step {
                Step::Red { .. } => self
                    .state
                    .build
                    .frozen_tests
                    .keys()
                    .filter(|p| inherited.owner(p, &self.state.retired).is_none())
                    .cloned()
                    .collect(),
                _ => Vec::new(),
            },
            earlier_tests: match step {
                Step::Red { .. } => inherited.live(&self.state.retired).cloned().collect(),
                _ => Vec::new(),
            },
        }
    }

    fn spawn_assign(&self, myself: &ActorRef<ConductorMsg>, a: Assignment) {
        let Some(endpoint) = self.wiring.roles.get(&a.role).cloned() else {
            let _ = myself.cast(ConductorMsg::Result(Box::new(Event::AgentFailed {
                assignment: a.id,
                failure: crate::AgentFailure::Crashed {
                    detail: format!("no actor plays {}", a.role),
                },
                role: Some(a.role),
                usage: crate::Usage::default(),
            })));
            return;
        };
        let timeout = self.wiring.config.step_timeout;
        let me = myself.clone();
        tokio::spawn(async move {
            let (id, role) = (a.id, a.role);
            let started = Instant::now();
            let event = match endpoint.assign(a, timeout).await {
                Ok(p) => Event::Produced {
                    assignment: p.assignment,
                    author: p.author,
                    artifact: p.artifact,
                    usage: p.usage,
                    transcript: p.transcript,
                },
                Err(failure) => budget::failed(id, role, failure, started.elapsed()),
            };
            let _ = me.cast(ConductorMsg::Result(Box::new(event)));
        });
    }

    fn spawn_verify(&self, myself: &ActorRef<ConductorMsg>, req: VerifyRequest) {
        let lakebase = Arc::clone(&self.wiring.lakebase);
        let timeout = self.wiring.config.verify_timeout;
        let retries = self.wiring.config.verify_retries;
        let me = myself.clone();
        tokio::spawn(async move {
            let mut tries = 0;
            let event = loop {
                match lakebase.verify(req.clone(), timeout).await {
                    Ok(receipt) => break Event::VerifyCompleted { receipt },
                    Err(error) if tries < retries && error.fault.is_transient() => {
                        tries += 1;
                        tracing::warn!(%error, tries, "verification failed for infrastructure reasons; retrying");
                    }
                    Err(error) => {
                        break Event::VerifyFailed {
                            request: req.id,
                            error,
                        };
                    }
                }
            };
            let _ = me.cast(ConductorMsg::Result(Box::new(event)));
        });
    }

    fn spawn_promote(&self, myself: &ActorRef<ConductorMsg>, req: PromoteRequest) {
        let lakebase = Arc::clone(&self.wiring.lakebase);
        let timeout = self.wiring.config.verify_timeout;
        let me = myself.clone();
        tokio::spawn(async move {
            let id = req.id;
            let event = match lakebase.promote(req, timeout).await {
                Ok(report) => Event::Promoted { report },
                Err(error) => Event::PromoteFailed { request: id, error },
            };
            let _ = me.cast(ConductorMsg::Result(Box::new(event)));
        });
    }

    fn await_gate(
        &self,
        myself: &ActorRef<ConductorMsg>,
        gate: GateKind,
        hash: ContentHash,
    ) -> Result<(), ConductorError> {
        let summary = self.gate_summary(gate);
        if gate == GateKind::Design
            && let Some(bundle) = self.state.design_bundle()
        {
            let text = serde_json::to_string_pretty(&bundle).map_err(|source| {
                ConductorError::Serialise {
                    what: "the frozen design",
                    source,
                }
            })?;
            let design_file = self.wiring.config.design_file();
            blocking(|| write_file(&design_file, &text))?;
            if let Some((files, plan)) = self.migration_files() {
                blocking(|| migrations::write_frozen(&self.work, files, plan))?;
            }
        }
        self.progress(Progress::GateWaiting {
            gate,
            hash,
            summary: summary.clone(),
        });
        let approver = Arc::clone(&self.wiring.approver);
        let timeout = self.wiring.config.gate_timeout;
        let me = myself.clone();
        let request = GateRequest {
            gate,
            hash,
            summary,
        };
        tokio::spawn(async move {
            // The approver runs in a task of its own: when it panics, the gate is unanswered.
            let decision = tokio::spawn(async move {
                tokio::time::timeout(timeout, approver.decide(&request)).await
            });
            // Fail closed: a timeout, no answer or a crashed approver leaves the gate closed.
            match decision.await {
                Ok(Ok(Some(approval))) => {
                    let _ = me.cast(ConductorMsg::Result(Box::new(Event::Gate { approval })));
                }
                Ok(Ok(None) | Err(_)) => {
                    let _ = me.cast(ConductorMsg::GateUnanswered);
                }
                Err(crashed) => {
                    tracing::warn!(gate = gate.as_str(), %crashed, "the approver crashed; the gate stays closed");
                    let _ = me.cast(ConductorMsg::GateUnanswered);
                }
            }
        });
        Ok(())
    }

    fn gate_summary(&self, gate: GateKind) -> String {
        let files = self.wiring.config.machine.migration_files.as_ref();
        gate_summary(&self.state, gate, files)
    }
}

/// What the baseline found, for the design gate: the tests failing before the feature (each
/// quarantined, or the run would have halted), or that the project's suite passed; nothing
/// when there was no suite to run.
fn baseline_said(s: &State) -> String {
    let Some(baseline) = &s.baseline else {
        return String::new();
    };
    if baseline.failing.is_empty() {
        return "\nbaseline: the project's tests pass before the feature".into();
    }
    let each: Vec<String> = baseline
        .failing
        .iter()
        .map(|t| match s.quarantines().find(|q| q.test == *t) {
            Some(q) => format!("{t} (quarantined by {}: {})", q.by, q.reason),
            None => t.clone(),
        })
        .collect();
    format!(
        "\nbaseline: {} before the feature, judging nothing: {}",
        crate::counted(baseline.failing.len() as u64, "test fails", "tests fail"),
        each.join(", ")
    )
}

/// A human-readable summary of what a gate approves; the design's migrations by the files
/// they are written as (and, with the project's migration tool, the tool that applies them).
pub(crate) fn gate_summary(
    s: &State,
    gate: GateKind,
    files: Option<&crate::core::migration_files::MigrationFiles>,
) -> String {
    let written = migration_files_said(s, files);
    match gate {
        GateKind::Design => {
            let stories = s.stories.as_ref().map_or(0, |x| x.stories.len());
            let acs = s.stories.as_ref().map_or(0, |x| x.ac_ids().count());
            let tests = s.test_list.as_ref().map_or(0, |x| x.entries.len());
            let migrations = s.schema.as_ref().map_or(0, |x| x.migrations.len());
            let n = |count: usize, one: &str, many: &str| crate::counted(count as u64, one, many);
            let migrations = match migrations {
                0 => "no migration".to_string(),
                m => format!("{}{written}", n(m, "migration", "migrations")),
            };
            let unrealised = match (&s.architecture, &s.schema) {
                (Some(a), Some(p)) => crate::core::artifact::unrealised_invariants(a, p)
                    .map_or(String::new(), |w| format!("; warning: {w}")),
                _ => String::new(),
            };
            format!(
                "design of {}: {}, {}, {}, {migrations}{}{unrealised}{}",
                s.feature.as_ref().map_or("?", |f| f.id.as_str()),
                n(stories, "story", "stories"),
                n(acs, "acceptance criterion", "acceptance criteria"),
                n(tests, "test", "tests"),
                if s.ux.is_some() { ", a UX design" } else { "" },
                baseline_said(s),
            )
        }
        GateKind::Deploy => format!(
            "release: {} green, {} on fresh branches",
            crate::counted(s.build.completed as u64, "test", "tests"),
            crate::counted(s.receipts.len() as u64, "verified run", "verified runs")
        ),
        GateKind::Promote => match s.schema.as_ref().map_or(0, |x| x.migrations.len()) {
            0 => "promote: the design has no migration, so the parent database is left as it is"
                .into(),
            m => format!(
                "promote {}{written} to the parent database",
                crate::counted(m as u64, "migration", "migrations")
            ),
        },
    }
}

/// ` (db/migrations/0002_S1_labels.js, applied by knex)`: the design's migration files, when
/// they are written as files.
fn migration_files_said(
    s: &State,
    files: Option<&crate::core::migration_files::MigrationFiles>,
) -> String {
    let (Some(files), Some(plan)) = (files, s.schema.as_deref()) else {
        return String::new();
    };
    let paths: Vec<String> = files.planned(plan).into_iter().map(|(p, _)| p).collect();
    if paths.is_empty() {
        return String::new();
    }
    let by = files
        .tool
        .as_ref()
        .map_or(String::new(), |t| format!(", applied by {}", t.name));
    format!(" ({}{by})", crate::first_and_more(&paths, 3))
}

fn write_file(path: &Path, text: &str) -> Result<(), ConductorError> {
    let scratch = path.parent().unwrap_or(Path::new("."));
    write_file_via(path, text, scratch)
}

/// Writes `text` to `path` whole or not at all: into a file in `scratch` (a directory on the
/// same file system that no hash of the work tree reads), then renamed over `path`, so a run
/// killed mid-write leaves no half-written file for the next one to find.
fn write_file_via(path: &Path, text: &str, scratch: &Path) -> Result<(), ConductorError> {
    let io = |source| WorkTreeError::from(PathIoError::new("write", path.display(), source));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::create_dir_all(scratch).map_err(io)?;
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = scratch.join(format!(".{name}.consort-write"));
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    Ok(())
}

/// Runs I/O whose size the project decides (hashing the tree, applying a change set, reading
/// the files an assignment carries, writing the frozen design) without stalling the runtime: on
/// a multi-threaded runtime through [`tokio::task::block_in_place`] (the worker hands its other
/// tasks to another thread while this one blocks), inline on a current-thread runtime (which
/// has no other worker to hand them to). Synchronous either way, so the conductor's order — an
/// event durable before it takes effect — is unchanged. The ledger append is bounded and runs
/// inline (`ConductorState::append`).
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
