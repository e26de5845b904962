//! Past one machine: worker processes that share nothing but a bare git remote and one
//! PostgreSQL server (the shared store's database and the branch provider's parent) drive a
//! backlog to done. Each worker is a clone of its own with its own HOME and temporary
//! directory, as a CI job or a Kubernetes pod would be. One worker is killed mid-step and
//! another takes its feature over; one is paused past its lease and, let go again, can record
//! nothing more; a fourth clone then verifies every feature from the store and the remote. A
//! stop from a laptop's clone stops a remote worker; a worker killed at many instants leaves
//! nothing on the server that a sweep from another clone misses.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use consort::lakebase::store::{Holding, PgStore};
use consort::lakebase::{ConnectInfo, EmbeddedCluster, Secret};
use consort_testkit::process::text;

use crate::backlog::{Plan, f1, git, scripted_project};
use crate::common::{
    approving_run, assert_exit, assert_exit_saying, consort_in, feature_add, run, says, write,
};
use crate::lanes::orders;

/// Suppliers: a table and a function of its own, nothing of the others'.
fn suppliers() -> Plan<'static> {
    Plan {
        feature: "f3-suppliers",
        story: "Suppliers",
        migration: (
            "0001_suppliers",
            "CREATE TABLE suppliers (id int PRIMARY KEY, name text NOT NULL);",
        ),
        test: (
            "tests/f3_t1_suppliers.sql",
            "INSERT INTO suppliers VALUES (1, 'Acme');\nDO $$ BEGIN IF supplier_count() <> 1 THEN RAISE EXCEPTION 'suppliers: %', supplier_count(); END IF; END $$;\n",
        ),
        red_extra: "",
        green_file: "src/suppliers.sql",
        green: "CREATE FUNCTION supplier_count() RETURNS int LANGUAGE sql AS $$ SELECT count(*)::int FROM suppliers $$;\n".into(),
        repair: None,
    }
}

const FEATURES: [&str; 3] = ["f1-stock", "f2-orders", "f3-suppliers"];
/// The lease time the workers use: short, so that a takeover comes soon.
const LEASE_SECONDS: u64 = 3;

/// The one server the machines share, with the two databases they name by URL.
struct Server {
    cluster: std::sync::Arc<EmbeddedCluster>,
    password: String,
    parent: String,
    store: String,
}

impl Server {
    fn url(&self, database: &str) -> String {
        consort_testkit::cluster::admin_url(&self.cluster, database)
    }

    /// Runs `sql` in `database` as the superuser; its output.
    fn sql(&self, database: &str, sql: &str) -> String {
        let o = run(Command::new("psql")
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
            ])
            .args(["-U", self.cluster.superuser()])
            .args([
                "-p",
                &self.cluster.port().to_string(),
                "-d",
                database,
                "-c",
                sql,
            ])
            .env("PGPASSWORD", &self.password));
        assert!(o.status.success(), "{sql}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn store_info(&self) -> ConnectInfo {
        consort::lakebase::connect_info_of_url(&Secret::new(self.url(&self.store))).expect("url")
    }
}

/// A machine: where its clone of the project goes, its HOME and its temporary directory.
struct Machine {
    clone: PathBuf,
    home: PathBuf,
    tmp: PathBuf,
}

impl Machine {
    /// The machine of the project's own clone `origin`, its home `root/origin`.
    fn at_origin(origin: &Path, root: &Path) -> Machine {
        Machine {
            clone: origin.to_path_buf(),
            home: root.join("origin"),
            tmp: std::env::temp_dir(),
        }
    }

    /// A fresh machine in `root/name`; its worker clones the project itself.
    fn new(root: &Path, name: &str) -> Machine {
        let base = root.join(name);
        let (home, tmp) = (base.join("home"), base.join("tmp"));
        for d in [&home, &tmp] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        Machine {
            clone: base.join("shop"),
            home,
            tmp,
        }
    }

