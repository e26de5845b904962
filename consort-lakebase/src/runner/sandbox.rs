//! Confinement of test runs: every process a runner starts (psql, `sh -c …`, and everything
//! they start) runs inside a Linux Landlock domain.
//!
//! What a confined run may do:
//!
//! | what | allowed |
//! |---|---|
//! | read and execute | every file, except Consort's private state (the project's `.consort/`, the embedded cluster's directory) and the project's lanes (its own work tree excepted) |
//! | write, create, delete, rename | only its private scratch directory (its `HOME`, `TMPDIR` and report directory), the cache directories that exist in the tree when the run starts, `/dev/shm` (a directory of the run's own scratch when Consort runs as root, else the machine's) and a few devices (`/dev/null`, …) |
//! | TCP connect | only the branch's port (Landlock ABI 4 and later; ports, not addresses) |
//! | signals, abstract Unix sockets | only inside the run (ABI 6 and later) |
//!
//! So the tests, the frozen tests, the harness and VCS metadata are read-only to the code under
//! test: it cannot move them aside for the length of a run and put them back afterwards.
//!
//! The domain is applied on a short-lived thread made for one spawn: the thread restricts
//! itself, drops every capability (a run as root keeps uid 0 but none of root's powers), starts
//! the child (which inherits both), and ends. No thread of the runtime is ever restricted, and
//! no `unsafe` code is needed. Where it may (as root), that thread first enters a mount
//! namespace of its own in which `/dev/shm` is a directory of the run's scratch, so POSIX
//! shared memory works confined and stays private to the run. This process is made
//! non-dumpable, so its `/proc` files (its environment, with any API key in it) are out of the
//! runs' reach.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use consort_actors::Confinement;
use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, LandlockStatus, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::denial::{self, Reach};
use super::forward::Forwarder;
use super::namespaces::{self, Plan};
use crate::error::{Error, Refusal, Result};

/// The Landlock ABI whose rights the rules ask for (older kernels enforce what they know).
const ABI_WANTED: ABI = ABI::V7;

/// The oldest Landlock ABI that confines a run as the rules say: ABI 3 is the first to refuse
/// truncating a file (the tests, the harness) the run may only read.
const ABI_NEEDED: u32 = 3;

/// Where POSIX shared memory and named semaphores live; every run may write there (its own
/// directory when [`private_dev_shm`] can mount one there).
const SHM: &str = "/dev/shm";

/// Devices every run may write to (`/dev/ptmx` opens a pty of the run's own devpts instance
/// where it has one).
const DEVICES: [&str; 7] = [
    "/dev/ptmx",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/random",
    "/dev/urandom",
];

/// Whether test runs are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// Confined with Landlock; a kernel without it makes verification refuse to run.
    #[default]
    Landlock,
    /// Confined with Landlock alone, no namespaces of the run's own, as on a kernel that
    /// refuses them (TCP only to the branch's port, no ptys): for comparison.
    LandlockAlone,
    /// Not confined: only with `sandbox = "off"` in the configuration, said in every receipt.
    Off,
}

/// What this machine offers for confinement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxSupport {
    /// Landlock works at this ABI.
    Available {
        /// The ABI the kernel enforces (capped at the newest this code asks for).
        abi: u32,
        /// Whether runs get namespaces of their own (a network, ptys, mounts), and if not,
        /// why: the kernel refused them.
        namespaces: Result<(), String>,
    },
    /// Landlock cannot be used here, and why.
    Unavailable(String),
}

