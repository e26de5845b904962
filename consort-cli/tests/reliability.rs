//! The reliability suite (issue 6): crashes at every transition, injected faults, malformed
//! input, secrets and load — on real PostgreSQL, real processes and real HTTP on loopback.
//!
//! A `libtest-mimic` main (`harness = false` in Cargo.toml) runs the parts in order and ends with one line:
//!
//! ```text
//! reliability: crash points N of N resumed, faults N of N handled, leaked branches 0, fuzz cases N, panics 0
//! ```
//!
//! * **crash** — the small scripted ensemble in `tests/fixtures/reliability/` (one story, two
//!   tests, a review that asks for a refactor, a GREEN that is repaired) runs once through the
//!   `consort` binary uninterrupted; then, for every event index `N` of that run, a fresh copy
//!   is run by this test binary re-executing itself with `RELIABILITY_CRASH_CHILD=N` (it runs
//!   the project as `consort run --approve-as ada` does, with an append observer that aborts
//!   the process right after its `N`-th fsynced ledger append) and run again to the end
//!   through the `consort` binary. Each resumed run must exit 0 with the
//!   same ledger (timestamps, branch names and timings aside), the same `consort status --json`,
//!   the same replayed state and work tree, no verify request answered twice, `consort verify`
//!   passing and no branch with Consort's prefix left.
//! * **faults** — a panicking role actor (restarted and retried; past the intensity limit an
//!   infrastructure escalation), a branch provider failing on create (retried; always: an
//!   escalation), a connection dropped in the middle of a test run, a hanging test command,
//!   and a model server answering 500 and 429 and then going away.
//! * **load** — 32 verifications at once on the embedded cluster through the Lakebase actor.
//! * **secrets** — a whole run through the binary with a known API key and a known database
//!   password, logs at debug; neither appears in any output, log, ledger, receipt or error.
//! * **fuzz** — proptest over malformed agent outputs (through `consort::agents` parsing and
//!   validation and through `Machine::step`), configuration files and ledger lines.
//!
//! Each part (the crash sweep, each fault scenario, load, secrets, fuzz) is a `libtest-mimic`
//! trial that a filter selects (`cargo test --test reliability -- fuzz`, `-- faults::hanging`);
//! they run one after the other in the order above unless `--test-threads` says otherwise.
//! The summary line is printed when every part ran. `RELIABILITY_WORKERS` sets how many
//! crash points run at once (default 2). `RELIABILITY_KEEP=1` keeps the temporary directories.

use consort_testkit::process::{eventually, text};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use consort::actors::design_hash_on_disk;
use consort::actors::hash_dir;
use consort::actors::{
    Artifact, EscalationReason, Event, GateKind, InfraFault, LakebaseMsg, Migration, RequestId,
    Role, RunOutcome, State, Step, TestStatus, VerifyRequest, WorkTree,
};
use consort::actors::{Entry, Ledger};
use consort::agents::{Agent, Assignment, Script};
use consort::lakebase::{
    BranchProvider, ConnectInfo, EmbeddedCluster, EmbeddedProvider, PsqlRunner, PsqlRunnerConfig,
    RunContext, RunReport, ServerOptions, TestRunner,
};
use consort::project::Project;
use consort::{ApproveAs, Approver, Ensemble, EnsembleBuilder, StopAtGates};
use consort_testkit::providers::RecordingProvider;
use libtest_mimic::{Failed, Trial};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Shared helpers.

/// The fixture project: `consort.toml`, `feature.md`, `script.toml`.
const FIXTURE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/reliability");
/// Where a project keeps the fixture's script (part of the harness, like `consort init` does).
const SCRIPT_REL: &str = ".consort/agents/tally.toml";
/// The marker of panics this suite causes on purpose (a panicking agent).
const DELIBERATE_PANIC: &str = "deliberate panic (reliability suite)";
/// Consort's branch prefix.
const PREFIX: &str = "consort-";

/// Panics anywhere in this process that the suite did not cause on purpose.
static UNEXPECTED_PANICS: AtomicUsize = AtomicUsize::new(0);
/// Panics the suite caused on purpose.
static DELIBERATE_PANICS: AtomicUsize = AtomicUsize::new(0);

fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if text.contains(DELIBERATE_PANIC) {
            DELIBERATE_PANICS.fetch_add(1, Ordering::SeqCst);
        } else {
            UNEXPECTED_PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }
    }));
}

/// `Ok` when `ok`, else the message.
fn ensure<M: Into<String>>(ok: bool, what: impl FnOnce() -> M) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what().into()) }
}

/// Any error as text, with what was being done.
fn ctx<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

fn consort() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_consort"));
    c.env_remove(crash::CHILD_ENV)
        .env("CONSORT_LOG", "warn")
        .stdin(Stdio::null());
    c
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the command starts")
}

/// The last `n` characters of a text (for failure messages).
fn tail(s: &str, n: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

/// Panics reported by a child process.
fn child_panics(o: &Output) -> usize {
    text(o).matches("panicked at").count()
}

/// A temporary directory under /tmp that the `postgres` user can reach (the embedded cluster
/// lives inside the project).
fn reachable_tempdir(prefix: &str) -> tempfile::TempDir {
    consort_testkit::cluster::tmp_dir(prefix, 0o755)
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(Path::new(FIXTURE_DIR).join(name)).expect("fixture file")
}

/// Writes the fixture project into `dir` (created, mode 0755), with `config` as its
/// `consort.toml` (the fixture's when `None`).
fn new_project(dir: &Path, config: Option<&str>) -> Result<(), String> {
    ctx(
        std::fs::create_dir_all(dir.join(".consort/agents")),
        "create the project",
    )?;
    for d in [dir, &dir.join(".consort"), &dir.join(".consort/agents")] {
        ctx(
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)),
            "chmod",
        )?;
    }
    let cfg = config.map_or_else(|| fixture("consort.toml"), str::to_string);
    ctx(std::fs::write(dir.join("consort.toml"), cfg), "write")?;
    ctx(
        std::fs::write(dir.join("feature.md"), fixture("feature.md")),
        "write",
    )?;
    ctx(
        std::fs::write(dir.join(SCRIPT_REL), fixture("script.toml")),
        "write",
    )?;
    Ok(())
}

fn ledger_path(dir: &Path) -> PathBuf {
    consort::project::Project::open(dir)
        .expect("project")
        .ledger_path()
}

/// The figures of the summary line, and every failure found on the way.
#[derive(Default)]
struct Tally {
    crash_resumed: usize,
    crash_points: usize,
    faults_handled: usize,
    faults: usize,
    leaked: usize,
    fuzz_cases: usize,
    child_panics: usize,
    failures: Vec<String>,
}

