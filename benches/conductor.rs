//! One assignment → artifact round trip through the conductor and a trivial role actor, beside
//! a bare tokio mpsc + oneshot round trip and a bare ractor `call` round trip; and the ledger's
//! per-event cost beside a bare append + fsync of the same bytes to the same disk.
//!
//! How the round trip is measured: a real [`Conductor`] drives the design lane (stories, spec,
//! architecture with 20 revise verdicts, schema, test list, UX) against eight supervised trivial
//! role actors that answer at once with a ready artifact. Each role actor stamps the instant
//! an assignment reaches it; the gap between two consecutive stamps is one full cycle: reply →
//! the conductor's task casts the result → ledger append → machine step → next assignment
//! built → task spawned → `SupervisedRole::assign` → the next role actor. Nothing else happens
//! between two design steps, so the gap is exactly one round trip through the conductor.
//!
//! The ledger is measured two ways: on tmpfs (`/dev/shm` where it exists, else the temp dir: the
//! ledger's CPU and syscall cost with no disk flush, so the conductor's own cost per event shows)
//! and on the project's disk (the real configuration: every event fsynced before it takes
//! effect). Every run writes a real ledger: there is no way to switch it off.
//!
//! `cargo bench --bench conductor`

#[path = "common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Script, interleave, machine_config, median, report_line, report_ratio};
use consort::actors::BoxFuture;
use consort::actors::Ledger;
use consort::actors::ractor::{self, Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use consort::actors::{
    ActorId, Artifact, Assignment, AssignmentId, AssignmentInputs, Conductor, ConductorConfig,
    Event, InfraError, InfraFault, PromoteReport, PromoteRequest, Role, RoleMsg, RunOutcome,
    StopAtGates, TestRunReceipt, VerifyRequest, Wiring,
};
use consort::actors::{ChildSpec, Supervised};
use consort::actors::{LakebaseEndpoint, RoleEndpoint, SupervisedRole};
use consort_testkit::actors::FnActor;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

/// Architect revise verdicts per conductor run: 2 × REVISIONS + 5 round trips per run.
const REVISIONS: u32 = 20;

fn script() -> Script {
    Script {
        tests: 3,
        revisions: REVISIONS,
        user_facing: true,
        real_refactors: false,
    }
}

// ---------------------------------------------------------------- the trivial role actor

type Stamps = Arc<Mutex<Vec<Instant>>>;

/// A role actor that answers every assignment at once with a ready artifact (built on first
/// use, then cloned) and stamps its arrival: the test kit's function actor, so its handler is
/// one synchronous call and nothing but the reply is measured.
fn trivial_role(id: ActorId, stamps: Stamps) -> FnActor<RoleMsg> {
    let ready: Mutex<BTreeMap<String, Artifact>> = Mutex::new(BTreeMap::new());
    consort_testkit::actors::role(id, move |a| {
        let now = Instant::now();
        if let Ok(mut s) = stamps.lock() {
            s.push(now);
        }
        let artifact = ready
            .lock()
            .map_err(|_| "the artifact cache is poisoned")?
            .entry(a.step.to_string())
            .or_insert_with(|| common::artifact_for(&a.step, &script(), a.inputs.test.as_ref()))
            .clone();
        Ok(artifact)
    })
}

/// The Lakebase side is never reached in the design lane.
struct NoLakebase;

impl LakebaseEndpoint for NoLakebase {
    fn verify(
        &self,
        _: VerifyRequest,
        _: Duration,
    ) -> BoxFuture<'_, Result<TestRunReceipt, InfraError>> {
        Box::pin(async {
            Err(InfraError {
                fault: InfraFault::DatabaseDown,
                detail: "not in this bench".into(),
            })
        })
    }

    fn promote(
        &self,
        _: PromoteRequest,
        _: Duration,
    ) -> BoxFuture<'_, Result<PromoteReport, InfraError>> {
        Box::pin(async {
            Err(InfraError {
                fault: InfraFault::DatabaseDown,
                detail: "not in this bench".into(),
            })
        })
    }
}

struct Roles {
    endpoints: BTreeMap<Role, Arc<dyn RoleEndpoint>>,
    spec_author: SupervisedRole,
    stamps: Stamps,
}