    /// A fresh machine with a clone of `remote` made by hand (a laptop's).
    fn cloned(root: &Path, name: &str, remote: &Path) -> Machine {
        let machine = Machine::new(root, name);
        let parent = machine.clone.parent().expect("parent");
        git(parent, &["clone", "-q", &remote.to_string_lossy(), "shop"]);
        machine
    }

    /// `consort SUBCOMMAND` on this machine, with the URLs in its environment.
    fn command(&self, mut cmd: Command, server: &Server) -> Command {
        cmd.env("HOME", &self.home)
            .env("TMPDIR", &self.tmp)
            .env("MACHINES_DATABASE_URL", server.url(&server.parent))
            .env("MACHINES_STORE_URL", server.url(&server.store));
        cmd
    }

    /// A worker, as the engines run one: `deploy/worker.sh`, which clones `remote` (unless the
    /// machine's clone is there) and runs `consort run --parallel 1`, every gate approved as
    /// ada; its output in a file.
    fn worker(&self, server: &Server, remote: &Path) -> Child {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/worker.sh");
        let bin = Path::new(env!("CARGO_BIN_EXE_consort"))
            .parent()
            .expect("bin dir");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = self.command(Command::new("sh"), server);
        let out = std::fs::File::create(self.home.join("worker.out")).expect("out");
        let err = out.try_clone().expect("err");
        cmd.arg(script)
            .env("PATH", path)
            .env("CONSORT_REPOSITORY", remote)
            .env("CONSORT_WORKDIR", &self.clone)
            .env("CONSORT_APPROVE_AS", "ada")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn")
    }

    fn output(&self) -> String {
        std::fs::read_to_string(self.home.join("worker.out")).unwrap_or_default()
    }
}

/// What every machine's worker said, for a failure's message.
fn outputs(machines: &[Machine]) -> String {
    machines
        .iter()
        .enumerate()
        .map(|(n, m)| format!("--- worker {}:\n{}", n + 1, m.output()))
        .collect()
}

/// Who holds what, and how many entries each feature's ledger has, as the store says.
fn store_view(server: &Server) -> (Vec<Holding>, Vec<usize>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = PgStore::connect(&server.store_info(), "shop")
            .await
            .expect("store");
        let mut counts = Vec::new();
        for f in FEATURES {
            counts.push(store.entries(f).await.expect("entries").len());
        }
        (store.holdings().await.expect("holdings"), counts)
    })
}

/// Stops process `pid` with SIGSTOP, trying (a bounded number of times) to catch it while its
/// store session is idle inside a transaction; whether it was caught there. It stays stopped.
fn pause_inside_a_store_transaction(server: &Server, pid: nix::unistd::Pid) -> bool {
    use nix::sys::signal::{Signal, kill};
    let query = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'consort-store:{pid}' \
         AND state LIKE 'idle in transaction%'"
    );
    // Few tries, each letting it run a few milliseconds: a scripted feature is soon done, and
    // the feature it holds now must still be its own when it is paused.
    const TRIES: u64 = 20;
    for n in 0..TRIES {
        kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
        if server.sql("shop_records", &query).trim() != "0" {
            return true;
        }
        if n + 1 == TRIES {
            break;
        }
        kill(pid, Signal::SIGCONT).expect("SIGCONT");
        std::thread::sleep(Duration::from_millis(1 + n % 7));
    }
    false
}