impl SandboxSupport {
    /// The kernel's Landlock support, probed by really restricting a throwaway thread.
    pub fn probe() -> SandboxSupport {
        let probe = std::thread::spawn(|| -> std::result::Result<u32, String> {
            let created = Ruleset::default()
                .handle_access(AccessFs::from_all(ABI::V1))
                .and_then(|r| r.create())
                .map_err(|e| e.to_string())?;
            let status = created.restrict_self().map_err(|e| e.to_string())?;
            enforced_abi(&status.ruleset, status.landlock)
        });
        match probe.join() {
            Ok(Ok(abi)) if abi < ABI_NEEDED => SandboxSupport::Unavailable(format!(
                "Landlock ABI {abi} cannot keep truncation from the tests and the harness (ABI {ABI_NEEDED} and later can)"
            )),
            Ok(Ok(abi)) => SandboxSupport::Available {
                abi,
                namespaces: super::namespaces::probe(),
            },
            Ok(Err(why)) => SandboxSupport::Unavailable(why),
            Err(_) => SandboxSupport::Unavailable("the probe thread panicked".into()),
        }
    }
}

impl std::fmt::Display for SandboxSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SandboxSupport::Available {
                abi,
                namespaces: Ok(()),
            } => write!(
                f,
                "Landlock ABI {abi} (files{}) in namespaces of its own: a network (its branch forwarded in, nothing else out), ptys, /dev/shm, read-only dependencies",
                if *abi >= 6 { ", signals" } else { "" }
            ),
            SandboxSupport::Available {
                abi,
                namespaces: Err(why),
            } if *abi >= 4 => write!(
                f,
                "Landlock ABI {abi} alone (files, TCP only to the branch's port{}): no namespaces of its own ({why}), so tests cannot serve on loopback or open ptys",
                if *abi >= 6 { ", signals" } else { "" }
            ),
            SandboxSupport::Available {
                abi,
                namespaces: Err(why),
            } => write!(
                f,
                "Landlock ABI {abi} alone, files only (TCP needs ABI 4; no namespaces: {why})"
            ),
            SandboxSupport::Unavailable(why) => write!(f, "no Landlock: {why}"),
        }
    }
}

/// What this process can confine with, probed once; the first call also makes this process
/// non-dumpable: its memory and environment (API keys, tokens) are not for the code under
/// test, and a non-dumpable process's `/proc` files need privileges the runs do not have.
fn process_support() -> &'static SandboxSupport {
    static SUPPORT: std::sync::OnceLock<SandboxSupport> = std::sync::OnceLock::new();
    SUPPORT.get_or_init(|| match nix::sys::prctl::set_dumpable(false) {
        Ok(()) => SandboxSupport::probe(),
        Err(e) => {
            SandboxSupport::Unavailable(format!("cannot make this process non-dumpable: {e}"))
        }
    })
}

fn enforced_abi(
    ruleset: &RulesetStatus,
    status: LandlockStatus,
) -> std::result::Result<u32, String> {
    match (ruleset, status) {
        (RulesetStatus::NotEnforced, _) => Err("the kernel enforced no Landlock rule".into()),
        (_, LandlockStatus::Available { effective_abi, .. }) => Ok(effective_abi as u32),
        (_, LandlockStatus::NotEnabled) => Err("Landlock is built in but not enabled".into()),
        (_, LandlockStatus::NotImplemented) => Err("the kernel has no Landlock".into()),
    }
}

/// A run's private scratch directory, removed when dropped: `run/` (its `home/`, `tmp/`,
/// `reports/` and Python's bytecode cache), which the run may write as it likes, and `views/`,
/// where each of its processes gets a fresh view of the work tree (`view.rs`), in which it may
/// only create.
#[derive(Debug)]
pub struct Scratch {
    root: PathBuf,
}

/// The part of a scratch directory a run may write as it likes.
const SCRATCH_RUN: &str = "run";
/// The part of a scratch directory that holds the run's views of the work tree.
const SCRATCH_VIEWS: &str = "views";