impl Tally {
    fn fail(&mut self, part: &str, what: impl Into<String>) {
        let what = what.into();
        eprintln!("FAIL [{part}] {what}");
        self.failures.push(format!("[{part}] {what}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Crash at every transition.

mod crash {
    use super::*;
    use consort::project::RunOptions;
    use consort_testkit::observers::AbortAfter;

    /// Set (to `N`) only for a crash point's child: this binary's `main` then runs the project
    /// in [`CHILD_DIR_ENV`] and aborts right after its `N`-th ledger append. Read by this test
    /// binary alone; no library reads it.
    pub(crate) const CHILD_ENV: &str = "RELIABILITY_CRASH_CHILD";
    /// The project a crash point's child runs.
    pub(crate) const CHILD_DIR_ENV: &str = "RELIABILITY_CRASH_DIR";

    /// The crash point's child mode, when [`CHILD_ENV`] is set: runs the project as
    /// `consort run --approve-as ada --dir DIR` does, aborting after the `N`-th append. Returns
    /// the exit code when the run ends without reaching that append (the parent expects an
    /// abort, so any return is a failure it reports).
    pub(crate) fn child() -> Option<ExitCode> {
        let n: u64 = std::env::var(CHILD_ENV).ok()?.parse().ok()?;
        let dir = PathBuf::from(std::env::var_os(CHILD_DIR_ENV)?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .ok()?;
        let outcome = runtime.block_on(async {
            let project = ctx(Project::open(&dir), "open the project")?;
            let lock = ctx(project.lock("consort run"), "take the run lock")?;
            let opts = RunOptions {
                approver: Some(Arc::new(ApproveAs { name: "ada".into() })),
                append_observer: Some(Arc::new(AbortAfter(n))),
                ..RunOptions::default()
            };
            let ensemble = ctx(project.ensemble_locked(lock, opts).await, "build")?;
            let result = ensemble.run().await;
            ensemble.shutdown().await;
            ctx(result, "run").map(|r| r.events_appended)
        });
        let how = match outcome {
            Ok(events) => format!("{events} events appended"),
            Err(e) => e,
        };
        eprintln!("the crash child ended without aborting after append {n}: {how}");
        Some(ExitCode::FAILURE)
    }

    /// What a finished run looks like, with everything that differs between two correct runs
    /// (times, branch names, timings) left out.
    #[derive(Debug, Clone, PartialEq)]
    pub(crate) struct Facts {
        /// One normalised value per ledger event.
        pub signature: Vec<Value>,
        /// `consort status --json` without the random branch name.
        pub status: Value,
        /// The replayed machine state's essential parts, the work tree and the design on disk.
        pub essentials: Value,
        /// Request ids of every `verify-completed` event, in ledger order.
        pub verify_ids: Vec<u64>,
    }

    /// An event without what legitimately differs between runs.
    pub(crate) fn normalise(event: &Event) -> Value {
        let mut v = serde_json::to_value(event).unwrap_or(Value::Null);
        if let Some(r) = v.get_mut("receipt").and_then(Value::as_object_mut) {
            r.remove("branch_id");
            r.remove("timings");
        }
        if let Some(a) = v.get_mut("approval").and_then(Value::as_object_mut) {
            a.remove("at");
        }
        // A step's wall time is a measurement, like a receipt's timings; what is left of the
        // usage (calls, tokens) must be the same.
        if let Some(o) = v.as_object_mut() {
            let spent = o.get_mut("usage").and_then(Value::as_object_mut).map(|u| {
                u.remove("wall_ms");
                u.values().any(|x| x.as_u64() != Some(0))
            });
            if spent == Some(false) {
                o.remove("usage");
            }
        }
        v
    }

    /// The parts of a state that must be equal after any crash and resume.
    pub(crate) fn essentials(state: &State, dir: &Path) -> Result<Value, String> {
        let work = ctx(WorkTree::open(dir), "open the work tree")?;
        let files = ctx(work.file_hashes(), "hash the work tree")?;
        let project = ctx(Project::open(dir), "open the project")?;
        let design_file = project.design_path();
        Ok(json!({
            "phase": state.phase(),
            "status": state.status,
            "pending": state.pending,
            "build": state.build,
            "frozen": state.frozen,
            "design": state.design_bundle().map(|b| b.hash()),
            "receipts": state.receipts.iter().map(|r| json!({
                "request": r.request_id,
                "workspace": r.workspace_hash,
                "outcomes": r.outcomes,
                "exit": r.exit,
                "digest": r.output_digest,
                "provider": r.provider,
                "runner": r.runner,
            })).collect::<Vec<_>>(),
            "approvals": state.approvals.iter().map(|a| json!({
                "gate": a.gate,
                "hash": a.hash,
                "decision": a.decision,
                "approver": a.approver,
            })).collect::<Vec<_>>(),
            "promotion": state.promotion,
            "authors": state.authors,
            "next_request": state.next_request,
            "next_assignment": state.next_assignment,
            "work_tree": files,
            "design_on_disk": design_hash_on_disk(&design_file),
        }))
    }

    impl Facts {
        pub(crate) fn read(dir: &Path) -> Result<Facts, String> {
            let entries = ctx(Ledger::<Event>::read(ledger_path(dir)), "read the ledger")?;
            let signature = entries.iter().map(|e| normalise(&e.event)).collect();
            let verify_ids = entries
                .iter()
                .filter_map(|e| match &e.event {
                    Event::VerifyCompleted { receipt } => Some(receipt.request_id.0),
                    _ => None,
                })
                .collect();
            let o = run(consort().args(["status", "--json", "--dir"]).arg(dir));
            ensure(o.status.success(), || {
                format!("consort status failed: {}", text(&o))
            })?;
            let mut status: Value = ctx(serde_json::from_slice(&o.stdout), "status is JSON")?;
            if let Some(r) = status
                .get_mut("last_receipt")
                .and_then(Value::as_object_mut)
            {
                r.remove("branch");
            }
            // Wall times are measurements (see `normalise`); the rest of the usage must agree.
            if let Some(u) = status.get_mut("usage").and_then(Value::as_object_mut) {
                for (key, v) in u.iter_mut() {
                    let tallies: Vec<&mut Value> = match v.as_object_mut() {
                        Some(roles) if key == "roles" => roles.values_mut().collect(),
                        _ => vec![v],
                    };
                    for t in tallies.into_iter().filter_map(Value::as_object_mut) {
                        t.remove("wall_ms");
                    }
                }
            }
            let project = ctx(Project::open(dir), "open the project")?;
            let state = ctx(project.state(), "replay the ledger")?;
            Ok(Facts {
                signature,
                status,
                essentials: essentials(&state, dir)?,
                verify_ids,
            })
        }
    }

    /// A project with the fixture and an initialised (stopped) embedded cluster, copied for
    /// every run so that each starts from the same place without paying for `initdb`.
    pub(crate) fn template(root: &Path) -> Result<PathBuf, String> {
        let t = root.join("template");
        new_project(&t, None)?;
        let o = run(consort().arg("branches").arg("--dir").arg(&t));
        ensure(o.status.success(), || {
            format!("consort branches on a new project: {}", text(&o))
        })?;
        ensure(
            t.join(".consort/pg/data/PG_VERSION").exists(),
            || "the embedded cluster was not initialised inside the project",
        )?;
        Ok(t)
    }

    pub(crate) fn copy(from: &Path, to: &Path) -> Result<(), String> {
        let o = run(Command::new("cp").arg("-a").arg(from).arg(to));
        ensure(o.status.success(), || format!("cp -a: {}", text(&o)))
    }

    fn run_to_end(dir: &Path) -> Output {
        run(consort()
            .args(["run", "--approve-as", "ada", "--dir"])
            .arg(dir))
    }

    /// Branches with Consort's prefix that `consort branches` lists.
    pub(crate) fn branches_left(dir: &Path) -> Result<usize, String> {
        let o = run(consort().arg("branches").arg("--dir").arg(dir));
        ensure(o.status.success(), || {
            format!("consort branches: {}", text(&o))
        })?;
        Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with(PREFIX))
            .count())
    }

    /// The uninterrupted run every crashed run is compared with.
    pub(crate) struct Reference {
        pub dir: PathBuf,
        pub events: usize,
        pub facts: Facts,
    }

    pub(crate) fn reference(root: &Path, template: &Path) -> Result<(Reference, usize), String> {
        let dir = root.join("reference");
        copy(template, &dir)?;
        let o = run_to_end(&dir);
        let panics = child_panics(&o);
        ensure(o.status.code() == Some(0), || {
            format!("the uninterrupted run failed: {}", tail(&text(&o), 3000))
        })?;
        let facts = Facts::read(&dir)?;
        ensure(facts.status["phase"] == "done", || {
            format!("the uninterrupted run is not done: {}", facts.status)
        })?;
        let unique: BTreeSet<u64> = facts.verify_ids.iter().copied().collect();
        ensure(
            unique.len() == facts.verify_ids.len(),
            || "the uninterrupted run answered a verify request twice",
        )?;
        let o = run(consort().arg("verify").arg("--dir").arg(&dir));
        ensure(o.status.success(), || {
            format!("consort verify on the reference: {}", text(&o))
        })?;
        ensure(
            branches_left(&dir)? == 0,
            || "the uninterrupted run left branches",
        )?;
        Ok((
            Reference {
                events: facts.signature.len(),
                dir,
                facts,
            },
            panics,
        ))
    }

    /// One crash point's verdict.
    pub(crate) struct Point {
        pub n: usize,
        pub result: Result<(), String>,
        pub leaked: usize,
        pub panics: usize,
    }

    fn first_difference(a: &[Value], b: &[Value]) -> String {
        match a.iter().zip(b).position(|(x, y)| x != y) {
            Some(i) => format!(
                "event {} differs:\n  uninterrupted: {}\n  resumed:       {}",
                i + 1,
                tail(&a[i].to_string(), 600),
                tail(&b[i].to_string(), 600)
            ),
            None => format!("{} events, uninterrupted {}", b.len(), a.len()),
        }
    }

    /// Crash after the `n`-th append, resume, compare.
    pub(crate) fn point(root: &Path, template: &Path, reference: &Reference, n: usize) -> Point {
        let mut p = Point {
            n,
            result: Ok(()),
            leaked: 0,
            panics: 0,
        };
        let dir = root.join(format!("crash-{n:03}"));
        p.result = (|| {
            copy(template, &dir)?;
            let crashed = run(
                Command::new(ctx(std::env::current_exe(), "this test binary")?)
                    .env(CHILD_ENV, n.to_string())
                    .env(CHILD_DIR_ENV, &dir)
                    .env("CONSORT_LOG", "warn")
                    .stdin(Stdio::null()),
            );
            p.panics += child_panics(&crashed);
            ensure(crashed.status.signal() == Some(6), || {
                format!(
                    "expected an abort after append {n}, got {:?}: {}",
                    crashed.status,
                    tail(&text(&crashed), 2000)
                )
            })?;
            let kept = ctx(Ledger::<Event>::read(ledger_path(&dir)), "read")?.len();
            ensure(kept == n, || {
                format!("the crashed run left {kept} events, expected {n}")
            })?;
            let resumed = run_to_end(&dir);
            p.panics += child_panics(&resumed);
            ensure(resumed.status.code() == Some(0), || {
                format!(
                    "the resumed run exited {:?}: {}",
                    resumed.status.code(),
                    tail(&text(&resumed), 3000)
                )
            })?;
            let facts = Facts::read(&dir)?;
            let unique: BTreeSet<u64> = facts.verify_ids.iter().copied().collect();
            ensure(unique.len() == facts.verify_ids.len(), || {
                format!(
                    "a verification whose receipt was already in the ledger ran again: request ids {:?}",
                    facts.verify_ids
                )
            })?;
            ensure(facts.signature == reference.facts.signature, || {
                format!(
                    "the ledger differs from the uninterrupted run's: {}",
                    first_difference(&reference.facts.signature, &facts.signature)
                )
            })?;
            ensure(facts.status == reference.facts.status, || {
                format!(
                    "status differs:\n  uninterrupted: {}\n  resumed:       {}",
                    reference.facts.status, facts.status
                )
            })?;
            ensure(facts.essentials == reference.facts.essentials, || {
                format!(
                    "the replayed state or the work tree differs:\n  uninterrupted: {}\n  resumed:       {}",
                    tail(&reference.facts.essentials.to_string(), 1500),
                    tail(&facts.essentials.to_string(), 1500)
                )
            })?;
            let v = run(consort().arg("verify").arg("--dir").arg(&dir));
            ensure(v.status.success(), || {
                format!("consort verify fails: {}", text(&v))
            })?;
            p.leaked = branches_left(&dir)?;
            ensure(p.leaked == 0, || {
                format!("{} branch(es) with Consort's prefix left", p.leaked)
            })?;
            Ok(())
        })();
        if p.result.is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        p
    }

    /// Every crash point, `workers` at a time.
    pub(crate) fn sweep(
        root: &Path,
        template: &Path,
        reference: &Reference,
        workers: usize,
    ) -> Vec<Point> {
        let next = AtomicUsize::new(1);
        let done = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..workers.max(1) {
                s.spawn(|| {
                    loop {
                        let n = next.fetch_add(1, Ordering::SeqCst);
                        if n > reference.events {
                            return;
                        }
                        let p = point(root, template, reference, n);
                        if let Err(e) = &p.result {
                            eprintln!("crash point {n}: {e}");
                        }
                        done.lock().expect("results").push(p);
                    }
                });
            }
        });
        let mut points = done.into_inner().expect("results");
        points.sort_by_key(|p| p.n);
        points
    }
}

// ---------------------------------------------------------------------------------------------
// Injected faults.

mod faults {
    use super::*;
    use consort::actors::RunReport as Report;
    use consort::agents::{ApiKey, HttpPolicy, OpenAiAgent, OpenAiConfig};
    use consort::lakebase::{CommandRunner, CommandRunnerConfig, LakebaseActor, LakebaseArgs};
    use consort_testkit::model::{fail, ok, start_stub_stopping as start_stub};

    /// How many fault scenarios there are.
    pub(crate) const SCENARIOS: usize = 8;

    /// The API key the fault scenarios' model agents send.
    pub(crate) const FAULT_KEY: &str = "sk-reliability-fault-Hq3Vx8";

    /// What every in-process scenario shares: one embedded cluster (each scenario gets its own
    /// parent database on it) and the branch passwords seen, for the secrets sweep.
    pub(crate) struct Rig {
        pub cluster: Arc<EmbeddedCluster>,
        pub root: PathBuf,
        pub branch_secrets: Arc<Mutex<BTreeSet<String>>>,
        pub ledgers: Mutex<Vec<PathBuf>>,
    }

    impl Rig {
        pub(crate) async fn provider(
            &self,
            parent: &str,
        ) -> Result<Arc<dyn BranchProvider>, String> {
            Ok(self.flaky(parent, 0).await?)
        }

        pub(crate) async fn flaky(
            &self,
            parent: &str,
            fail_creates: u32,
        ) -> Result<Arc<RecordingProvider>, String> {
            let opts = ServerOptions {
                parent_database: Some(parent.to_string()),
                ..ServerOptions::default()
            };
            let p = ctx(
                EmbeddedProvider::with_options(self.cluster.clone(), opts).await,
                "embedded provider",
            )?;
            Ok(Arc::new(
                RecordingProvider::new(Arc::new(p), self.branch_secrets.clone())
                    .failing_creates(fail_creates),
            ))
        }

        /// A scenario's project `name` and a provider on its own parent database `parent`.
        pub(crate) async fn scenario(
            &self,
            name: &str,
            parent: &str,
        ) -> Result<(PathBuf, Arc<dyn BranchProvider>), String> {
            Ok((self.project(name)?, self.provider(parent).await?))
        }

        /// Scenario `name` on its own parent database `parent`, run to its end with every gate
        /// approved, over a provider whose first `fail_creates` creates fail.
        pub(crate) async fn flaky_run(
            &self,
            name: &str,
            parent: &str,
            fail_creates: u32,
        ) -> Result<(Arc<RecordingProvider>, Ran), String> {
            let dir = self.project(name)?;
            let flaky = self.flaky(parent, fail_creates).await?;
            let provider: Arc<dyn BranchProvider> = flaky.clone();
            let ran = drive(approved_by_ada(&dir, &provider, psql_runner()?)?, &provider).await?;
            Ok((flaky, ran))
        }

