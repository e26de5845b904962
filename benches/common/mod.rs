//! Shared by the benches: a scripted lifecycle (valid artifacts for every step, a simulated
//! conductor that answers the pure machine's commands), interleaved side-by-side timing, and
//! the one-line summaries every bench prints beside criterion's own output.
//!
//! Each bench includes this file with `#[path = "common/mod.rs"] mod common;` and uses only
//! part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use consort::actors::{
    AcceptanceCriterion, ActorId, ArchitectureVerdict, Artifact, ChangeSet, Command, ContentHash,
    Event, ExitRecord, FeatureRequest, FileChange, FileHashes, GateApproval, GateDecision,
    GateKind, Machine, MachineConfig, Migration, PathPolicy, PromoteReport, Requirement,
    ReviewVerdict, Role, RunStatus, RunTimings, SchemaPlan, Screen, Spec, State, Step, Stories,
    Story, TestEntry, TestList, TestOutcome, TestRunReceipt, TestStatus, UxDesign, VerifyPurpose,
};

// ---------------------------------------------------------------- the scripted lifecycle

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

pub fn feature() -> FeatureRequest {
    FeatureRequest {
        id: "F1".into(),
        title: "Stock by SKU and location".into(),
        body: "Record stock movements and answer the on-hand quantity per SKU and location.".into(),
    }
}

fn ac(id: &str) -> AcceptanceCriterion {
    AcceptanceCriterion {
        id: id.into(),
        given: "a warehouse with stock".into(),
        when: "a movement is recorded".into(),
        then: "the on-hand quantity follows".into(),
    }
}

/// Three stories, two acceptance criteria each.
pub fn stories(user_facing: bool) -> Stories {
    let story = |n: usize, uf: bool| Story {
        id: format!("S{n}"),
        title: format!("story {n}"),
        as_a: "warehouse operator".into(),
        i_want: "to record stock".into(),
        so_that: "counts are right".into(),
        user_facing: uf,
        acceptance_criteria: vec![ac(&format!("S{n}-AC1")), ac(&format!("S{n}-AC2"))],
    };
    Stories {
        feature_id: "F1".into(),
        stories: vec![story(1, user_facing), story(2, false), story(3, false)],
    }
}

fn ac_ids() -> Vec<String> {
    (1..=3)
        .flat_map(|s| (1..=2).map(move |a| format!("S{s}-AC{a}")))
        .collect()
}

pub fn spec() -> Spec {
    Spec {
        feature_id: "F1".into(),
        summary: "Stock movements and on-hand quantities.".into(),
        requirements: ac_ids()
            .into_iter()
            .enumerate()
            .map(|(i, ac_id)| Requirement {
                id: format!("R{}", i + 1),
                ac_id,
                statement: "the system shall keep the quantity consistent".into(),
            })
            .collect(),
        out_of_scope: vec![],
        open_questions: vec![],
    }
}

pub fn schema() -> SchemaPlan {
    SchemaPlan {
        migrations: (1..=3)
            .map(|n| Migration {
                version: format!("000{n}"),
                story_id: format!("S{n}"),
                description: format!("tables of story {n}"),
                sql: format!("CREATE TABLE t{n} (id bigint PRIMARY KEY, qty int NOT NULL);"),
            })
            .collect(),
    }
}

pub fn test_list(n: usize) -> TestList {
    let acs = ac_ids();
    TestList {
        entries: (1..=n)
            .map(|i| TestEntry {
                id: format!("T{i}"),
                ac_id: acs[(i - 1) % acs.len()].clone(),
                description: format!("test {i}"),
                path: format!("tests/t{i:02}.sql"),
                test_name: None,
            })
            .collect(),
    }
}

pub fn ux() -> UxDesign {
    UxDesign {
        screens: vec![Screen {
            story_id: "S1".into(),
            name: "record stock".into(),
            elements: vec!["sku".into(), "location".into(), "quantity".into()],
        }],
        notes: vec![],
    }
}