impl Scratch {
    /// Makes a fresh scratch directory under the system's temporary directory (mode 0700),
    /// recording this process as its owner so that [`sweep_abandoned_scratch`] can tell it
    /// from one a killed run left.
    pub fn create() -> Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        let root = base.join(format!("{SCRATCH_PREFIX}{}", crate::names::random_tag(12)));
        let mut b = std::fs::DirBuilder::new();
        b.mode(0o700);
        b.create(&root)
            .map_err(|e| Error::io(format!("create {}", root.display()), e))?;
        let scratch = Scratch { root };
        if let Some((pid, ticks)) = crate::procinfo::me() {
            let owner = scratch.root.join(SCRATCH_OWNER);
            std::fs::write(&owner, format!("{pid} {ticks}\n"))
                .map_err(|e| Error::io(format!("write {}", owner.display()), e))?;
        }
        b.recursive(true);
        for sub in ["home", "tmp", "reports", "pycache", "shm"] {
            let p = scratch.writable().join(sub);
            b.create(&p)
                .map_err(|e| Error::io(format!("create {}", p.display()), e))?;
        }
        let views = scratch.views();
        b.create(&views)
            .map_err(|e| Error::io(format!("create {}", views.display()), e))?;
        Ok(scratch)
    }

    /// The scratch directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The part the run may write as it likes (`$CONSORT_SCRATCH`).
    pub fn writable(&self) -> PathBuf {
        self.root.join(SCRATCH_RUN)
    }

    /// Where the run's views of the work tree are made.
    pub fn views(&self) -> PathBuf {
        self.root.join(SCRATCH_VIEWS)
    }

    /// The run's own POSIX shared memory: what its processes see as `/dev/shm` where a
    /// private one can be mounted (see [`JailSpec::shm`]).
    pub fn shm(&self) -> PathBuf {
        self.writable().join("shm")
    }

    /// Where runner reports (JUnit XML, TAP files) go.
    pub fn reports(&self) -> PathBuf {
        self.writable().join("reports")
    }

    /// The variables that point a run at its scratch directory (`HOME`, `TMPDIR`, the report
    /// directory), where Rust's tools live when `HOME` moved them, and Python told to write no
    /// bytecode: it still reads the installed modules' own, where a fresh cache directory
    /// (`PYTHONPYCACHEPREFIX`) would compile the standard library, pytest and every driver
    /// again on every run (0.7 s of a one-file pytest run's 1.2 s).
    pub fn env(&self) -> Vec<(String, String)> {
        let run = self.writable();
        let at = |sub: &str| run.join(sub).display().to_string();
        let mut env = vec![
            ("HOME".to_string(), at("home")),
            ("TMPDIR".to_string(), at("tmp")),
            ("CONSORT_SCRATCH".to_string(), run.display().to_string()),
            ("CONSORT_REPORT_DIR".to_string(), at("reports")),
            ("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string()),
        ];
        // Moving HOME must not hide the user's toolchains and user-installed packages.
        if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
            for (var, sub) in [
                ("CARGO_HOME", ".cargo"),
                ("RUSTUP_HOME", ".rustup"),
                ("PYTHONUSERBASE", ".local"),
            ] {
                let dir = home.join(sub);
                if std::env::var_os(var).is_none() && dir.is_dir() {
                    env.push((var.to_string(), dir.display().to_string()));
                }
            }
        }
        env
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// How a run's scratch directory is named under the temporary directory.
const SCRATCH_PREFIX: &str = "consort-run-";
/// The owner record in a scratch directory: the creating process's pid and start time.
const SCRATCH_OWNER: &str = "owner";

/// Removes the run scratch directories (`$TMPDIR/consort-run-*`) whose recorded owner has
/// ended: what a run killed before it could drop its scratch leaves behind. A directory
/// without a readable owner record, or whose owner lives, is left alone; links are not
/// followed. Returns each directory removed with the bytes it held.
pub fn sweep_abandoned_scratch() -> Vec<(PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let is_scratch = entry
            .file_name()
            .to_string_lossy()
            .starts_with(SCRATCH_PREFIX)
            && entry.file_type().is_ok_and(|t| t.is_dir());
        let dir = entry.path();
        if !is_scratch || owner_lives(&dir) {
            continue;
        }
        let bytes = crate::embedded::size_of(&dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => removed.push((dir, bytes)),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an abandoned run scratch directory")
            }
        }
    }
    removed
}