async fn start_roles() -> Roles {
    let stamps: Stamps = Arc::new(Mutex::new(Vec::with_capacity(256)));
    let mut endpoints: BTreeMap<Role, Arc<dyn RoleEndpoint>> = BTreeMap::new();
    let mut spec_author = None;
    for role in Role::ALL {
        let id = ActorId::new(role, role.as_str());
        let actor = trivial_role(id.clone(), stamps.clone());
        let handle = Supervised::start(ChildSpec::new(role.as_str(), move |sup| {
            let actor = actor.clone();
            async move {
                Actor::spawn_linked(None, actor, (), sup)
                    .await
                    .map(|(r, _)| r)
            }
        }))
        .await
        .expect("role actor");
        let endpoint = SupervisedRole { id, handle };
        if role == Role::SpecAuthor {
            spec_author = Some(endpoint.clone());
        }
        endpoints.insert(role, Arc::new(endpoint));
    }
    Roles {
        endpoints,
        spec_author: spec_author.expect("spec author"),
        stamps,
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum LedgerMode {
    /// On tmpfs: no disk flush.
    Tmpfs,
    Disk,
}

/// Where "disk" files go: the project's file system (not tmpfs).
fn disk_dir() -> PathBuf {
    std::env::temp_dir()
}

fn tmpfs_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// One conductor run through the design lane; returns the gaps between consecutive
/// assignments (one per round trip).
async fn conductor_run(roles: &Roles, mode: LedgerMode) -> Vec<Duration> {
    let work = tempfile::tempdir_in(disk_dir()).expect("work tree");
    let shm = tempfile::tempdir_in(tmpfs_dir()).expect("tmpfs dir");
    let mut config = ConductorConfig::new(work.path());
    config.machine = machine_config(&script());
    match mode {
        LedgerMode::Tmpfs => config.ledger_path = shm.path().join("ledger.jsonl"),
        LedgerMode::Disk => {}
    }
    roles.stamps.lock().expect("stamps").clear();
    let handle = Conductor::start(Wiring {
        config,
        feature: Some(common::feature()),
        inherited: Default::default(),
        harness: None,
        roles: roles.endpoints.clone(),
        lakebase: Arc::new(NoLakebase),
        approver: Arc::new(StopAtGates),
    })
    .await
    .expect("conductor");
    let report = handle.run().await.expect("run");
    handle.stop();
    assert!(
        matches!(report.outcome, RunOutcome::AtGate { .. }),
        "the design lane ends at the design gate: {:?}",
        report.outcome
    );
    let stamps = roles.stamps.lock().expect("stamps").clone();
    assert_eq!(
        stamps.len(),
        2 * REVISIONS as usize + 6,
        "every step assigned once"
    );
    stamps.windows(2).map(|w| w[1] - w[0]).collect()
}

/// The median round trip of one conductor run.
fn conductor_median(rt: &Runtime, roles: &Roles, mode: LedgerMode) -> Duration {
    let mut gaps = rt.block_on(conductor_run(roles, mode));
    median(&mut gaps)
}

// ---------------------------------------------------------------- the floors

/// `n` bare tokio round trips (unbounded mpsc request, oneshot reply), timed inside a task.
async fn tokio_round_trips(n: u32) -> Duration {
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, oneshot::Sender<u64>)>();
    let server = tokio::spawn(async move {
        while let Some((x, reply)) = rx.recv().await {
            let _ = reply.send(x + 1);
        }
    });
    let client = tokio::spawn(async move {
        for i in 0..100 {
            let (otx, orx) = oneshot::channel();
            let _ = tx.send((i, otx));
            let _ = orx.await;
        }
        let t = Instant::now();
        for i in 0..u64::from(n) {
            let (otx, orx) = oneshot::channel();
            let _ = tx.send((i, otx));
            std::hint::black_box(orx.await.expect("reply"));
        }
        t.elapsed()
    });
    let d = client.await.expect("client");
    server.abort();
    d
}

struct Echo;

impl Actor for Echo {
    type Msg = RpcReplyPort<u64>;
    type State = u64;
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<Self::Msg>, _: ()) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }

    async fn handle(
        &self,
        _: ActorRef<Self::Msg>,
        port: RpcReplyPort<u64>,
        n: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        *n += 1;
        let _ = port.send(*n);
        Ok(())
    }
}