fn change(path: &str, content: String) -> Artifact {
    Artifact::ChangeSet(ChangeSet {
        summary: format!("write {path}"),
        changes: vec![FileChange::Write {
            path: path.into(),
            content,
        }],
    })
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
        Step::Architecture { .. } => Artifact::ArchitectureVerdict(ArchitectureVerdict::Approve {
            layers: vec!["sql".into()],
            nfrs: vec![],
            invariants: vec![],
        }),
        Step::Schema => Artifact::SchemaPlan(schema()),
        Step::TestList => Artifact::TestList(test_list(script.tests)),
        Step::Ux => Artifact::UxDesign(ux()),
        Step::Red { test } => change(
            entry_path,
            format!("-- {test}\nSELECT 1/0 AS not_yet_implemented;\n"),
        ),
        Step::Green { test } | Step::Repair { test, .. } => change(
            &format!("src/{}.sql", test.to_lowercase()),
            format!(
                "CREATE FUNCTION f_{}() RETURNS int LANGUAGE sql AS 'SELECT 1';\n",
                test.to_lowercase()
            ),
        ),
        Step::Refactor { test, .. } if script.real_refactors => change(
            &format!("src/{}.sql", test.to_lowercase()),
            format!(
                "-- refactored\nCREATE FUNCTION f_{}() RETURNS int LANGUAGE sql AS 'SELECT 1';\n",
                test.to_lowercase()
            ),
        ),
        Step::Refactor { .. } => Artifact::ChangeSet(ChangeSet {
            summary: "nothing to refactor".into(),
            changes: vec![],
        }),
        Step::Review { .. } => Artifact::ReviewVerdict(ReviewVerdict::Approve {
            notes: vec!["reads well".into()],
        }),
    }
}

pub fn author(role: Role) -> ActorId {
    ActorId::new(role, role.as_str())
}

pub fn approval(gate: GateKind, hash: ContentHash) -> GateApproval {
    GateApproval {
        gate,
        hash,
        approver: "ada".into(),
        at: Utc
            .with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
            .single()
            .unwrap_or_default(),
        decision: GateDecision::Approve,
        note: String::new(),
    }
}

/// A receipt as the Lakebase side would write it: every expected test passes, except the
/// focus of a RED run, which fails. The excerpt is about 1 KB, like a short psql run.
pub fn receipt(
    request: consort::actors::RequestId,
    workspace_hash: ContentHash,
    purpose: VerifyPurpose,
    tests: &[String],
    focus: Option<&str>,
) -> TestRunReceipt {
    let mut outcomes: Vec<TestOutcome> = tests
        .iter()
        .map(|t| TestOutcome {
            name: t.clone(),
            status: TestStatus::Passed,
        })
        .collect();
    if let (VerifyPurpose::Red, Some(f)) = (purpose, focus) {
        match outcomes.iter_mut().find(|o| o.name == f) {
            Some(o) => o.status = TestStatus::Failed,
            None => outcomes.push(TestOutcome {
                name: f.to_string(),
                status: TestStatus::Failed,
            }),
        }
    }
    let failed = outcomes.iter().any(|o| o.status != TestStatus::Passed);
    let excerpt: String = outcomes
        .iter()
        .map(|o| format!("== test {} ==\n{:?}\n", o.name, o.status))
        .collect::<String>()
        + &"psql:tests/t.sql:2: ERROR:  division by zero\n".repeat(16);
    TestRunReceipt {
        request_id: request,
        workspace_hash,
        provider: "embedded".into(),
        branch_id: format!("consort_b{}", request.0),
        runner: "psql".into(),
        command: "psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f <test> -c ROLLBACK".into(),
        timings: RunTimings::default(),
        outcomes,
        exit: ExitRecord {
            code: Some(i32::from(failed)),
            signal: None,
            timed_out: false,
        },
        output_digest: ContentHash::of_bytes(excerpt.as_bytes()),
        output_excerpt: excerpt,
        confinement: Default::default(),
        tree_changes: Vec::new(),
    }
}

/// A simulated conductor over the pure machine: a fake disk, answers to every command.
pub struct Simulation {
    pub machine: Machine,
    pub script: Script,
    pub state: State,
    pub disk: BTreeMap<String, String>,
    pub design_on_disk: Option<ContentHash>,
    pub events: Vec<Event>,
}

impl Simulation {
    pub fn new(script: Script) -> Self {
        Simulation {
            machine: Machine::new(machine_config(&script)),
            script,
            state: State::default(),
            disk: BTreeMap::new(),
            design_on_disk: None,
            events: Vec::new(),
        }
    }

    fn test_hashes(&self) -> FileHashes {
        self.disk
            .iter()
            .filter(|(p, _)| p.starts_with("tests/"))
            .map(|(p, c)| (p.clone(), ContentHash::of_bytes(c.as_bytes())))
            .collect()
    }

    fn feed(&mut self, e: Event) {
        let (next, _) = self
            .machine
            .step(&self.state, &e)
            .unwrap_or_else(|v| panic!("{} refused: {v}", e.name()));
        self.state = next;
        self.events.push(e);
    }