        pub(crate) fn project(&self, name: &str) -> Result<PathBuf, String> {
            let dir = self.root.join(name);
            new_project(&dir, None)?;
            self.ledgers
                .lock()
                .expect("ledgers")
                .push(ledger_path(&dir));
            Ok(dir)
        }
    }

    /// An agent that panics on `step` (`panics` times, then plays `inner`), else plays
    /// `inner`; `calls` counts the assignments of `step`.
    pub(crate) fn panic_on(
        inner: Arc<dyn Agent>,
        step: &'static str,
        panics: u32,
        calls: Arc<AtomicU32>,
    ) -> impl Agent {
        let panics_left = Arc::new(AtomicU32::new(panics));
        consort_testkit::agents::agent_fn(move |a: Assignment| {
            let (inner, calls, panics_left) = (inner.clone(), calls.clone(), panics_left.clone());
            async move {
                if a.step.to_string() == step {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let left = panics_left.load(Ordering::SeqCst);
                    if left > 0 {
                        panics_left.store(left.saturating_sub(1), Ordering::SeqCst);
                        panic!("{DELIBERATE_PANIC}: the agent blows up on {}", a.step);
                    }
                }
                inner.act(&a).await
            }
        })
    }

    /// The psql runner, with a saboteur: in the first run of the GREEN code it holds an
    /// exclusive lock on the `counters` table from another session of the same branch user,
    /// and terminates the runner's session as soon as it waits for that lock — the connection
    /// drops in the middle of the run.
    #[derive(Debug)]
    pub(crate) struct DropConnection {
        inner: PsqlRunner,
        psql: PathBuf,
        pub dropped: AtomicU32,
    }

    const SABOTEUR: &str = r#"
BEGIN;
SET LOCAL client_connection_check_interval = '100ms';
SET LOCAL statement_timeout = '60s';
LOCK TABLE counters IN ACCESS EXCLUSIVE MODE;
DO $$
DECLARE
    n int := 0;
BEGIN
    LOOP
        PERFORM pg_stat_clear_snapshot();
        SELECT count(pg_terminate_backend(pid)) INTO n
          FROM pg_stat_activity
         WHERE usename = current_user AND pid <> pg_backend_pid() AND wait_event_type = 'Lock';
        EXIT WHEN n > 0;
        PERFORM pg_sleep(0.01);
    END LOOP;
    RAISE NOTICE 'terminated %', n;
END $$;
COMMIT;
"#;

    impl DropConnection {
        pub(crate) fn new() -> Result<Self, String> {
            Ok(DropConnection {
                inner: ctx(PsqlRunner::new(PsqlRunnerConfig::default()), "psql runner")?,
                psql: ctx(consort::lakebase::find_psql(), "psql")?,
                dropped: AtomicU32::new(0),
            })
        }

        fn psql(&self, conn: &ConnectInfo) -> tokio::process::Command {
            let mut c = tokio::process::Command::new(&self.psql);
            c.env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .envs(conn.env())
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
                .stdin(Stdio::null())
                .kill_on_drop(true);
            c
        }

        async fn lock_held(&self, conn: &ConnectInfo) -> bool {
            let out = self
                .psql(conn)
                .args([
                    "-At",
                    "-c",
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                     WHERE c.relname = 'counters' AND l.mode = 'AccessExclusiveLock' AND l.granted",
                ])
                .output()
                .await;
            matches!(out, Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "1")
        }

        async fn sabotaged(&self, ctx: &RunContext) -> consort::lakebase::Result<RunReport> {
            let saboteur = self
                .psql(&ctx.conn)
                .args(["-c", SABOTEUR])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| consort::lakebase::Error::io("start the saboteur", e))?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !self.lock_held(&ctx.conn).await && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let report = self.inner.run(ctx).await;
            if let Ok(Ok(out)) =
                tokio::time::timeout(Duration::from_secs(30), saboteur.wait_with_output()).await
            {
                let said = String::from_utf8_lossy(&out.stderr);
                let n: u32 = said
                    .split("terminated ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(0);
                self.dropped.fetch_add(n, Ordering::SeqCst);
            }
            report
        }
    }

    impl TestRunner for DropConnection {
        fn name(&self) -> &'static str {
            "psql"
        }