/// Whether the scratch directory's owner lives — or cannot be told (no readable record):
/// only a record of an ended process lets a sweep remove it.
fn owner_lives(dir: &Path) -> bool {
    match crate::procinfo::read_numbers(&dir.join(SCRATCH_OWNER)).as_deref() {
        Some([pid, ticks]) => {
            u32::try_from(*pid).map_or(true, |pid| crate::procinfo::same_process_alive(pid, *ticks))
        }
        _ => true,
    }
}

/// The dependency directories of `tree` (canonical): its own, and those its links lead to
/// (a lane's entries linked into the main tree's `node_modules`, its `.venv` linked whole), so
/// no run writes the main tree's dependencies through a lane.
pub(crate) fn dependency_dirs(tree: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |dir: PathBuf| {
        if dir.is_dir() && !out.contains(&dir) {
            out.push(dir);
        }
    };
    for name in consort_actors::DEPENDENCY_DIRS.map(|(name, _)| name) {
        let dir = tree.join(name);
        let Ok(real) = dir.canonicalize() else {
            continue;
        };
        add(real);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let linked = entry.file_type().is_ok_and(|t| t.is_symlink());
            let target = linked.then(|| entry.path().canonicalize().ok()).flatten();
            if let Some(parent) = target.as_deref().and_then(Path::parent)
                && parent.file_name().is_some_and(|n| n == name)
            {
                add(parent.to_path_buf());
            }
        }
    }
    out
}

/// What one run may reach; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct JailSpec {
    /// Paths the run may not read (Consort's private state, the lanes of a project).
    pub hidden: Vec<PathBuf>,
    /// The run's work tree: readable even when it lies inside a hidden path (a lane's, inside
    /// the hidden directory of every lane), what is hidden inside it excepted.
    pub tree: Option<PathBuf>,
    /// Directories the run may write in (its scratch directory, the existing caches).
    pub writable: Vec<PathBuf>,
    /// A directory in which the run may read and create files and directories, and write
    /// what it created, but remove, rename or link nothing (its views of the work tree).
    pub create_only: Option<PathBuf>,
    /// The branch's host and TCP port (none for a Unix socket directory): forwarded into the
    /// run's own network, or, where runs get none, the one port it may connect to.
    pub branch: Option<(String, u16)>,
    /// Dependency directories (`node_modules`, `.venv` and what their links reach), mounted
    /// read-only where runs get a mount namespace of their own; writable directories inside
    /// them (the tools' caches) stay writable.
    pub read_only: Vec<PathBuf>,
    /// The run's own directory for POSIX shared memory, seen by its processes as `/dev/shm`
    /// (see [`Scratch::shm`]), if any.
    pub shm: Option<PathBuf>,
}

/// The confinement of one run, ready to apply to each process it starts.
#[derive(Clone, Debug)]
pub struct Jail {
    inner: Option<Arc<RulesetCreated>>,
    confinement: Confinement,
    /// The directory its processes see as `/dev/shm` (without namespaces of their own).
    shm: Option<PathBuf>,
    /// The namespaces its processes enter, where the kernel gives them.
    namespaces: Option<Arc<Plan>>,
    /// The branch the run's own network forwards to.
    branch: Option<(String, u16)>,
    /// What the run may reach, to tell a refusal of the confinement in its output.
    reach: Option<Arc<Reach>>,
}

/// A process started in a [`Jail`], with the forwarding of its branch into its network (which
/// ends when this is dropped).
#[derive(Debug)]
pub(crate) struct Confined {
    /// The process.
    pub child: tokio::process::Child,
    /// The forwarding of its branch into its network, if it has one.
    pub forwarder: Option<Forwarder>,
}

impl Jail {
    /// No confinement (`sandbox = "off"`); receipts say so.
    pub fn off() -> Jail {
        Jail {
            inner: None,
            confinement: Confinement::Off,
            shm: None,
            namespaces: None,
            branch: None,
            reach: None,
        }
    }