    /// The event that answers `cmd`, with its side effects on the fake disk.
    fn answer(&mut self, cmd: Command) -> Event {
        match cmd {
            Command::Assign { id, role, step, .. } => Event::Produced {
                assignment: id,
                author: author(role),
                artifact: artifact_for(&step, &self.script, self.state.current_test()),
            },
            Command::Observe => Event::Observed {
                design_hash: self.design_on_disk,
                tests: self.test_hashes(),
            },
            Command::Apply { change_set } => {
                let mut inverse = Vec::new();
                for c in &change_set.changes {
                    inverse.push(match self.disk.get(c.path()) {
                        Some(content) => FileChange::Write {
                            path: c.path().into(),
                            content: content.clone(),
                        },
                        None => FileChange::Delete {
                            path: c.path().into(),
                        },
                    });
                    match c {
                        FileChange::Write { path, content } => {
                            self.disk.insert(path.clone(), content.clone());
                        }
                        FileChange::Delete { path } => {
                            self.disk.remove(path);
                        }
                        FileChange::Restore { .. } => {
                            unreachable!(
                                "the fake disk holds text only; it never restores raw bytes"
                            )
                        }
                    }
                }
                inverse.reverse();
                Event::Applied {
                    workspace_hash: ContentHash::of(&self.disk),
                    tests: self.test_hashes(),
                    inverse: ChangeSet {
                        summary: "undo".into(),
                        changes: inverse,
                    },
                }
            }
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
                },
            },
            other => panic!("the scripted run never needs {other:?}"),
        }
    }

    /// Drives the whole lifecycle to `Done` and returns every event fed, in order.
    pub fn run(mut self) -> (Vec<Event>, State) {
        self.feed(Event::Start { feature: feature() });
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

// ---------------------------------------------------------------- side-by-side timing

/// The median of some durations.
pub fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[v.len() / 2]
}

/// A figure and its floor, measured alternately in the same run.
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    /// The median of the figure.
    pub figure: Duration,
    /// The median of the floor.
    pub floor: Duration,
    /// The median of the per-round ratios figure / floor (each round measures both back to
    /// back, so load that drifts during the run cancels out).
    pub round_ratio: f64,
}

impl Pair {
    /// The ratio of the medians.
    pub fn ratio(&self) -> f64 {
        self.figure.as_secs_f64() / self.floor.as_secs_f64().max(1e-12)
    }
}

/// Runs `figure` and `floor` alternately, `rounds` times each (so both see the same machine
/// noise). Each closure returns the time of one operation.
pub fn interleave(
    rounds: usize,
    mut figure: impl FnMut() -> Duration,
    mut floor: impl FnMut() -> Duration,
) -> Pair {
    let mut a = Vec::with_capacity(rounds);
    let mut b = Vec::with_capacity(rounds);
    let mut r = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let (x, y) = if i % 2 == 0 {
            let x = figure();
            (x, floor())
        } else {
            let y = floor();
            (figure(), y)
        };
        a.push(x);
        b.push(y);
        r.push(x.as_secs_f64() / y.as_secs_f64().max(1e-12));
    }
    r.sort_by(f64::total_cmp);
    Pair {
        figure: median(&mut a),
        floor: median(&mut b),
        round_ratio: r.get(r.len() / 2).copied().unwrap_or(f64::NAN),
    }
}

/// The median of `rounds` runs of `f`.
pub fn median_of(rounds: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..rounds).map(|_| f()).collect();
    median(&mut v)
}

/// Whether criterion was asked to profile (`--profile-time`): then the benches skip their
/// side-by-side summaries, so that a profiler sees only the benchmark selected by the filter.
pub fn profiling() -> bool {
    std::env::args().any(|a| a == "--profile-time")
}

/// A duration in a readable unit.
pub fn fmt(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Prints one summary line: the figure beside its floor, their ratios, and the goal (judged
/// on the median of the per-round ratios).
pub fn report_ratio(name: &str, pair: &Pair, floor_name: &str, goal: Option<f64>) {
    let verdict = match goal {
        Some(g) if pair.round_ratio <= g => format!(" | goal ≤ {g}×: met"),
        Some(g) => format!(" | goal ≤ {g}×: MISSED"),
        None => String::new(),
    };
    println!(
        "SUMMARY {name}: {} | floor ({floor_name}): {} | ratio {:.2}× (per-round median {:.2}×){verdict}",
        fmt(pair.figure),
        fmt(pair.floor),
        pair.ratio(),
        pair.round_ratio
    );
}

/// Prints one summary line for an absolute or additive goal.
pub fn report_line(name: &str, text: &str) {
    println!("SUMMARY {name}: {text}");
}

/// The benches' multi-thread runtime: two workers, like the machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The psql command the runner issues for one test file, by hand: `-X -q -v ON_ERROR_STOP=1
/// -c BEGIN -f <file> -c ROLLBACK` in `dir`, with exactly the environment `env`.
pub fn bare_psql(
    psql: &std::path::Path,
    file: &str,
    dir: &std::path::Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(psql);
    cmd.args([
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        "BEGIN",
        "-f",
        file,
        "-c",
        "ROLLBACK",
    ])
    .current_dir(dir)
    .env_clear()
    .envs(env);
    cmd
}