/// `n` bare ractor `call` round trips, timed inside a task.
async fn ractor_round_trips(actor: ActorRef<RpcReplyPort<u64>>, n: u32) -> Duration {
    tokio::spawn(async move {
        for _ in 0..100 {
            let _ = actor.call(|p| p, None).await;
        }
        let t = Instant::now();
        for _ in 0..n {
            match actor.call(|p| p, None).await {
                Ok(ractor::rpc::CallResult::Success(x)) => {
                    std::hint::black_box(x);
                }
                other => panic!("echo failed: {other:?}"),
            }
        }
        t.elapsed()
    })
    .await
    .expect("client")
}

fn spec_assignment() -> Assignment {
    Assignment {
        id: AssignmentId(2),
        role: Role::SpecAuthor,
        step: consort::actors::Step::Spec { revision: 0 },
        attempt: 0,
        runner: None,
        writes: None,
        inputs: AssignmentInputs {
            feature: Some(common::feature().into()),
            stories: Some(common::stories(true).into()),
            ..AssignmentInputs::default()
        },
        feedback: vec![],
        budget: None,
        tools: None,
    }
}

/// `n` calls of `SupervisedRole::assign` (the conductor's endpoint) to a trivial role actor.
async fn endpoint_round_trips(role: SupervisedRole, n: u32) -> Duration {
    tokio::spawn(async move {
        let a = spec_assignment();
        let mut total = Duration::ZERO;
        for _ in 0..n {
            let a = a.clone();
            let t = Instant::now();
            let r = role.assign(a, Duration::from_secs(600)).await;
            total += t.elapsed();
            assert!(r.is_ok());
        }
        total
    })
    .await
    .expect("client")
}

// ---------------------------------------------------------------- the ledger

/// A representative event: the Spec Author's answer.
fn spec_event() -> Event {
    Event::Produced {
        assignment: AssignmentId(2),
        author: ActorId::new(Role::SpecAuthor, "spec-author"),
        artifact: Artifact::Spec(common::spec()),
        usage: Default::default(),
        transcript: None,
    }
}

struct LedgerPair {
    ledger: Ledger<Event>,
    event: Event,
    bare: std::fs::File,
    line: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn ledger_pair(dir: &Path) -> LedgerPair {
    let d = tempfile::tempdir_in(dir).expect("dir");
    let mut ledger = Ledger::<Event>::open(d.path().join("ledger.jsonl")).expect("ledger");
    let event = spec_event();
    ledger.append(&event).expect("append");
    let text = std::fs::read_to_string(ledger.path()).expect("read");
    let line = text.lines().last().expect("a line").as_bytes().to_vec();
    let mut line = line;
    line.push(b'\n');
    let bare = OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.path().join("bare.jsonl"))
        .expect("bare file");
    LedgerPair {
        ledger,
        event,
        bare,
        line,
        _dir: d,
    }
}

impl LedgerPair {
    fn ledger_append(&mut self, n: u32) -> Duration {
        let t = Instant::now();
        for _ in 0..n {
            self.ledger.append(&self.event).expect("append");
        }
        t.elapsed() / n
    }

    fn bare_append(&mut self, n: u32) -> Duration {
        let t = Instant::now();
        for _ in 0..n {
            self.bare.write_all(&self.line).expect("write");
            self.bare.sync_data().expect("fsync");
        }
        t.elapsed() / n
    }

    /// The median of `n` single appends (an fsync's latency varies with the other writers of
    /// the file system, so medians of single operations compare better than means).
    fn ledger_append_median(&mut self, n: u32) -> Duration {
        common::median_of(n as usize, || self.ledger_append(1))
    }

    fn bare_append_median(&mut self, n: u32) -> Duration {
        common::median_of(n as usize, || self.bare_append(1))
    }
}