    /// An unconfined jail (`sandbox = "off"`) for `spec`: where the kernel gives namespaces,
    /// its processes still get the dependency directories read-only, so that a lane does not
    /// write the main tree's through its links.
    fn unconfined(spec: &JailSpec) -> Jail {
        let namespaces = matches!(
            process_support(),
            SandboxSupport::Available {
                namespaces: Ok(()),
                ..
            }
        );
        let plan = namespaces
            .then(|| Plan::unconfined(&spec.read_only, &spec.writable))
            .filter(Plan::protects_anything);
        Jail {
            namespaces: plan.map(Arc::new),
            ..Jail::off()
        }
    }

    /// Builds the Landlock rules for `spec` (or none for [`SandboxMode::Off`]). Fails when the
    /// kernel cannot confine and the mode requires it.
    pub fn prepare(mode: SandboxMode, spec: &JailSpec) -> Result<Jail> {
        if mode == SandboxMode::Off {
            return Ok(Jail::unconfined(spec));
        }
        let (abi, namespaces) = match process_support() {
            SandboxSupport::Available { abi, namespaces } => {
                (*abi, namespaces.is_ok() && mode == SandboxMode::Landlock)
            }
            SandboxSupport::Unavailable(why) => {
                return Err(Error::Runner(format!(
                    "test runs must be confined, but this machine cannot ({why}); fix the kernel, \
                     or set `sandbox = \"off\"` under [runner] in consort.toml to run unconfined"
                )));
            }
        };
        let plan = namespaces.then(|| {
            let branch = spec.branch.as_ref().map(|(h, p)| (h.as_str(), *p));
            Plan::new(branch, spec.shm.as_deref(), &spec.read_only, &spec.writable)
        });
        let own_network = plan.as_ref().is_some_and(Plan::own_network);
        let created = build_rules(spec, abi, own_network)
            .map_err(|e| Error::Runner(format!("cannot build the sandbox of the test run: {e}")))?;
        let confinement = match &plan {
            Some(plan) => Confinement::Namespaced {
                abi,
                own_network: plan.own_network(),
            },
            None => Confinement::Landlock {
                abi,
                network: abi >= 4,
            },
        };
        let canonical = |paths: &mut dyn Iterator<Item = &PathBuf>| -> Vec<PathBuf> {
            paths.filter_map(|p| p.canonicalize().ok()).collect()
        };
        let reach = Reach {
            hidden: canonical(&mut spec.hidden.iter()),
            writable: canonical(
                &mut spec
                    .writable
                    .iter()
                    .chain(&spec.create_only)
                    .chain(&spec.shm)
                    .chain(&[PathBuf::from(SHM)]),
            ),
            tree: spec.tree.clone().unwrap_or_default(),
            own_network,
            own_ptys: plan.is_some(),
        };
        Ok(Jail {
            inner: Some(Arc::new(created)),
            shm: spec.shm.clone(),
            confinement,
            namespaces: plan.map(Arc::new),
            branch: spec.branch.clone(),
            reach: Some(Arc::new(reach)),
        })
    }

    /// What the confinement refused a failed run whose output is `text`, if that is why it
    /// failed (see `denial.rs`); nothing for an unconfined run.
    pub(crate) fn refusal(&self, text: &str) -> Option<Refusal> {
        denial::read(text, self.reach.as_deref()?)
    }

    /// What receipts of runs in this jail record.
    pub fn confinement(&self) -> Confinement {
        self.confinement
    }