/// The feature `pid` holds, once it holds one whose ledger has at least `entries` entries.
fn wait_until_mid_feature(
    server: &Server,
    (machine, child): (&Machine, &mut Child),
    entries: usize,
) -> String {
    let pid = format!("(PID {})", child.id());
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the worker ended before it was caught mid-feature: {status}\n{}",
                machine.output()
            );
        }
        let (holdings, counts) = store_view(server);
        let held = holdings
            .iter()
            .find(|h| h.live && h.holder.ends_with(&pid))
            .map(|h| h.feature.clone());
        if let Some(feature) = held {
            let at = FEATURES.iter().position(|f| *f == feature).expect("ours");
            if counts[at] >= entries {
                return feature;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The project at `root/origin/shop` on the server's parent database, pushed to a bare remote
/// `root/remote.git`; with `shared`, its records in the shared store and its lanes pushed to
/// the remote. Its second and third features are added to its backlog (the store's, or the
/// origin's own files).
fn origin_project(root: &Path, server: &Server, shared: bool) -> (PathBuf, PathBuf) {
    let origin = root.join("origin/shop");
    scripted_project(&origin, &[&f1(), &orders(), &suppliers()]);
    // The agents' scripts are the project's, in git: every clone plays them.
    std::fs::rename(origin.join(".consort/agents"), origin.join("agents")).expect("the scripts");
    let config = std::fs::read_to_string(origin.join("consort.toml"))
        .expect("config")
        .replace(".consort/agents/", "agents/");
    let mut config =
        format!("{config}\n[database]\nprovider = \"url\"\nurl_env = \"MACHINES_DATABASE_URL\"\n");
    if shared {
        config.push_str(&format!(
            "\n[store]\nkind = \"postgres\"\nproject = \"shop\"\nurl_env = \"MACHINES_STORE_URL\"\nlease_seconds = {LEASE_SECONDS}\n\n[git]\nremote = \"origin\"\n"
        ));
    }
    write(&origin, &[("consort.toml", &config)]);
    consort::git::GitRepo::init_with_commit(&origin, "Test Author", "before Consort").expect("git");
    let remote = root.join("remote.git");
    git(
        root,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            &remote.to_string_lossy(),
        ],
    );
    git(
        &origin,
        &["remote", "add", "origin", &remote.to_string_lossy()],
    );
    git(&origin, &["push", "-q", "origin", "main"]);
    let machine = Machine::at_origin(&origin, root);
    for (id, story) in [("f2-orders", "Orders"), ("f3-suppliers", "Suppliers")] {
        let request = root.join(format!("{id}.md"));
        std::fs::write(&request, format!("# {story}\n\nThe {story} feature.\n")).expect("request");
        let o = run(&mut machine.command(feature_add(&request, id, &origin), server));
        assert_exit_saying(
            &o,
            0,
            "a feature joins the backlog",
            if shared {
                "its request is kept in the shared store (project shop)"
            } else {
                "its request is kept in .consort/features/"
            },
        );
    }
    (origin, remote)
}

/// A server of the test's own (every database left on it afterwards is the workers'), with
/// the parent database and the store's.
/// What most tests start from: a server, and in a fresh root the project's origin clone and
/// its remote ([`origin_project`]; `shared`: its records in the server's shared store).
fn setup(shared: bool) -> (Server, tempfile::TempDir, PathBuf, PathBuf) {
    let server = server();
    let root = tempfile::tempdir().expect("tempdir");
    let (origin, remote) = origin_project(root.path(), &server, shared);
    (server, root, origin, remote)
}

fn server() -> Server {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = runtime
        .block_on(consort::lakebase::EmbeddedPostgres::start(
            consort::lakebase::EmbeddedConfig::temporary(),
        ))
        .expect("a server of its own");
    let password = consort_testkit::cluster::admin_info(&cluster, "postgres")
        .secret
        .expose()
        .to_string();
    let server = Server {
        cluster,
        password,
        parent: "shop".into(),
        store: "shop_records".into(),
    };
    server.sql("postgres", "CREATE DATABASE shop");
    server.sql("postgres", "CREATE DATABASE shop_records");
    server
}

#[test]
fn three_machines_share_a_store_and_a_remote_and_one_takes_over_a_killed_ones_feature() {
    let (server, root, _, remote) = setup(true);
    let machines: Vec<Machine> = (1..=3)
        .map(|n| Machine::new(root.path(), &format!("m{n}")))
        .collect();

    let mut workers: Vec<Child> = machines
        .iter()
        .map(|m| m.worker(&server, &remote))
        .collect();
    // The first is killed mid-step; the second paused past its lease, then let go.
    let killed = wait_until_mid_feature(&server, (&machines[0], &mut workers[0]), 6);
    workers[0].kill().expect("SIGKILL");
    let _ = workers[0].wait();
    let paused = wait_until_mid_feature(&server, (&machines[1], &mut workers[1]), 6);
    let pid = nix::unistd::Pid::from_raw(workers[1].id() as i32);
    // Paused inside a transaction of the store (an append, a take, a renewal) when it can be
    // caught there: its lease row may be locked, and the server must end the session for the
    // feature to be taken over.
    let inside = pause_inside_a_store_transaction(&server, pid);
    // From the origin's checkout, which drives nothing: the paused worker's lane, held by it
    // on another machine, while its lease lasts.
    let origin = root.path().join("origin/shop");
    let looker = Machine::at_origin(&origin, root.path());
    let mut status = consort_in("status", &origin);
    status.arg("--json");
    let o = run(&mut looker.command(status, &server));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    let lane = json["lanes"]
        .as_array()
        .and_then(|lanes| lanes.iter().find(|l| l["feature"] == paused.as_str()))
        .unwrap_or_else(|| panic!("the paused worker's lane is listed: {json:#}"));
    assert_eq!(lane["work_tree"], serde_json::Value::Null, "{lane:#}");
    assert!(
        lane["held_by"]
            .as_str()
            .is_some_and(|h| h.ends_with(&format!("(PID {})", workers[1].id()))),
        "{lane:#}"
    );
    assert!(lane["since"].as_str().is_some(), "{lane:#}");
    // Taken over: a live lease on the paused worker's feature held by another process.
    let start = Instant::now();
    let paused_pid = format!("(PID {})", workers[1].id());
    loop {
        let (holdings, _) = store_view(&server);
        if holdings
            .iter()
            .any(|h| h.feature == paused && h.live && !h.holder.ends_with(&paused_pid))
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "never taken over: {holdings:?}\n{}",
            outputs(&machines)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "paused {}inside a store transaction; taken over {:.1} s later",
        if inside { "" } else { "(not caught) " },
        start.elapsed().as_secs_f64()
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");

    for (n, worker) in workers.iter_mut().enumerate().skip(1) {
        let status = worker.wait().expect("wait");
        let said = machines[n].output();
        if n == 1 {
            // Paused between two statements of a transaction, its session was ended by the
            // server (idle in a transaction past a second): the append it was in never
            // committed. Paused elsewhere, its next append carries a stale lease — unless its
            // lease renewal, resumed first, found the feature taken and stopped it recording.
            let refused = said.contains("no longer driven by this process");
            let ended = said.contains("connection closed") && said.contains("records nothing more");
            let lost = said.contains("lost its hold on the feature")
                && said.contains("records nothing more");
            assert!(
                refused || lost || (inside && ended),
                "the paused worker's late append was refused or never committed: {said}"
            );
        } else {
            assert!(status.success(), "worker {}: {said}", n + 1);
        }
    }
    let taken_over = machines[1].output() + &machines[2].output();
    for feature in [&killed, &paused] {
        assert!(
            taken_over.contains(&format!("{feature}: done")),
            "{feature} was taken over and finished: {taken_over}"
        );
    }
    assert_everything_done_and_nothing_left(&server, root.path(), &remote, &machines);
}

/// Issue 49, item 3, end to end: `consort stop` from a laptop's clone, while a worker on
/// another machine drives the feature before its gates, ends the worker's lease in the same
/// transaction: the worker records nothing more for it, never promotes its migrations to the
/// parent nor pushes it into the remote's base, and goes on with the rest of the backlog.
#[test]
fn a_stop_from_another_clone_stops_a_remote_worker_before_any_further_side_effect() {
    let (server, root, origin, remote) = setup(true);
    let machine = Machine::new(root.path(), "m1");
    let mut worker = machine.worker(&server, &remote);
    let feature = wait_until_mid_feature(&server, (&machine, &mut worker), 6);
    assert_eq!(feature, "f1-stock", "the backlog's first");
    let laptop = Machine::at_origin(&origin, root.path());
    let mut stop = consort_in("stop", &origin);
    stop.args(["--feature", &feature, "--by", "carol"]);
    let o = run(&mut laptop.command(stop, &server));
    assert_exit_saying(&o, 0, "the stop is recorded", "recorded: stop by carol");
    // It goes on with the backlog (the fixture's third feature, numbered for a run beside the
    // first, then halts at its schema: what it does is not this test's).
    let _ = worker.wait().expect("the worker ends");
    let said = machine.output();
    assert!(
        said.contains("f2-orders: done"),
        "the worker went on: {said}"
    );
    assert!(said.contains("person's decision"), "{said}");

    // Nothing after the stop's row; no promotion; no push into the base.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let events = runtime.block_on(async {
        let store = PgStore::connect(&server.store_info(), "shop")
            .await
            .expect("store");
        store.entries(&feature).await.expect("entries")
    });
    assert!(
        matches!(
            events.last().map(|e| &e.event),
            Some(consort::actors::Event::Human {
                decision: consort::actors::HumanDecision::Stop,
                ..
            })
        ),
        "the stop is the ledger's last row: {:?}",
        events.last()
    );
    assert_eq!(
        server
            .sql(&server.parent, "SELECT to_regclass('public.stock') IS NULL")
            .trim(),
        "t",
        "the stopped feature's migration never reached the parent"
    );
    let log = git(&remote, &["log", "--format=%B", "main"]);
    assert!(
        !log.contains(&format!("Consort-Feature: {feature}")),
        "the stopped feature never reached the remote's base: {log}"
    );
    assert!(log.contains("Consort-Feature: f2-orders"), "{log}");
    let mut verify = consort_in("verify", &origin);
    verify.args(["--feature", &feature]);
    let o = run(&mut laptop.command(verify, &server));
    assert_exit(&o, 0, "the stopped feature's ledger verifies");
}