// ---------------------------------------------------------------- the benches

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let roles = rt.block_on(start_roles());
    let echo = rt
        .block_on(Actor::spawn(None, Echo, ()))
        .expect("echo actor")
        .0;

    let mut g = c.benchmark_group("conductor");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("floor: bare tokio mpsc + oneshot round trip", |b| {
        b.iter_custom(|iters| rt.block_on(tokio_round_trips(iters as u32)))
    });
    g.bench_function("floor: bare ractor call round trip", |b| {
        b.iter_custom(|iters| rt.block_on(ractor_round_trips(echo.clone(), iters as u32)))
    });
    g.bench_function("SupervisedRole::assign to a trivial role actor", |b| {
        b.iter_custom(|iters| {
            rt.block_on(endpoint_round_trips(
                roles.spec_author.clone(),
                iters as u32,
            ))
        })
    });
    for (name, mode) in [
        (
            "round trip through the conductor, ledger on tmpfs (no disk flush)",
            LedgerMode::Tmpfs,
        ),
        (
            "round trip through the conductor, ledger on disk (fsync)",
            LedgerMode::Disk,
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let gaps = rt.block_on(conductor_run(&roles, mode));
                    for g in gaps.into_iter().take(left) {
                        total += g;
                        left -= 1;
                    }
                }
                total
            })
        });
    }
    let mut disk = ledger_pair(&disk_dir());
    g.bench_function("Ledger::append (disk, fsync)", |b| {
        b.iter_custom(|iters| disk.ledger_append(iters as u32) * iters as u32)
    });
    g.bench_function(
        "floor: write_all + sync_data of the same line (disk)",
        |b| b.iter_custom(|iters| disk.bare_append(iters as u32) * iters as u32),
    );
    g.finish();

    if common::profiling() {
        return;
    }
    // ---- side by side, interleaved, for the summary lines
    let rounds = 21;
    let tokio_rt = || rt.block_on(tokio_round_trips(20_000)) / 20_000;
    let ractor_pair = interleave(
        rounds,
        || rt.block_on(ractor_round_trips(echo.clone(), 20_000)) / 20_000,
        tokio_rt,
    );
    let endpoint = interleave(
        rounds,
        || rt.block_on(endpoint_round_trips(roles.spec_author.clone(), 2_000)) / 2_000,
        tokio_rt,
    );
    let shm = interleave(
        rounds,
        || conductor_median(&rt, &roles, LedgerMode::Tmpfs),
        tokio_rt,
    );
    let disk = std::cell::RefCell::new(disk);
    let on_disk = interleave(
        rounds,
        || conductor_median(&rt, &roles, LedgerMode::Disk),
        || disk.borrow_mut().bare_append_median(2 * REVISIONS + 5),
    );
    let ledger_disk = interleave(
        rounds,
        || disk.borrow_mut().ledger_append_median(2 * REVISIONS + 5),
        || disk.borrow_mut().bare_append_median(2 * REVISIONS + 5),
    );
    let shm_pair = std::cell::RefCell::new(ledger_pair(&tmpfs_dir()));
    let ledger_shm = interleave(
        rounds,
        || shm_pair.borrow_mut().ledger_append(200),
        || shm_pair.borrow_mut().bare_append(200),
    );

    let tokio_name = "tokio mpsc + oneshot round trip";
    let fsync_name = "write_all + sync_data of the same line, same disk";
    report_ratio("ractor call round trip", &ractor_pair, tokio_name, None);
    report_ratio(
        "SupervisedRole::assign round trip",
        &endpoint,
        tokio_name,
        None,
    );
    report_ratio(
        "conductor round trip, ledger on tmpfs (no disk flush)",
        &shm,
        tokio_name,
        Some(5.0),
    );
    report_ratio(
        "conductor per event, ledger on disk",
        &on_disk,
        fsync_name,
        Some(1.2),
    );
    report_ratio(
        "Ledger::append on disk",
        &ledger_disk,
        fsync_name,
        Some(1.2),
    );
    report_ratio(
        "Ledger::append on tmpfs (CPU and syscalls only)",
        &ledger_shm,
        "write_all + sync_data on tmpfs",
        None,
    );
    report_line(
        "ledger line",
        &format!(
            "{} bytes (the Spec Author's answer)",
            disk.borrow().line.len()
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