    /// Spawns `cmd` confined: in namespaces of its own where it gets them (its branch
    /// forwarded into its network), else on a new thread that restricts itself, starts the
    /// child and ends.
    pub(crate) async fn spawn(
        &self,
        mut cmd: tokio::process::Command,
    ) -> std::io::Result<Confined> {
        if let Some(plan) = &self.namespaces {
            let rules = self.inner.as_ref().map(|r| r.try_clone()).transpose()?;
            return self.spawn_namespaced(cmd, plan, rules);
        }
        let Some(rules) = &self.inner else {
            return Ok(Confined {
                child: cmd.spawn()?,
                forwarder: None,
            });
        };
        let rules = rules.try_clone()?;
        let shm = self.shm.clone();
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("consort-confined-spawn".into())
            .spawn(move || {
                let _guard = handle.enter();
                let shm = shm.as_deref().map_or(Ok(()), private_dev_shm);
                let result = match rules.restrict_self() {
                    Ok(s) if s.ruleset != RulesetStatus::NotEnforced => {
                        drop_capabilities().and_then(|()| cmd.spawn())
                    }
                    Ok(_) => Err(std::io::Error::other(
                        "the kernel enforced no Landlock rule",
                    )),
                    Err(e) => Err(std::io::Error::other(format!("Landlock: {e}"))),
                };
                let _ = tx.send(result.map(|child| (child, shm)));
            })?;
        let (child, shm) = rx.await.map_err(|_| {
            std::io::Error::other("the confined spawn thread ended without a word")
        })??;
        if let Err(e) = shm {
            shared_dev_shm_noted(&e);
        }
        Ok(Confined {
            child,
            forwarder: None,
        })
    }

    /// Spawns `cmd` in the namespaces of `plan`, confined by `rules` there, and forwards its
    /// branch into its network.
    fn spawn_namespaced(
        &self,
        mut cmd: tokio::process::Command,
        plan: &Arc<Plan>,
        rules: Option<RulesetCreated>,
    ) -> std::io::Result<Confined> {
        let channel = namespaces::confine(cmd.as_std_mut(), plan.clone(), rules)?;
        let spawned = cmd.spawn();
        let sent = namespaces::drain(&channel);
        let child = spawned.map_err(|e| std::io::Error::new(e.kind(), sent.failure(&e)))?;
        let forwarder = match (&self.branch, plan.own_network()) {
            (Some((host, port)), true) => {
                Some(Forwarder::start(sent.listeners, host.clone(), *port)?)
            }
            _ => None,
        };
        Ok(Confined { child, forwarder })
    }
}

/// Gives the calling thread, and so the child it starts, a mount namespace of its own in which
/// `/dev/shm` is `dir` (the run's own, in its scratch directory): POSIX shared memory and
/// named semaphores (`shm_open`, `sem_open`: Python's `multiprocessing`, task-queue workers,
/// pytest-xdist) work confined, what a run leaves there goes with its scratch directory, and
/// no other run sees it. A bind mount, not a fresh tmpfs: Landlock ignores a rule on a
/// directory something is mounted over, so the rule must be on the mount's own root, `dir`.
/// Needs `CAP_SYS_ADMIN` (a run as root); without it the run shares the machine's `/dev/shm`.
fn private_dev_shm(dir: &Path) -> nix::Result<()> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    if !Path::new(SHM).is_dir() {
        return Err(nix::errno::Errno::ENOENT);
    }
    unshare(CloneFlags::CLONE_NEWNS)?;
    // Nothing mounted here may reach the machine's mounts.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    mount(Some(dir), SHM, None::<&str>, MsFlags::MS_BIND, None::<&str>)
}

/// Says once per process that runs share the machine's `/dev/shm` (no private one could be
/// mounted).
fn shared_dev_shm_noted(e: &nix::errno::Errno) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::info!(error = %e, "test runs share this machine's /dev/shm: a private one needs CAP_SYS_ADMIN (run as root)");
    });
}

/// Empties every capability set of the calling thread (bounding set first, so a program run
/// as root does not get them back at exec): a confined run as root keeps uid 0 but none of
/// root's powers, such as reading another process's environment or bypassing file modes.
pub(crate) fn drop_capabilities() -> std::io::Result<()> {
    use caps::CapSet;
    let err = |e: caps::errors::CapsError| std::io::Error::other(format!("capabilities: {e}"));
    let permitted = caps::read(None, CapSet::Permitted).map_err(err)?;
    if permitted.is_empty() {
        return Ok(());
    }
    for set in [
        CapSet::Bounding,
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(err)?;
    }
    Ok(())
}

