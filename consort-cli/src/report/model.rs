//! What a report shows, read from the feature's ledger by replaying it through the machine.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use consort_actors::{
    ActorId, Artifact, Entry, Event, FilesWritten, GateApproval, HumanDecision, Machine, Pending,
    State, Step, StepCommit, TestRunReceipt, Usage, UsageTotals, step_commits, usage_totals,
};

use super::ReportError;
use consort::project::{GitTip, Project};

/// One build step as the ledger tells it: who answered, what they said, and the run that
/// judged it.
#[derive(Debug, Clone)]
pub(super) struct StepRecord {
    /// The step (`red/T1`, `repair/T1#1`, …).
    pub step: Step,
    /// Who answered (None while no answer was accepted).
    pub author: Option<ActorId>,
    /// When the answer was recorded.
    pub at: Option<DateTime<Utc>>,
    /// The change set's summary, or the review's verdict.
    pub summary: String,
    /// The files the change set writes.
    pub files: Vec<String>,
    /// What the answer cost.
    pub usage: Usage,
    /// The run that judged it, with when it was recorded.
    pub receipt: Option<(DateTime<Utc>, Arc<TestRunReceipt>)>,
    /// Refusals and failures along the way, in order.
    pub notes: Vec<String>,
}

/// A person's decision: at a gate, or on a halted run.
#[derive(Debug, Clone)]
pub(super) enum Decision {
    /// An approval or rejection at a gate.
    Gate(GateApproval),
    /// A retry or a stop, with when it was recorded.
    Human {
        /// What.
        decision: HumanDecision,
        /// Who.
        by: String,
        /// When.
        at: DateTime<Utc>,
    },
    /// A change to the configuration that judges the runs, with when it was recorded.
    Harness {
        /// The change.
        change: consort_actors::HarnessChange,
        /// When.
        at: DateTime<Utc>,
    },
}

/// Everything the page renders.
#[derive(Debug)]
pub(super) struct Model {
    /// The feature's id.
    pub feature_id: String,
    /// The state the ledger replays to.
    pub state: State,
    /// How many entries the ledger holds, and the first and last entry's times.
    pub entries: usize,
    /// The first and the last entry's times.
    pub span: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The build steps, in the order they were assigned.
    pub steps: Vec<StepRecord>,
    /// The full-suite deploy run.
    pub deploy: Option<(DateTime<Utc>, Arc<TestRunReceipt>)>,
    /// When the promotion was recorded.
    pub promoted_at: Option<DateTime<Utc>>,
    /// Every decision people made, in order.
    pub decisions: Vec<Decision>,
    /// The files the accepted change sets wrote, in the order first written.
    pub files: Vec<String>,
    /// The migration files of the design (path, version, description).
    pub migrations: Vec<(String, String, String)>,
    /// The commits the ledger calls for.
    pub commits: Vec<StepCommit>,
    /// Their ids in git, by [`StepCommit::key`].
    pub commit_ids: BTreeMap<String, String>,
    /// The run branch and its tip.
    pub git: Option<GitTip>,
    /// Usage per role.
    pub usage: UsageTotals,
    /// Every lane of the project: what each waits on, and on whom.
    pub lanes: Vec<consort::project::LaneStatus>,
}

impl Model {
    /// Reads `project`'s feature: its ledger, replayed, and what it leads to.
    pub(super) fn read(project: &Project) -> Result<Self, ReportError> {
        let entries = project.entries()?;
        if entries.is_empty() {
            return Err(ReportError::NotStarted {
                feature: project.feature_id().to_string(),
            });
        }
        let machine = project.machine()?;
        let mut replay = Replay::default();
        for entry in &entries {
            replay.step(&machine, entry);
        }
        let state = replay.state.clone();
        let migrations = match (&machine.config().migration_files, state.schema.as_deref()) {
            (Some(files), Some(plan)) => files
                .planned(plan)
                .into_iter()
                .map(|(p, m)| (p, m.version.clone(), m.description.clone()))
                .collect(),
            _ => Vec::new(),
        };
        let repo = project.git();
        Ok(Model {
            feature_id: project.feature_id().to_string(),
            entries: entries.len(),
            span: entries
                .first()
                .zip(entries.last())
                .map(|(a, b)| (a.time, b.time)),
            commits: step_commits(&machine, entries.iter().map(|e| &e.event)),
            // Not a git repository: no commit has an id.
            commit_ids: repo.map_or_else(BTreeMap::new, |r| r.commit_ids(project.feature_id())),
            git: project.git_tip(),
            usage: usage_totals(entries.iter().map(|e| &e.event)),
            lanes: project.lanes()?,
            migrations,
            state,
            steps: replay.steps,
            deploy: replay.deploy,
            promoted_at: replay.promoted_at,
            decisions: replay.decisions,
            files: replay.files.into_paths(),
        })
    }