/// Issue 49, item 1, end to end: a worker on a `url` server killed with SIGKILL at many
/// instants (its clone, its provider's set-up, a base being built, a branch being made, a test
/// run), a new worker started after each kill; then `consort branches --sweep` from a laptop's
/// clone leaves nothing of Consort's on the server: no branch database, no branch role, no
/// base half-built, no template.
#[test]
fn a_worker_killed_at_many_instants_leaves_nothing_a_sweep_from_another_clone_misses() {
    let (server, root, origin, remote) = setup(true);
    let machine = Machine::new(root.path(), "m1");
    // Instants spread over a worker's first seconds, shifted a little by the clock each run.
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_millis()) % 150);
    let mut instants = Vec::new();
    for base_ms in [150, 400, 800, 1300, 1900, 2600, 3500, 4500] {
        let mut worker = machine.worker(&server, &remote);
        let at = Duration::from_millis(base_ms + jitter);
        std::thread::sleep(at);
        worker.kill().expect("SIGKILL");
        let _ = worker.wait();
        instants.push(format!("{:.2} s", at.as_secs_f64()));
    }
    let laptop = Machine::at_origin(&origin, root.path());
    let mut sweep = consort_in("branches", &origin);
    sweep.arg("--sweep");
    let o = run(&mut laptop.command(sweep, &server));
    assert_exit(&o, 0, "the sweep");
    let left = server.sql(
        "postgres",
        "SELECT string_agg(n, ', ') FROM ( \
           SELECT datname AS n FROM pg_database WHERE datname LIKE 'consort\\_%' \
             OR datname LIKE 'consorttmp\\_%' OR datname LIKE 'consorttpl\\_%' \
           UNION ALL SELECT rolname FROM pg_roles WHERE rolname LIKE 'consort\\_%') AS made",
    );
    assert_eq!(
        left.trim(),
        "",
        "nothing of Consort's is left after kills at {}: {}\n{}",
        instants.join(", "),
        text(&o),
        machine.output()
    );
}