        fn run<'a>(
            &'a self,
            ctx: &'a RunContext,
        ) -> consort::lakebase::BoxFuture<'a, consort::lakebase::Result<RunReport>> {
            Box::pin(async move {
                let armed = self.dropped.load(Ordering::SeqCst) == 0
                    && ctx.work_tree.join("src/counters.sql").exists();
                if armed {
                    self.sabotaged(ctx).await
                } else {
                    self.inner.run(ctx).await
                }
            })
        }
    }

    fn psql_runner() -> Result<Arc<dyn TestRunner>, String> {
        Ok(Arc::new(ctx(
            PsqlRunner::new(PsqlRunnerConfig::default()),
            "psql runner",
        )?))
    }

    /// An ensemble for the fixture project in `dir`, every role on the fixture's script.
    pub(crate) fn builder(
        dir: &Path,
        provider: Arc<dyn BranchProvider>,
        runner: Arc<dyn TestRunner>,
        approver: Arc<dyn Approver>,
    ) -> Result<EnsembleBuilder, String> {
        let project = ctx(Project::open(dir), "open the project")?;
        let script = ctx(Script::from_path(dir.join(SCRIPT_REL)), "the script")?;
        let mut b = Ensemble::builder(dir)
            .feature(ctx(project.feature(), "the feature")?)
            .machine(ctx(project.machine(), "the machine")?.config().clone())
            .provider(provider)
            .runner(runner)
            .approver(approver)
            .pool(consort_testkit::cluster::pool_config(1), 2)
            .timeouts(Duration::from_secs(60), Duration::from_secs(60));
        for role in Role::ALL {
            b = b.agent(role, script.agent(role));
        }
        Ok(b)
    }

    /// [`builder`] on the psql runner with gates no one approves: the run stops at the design
    /// gate.
    fn stopping_at_gates(
        dir: &Path,
        provider: &Arc<dyn BranchProvider>,
    ) -> Result<EnsembleBuilder, String> {
        builder(dir, provider.clone(), psql_runner()?, Arc::new(StopAtGates))
    }

    /// [`builder`] with every gate approved by "ada": the run goes to the end.
    fn approved_by_ada(
        dir: &Path,
        provider: &Arc<dyn BranchProvider>,
        runner: Arc<dyn TestRunner>,
    ) -> Result<EnsembleBuilder, String> {
        let ada = Arc::new(ApproveAs { name: "ada".into() });
        builder(dir, provider.clone(), runner, ada)
    }

    pub(crate) fn script_agent(dir: &Path, role: Role) -> Result<Arc<dyn Agent>, String> {
        let script = ctx(Script::from_path(dir.join(SCRIPT_REL)), "the script")?;
        Ok(Arc::new(script.agent(role)))
    }

    /// A finished in-process run.
    pub(crate) struct Ran {
        pub report: Report,
        pub entries: Vec<Entry<Event>>,
        pub leaked: usize,
    }

    /// Builds, runs and shuts down; checks that no event was lost and counts leftover branches.
    pub(crate) async fn drive(
        b: EnsembleBuilder,
        provider: &Arc<dyn BranchProvider>,
    ) -> Result<Ran, String> {
        let ensemble = ctx(b.build().await, "build the ensemble")?;
        let report = ensemble.run().await;
        ensemble.shutdown().await;
        let report = ctx(report, "the run")?;
        ctx(
            Ledger::<Event>::verify(&report.ledger_path),
            "the ledger verifies",
        )?;
        let entries = ctx(
            Ledger::<Event>::read(&report.ledger_path),
            "read the ledger",
        )?;
        ensure(entries.len() == report.events_appended, || {
            format!(
                "{} events appended, {} in the ledger: an event was lost",
                report.events_appended,
                entries.len()
            )
        })?;
        let leaked = ctx(provider.list(PREFIX).await, "list branches")?.len();
        Ok(Ran {
            report,
            entries,
            leaked,
        })
    }

    fn halted(report: &Report) -> Option<(&str, &EscalationReason)> {
        match &report.outcome {
            RunOutcome::Halted { escalation } => Some((&escalation.step, &escalation.reason)),
            _ => None,
        }
    }

    /// Checks that the run halted because of `fault` (at `step`, when one is named).
    fn ensure_halted(ran: &Ran, step: Option<&str>, fault: InfraFault) -> Result<(), String> {
        let reason = EscalationReason::Infrastructure(fault.clone());
        let ok = halted(&ran.report)
            .is_some_and(|(at, why)| *why == reason && step.is_none_or(|want| want == at));
        ensure(ok, || {
            format!(
                "expected a halt at {} because {fault}, got {:?}",
                step.unwrap_or("any step"),
                ran.report.outcome
            )
        })
    }

    /// Checks that the run stopped at the design gate.
    fn ensure_at_design_gate(ran: &Ran) -> Result<(), String> {
        ensure(
            matches!(
                ran.report.outcome,
                RunOutcome::AtGate {
                    gate: GateKind::Design,
                    ..
                }
            ),
            || format!("expected the design gate, got {:?}", ran.report.outcome),
        )
    }

    impl Ran {
        /// Checks that the ledger holds `want` events named `name`; `why` says what it means.
        fn ensure_count(&self, name: &str, want: usize, why: &str) -> Result<(), String> {
            let got = self
                .entries
                .iter()
                .filter(|e| e.event.name() == name)
                .count();
            ensure(got == want, || {
                format!("{why}: {got} {name} events, expected {want}")
            })
        }
    }

    /// The fixture's Product Owner in `dir`, panicking on `stories` `panics` times, and the
    /// count of its `stories` assignments.
    fn panicky_product_owner(
        dir: &Path,
        panics: u32,
    ) -> Result<(impl Agent + use<>, Arc<AtomicU32>), String> {
        let calls = Arc::new(AtomicU32::new(0));
        let inner = script_agent(dir, Role::ProductOwner)?;
        Ok((panic_on(inner, "stories", panics, calls.clone()), calls))
    }

    /// A role actor panics twice on a step: restarted, the step retried, the run goes on.
    pub(crate) async fn panic_then_recover(rig: &Rig) -> Result<usize, String> {
        let (dir, provider) = rig.scenario("panic-recover", "rel_panic_recover").await?;
        let (panicky, calls) = panicky_product_owner(&dir, 2)?;
        let before = DELIBERATE_PANICS.load(Ordering::SeqCst);
        let b = stopping_at_gates(&dir, &provider)?.agent(Role::ProductOwner, panicky);
        let ran = drive(b, &provider).await?;
        ensure_at_design_gate(&ran)?;
        ensure(calls.load(Ordering::SeqCst) == 3, || {
            format!(
                "stories asked {} times, expected 3",
                calls.load(Ordering::SeqCst)
            )
        })?;
        ensure(
            DELIBERATE_PANICS.load(Ordering::SeqCst) - before == 2,
            || "the agent did not panic twice",
        )?;
        ran.ensure_count(
            "agent-failed",
            0,
            "a restarted step must not be recorded as failed",
        )?;
        ensure(
            ran.report.state.stories.is_some(),
            || "the retried step produced no stories",
        )?;
        Ok(ran.leaked)
    }

    /// A role actor that always panics: past the restart intensity, an infrastructure
    /// escalation (actor crashing), not a loop.
    pub(crate) async fn panic_past_intensity(rig: &Rig) -> Result<usize, String> {
        let (dir, provider) = rig.scenario("panic-always", "rel_panic_always").await?;
        let (panicky, calls) = panicky_product_owner(&dir, u32::MAX)?;
        let policy = consort::actors::RestartPolicy::default();
        let b = stopping_at_gates(&dir, &provider)?
            .agent(Role::ProductOwner, panicky)
            .restart_policy(policy);
        let ran = drive(b, &provider).await?;
        ensure_halted(&ran, Some("stories"), InfraFault::ActorCrashing)?;
        let asked = calls.load(Ordering::SeqCst) as usize;
        ensure(asked == policy.max_restarts + 1, || {
            format!(
                "the step was tried {asked} times; the intensity allows {} restarts",
                policy.max_restarts
            )
        })?;
        ran.ensure_count("agent-failed", 1, "the escalation is recorded once")?;
        Ok(ran.leaked)
    }

    /// The branch provider fails the first create: the verification is retried on a new
    /// branch and the run finishes.
    pub(crate) async fn create_fails_once(rig: &Rig) -> Result<usize, String> {
        let (flaky, ran) = rig.flaky_run("create-once", "rel_create_once", 1).await?;
        ensure(ran.report.outcome == RunOutcome::Done, || {
            format!("expected done, got {:?}", ran.report.outcome)
        })?;
        ensure(flaky.injected() == 1, || "the fault was not injected")?;
        ran.ensure_count(
            "verify-failed",
            0,
            "the retried verification must not be recorded as failed",
        )?;
        ensure(ran.report.state.receipts.len() == 7, || {
            format!("{} receipts, expected 7", ran.report.state.receipts.len())
        })?;
        Ok(ran.leaked)
    }

    /// The branch provider fails every create: a typed escalation (database down).
    pub(crate) async fn create_always_fails(rig: &Rig) -> Result<usize, String> {
        let (_flaky, ran) = rig
            .flaky_run("create-always", "rel_create_always", u32::MAX)
            .await?;
        ensure_halted(&ran, None, InfraFault::DatabaseDown)?;
        ran.ensure_count(
            "verify-failed",
            1,
            "the failed verification is recorded once",
        )?;
        ensure(
            ran.report.state.receipts.is_empty(),
            || "no receipt without a branch",
        )?;
        Ok(ran.leaked)
    }

    /// The connection to the branch drops in the middle of a test run: not a verdict on the
    /// code — the verification is retried and the run finishes.
    pub(crate) async fn connection_dropped(rig: &Rig) -> Result<usize, String> {
        let (dir, provider) = rig.scenario("conn-drop", "rel_conn_drop").await?;
        let runner = Arc::new(DropConnection::new()?);
        let b = approved_by_ada(&dir, &provider, runner.clone())?;
        let ran = drive(b, &provider).await?;
        ensure(
            runner.dropped.load(Ordering::SeqCst) == 1,
            || "no connection was dropped",
        )?;
        ensure(ran.report.outcome == RunOutcome::Done, || {
            format!("expected done after a retry, got {:?}", ran.report.outcome)
        })?;
        let repairs = ran
            .entries
            .iter()
            .filter(|e| matches!(&e.event, Event::Produced { artifact: Artifact::ChangeSet(c), .. } if c.summary.starts_with("a bump")))
            .count();
        ensure(repairs == 1, || "only T2 needs its repair")?;
        ensure(ran.report.state.receipts.len() == 7, || {
            format!(
                "{} receipts, expected 7 (the broken run is no receipt)",
                ran.report.state.receipts.len()
            )
        })?;
        Ok(ran.leaked)
    }

    /// A test command that hangs is killed with its process group at the time limit; the
    /// receipt says it timed out and is not a pass.
    pub(crate) async fn hanging_command(rig: &Rig) -> Result<usize, String> {
        let tree = rig.root.join("hang-tree");
        ctx(std::fs::create_dir_all(tree.join("tests")), "mkdir")?;
        ctx(std::fs::write(tree.join("tests/t1.sh"), "true\n"), "write")?;
        // The run is confined (it may write only its scratch directory): the sleeper's pid
        // comes back in the output.
        let mut cfg = CommandRunnerConfig::new("sleep 300 & echo \"sleeper pid $!\"; wait");
        cfg.timeout = Duration::from_secs(2);
        let provider = rig.provider("rel_hang").await?;
        let args = LakebaseArgs::new(provider.clone(), Arc::new(CommandRunner::new(cfg)));
        let (actor, handle) = ctx(LakebaseActor::spawn(args).await, "spawn the Lakebase actor")?;
        let req = VerifyRequest {
            workspace_hash: ctx(hash_dir(&tree), "hash")?,
            files: None,
            tests: vec!["t1".into()],
            ..consort_testkit::verify::request(1, &tree, Vec::new())
        };
        let answer = consort_testkit::verify::verify(&actor, req, Duration::from_secs(120)).await;
        actor.stop(None);
        let _ = handle.await;
        let receipt = answer.map_err(|e| format!("no receipt for the hanging command: {e}"))?;
        ensure(receipt.exit.timed_out, || {
            format!("the receipt does not say timed out: {:?}", receipt.exit)
        })?;
        ensure(
            !receipt.exit.success(),
            || "a timed-out run is not a clean exit",
        )?;
        ensure(
            receipt.status_of("t1") != Some(TestStatus::Passed),
            || "a test of a timed-out run passed",
        )?;
        let pid: u32 = ctx(
            receipt
                .output_excerpt
                .lines()
                .find_map(|l| l.strip_prefix("sleeper pid "))
                .ok_or_else(|| format!("no sleeper pid in: {}", receipt.output_excerpt))?
                .trim()
                .parse(),
            "pid",
        )?;
        ensure(
            eventually(10, || !consort::lakebase::procinfo::alive(pid)),
            || format!("the hanging command's child {pid} survived the time limit"),
        )?;
        Ok(ctx(provider.list(PREFIX).await, "list")?.len())
    }

    fn openai(role: Role, base: &str) -> Result<OpenAiAgent, String> {
        let mut cfg = OpenAiConfig::new(base, "stub-model");
        cfg.api_key_env = None;
        cfg.output_retries = 0;
        cfg.http = HttpPolicy {
            max_retries: 2,
            initial_backoff_ms: 10,
            max_backoff_ms: 50,
            request_timeout_secs: 10,
            connect_timeout_secs: 2,
        };
        let key = ctx(ApiKey::new(FAULT_KEY), "api key")?;
        ctx(OpenAiAgent::with_key(role, cfg, key), "openai agent")
    }

    /// The stories the fixture's Product Owner answers, as a model would send them.
    pub(crate) fn stories_answer() -> Result<String, String> {
        let script = ctx(Script::from_toml_str(&fixture("script.toml")), "the script")?;
        let step: Step = ctx("stories".parse(), "step")?;
        let entry = ctx(script.lookup(Role::ProductOwner, &step, 0), "lookup")?;
        ctx(serde_json::to_string(&entry.artifact), "json")
    }

    /// The model server answers 500, then 429: retried; the third answer is used.
    pub(crate) async fn model_server_errors(rig: &Rig) -> Result<usize, String> {
        let dir = rig.project("model-errors")?;
        let (base, stub) =
            start_stub(vec![fail(500), fail(429), ok(&stories_answer()?)], None).await;
        let provider = rig.provider("rel_model_errors").await?;
        let b = stopping_at_gates(&dir, &provider)?
            .agent(Role::ProductOwner, openai(Role::ProductOwner, &base)?);
        let ran = drive(b, &provider).await?;
        ensure_at_design_gate(&ran)?;
        ensure(stub.requests() == 3, || {
            format!(
                "the model server saw {} requests, expected 3",
                stub.requests()
            )
        })?;
        let expected: Artifact = ctx(serde_json::from_str(&stories_answer()?), "stories")?;
        ensure(
            ran.report
                .state
                .stories
                .as_ref()
                .map(|s| Artifact::Stories((**s).clone()))
                == Some(expected),
            || "the stories are not the model's answer",
        )?;
        Ok(ran.leaked)
    }

    /// The model server answers once and goes away: the next role's step escalates with
    /// model-server-failing after its retries.
    pub(crate) async fn model_server_gone(rig: &Rig) -> Result<usize, String> {
        let dir = rig.project("model-gone")?;
        let (base, stub) = start_stub(vec![ok(&stories_answer()?)], Some(1)).await;
        let provider = rig.provider("rel_model_gone").await?;
        let b = stopping_at_gates(&dir, &provider)?
            .agent(Role::ProductOwner, openai(Role::ProductOwner, &base)?)
            .agent(Role::SpecAuthor, openai(Role::SpecAuthor, &base)?);
        let ran = drive(b, &provider).await?;
        ensure_halted(&ran, Some("spec/r0"), InfraFault::ModelServerFailing)?;
        ensure(
            stub.requests() == 1,
            || "the server answered after it went away",
        )?;
        Ok(ran.leaked)
    }
}

// ---------------------------------------------------------------------------------------------
// 32 verifications at once.

mod load {
    use super::faults::Rig;
    use super::*;
    use consort::lakebase::{LakebaseActor, LakebaseArgs};

    pub(crate) const RUNS: u64 = 32;

    fn write(path: &Path, content: &str) -> Result<(), String> {
        if let Some(parent) = path.parent() {
            ctx(std::fs::create_dir_all(parent), "mkdir")?;
        }
        ctx(std::fs::write(path, content), "write")
    }