    /// The build steps of the test-list entry `test`, in order.
    pub(super) fn steps_of<'a>(&'a self, test: &'a str) -> impl Iterator<Item = &'a StepRecord> {
        self.steps
            .iter()
            .filter(move |r| r.step.test() == Some(test))
    }
}

/// The replay: the machine's state, and what the report collects on the way.
#[derive(Default)]
struct Replay {
    state: State,
    steps: Vec<StepRecord>,
    deploy: Option<(DateTime<Utc>, Arc<TestRunReceipt>)>,
    promoted_at: Option<DateTime<Utc>>,
    decisions: Vec<Decision>,
    files: FilesWritten,
}

impl Replay {
    /// Feeds one entry; what the machine refuses (it never recorded it) is left out.
    fn step(&mut self, machine: &Machine, entry: &Entry<Event>) {
        let Ok((next, _)) = machine.step(&self.state, &entry.event) else {
            return;
        };
        let pending = self.state.pending.clone();
        self.files.note(pending.as_ref(), &entry.event);
        self.collect(pending.as_ref(), entry);
        self.state = next;
    }

    fn collect(&mut self, pending: Option<&Pending>, entry: &Entry<Event>) {
        let build_step = match pending {
            Some(Pending::Agent { step, .. }) if step.is_build() => Some(step),
            _ => None,
        };
        match (&entry.event, pending) {
            (
                Event::Produced {
                    author,
                    artifact,
                    usage,
                    ..
                },
                _,
            ) => {
                if let Some(step) = build_step {
                    let record = self.record(step);
                    record.author = Some(author.clone());
                    record.at = Some(entry.time);
                    record.usage = usage.clone();
                    (record.summary, record.files) = answer_text(artifact);
                }
            }
            (Event::Refused { violation, .. }, _) => {
                if let Some(step) = build_step {
                    self.record(step)
                        .notes
                        .push(format!("refused: {violation}"));
                }
            }
            (Event::AgentFailed { failure, .. }, _) => {
                if let Some(step) = build_step {
                    self.record(step).notes.push(format!("failed: {failure}"));
                }
            }
            (Event::VerifyCompleted { receipt }, Some(Pending::Verify { step, .. })) => {
                let receipt = (entry.time, Arc::new(receipt.clone()));
                match step {
                    Some(step) => self.record(step).receipt = Some(receipt),
                    None => self.deploy = Some(receipt),
                }
            }
            (Event::Gate { approval }, _) => {
                self.decisions.push(Decision::Gate(approval.clone()));
            }
            (Event::Promoted { .. }, _) => self.promoted_at = Some(entry.time),
            (Event::HarnessChanged { change }, _) => self.decisions.push(Decision::Harness {
                change: change.clone(),
                at: entry.time,
            }),
            (Event::Human { decision, by }, _) => self.decisions.push(Decision::Human {
                decision: *decision,
                by: by.clone(),
                at: entry.time,
            }),
            _ => {}
        }
    }

    /// The record of `step`: the last one, when it is that step's, or a new one.
    fn record(&mut self, step: &Step) -> &mut StepRecord {
        if self.steps.last().is_none_or(|r| &r.step != step) {
            self.steps.push(StepRecord {
                step: step.clone(),
                author: None,
                at: None,
                summary: String::new(),
                files: Vec::new(),
                usage: Usage::default(),
                receipt: None,
                notes: Vec::new(),
            });
        }
        let last = self.steps.len() - 1;
        &mut self.steps[last]
    }
}

/// What an answer says, in a line, and the files it writes.
fn answer_text(artifact: &Artifact) -> (String, Vec<String>) {
    use consort_actors::ReviewVerdict;
    match artifact {
        Artifact::ChangeSet(c) => (
            c.summary.clone(),
            c.changes.iter().map(|f| f.path().to_string()).collect(),
        ),
        Artifact::ReviewVerdict(ReviewVerdict::Approve { notes }) if notes.is_empty() => {
            ("approved".into(), Vec::new())
        }
        Artifact::ReviewVerdict(ReviewVerdict::Approve { notes }) => {
            (format!("approved: {}", notes.join("; ")), Vec::new())
        }
        Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested { reasons }) => (
            format!("changes requested: {}", reasons.join("; ")),
            Vec::new(),
        ),
        other => (other.kind().to_string(), Vec::new()),
    }
}