/// A fourth machine's fresh clone verifies every feature; the remote's base holds every
/// feature's commits; no lease, no lane worktree of a live machine and no database branch is
/// left.
fn assert_everything_done_and_nothing_left(
    server: &Server,
    root: &Path,
    remote: &Path,
    machines: &[Machine],
) {
    let fourth = Machine::cloned(root, "m4", remote);
    for feature in FEATURES {
        let mut verify = consort_in("verify", &fourth.clone);
        verify.args(["--feature", feature]);
        let o = run(&mut fourth.command(verify, server));
        assert_exit(&o, 0, &format!("{feature} verifies from a fresh clone"));
    }
    let status = run(&mut fourth.command(consort_in("status", &fourth.clone), server));
    assert_exit(&status, 0, "status");
    let log = git(&fourth.clone, &["log", "--format=%B", "origin/main"]);
    for feature in FEATURES {
        assert!(
            log.contains(&format!("Consort-Feature: {feature}")),
            "the remote's base holds {feature}'s commits: {log}"
        );
    }
    let (holdings, _) = store_view(server);
    assert!(holdings.is_empty(), "no lease is left: {holdings:?}");
    for m in &machines[1..] {
        let lanes = m.clone.with_file_name("shop.consort-lanes");
        assert!(!lanes.exists(), "no lane is left on {}", m.clone.display());
    }
    assert_no_branch_left(server);
}