    /// Returns the branches left behind.
    pub(crate) async fn thirty_two_at_once(rig: &Rig) -> Result<usize, String> {
        let provider = rig.provider("rel_load").await?;
        let runner: Arc<dyn TestRunner> =
            Arc::new(ctx(PsqlRunner::new(PsqlRunnerConfig::default()), "psql")?);
        let mut args = LakebaseArgs::new(provider.clone(), runner);
        args.max_concurrent = RUNS as usize;
        args.pool = consort_testkit::cluster::pool_config(4);
        let stats = args.stats.clone();
        let (actor, handle) = ctx(LakebaseActor::spawn(args).await, "spawn")?;
        let migrations = vec![Migration {
            version: "0001_load_rows".into(),
            story_id: "S1".into(),
            description: "a table every run writes to".into(),
            sql: "CREATE TABLE load_rows (id int PRIMARY KEY, tree int NOT NULL);".into(),
        }];
        let mut trees = BTreeMap::new();
        for i in 1..=RUNS {
            let tree = rig.root.join(format!("load/tree-{i:02}"));
            // Plain CREATE (not OR REPLACE): a branch shared by two runs fails the setup.
            write(
                &tree.join("src/answer.sql"),
                &format!(
                    "CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS $$ SELECT {i} $$;\n"
                ),
            )?;
            write(
                &tree.join(format!("tests/t_{i:02}.sql")),
                &format!(
                    "DO $$ BEGIN\n  INSERT INTO load_rows VALUES (1, {i});\n  ASSERT answer() = {i}, format('tree {i} got answer %s', answer());\n  ASSERT (SELECT count(*) FROM load_rows) = 1, 'rows of another run are visible';\nEND $$;\n"
                ),
            )?;
            if i % 2 == 1 {
                write(
                    &tree.join("tests/z_odd.sql"),
                    "DO $$ BEGIN ASSERT answer() % 2 = 0, format('tree %s is odd', answer()); END $$;\n",
                )?;
            }
            trees.insert(i, tree);
        }
        let mut calls = Vec::new();
        for (i, tree) in &trees {
            let req = VerifyRequest {
                workspace_hash: ctx(hash_dir(tree), "hash")?,
                files: None,
                ..consort_testkit::verify::request(*i, tree, migrations.clone())
            };
            let actor = actor.clone();
            let i = *i;
            calls.push(tokio::spawn(async move {
                let r = actor
                    .call(
                        |port| LakebaseMsg::Verify(req, port),
                        Some(Duration::from_secs(300)),
                    )
                    .await;
                (i, r)
            }));
        }
        let mut receipts = BTreeMap::new();
        let mut problems = Vec::new();
        for c in calls {
            match c.await {
                Ok((i, Ok(consort::actors::ractor::rpc::CallResult::Success(Ok(r))))) => {
                    receipts.insert(i, r);
                }
                Ok((i, other)) => problems.push(format!("request {i}: {other:?}")),
                Err(e) => problems.push(format!("a caller task failed: {e}")),
            }
        }
        actor.stop(None);
        let _ = handle.await;
        ensure(problems.is_empty(), || problems.join("; "))?;
        ensure(receipts.len() == RUNS as usize, || {
            format!("{} of {RUNS} verifications completed", receipts.len())
        })?;
        let mut branches = BTreeSet::new();
        for (i, r) in &receipts {
            let tree = &trees[i];
            ensure(r.request_id == RequestId(*i), || {
                format!("request {i} got the receipt of {}", r.request_id)
            })?;
            ensure(r.workspace_hash == ctx(hash_dir(tree), "hash")?, || {
                format!("request {i}'s receipt is for another work tree")
            })?;
            let mine = format!("tests/t_{i:02}.sql");
            ensure(r.status_of(&mine) == Some(TestStatus::Passed), || {
                format!(
                    "request {i}: {mine} is {:?}: {}",
                    r.status_of(&mine),
                    r.output_excerpt
                )
            })?;
            let odd = r.status_of("tests/z_odd.sql");
            ensure(
                if i % 2 == 1 {
                    odd == Some(TestStatus::Failed)
                } else {
                    odd.is_none()
                },
                || format!("request {i}: z_odd is {odd:?}"),
            )?;
            ensure(r.outcomes.len() == if i % 2 == 1 { 2 } else { 1 }, || {
                format!(
                    "request {i} reports tests of another tree: {:?}",
                    r.outcomes
                )
            })?;
            ensure(
                !r.branch_id.is_empty() && branches.insert(r.branch_id.clone()),
                || {
                    format!(
                        "request {i} ran on a branch another request used: {}",
                        r.branch_id
                    )
                },
            )?;
        }
        let s = stats.snapshot();
        ensure(s.created == s.dropped, || {
            format!("{} branches created, {} dropped", s.created, s.dropped)
        })?;
        Ok(ctx(provider.list(PREFIX).await, "list")?.len())
    }
}

// ---------------------------------------------------------------------------------------------
// Secrets.

mod secrets {
    use super::faults::{FAULT_KEY, Rig, stories_answer};
    use super::*;
    use consort_testkit::model::{Reply, ok, start_stub_stopping as start_stub};

    pub(crate) const API_KEY: &str = "sk-reliability-Zq7RkW2mXv9tLp4N";
    pub(crate) const DB_PASSWORD: &str = "Kn0wnPass-reliability-4417";
    const DB_USER: &str = "relsecret";
    const DB_NAME: &str = "relsecret_parent";

    /// Runs SQL as the cluster's bootstrap superuser (password from the cluster directory).
    fn admin_sql(cluster: &EmbeddedCluster, statements: &[&str]) -> Result<(), String> {
        let password = ctx(
            std::fs::read_to_string(cluster.dir().join("admin.pw")),
            "read the admin password",
        )?;
        let psql = ctx(consort::lakebase::find_psql(), "psql")?;
        let o = run(Command::new(psql)
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U"])
            .arg(cluster.superuser())
            .arg("-p")
            .arg(cluster.port().to_string())
            .args(["-d", "postgres"])
            .args(statements.iter().flat_map(|s| ["-c", s]))
            .env("PGPASSWORD", password.trim())
            .stdin(Stdio::null()));
        ensure(o.status.success(), || {
            format!("admin SQL failed: {}", text(&o))
        })
    }

    fn config(base: &str) -> String {
        let mut cfg = fixture("consort.toml");
        cfg = cfg.replace(
            "provider = \"embedded\"\ndata_dir = \".consort/pg\"\nrun_as = \"postgres\"",
            "provider = \"url\"\nurl_env = \"RELIABILITY_DATABASE_URL\"",
        );
        cfg.push_str(&format!(
            r#"
[agents.roles.product-owner]
backend = "openai"
base_url = "{base}"
model = "stub-model"
api_key_env = "RELIABILITY_API_KEY"
output_retries = 0
http = {{ max_retries = 2, initial_backoff_ms = 10, max_backoff_ms = 50, request_timeout_secs = 10, connect_timeout_secs = 2 }}
"#
        ));
        cfg
    }

    /// Runs the binary on a blocking thread (the model stub serves on this runtime).
    async fn binary(args: Vec<String>, env: Vec<(String, String)>) -> Output {
        tokio::task::spawn_blocking(move || {
            let mut c = consort();
            c.args(&args).env("CONSORT_LOG", "debug");
            for (k, v) in env {
                c.env(k, v);
            }
            run(&mut c)
        })
        .await
        .expect("the binary's thread")
    }

    /// `consort run --approve-as ada --dir <dir>`, run as [`binary`] runs it.
    async fn approved_run(dir: &Path, env: Vec<(String, String)>) -> Output {
        let run = ["run", "--approve-as", "ada", "--dir"].map(String::from);
        binary([&run[..], &[dir.display().to_string()]].concat(), env).await
    }