fn build_rules(
    spec: &JailSpec,
    abi: u32,
    own_network: bool,
) -> std::result::Result<RulesetCreated, String> {
    let read = AccessFs::from_read(ABI_WANTED);
    let write = AccessFs::from_write(ABI_WANTED);
    let err = |e: landlock::RulesetError| e.to_string();
    let mut ruleset = Ruleset::default()
        .handle_access(read | write)
        .map_err(err)?;
    // Without a network of its own, the run may connect to its branch's port alone.
    let tcp_rule = abi >= 4 && !own_network;
    if tcp_rule {
        ruleset = ruleset.handle_access(AccessNet::ConnectTcp).map_err(err)?;
    }
    if abi >= 6 {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    let hidden: Vec<PathBuf> = spec
        .hidden
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    let mut readable = Vec::new();
    readable_except(Path::new("/"), &hidden, &mut readable);
    // The run's own tree, inside a hidden path (a lane's): readable again, what is hidden
    // inside it excepted.
    if let Some(tree) = spec.tree.as_ref().and_then(|t| t.canonicalize().ok())
        && hidden.iter().any(|h| tree.starts_with(h))
    {
        let inside: Vec<PathBuf> = hidden
            .iter()
            .filter(|h| h.starts_with(&tree) && **h != tree)
            .cloned()
            .collect();
        readable_except(&tree, &inside, &mut readable);
    }
    created = add_path(created, Path::new("/"), AccessFs::ReadDir.into())?;
    for p in &readable {
        created = add_path(created, p, read)?;
    }
    for p in &spec.writable {
        created = add_path(created, p, read | write)?;
    }
    if let Some(views) = &spec.create_only {
        let create = write
            & (AccessFs::MakeReg | AccessFs::MakeDir | AccessFs::WriteFile | AccessFs::Truncate);
        created = add_path(created, views, read | create)?;
    }
    // The run's own /dev/shm, by the directory mounted there (a rule on the mount point
    // would not reach it); the machine's, where no private one can be mounted.
    for shm in spec
        .shm
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new(SHM)])
    {
        if shm.is_dir() {
            created = add_path(created, shm, read | write)?;
        }
    }
    for dev in DEVICES.iter().map(Path::new).filter(|d| d.exists()) {
        created = add_path(
            created,
            dev,
            AccessFs::from_file(ABI_WANTED) & (read | write),
        )?;
    }
    if let Some((_, port)) = spec.branch.as_ref().filter(|_| tcp_rule) {
        created = created
            .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
            .map_err(err)?;
    }
    Ok(created)
}