fn assert_no_branch_left(server: &Server) {
    let branches = server.sql(
        "postgres",
        "SELECT datname FROM pg_database WHERE datname LIKE 'consort\\_%'",
    );
    assert_eq!(branches.trim(), "", "no database branch is left");
}

/// The same backlog with the file store, on one machine: three workers in one checkout, one
/// killed mid-step; the feature it held waits for a run in that checkout, which resumes it
/// where its ledger stops (one machine works as it did before the shared store).
#[test]
fn three_workers_of_one_checkout_with_the_file_store_and_a_killed_ones_feature_resumed() {
    let (server, root, origin, remote) = setup(false);
    let machine = Machine::at_origin(&origin, root.path());
    let mut workers: Vec<Child> = (0..3).map(|_| machine.worker(&server, &remote)).collect();
    let ledger = |f: &str| origin.join(format!(".consort/features/{f}/ledger.jsonl"));
    // The first worker takes f1: killed once its ledger has six entries.
    let start = Instant::now();
    while std::fs::read_to_string(ledger("f1-stock")).map_or(0, |l| l.lines().count()) < 6 {
        assert!(start.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    let holder = consort::runlock::Holder::parse(
        &std::fs::read(origin.join(".consort/features/f1-stock/feature.lock")).expect("lock"),
    )
    .expect("a holder");
    let at = workers
        .iter()
        .position(|w| w.id() == holder.pid)
        .expect("a worker holds f1");
    workers[at].kill().expect("SIGKILL");
    for w in &mut workers {
        let _ = w.wait();
    }
    let mut resume = approving_run(&origin);
    resume.args(["--parallel", "1"]);
    let o = run(&mut machine.command(resume, &server));
    assert_exit(&o, 0, "the killed worker's feature resumes to done");
    says(&o, "f1-stock: done");
    let o = run(&mut machine.command(consort_in("verify", &origin), &server));
    assert_exit(&o, 0, "every feature verifies");
    assert!(
        !origin.with_file_name("shop.consort-lanes").exists(),
        "no lane is left"
    );
    assert_no_branch_left(&server);
}