    fn files_under(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.filter_map(Result::ok) {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => files_under(&p, out),
                Ok(t) if t.is_file() => {
                    if let Ok(b) = std::fs::read(&p) {
                        out.push((p, b));
                    }
                }
                _ => {}
            }
        }
    }

    /// Where a secret shows up (empty when nowhere).
    fn find(secret: &str, haystacks: &[(String, String)]) -> Vec<String> {
        haystacks
            .iter()
            .filter(|(_, text)| text.contains(secret))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Returns the branches left behind.
    pub(crate) async fn sweep(
        rig: &Rig,
        capture: &consort_testkit::logs::Capture,
    ) -> Result<usize, String> {
        admin_sql(
            &rig.cluster,
            &[
                &format!(
                    "CREATE ROLE {DB_USER} LOGIN CREATEDB CREATEROLE PASSWORD '{DB_PASSWORD}'"
                ),
                &format!("CREATE DATABASE {DB_NAME} OWNER {DB_USER}"),
                // The embedded providers of the other parts keep PUBLIC out of `postgres`.
                &format!("GRANT CONNECT ON DATABASE postgres TO {DB_USER}"),
            ],
        )?;
        let url = format!(
            "postgres://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{}/{DB_NAME}",
            rig.cluster.port()
        );
        let env = |url: &str| {
            vec![
                ("RELIABILITY_DATABASE_URL".to_string(), url.to_string()),
                ("RELIABILITY_API_KEY".to_string(), API_KEY.to_string()),
            ]
        };
        let mut outputs: Vec<(String, String)> = Vec::new();

        // A whole run: the model server first fails with an error that repeats the key.
        let dir = rig.root.join("secrets-run");
        let (base, stub) =
            start_stub(vec![Reply::EchoKey(500), ok(&stories_answer()?)], None).await;
        new_project(&dir, Some(&config(&base)))?;
        let d = dir.display().to_string();
        let o = approved_run(&dir, env(&url)).await;
        ensure(o.status.code() == Some(0), || {
            format!("the run with secrets failed: {}", tail(&text(&o), 3000))
        })?;
        outputs.push(("consort run".into(), text(&o)));
        ensure(
            stub.authorizations()
                .iter()
                .any(|a| a == &format!("Bearer {API_KEY}")),
            || "the model server never received the key",
        )?;
        let entries = ctx(Ledger::<Event>::read(ledger_path(&dir)), "read")?;
        ensure(
            entries.iter().any(|e| matches!(&e.event, Event::VerifyCompleted { receipt } if receipt.provider != "embedded")),
            || "the run did not use the URL provider",
        )?;
        for args in [
            vec!["status", "--json"],
            vec!["log", "--json"],
            vec!["log"],
            vec!["verify"],
            vec!["branches"],
            vec!["doctor"],
        ] {
            let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            a.extend(["--dir".to_string(), d.clone()]);
            let o = binary(a.clone(), env(&url)).await;
            outputs.push((format!("consort {}", a.join(" ")), text(&o)));
        }
        let leaked = {
            let o = binary(
                vec!["branches".into(), "--dir".into(), d.clone()],
                env(&url),
            )
            .await;
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with(PREFIX))
                .count()
        };

        // Error messages: a server that rejects the key and repeats it back; a database
        // server that is not there; a database that does not exist.
        let dir2 = rig.root.join("secrets-rejected");
        let (base2, _stub2) = start_stub(vec![Reply::EchoKey(401)], None).await;
        new_project(&dir2, Some(&config(&base2)))?;
        let o = approved_run(&dir2, env(&url)).await;
        ensure(o.status.code() == Some(4), || {
            format!(
                "a rejected key must halt the run (exit 4): {}",
                tail(&text(&o), 2000)
            )
        })?;
        outputs.push(("consort run (key rejected)".into(), text(&o)));
        let closed_port = {
            let l = ctx(std::net::TcpListener::bind("127.0.0.1:0"), "bind")?;
            ctx(l.local_addr(), "addr")?.port()
        };
        for bad in [
            format!("postgres://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{closed_port}/{DB_NAME}"),
            format!(
                "postgres://{DB_USER}:{DB_PASSWORD}@127.0.0.1:{}/no_such_db",
                rig.cluster.port()
            ),
            format!("postgres://{DB_USER}:{DB_PASSWORD}@127.0.0.1:notaport/{DB_NAME}"),
        ] {
            let o = binary(
                vec!["branches".into(), "--dir".into(), d.clone()],
                env(&bad),
            )
            .await;
            ensure(!o.status.success(), || {
                format!("consort branches with a bad URL succeeded: {}", text(&o))
            })?;
            outputs.push(("consort branches (bad URL)".into(), text(&o)));
        }

        // Everything written: every file of both projects, and this process's own logs.
        let mut haystacks = outputs;
        for d in [&dir, &dir2] {
            let mut files = Vec::new();
            files_under(d, &mut files);
            for (p, bytes) in files {
                haystacks.push((
                    p.display().to_string(),
                    String::from_utf8_lossy(&bytes).into_owned(),
                ));
            }
        }
        for l in rig.ledgers.lock().expect("ledgers").iter() {
            if let Ok(t) = std::fs::read_to_string(l) {
                haystacks.push((l.display().to_string(), t));
            }
        }
        haystacks.push(("this process's logs (debug)".into(), capture.text()));
        let mut leaks = Vec::new();
        for (what, secret) in [
            ("the API key", API_KEY),
            ("the database password", DB_PASSWORD),
            ("the fault scenarios' API key", FAULT_KEY),
        ] {
            let found = find(secret, &haystacks);
            if !found.is_empty() {
                leaks.push(format!("{what} appears in {found:?}"));
            }
        }
        let branch_secrets = rig.branch_secrets.lock().expect("secrets").clone();
        ensure(
            !branch_secrets.is_empty(),
            || "no branch password was recorded",
        )?;
        for s in &branch_secrets {
            let found = find(s, &haystacks);
            if !found.is_empty() {
                leaks.push(format!("a branch password appears in {found:?}"));
                break;
            }
        }
        ensure(leaks.is_empty(), || leaks.join("; "))?;
        Ok(leaked)
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed input.

mod fuzz {
    use super::*;
    use consort::actors::Machine;
    use consort::agents::openai::{extract_json, read_completion};
    use consort::agents::validate::{check_artifact, parse_artifact};
    use consort::config::ProjectConfig;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    /// How the inputs of one property were answered.
    #[derive(Default)]
    struct Seen {
        accepted: AtomicUsize,
        refused: AtomicUsize,
    }

    impl Seen {
        fn saw<T, E>(&self, r: &Result<T, E>) {
            match r {
                Ok(_) => self.accepted.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.refused.fetch_add(1, Ordering::Relaxed),
            };
        }
    }

    /// Runs `cases` cases of `test` over `strategy`; returns how many ran.
    fn property<S: Strategy>(
        name: &str,
        cases: u32,
        strategy: S,
        failures: &mut Vec<String>,
        test: impl Fn(S::Value, &Seen) -> Result<(), TestCaseError>,
    ) -> usize {
        let seen = Seen::default();
        let ran = AtomicUsize::new(0);
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 256,
            ..Config::default()
        });
        let result = runner.run(&strategy, |v| {
            ran.fetch_add(1, Ordering::SeqCst);
            test(v, &seen)
        });
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
        let ran = ran.into_inner();
        eprintln!(
            "fuzz: {name}: {ran} cases; {} accepted, {} refused with a typed error",
            seen.accepted.into_inner(),
            seen.refused.into_inner()
        );
        ran
    }

    const KEYS: &[&str] = &[
        "kind",
        "body",
        "id",
        "ac_id",
        "path",
        "changes",
        "op",
        "content",
        "summary",
        "stories",
        "acceptance_criteria",
        "feature_id",
        "requirements",
        "decision",
        "reasons",
        "migrations",
        "version",
        "sql",
        "story_id",
        "entries",
        "screens",
        "elements",
        "notes",
        "given",
        "when",
        "then",
        "title",
        "user_facing",
        "invariants",
        "layers",
        "nfrs",
    ];

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => proptest::sample::select(KEYS).prop_map(str::to_string),
            1 => "[a-z_]{0,12}",
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\PC{0,24}",
            Just(String::new()),
            Just("../../etc/passwd".to_string()),
            Just("/etc/shadow".to_string()),
            Just("tests/../src/x.sql".to_string()),
            Just(".consort/ledger.jsonl".to_string()),
            Just("consort.toml".to_string()),
            Just("tests/t1_new_counter_reads_zero.sql".to_string()),
            Just("S1-AC1".to_string()),
            Just("write".to_string()),
            Just("delete".to_string()),
            Just("approve".to_string()),
            Just("stories".to_string()),
            Just("change-set".to_string()),
            Just("test-run-receipt".to_string()),
            "x{1000,3000}",
        ]
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 96, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(key(), inner, 0..7)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A change to a JSON value at one of its nodes (chosen by index).
    #[derive(Debug, Clone)]
    enum Mutation {
        Remove(usize),
        Replace(usize, Value),
        EmptyIt(usize),
        Duplicate(usize),
        Rename(usize, String),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            any::<usize>().prop_map(Mutation::Remove),
            (any::<usize>(), json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
            any::<usize>().prop_map(Mutation::EmptyIt),
            any::<usize>().prop_map(Mutation::Duplicate),
            (any::<usize>(), key()).prop_map(|(i, k)| Mutation::Rename(i, k)),
        ]
    }

    /// JSON pointers of every node below the root.
    fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                    out.push(p.clone());
                    pointers(child, p, out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    let p = format!("{at}/{i}");
                    out.push(p.clone());
                    pointers(child, p, out);
                }
            }
            _ => {}
        }
    }

    fn mutate(v: &mut Value, m: &Mutation) {
        let mut ps = Vec::new();
        pointers(v, String::new(), &mut ps);
        if ps.is_empty() {
            if let Mutation::Replace(_, r) = m {
                *v = r.clone();
            }
            return;
        }
        let pick = |i: &usize| ps[i % ps.len()].clone();
        match m {
            Mutation::Replace(i, r) => {
                if let Some(node) = v.pointer_mut(&pick(i)) {
                    *node = r.clone();
                }
            }
            Mutation::EmptyIt(i) => {
                if let Some(node) = v.pointer_mut(&pick(i)) {
                    *node = match node {
                        Value::Array(_) => json!([]),
                        Value::Object(_) => json!({}),
                        Value::String(_) => json!(""),
                        _ => Value::Null,
                    };
                }
            }
            Mutation::Remove(i) | Mutation::Duplicate(i) | Mutation::Rename(i, _) => {
                let p = pick(i);
                let (parent, last) = p.rsplit_once('/').unwrap_or(("", ""));
                let last = last.replace("~1", "/").replace("~0", "~");
                let Some(node) = v.pointer_mut(parent) else {
                    return;
                };
                match (node, m) {
                    (Value::Object(map), Mutation::Remove(_)) => {
                        map.remove(&last);
                    }
                    (Value::Object(map), Mutation::Rename(_, k)) => {
                        if let Some(x) = map.remove(&last) {
                            map.insert(k.clone(), x);
                        }
                    }
                    (Value::Object(map), Mutation::Duplicate(_)) => {
                        if let Some(x) = map.get(&last).cloned() {
                            map.insert(format!("{last}_"), x);
                        }
                    }
                    (Value::Array(items), Mutation::Remove(_)) => {
                        if let Ok(idx) = last.parse::<usize>()
                            && idx < items.len()
                        {
                            items.remove(idx);
                        }
                    }
                    (Value::Array(items), Mutation::Duplicate(_) | Mutation::Rename(..)) => {
                        if let Ok(idx) = last.parse::<usize>()
                            && idx < items.len()
                        {
                            let x = items[idx].clone();
                            items.push(x);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The reference run, replayed: the state before each event, and the event.
    struct Timeline {
        machine: Machine,
        states: Vec<State>,
        events: Vec<Event>,
    }

    fn timeline(reference_dir: &Path) -> Result<Timeline, String> {
        let project = ctx(Project::open(reference_dir), "open the reference")?;
        let machine = ctx(project.machine(), "machine")?;
        let entries = ctx(Ledger::<Event>::read(ledger_path(reference_dir)), "read")?;
        let mut states = Vec::new();
        let mut s = State::default();
        let mut events = Vec::new();
        for e in entries {
            states.push(s.clone());
            if let Ok((next, _)) = machine.step(&s, &e.event) {
                s = next;
            }
            events.push(e.event);
        }
        Ok(Timeline {
            machine,
            states,
            events,
        })
    }

    fn config_bases() -> Vec<String> {
        let base = fixture("consort.toml");
        vec![
            base.clone(),
            format!(
                "{base}\n[agents.roles.driver]\nbackend = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key_env = \"K\"\nbudget = {{ max_tokens = 10, max_wall_secs = 5 }}\nhttp = {{ max_retries = 1 }}\n\n[agents.roles.navigator]\nbackend = \"command\"\nprogram = \"./nav.sh\"\ntimeout_ms = 1000\n"
            ),
            base.replace(
                "kind = \"psql\"\nsetup = [\"src/**/*.sql\"]\ntests = [\"tests/**/*.sql\"]\ntimeout_secs = 60",
                "kind = \"command\"\ncommand = \"cargo test\"\njunit = \"junit.xml\"\nsingle_test = \"cargo test -- {test}\"\ntap = false\npass_env = [\"HOME\"]",
            ),
            base.replace(
                "provider = \"embedded\"\ndata_dir = \".consort/pg\"\nrun_as = \"postgres\"",
                "provider = \"lakebase\"\nproject = \"p\"\nsource_branch = \"main\"\nttl_secs = 60",
            ),
        ]
    }

    #[derive(Debug, Clone)]
    enum TextEdit {
        DeleteLine(usize),
        DuplicateLine(usize),
        InsertLine(usize, String),
        ReplaceValue(usize, String),
        RenameKey(usize),
        Truncate(usize),
        InsertChars(usize, String),
    }

    fn text_edit() -> impl Strategy<Value = TextEdit> {
        let junk = prop_oneof![
            "\\PC{0,30}",
            Just("[".to_string()),
            Just("[[agents]]".to_string()),
            Just("= = =".to_string()),
            Just("\"unterminated".to_string()),
            Just("x = 1e999".to_string()),
            Just("max_repairs = -1".to_string()),
            Just("size = 99999999999999999999".to_string()),
            Just("tests = []".to_string()),
            Just("provider = \"oracle\"".to_string()),
            Just("[agents.roles.drivr]".to_string()),
            Just("timeout_secs = 0".to_string()),
        ];
        prop_oneof![
            any::<usize>().prop_map(TextEdit::DeleteLine),
            any::<usize>().prop_map(TextEdit::DuplicateLine),
            (any::<usize>(), junk.clone()).prop_map(|(i, s)| TextEdit::InsertLine(i, s)),
            (
                any::<usize>(),
                prop_oneof![
                    Just("\"\"".to_string()),
                    Just("[]".to_string()),
                    Just("0".to_string()),
                    Just("-5".to_string()),
                    Just("true".to_string()),
                    Just("{}".to_string()),
                    Just("\"[bad\"".to_string()),
                    Just("\"../x\"".to_string()),
                    "\\PC{0,10}"
                ]
            )
                .prop_map(|(i, s)| TextEdit::ReplaceValue(i, s)),
            any::<usize>().prop_map(TextEdit::RenameKey),
            any::<usize>().prop_map(TextEdit::Truncate),
            (any::<usize>(), junk).prop_map(|(i, s)| TextEdit::InsertChars(i, s)),
        ]
    }

    /// Removes line `i` (modulo the number of lines), if there is one.
    fn delete_line<T>(lines: &mut Vec<T>, i: usize) {
        if !lines.is_empty() {
            lines.remove(i % lines.len());
        }
    }

    /// Writes line `i` (modulo the number of lines) twice, if there is one.
    fn duplicate_line<T: Clone>(lines: &mut Vec<T>, i: usize) {
        if !lines.is_empty() {
            let at = i % lines.len();
            lines.insert(at, lines[at].clone());
        }
    }

    /// The assignment that was pending for `step` when `id` was produced, at its first attempt.
    fn first_attempt(id: consort::actors::AssignmentId, step: &Step) -> Assignment {
        Assignment {
            id,
            role: step.role(),
            step: step.clone(),
            attempt: 0,
            runner: None,
            writes: None,
            inputs: Default::default(),
            feedback: vec![],
            budget: None,
            tools: None,
        }
    }

    fn edit_text(text: &str, e: &TextEdit) -> String {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let n = lines.len().max(1);
        match e {
            TextEdit::DeleteLine(i) => delete_line(&mut lines, *i),
            TextEdit::DuplicateLine(i) => duplicate_line(&mut lines, *i),
            TextEdit::InsertLine(i, s) => lines.insert(i % (lines.len() + 1), s.clone()),
            TextEdit::ReplaceValue(i, s) => {
                if let Some(l) = lines.get_mut(i % n)
                    && let Some((k, _)) = l.split_once('=')
                {
                    *l = format!("{k}= {s}");
                }
            }
            TextEdit::RenameKey(i) => {
                if let Some(l) = lines.get_mut(i % n)
                    && let Some((k, v)) = l.split_once('=')
                {
                    *l = format!("{}z ={v}", k.trim_end());
                }
            }
            TextEdit::Truncate(i) => {
                let mut cut = i % (text.len() + 1);
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                return text[..cut].to_string();
            }
            TextEdit::InsertChars(i, s) => {
                let mut at = i % (text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                return format!("{}{s}{}", &text[..at], &text[at..]);
            }
        }
        lines.join("\n")
    }

    #[derive(Debug, Clone)]
    enum LedgerEdit {
        FlipByte(usize, usize, u8),
        DeleteLine(usize),
        DuplicateLine(usize),
        SwapLines(usize, usize),
        ReplaceLine(usize, String),
        InsertLine(usize, String),
        Truncate(usize),
        EditField(usize, &'static str, Value),
        AppendTorn(String),
    }

    fn ledger_edit() -> impl Strategy<Value = LedgerEdit> {
        let garbage = prop_oneof![
            "\\PC{0,80}",
            json().prop_map(|v| v.to_string()),
            Just("{}".to_string()),
            Just("{\"seq\":1}".to_string()),
            Just("null".to_string()),
            "x{5000,9000}",
        ];
        prop_oneof![
            (any::<usize>(), any::<usize>(), any::<u8>())
                .prop_map(|(l, p, b)| LedgerEdit::FlipByte(l, p, b)),
            any::<usize>().prop_map(LedgerEdit::DeleteLine),
            any::<usize>().prop_map(LedgerEdit::DuplicateLine),
            (any::<usize>(), any::<usize>()).prop_map(|(a, b)| LedgerEdit::SwapLines(a, b)),
            (any::<usize>(), garbage.clone()).prop_map(|(l, g)| LedgerEdit::ReplaceLine(l, g)),
            (any::<usize>(), garbage.clone()).prop_map(|(l, g)| LedgerEdit::InsertLine(l, g)),
            any::<usize>().prop_map(LedgerEdit::Truncate),
            (
                any::<usize>(),
                proptest::sample::select(&["seq", "time", "prev", "hash", "event"][..]),
                json()
            )
                .prop_map(|(l, f, v)| LedgerEdit::EditField(l, f, v)),
            garbage.prop_map(LedgerEdit::AppendTorn),
        ]
    }

    fn edit_ledger(text: &str, e: &LedgerEdit) -> Vec<u8> {
        let mut lines: Vec<Vec<u8>> = text.lines().map(|l| l.as_bytes().to_vec()).collect();
        let n = lines.len().max(1);
        let join = |lines: &[Vec<u8>]| {
            let mut out = Vec::new();
            for l in lines {
                out.extend_from_slice(l);
                out.push(b'\n');
            }
            out
        };
        match e {
            LedgerEdit::FlipByte(l, p, b) => {
                if let Some(line) = lines.get_mut(l % n)
                    && !line.is_empty()
                {
                    let at = p % line.len();
                    line[at] = if line[at] == *b {
                        b.wrapping_add(1)
                    } else {
                        *b
                    };
                }
            }
            LedgerEdit::DeleteLine(l) => delete_line(&mut lines, *l),
            LedgerEdit::DuplicateLine(l) => duplicate_line(&mut lines, *l),
            LedgerEdit::SwapLines(a, b) => {
                if !lines.is_empty() {
                    lines.swap(a % n, b % n);
                }
            }
            LedgerEdit::ReplaceLine(l, g) => {
                if !lines.is_empty() {
                    lines[l % n] = g.as_bytes().to_vec();
                }
            }
            LedgerEdit::InsertLine(l, g) => {
                lines.insert(l % (lines.len() + 1), g.as_bytes().to_vec())
            }
            LedgerEdit::Truncate(at) => {
                let all = join(&lines);
                let cut = at % (all.len() + 1);
                return all[..cut].to_vec();
            }
            LedgerEdit::EditField(l, f, v) => {
                if let Some(line) = lines.get_mut(l % n)
                    && let Ok(mut obj) = serde_json::from_slice::<Value>(line)
                    && let Some(map) = obj.as_object_mut()
                {
                    map.insert((*f).to_string(), v.clone());
                    *line = obj.to_string().into_bytes();
                }
            }
            LedgerEdit::AppendTorn(g) => {
                let mut all = join(&lines);
                all.extend_from_slice(g.trim_end_matches('\n').as_bytes());
                return all;
            }
        }
        join(&lines)
    }

    /// Runs every property; returns the cases run.
    pub(crate) fn all(reference_dir: &Path, scratch: &Path, failures: &mut Vec<String>) -> usize {
        let mut cases = 0;
        let tl = match timeline(reference_dir) {
            Ok(t) => t,
            Err(e) => {
                failures.push(e);
                return 0;
            }
        };
        let script = match Script::from_path(reference_dir.join(SCRIPT_REL)) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("script: {e}"));
                return 0;
            }
        };
        // Every Produced event of the reference run: the state before it and the event.
        let produced: Vec<usize> = tl
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Produced { .. }))
            .map(|(i, _)| i)
            .collect();
        let kinds: Vec<consort::actors::ArtifactKind> =
            script.entries().iter().map(|e| e.artifact.kind()).collect();
        let artifacts: Vec<Value> = script
            .entries()
            .iter()
            .map(|e| serde_json::to_value(&e.artifact).unwrap_or(Value::Null))
            .collect();

        // 1. Random JSON as an agent's answer, for every kind, then the role rules.
        cases += property(
            "random JSON as an artifact",
            1500,
            (0..kinds.len(), json()),
            failures,
            |(k, v), seen| {
                let kind = kinds[k];
                let parsed = parse_artifact(kind, v);
                seen.saw(&parsed);
                if let Ok(artifact) = parsed {
                    let i = produced[k % produced.len()];
                    if let Event::Produced { assignment, .. } = &tl.events[i]
                        && let Some(consort::actors::Pending::Agent { step, .. }) =
                            &tl.states[i].pending
                    {
                        let _ = check_artifact(&first_attempt(*assignment, step), &artifact);
                    }
                }
                Ok(())
            },
        );

        // 2. Valid answers, mutated, through parsing, the role rules and the state machine.
        cases += property(
            "mutated artifacts through parse, check and Machine::step",
            2500,
            (
                0..produced.len(),
                proptest::collection::vec(mutation(), 1..4),
            ),
            failures,
            |(p, ms), seen| {
                let i = produced[p];
                let Event::Produced {
                    assignment,
                    author,
                    artifact,
                    ..
                } = &tl.events[i]
                else {
                    return Ok(());
                };
                let mut body = serde_json::to_value(artifact).unwrap_or(Value::Null);
                for m in &ms {
                    mutate(&mut body, m);
                }
                if let Ok(mutated) = parse_artifact(artifact.kind(), body) {
                    if let Some(consort::actors::Pending::Agent { step, .. }) =
                        &tl.states[i].pending
                    {
                        let _ = check_artifact(&first_attempt(*assignment, step), &mutated);
                    }
                    let event = Event::Produced {
                        assignment: *assignment,
                        author: author.clone(),
                        artifact: mutated,
                        usage: Default::default(),
                        transcript: None,
                    };
                    seen.saw(&tl.machine.step(&tl.states[i], &event));
                } else {
                    seen.refused.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            },
        );

        // 3. A model's text: prose, fences, truncation, random text, random completions.
        cases += property(
            "model text and completions",
            1000,
            (
                0..artifacts.len(),
                "\\PC{0,40}",
                any::<usize>(),
                0u8..5,
                json(),
            ),
            failures,
            |(k, prose, cut, shape, completion), seen| {
                let body = artifacts[k].to_string();
                let text = match shape {
                    0 => format!("{prose}\n```json\n{body}\n```\n{prose}"),
                    1 => format!("<think>{prose}</think>{body}"),
                    2 => {
                        let mut c = cut % (body.len() + 1);
                        while !body.is_char_boundary(c) {
                            c -= 1;
                        }
                        body[..c].to_string()
                    }
                    3 => format!("{prose}{{{prose}}}{body}}}"),
                    _ => prose.clone(),
                };
                match extract_json(&text) {
                    Ok(v) => seen.saw(&parse_artifact(kinds[k], v)),
                    Err(e) => seen.saw::<(), _>(&Err(e)),
                }
                let _ = read_completion(&completion);
                let wrapped = json!({"choices": [{"message": {"content": completion}}]});
                let _ = read_completion(&wrapped);
                Ok(())
            },
        );

        // 4. Any event of the run, mutated, through Machine::step in the state it arrived in.
        cases += property(
            "mutated events through Machine::step",
            2000,
            (
                0..tl.events.len(),
                proptest::collection::vec(mutation(), 1..4),
            ),
            failures,
            |(i, ms), seen| {
                let mut v = serde_json::to_value(&tl.events[i]).unwrap_or(Value::Null);
                for m in &ms {
                    mutate(&mut v, m);
                }
                let Ok(event) = serde_json::from_value::<Event>(v) else {
                    seen.refused.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                };
                let stepped = tl.machine.step(&tl.states[i], &event);
                seen.saw(&stepped);
                // Whatever the machine made of it, the rest of the run's events must be
                // answered (accepted or refused), never a panic.
                let mut state = stepped.map_or_else(|_| tl.states[i].clone(), |(s, _)| s);
                for e in &tl.events[i + 1..] {
                    if let Ok((next, _)) = tl.machine.step(&state, e) {
                        state = next;
                    }
                }
                Ok(())
            },
        );

        // 5. Configuration files: mutated real ones and random text.
        let bases = config_bases();
        cases += property(
            "consort.toml",
            2000,
            (
                0..bases.len(),
                proptest::collection::vec(text_edit(), 1..4),
                "\\PC{0,200}",
                any::<bool>(),
            ),
            failures,
            |(b, edits, random, use_random), seen| {
                let text = if use_random {
                    random
                } else {
                    edits.iter().fold(bases[b].clone(), |t, e| edit_text(&t, e))
                };
                let parsed = ProjectConfig::parse(&text, Path::new("consort.toml"));
                seen.saw(&parsed);
                if let Ok(cfg) = parsed {
                    let _ = cfg.machine_config();
                    let _ = cfg.path_policy();
                    let _ = cfg.step_timeout();
                    for role in Role::ALL {
                        let _ = cfg.agents.for_role(role);
                    }
                }
                Ok(())
            },
        );

        // 6. Scripts: mutated TOML through the script loader.
        let script_text = fixture("script.toml");
        cases += property(
            "agent scripts",
            500,
            proptest::collection::vec(text_edit(), 1..4),
            failures,
            |edits, seen| {
                let text = edits
                    .iter()
                    .fold(script_text.clone(), |t, e| edit_text(&t, e));
                let parsed = Script::from_toml_str(&text);
                seen.saw(&parsed);
                if let Ok(s) = parsed {
                    for e in s.entries() {
                        let _ = e.artifact.kind();
                    }
                }
                Ok(())
            },
        );

        // 7. Ledger lines: any edit is either refused with a typed error, or what is accepted is
        //    exactly a prefix of what was written (a torn or cut tail).
        let original = match std::fs::read_to_string(ledger_path(reference_dir)) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("read the reference ledger: {e}"));
                return cases;
            }
        };
        let written = match Ledger::<Event>::read(ledger_path(reference_dir)) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("read the reference ledger: {e}"));
                return cases;
            }
        };
        let counter = AtomicUsize::new(0);
        cases += property(
            "ledger lines",
            1500,
            ledger_edit(),
            failures,
            |edit, seen| {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let path = scratch.join(format!("ledger-{}.jsonl", n % 4));
                let bytes = edit_ledger(&original, &edit);
                std::fs::write(&path, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let verified = Ledger::<Event>::verify(&path);
                seen.saw(&verified);
                match verified {
                    Ok(report) => {
                        let got = Ledger::<Event>::read(&path).map_err(|e| {
                            TestCaseError::fail(format!("verify passed, read failed: {e}"))
                        })?;
                        prop_assert!(got.len() as u64 == report.entries);
                        prop_assert!(
                            got.len() <= written.len() && got[..] == written[..got.len()],
                            "an edited ledger was accepted: {:?}",
                            edit
                        );
                    }
                    Err(e) => {
                        let _ = e.line();
                        let _ = e.to_string();
                    }
                }
                match Ledger::<Event>::open(&path) {
                    Ok(l) => {
                        prop_assert!(
                            l.entries().len() <= written.len()
                                && l.entries()[..] == written[..l.entries().len()],
                            "open accepted an edited ledger: {:?}",
                            edit
                        );
                    }
                    Err(e) => {
                        let _ = e.to_string();
                    }
                }
                Ok(())
            },
        );
        cases
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.

/// What the trials share: the scratch root, the log capture, the figures of the summary line,
/// the uninterrupted reference run (made by the first trial that needs it) and the rig of the
/// in-process parts.
struct Suite {
    root: tempfile::TempDir,
    capture: consort_testkit::logs::Capture,
    workers: usize,
    tally: Mutex<Tally>,
    reference: OnceLock<Result<(PathBuf, crash::Reference), String>>,
    rig: tokio::sync::OnceCell<faults::Rig>,
}

impl Suite {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The template and the uninterrupted run (also the fuzzers' ledger), made once.
    fn reference(&self) -> Result<&(PathBuf, crash::Reference), String> {
        self.reference
            .get_or_init(|| {
                let started = Instant::now();
                let tpl = crash::template(self.root.path())?;
                let (reference, panics) = crash::reference(self.root.path(), &tpl)?;
                self.tally().child_panics += panics;
                eprintln!(
                    "reference run: {} events ({:.1} s)",
                    reference.events,
                    started.elapsed().as_secs_f64()
                );
                Ok((tpl, reference))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The rig on the binary's shared embedded cluster, made once.
    async fn rig(&self) -> &faults::Rig {
        self.rig
            .get_or_init(|| async {
                faults::Rig {
                    cluster: consort_testkit::cluster::cluster().await,
                    root: self.root.path().join("rig"),
                    branch_secrets: Arc::new(Mutex::new(BTreeSet::new())),
                    ledgers: Mutex::new(Vec::new()),
                }
            })
            .await
    }

    /// Runs an in-process part on a runtime of its own.
    fn in_rig<T>(
        &self,
        part: impl for<'r> FnOnce(&'r faults::Rig, &'r Suite) -> Pin<Box<dyn Future<Output = T> + 'r>>,
    ) -> Result<T, Failed> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| Failed::from(format!("runtime: {e}")))?;
        Ok(runtime.block_on(async { part(self.rig().await, self).await }))
    }

    /// Records the failures of one trial and turns them into its verdict.
    fn verdict(&self, part: &str, failures: Vec<String>) -> Result<(), Failed> {
        let mut t = self.tally();
        for f in &failures {
            t.fail(part, f.clone());
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("\n").into())
        }
    }
}

/// Every crash point, resumed.
fn crash_sweep(suite: &Suite) -> Result<(), Failed> {
    let started = Instant::now();
    let (tpl, reference) = match suite.reference() {
        Ok(r) => r,
        Err(e) => return suite.verdict("crash", vec![e]),
    };
    let points = crash::sweep(suite.root.path(), tpl, reference, suite.workers);
    let mut failures = Vec::new();
    let mut t = suite.tally();
    t.crash_points = reference.events;
    for p in &points {
        t.leaked += p.leaked;
        t.child_panics += p.panics;
        match &p.result {
            Ok(()) => t.crash_resumed += 1,
            Err(e) => failures.push(format!("point {}: {e}", p.n)),
        }
    }
    eprintln!(
        "crash sweep: {} of {} resumed ({:.1} s)",
        t.crash_resumed,
        t.crash_points,
        started.elapsed().as_secs_f64()
    );
    drop(t);
    suite.verdict("crash", failures)
}

type Part<'r> = Pin<Box<dyn Future<Output = Result<usize, String>> + 'r>>;

type Scenario = for<'r> fn(&'r faults::Rig) -> Part<'r>;

/// One row of [`FAULTS`]: what the scenario does, and the function of `faults` that plays it,
/// whose name is the trial's name.
macro_rules! scenario {
    ($what:literal, $name:ident) => {
        ($what, stringify!($name), |rig| Box::pin(faults::$name(rig)))
    };
}

/// The fault scenarios: a name, a trial name and the scenario.
const FAULTS: [(&str, &str, Scenario); faults::SCENARIOS] = [
    scenario!(
        "a role actor panics, is restarted and the step retried",
        panic_then_recover
    ),
    scenario!(
        "a role actor panics past the restart intensity",
        panic_past_intensity
    ),
    scenario!(
        "the branch provider fails on create, once",
        create_fails_once
    ),
    scenario!(
        "the branch provider fails on every create",
        create_always_fails
    ),
    scenario!("the connection drops during a test run", connection_dropped),
    scenario!("a test command hangs", hanging_command),
    scenario!("the model server answers 500 and 429", model_server_errors),
    scenario!("the model server goes away", model_server_gone),
];

/// One fault scenario: handled when it passes and leaves no branch behind.
fn fault(suite: &Suite, name: &str, scenario: Scenario) -> Result<(), Failed> {
    let started = Instant::now();
    let outcome = suite.in_rig(|rig, _| scenario(rig))?;
    eprintln!("fault: {name} ({:.1} s)", started.elapsed().as_secs_f64());
    let mut t = suite.tally();
    t.faults += 1;
    let failure = match outcome {
        Ok(0) => {
            t.faults_handled += 1;
            None
        }
        Ok(leaked) => {
            t.leaked += leaked;
            Some(format!("{name}: {leaked} branch(es) left"))
        }
        Err(e) => Some(format!("{name}: {e}")),
    };
    drop(t);
    suite.verdict("faults", failure.into_iter().collect())
}

/// A part that returns the branches it left behind (load, secrets).
fn leaves_nothing(suite: &Suite, part: &str, outcome: Result<usize, String>) -> Result<(), Failed> {
    let failure = match outcome {
        Ok(0) => None,
        Ok(leaked) => {
            suite.tally().leaked += leaked;
            Some(format!("{leaked} branch(es) left"))
        }
        Err(e) => Some(e),
    };
    suite.verdict(part, failure.into_iter().collect())
}

fn load(suite: &Suite) -> Result<(), Failed> {
    let started = Instant::now();
    let outcome = suite.in_rig(|rig, _| Box::pin(load::thirty_two_at_once(rig)))?;
    eprintln!(
        "load: {} verifications at once ({:.1} s)",
        load::RUNS,
        started.elapsed().as_secs_f64()
    );
    leaves_nothing(suite, "load", outcome)
}

fn secrets(suite: &Suite) -> Result<(), Failed> {
    let started = Instant::now();
    let outcome = suite.in_rig(|rig, suite| Box::pin(secrets::sweep(rig, &suite.capture)))?;
    eprintln!("secrets ({:.1} s)", started.elapsed().as_secs_f64());
    leaves_nothing(suite, "secrets", outcome)
}

fn fuzz(suite: &Suite) -> Result<(), Failed> {
    let started = Instant::now();
    let dir = match suite.reference() {
        Ok((_, reference)) => &reference.dir,
        Err(e) => return suite.verdict("fuzz", vec![format!("no reference ledger to fuzz: {e}")]),
    };
    let scratch = suite.root.path().join("fuzz");
    let _ = std::fs::create_dir_all(&scratch);
    let mut failures = Vec::new();
    let cases = fuzz::all(dir, &scratch, &mut failures);
    suite.tally().fuzz_cases = cases;
    eprintln!(
        "fuzz: {cases} cases ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    if cases < 10_000 {
        failures.push(format!(
            "only {cases} fuzz cases; at least 10000 are required"
        ));
    }
    suite.verdict("fuzz", failures)
}

/// The trials, in the order the parts always ran: the crash sweep, each fault scenario, load,
/// secrets (which looks for every secret the earlier parts handed out), fuzz.
fn trials(suite: &Arc<Suite>) -> Vec<Trial> {
    let trial = |name: &str, f: fn(&Suite) -> Result<(), Failed>| {
        let suite = Arc::clone(suite);
        Trial::test(name, move || f(&suite))
    };
    let mut trials = vec![trial("crash::sweep", crash_sweep)];
    for (name, key, scenario) in FAULTS {
        let suite = Arc::clone(suite);
        trials.push(Trial::test(format!("faults::{key}"), move || {
            fault(&suite, name, scenario)
        }));
    }
    trials.push(trial("load::thirty_two_at_once", load));
    trials.push(trial("secrets::sweep", secrets));
    trials.push(trial("fuzz::all", fuzz));
    trials
}

fn main() -> ExitCode {
    if let Some(code) = crash::child() {
        return code;
    }
    install_panic_hook();
    let suite = Arc::new(Suite {
        root: reachable_tempdir("consort-reliability-"),
        capture: consort_testkit::logs::capture_globally("debug"),
        workers: std::env::var("RELIABILITY_WORKERS")
            .ok()
            .and_then(|w| w.parse().ok())
            .unwrap_or(2),
        tally: Mutex::new(Tally::default()),
        reference: OnceLock::new(),
        rig: tokio::sync::OnceCell::new(),
    });
    let started = Instant::now();
    // The parts share one scratch root and one cluster and run in order (one thread).
    let consort_testkit::trials::Selection { args, trials, all } =
        consort_testkit::trials::select(trials(&suite));
    let conclusion = libtest_mimic::run(&args, trials);
    if args.list {
        return ExitCode::SUCCESS;
    }
    if suite.rig.initialized()
        && let Err(e) = consort_testkit::cluster::stop()
    {
        suite
            .tally()
            .fail("faults", format!("stop the cluster: {e}"));
    }
    let Ok(suite) = Arc::try_unwrap(suite) else {
        eprintln!("a trial still holds the suite");
        return ExitCode::FAILURE;
    };
    let mut t = suite
        .tally
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let panics = UNEXPECTED_PANICS.load(Ordering::SeqCst) + t.child_panics;
    if std::env::var_os("RELIABILITY_KEEP").is_some() {
        eprintln!("kept {}", suite.root.keep().display());
    }
    if all && conclusion.num_filtered_out == 0 && conclusion.num_ignored == 0 {
        println!(
            "reliability: crash points {} of {} resumed, faults {} of {} handled, leaked branches {}, fuzz cases {}, panics {}",
            t.crash_resumed,
            t.crash_points,
            t.faults_handled,
            t.faults,
            t.leaked,
            t.fuzz_cases,
            panics
        );
    }
    eprintln!("({:.1} s)", started.elapsed().as_secs_f64());
    if panics > 0 {
        t.fail("panics", format!("{panics} unexpected panic(s)"));
    }
    if t.failures.is_empty() && !conclusion.has_failed() {
        ExitCode::SUCCESS
    } else {
        eprintln!("{} failure(s):", t.failures.len());
        for f in &t.failures {
            eprintln!("  {f}");
        }
        ExitCode::FAILURE
    }
}