fn add_path(
    created: RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
) -> std::result::Result<RulesetCreated, String> {
    let Ok(fd) = PathFd::new(path) else {
        // Vanished since it was listed, or not openable: nothing to grant.
        return Ok(created);
    };
    let access = if path.is_dir() {
        access
    } else {
        access & AccessFs::from_file(ABI_WANTED)
    };
    if access.is_empty() {
        return Ok(created);
    }
    created
        .add_rule(PathBeneath::new(fd, access))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Every entry under `dir` that reaches none of `hidden`: whole subtrees where possible, and
/// one level deeper along the way to each hidden path. A link is granted only when what it
/// reaches is not hidden and holds nothing hidden (a rule follows the link).
pub(crate) fn readable_except(dir: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    if hidden.is_empty() {
        out.push(dir.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let path = entry.path();
        // An entry whose type cannot be read is treated as a link (resolved, never trusted).
        let is_link = entry.file_type().map(|t| t.is_symlink()).unwrap_or(true);
        let real = if is_link {
            match path.canonicalize() {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            path.clone()
        };
        if hidden.iter().any(|h| real.starts_with(h)) {
            continue;
        }
        if hidden.iter().any(|h| h.starts_with(&real)) {
            if !is_link {
                readable_except(&path, hidden, out);
            }
            continue;
        }
        out.push(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_scratch_whose_owner_ended_is_swept() {
        let mut ended = std::process::Command::new("true").spawn().expect("true");
        let dead_pid = ended.id();
        ended.wait().expect("wait");
        let tmp = std::env::temp_dir();
        let made = |tag: &str, owner: Option<String>| {
            let dir = tmp.join(format!(
                "{SCRATCH_PREFIX}test-{tag}-{}",
                crate::names::random_tag(8)
            ));
            std::fs::create_dir_all(dir.join("home")).expect("mkdir");
            std::fs::write(dir.join("home/file"), b"12345").expect("write");
            if let Some(o) = owner {
                std::fs::write(dir.join(SCRATCH_OWNER), o).expect("owner");
            }
            dir
        };
        let abandoned = made("dead", Some(format!("{dead_pid} 1\n")));
        let (pid, ticks) = crate::procinfo::me().expect("this process");
        let live = made("live", Some(format!("{pid} {ticks}\n")));
        let reused_pid = made("reused", Some(format!("{pid} {}\n", ticks + 1)));
        let unknown = made("unknown", None);
        let garbled = made("garbled", Some("not a record".into()));
        let target = made("target", None);
        let link = tmp.join(format!(
            "{SCRATCH_PREFIX}test-link-{}",
            crate::names::random_tag(8)
        ));
        std::os::unix::fs::symlink(&target, &link).expect("link");

        let removed = sweep_abandoned_scratch();
        let gone: Vec<&PathBuf> = removed.iter().map(|(d, _)| d).collect();
        assert!(
            gone.contains(&&abandoned) && !abandoned.exists(),
            "{gone:?}"
        );
        assert!(
            gone.contains(&&reused_pid),
            "a pid reused by a later process is not the owner"
        );
        assert!(removed.iter().all(|(_, b)| *b >= 5), "{removed:?}");
        for kept in [&live, &unknown, &garbled, &target] {
            assert!(
                kept.join("home/file").exists(),
                "{} is kept",
                kept.display()
            );
        }
        assert!(
            link.symlink_metadata().is_ok(),
            "a link is not followed or removed"
        );
        for d in [&live, &unknown, &garbled, &target, &link] {
            let _ = std::fs::remove_dir_all(d);
            let _ = std::fs::remove_file(d);
        }
    }

    #[test]
    fn a_scratch_records_its_owner_and_is_not_swept_while_it_lives() {
        let scratch = Scratch::create().expect("scratch");
        assert!(scratch.root().join(SCRATCH_OWNER).exists());
        sweep_abandoned_scratch();
        assert!(scratch.writable().join("home").is_dir());
        assert!(scratch.views().is_dir());
    }

    #[test]
    fn hidden_paths_and_links_to_them_are_never_granted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir_all(root.join("work/.consort/pg")).expect("mkdir");
        std::fs::create_dir_all(root.join("work/src")).expect("mkdir");
        std::fs::write(root.join("work/a.sql"), "a").expect("write");
        std::os::unix::fs::symlink(root.join("work/.consort"), root.join("work/sneaky"))
            .expect("link");
        std::os::unix::fs::symlink(root.join("work"), root.join("up")).expect("link");
        let hidden = vec![root.join("work/.consort")];
        let mut out = Vec::new();
        readable_except(&root, &hidden, &mut out);
        out.sort();
        assert_eq!(out, vec![root.join("work/a.sql"), root.join("work/src")]);
    }

    #[test]
    fn nothing_hidden_grants_the_whole_directory() {
        let mut out = Vec::new();
        readable_except(Path::new("/usr"), &[], &mut out);
        assert_eq!(out, vec![PathBuf::from("/usr")]);
    }
}
