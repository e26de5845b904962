//! Confined runs, tried as an adversary would: the code under test runs inside the
//! verification, so everything that judges the run must be out of its reach — the tests, the
//! harness, VCS metadata, Consort's private state, other ports — while its scratch directory,
//! the caches and POSIX shared memory (worker processes) stay usable. Also: settings stored on
//! the role or database by code do not reach the tests, a setup file is SQL and never a psql
//! script, a session the code ends is a verdict, a run that changes the tree is void, and a
//! test that passes every other run is flaky, not broken.

use crate::common;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::tree_of;
use consort_actors::hash_dir;
use consort_actors::{
    Confinement, ContentHash, InfraFault, TestRunReceipt, TestStatus, VerifyRequest, WorkTree,
};
use consort_lakebase::{
    BaseSpec, BranchProvider, CommandRunner, CommandRunnerConfig, LakebaseActor, LakebaseArgs,
    PsqlRunner, PsqlRunnerConfig, RunContext, RunReport, SandboxMode, SandboxSupport, TestRunner,
};

/// A confined context for `tree` on a fresh branch of the shared cluster.
async fn confined(tree: &Path, caches: Vec<std::path::PathBuf>) -> RunContext {
    common::confined_branch(tree, &BaseSpec::default(), caches)
        .await
        .2
}

/// Asserts that a run's output excerpt says `what`.
fn excerpt_says(excerpt: &str, what: &str) {
    assert!(excerpt.contains(what), "{excerpt}");
}

fn status(r: &RunReport, name: &str) -> Option<TestStatus> {
    r.outcomes.iter().find(|o| o.name == name).map(|o| o.status)
}

/// Runs the tests of a tree of `files` with the psql runner, confined, on a fresh branch;
/// returns the tree and the report.
async fn psql_run(files: &[(&str, &str)]) -> (tempfile::TempDir, RunReport) {
    let tree = tree_of(files);
    let ctx = confined(tree.path(), Vec::new()).await;
    let runner = PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner");
    let r = runner.run(&ctx).await.expect("the run is reported");
    (tree, r)
}

/// A shell script that runs each `try NAME 'COMMAND'` line of `tries` and reports it as a TAP
/// line: `ok` when the command worked.
fn attempts(tries: &str) -> String {
    format!(
        r#"n=0
try() {{ n=$((n+1)); if sh -c "$2" >/dev/null 2>&1; then echo "ok $n - $1"; else echo "not ok $n - $1"; fi; }}
{tries}echo "1..$n"
"#
    )
}

/// Runs `cfg` in `ctx`: in a view of the tree when `view`, else in the tree itself.
async fn run_in(cfg: &mut CommandRunnerConfig, view: bool, ctx: &RunContext) -> RunReport {
    cfg.view = view;
    CommandRunner::new(cfg.clone())
        .run(ctx)
        .await
        .expect("the runner runs")
}

/// What a confined run tries: each is a TAP test of [`attempts`].
const TRIES: &str = r#"
# The tests, the harness and the code it is judged on, VCS metadata:
try read-tests 'cat tests/t1.sql'
try write-test 'echo x >> tests/t1.sql'
try move-tests-aside 'mv tests tests.away'
try delete-test 'rm tests/t1.sql'
try new-test 'echo y > tests/t9.sql'
try edit-harness 'echo z >> consort.toml'
try git-hook 'echo h > .git/hooks/pre-commit'
try write-code 'echo c >> src/a.sql'
# Consort's private state and process:
try read-consort-state 'cat .consort/ledger.jsonl'
try read-cluster-password 'cat "$PW_FILE"'
try environ-of-consort 'cat /proc/$CONSORT_TEST_PID/environ'
try memory-of-consort 'head -c 1 /proc/$CONSORT_TEST_PID/mem'
# Its scratch, the caches, and the test tools beside them:
try write-scratch 'echo s > "$TMPDIR/s" && echo h > "$HOME/h" && echo r > "$CONSORT_REPORT_DIR/r"'
try write-cache 'echo t > target/out'
try rewrite-test-tool 'echo "process.exit(0)" > node_modules/vitest/index.js'
try replace-test-tool 'mv node_modules/vitest node_modules/vitest.away'
try plant-a-package 'mkdir node_modules/evil'
try rewrite-venv-tool 'echo "exit 0" > .venv/bin/pytest'
try write-tool-cache 'mkdir -p node_modules/.vite/vitest && echo r > node_modules/.vite/vitest/results.json'
# Ports: another process's, and its own branch's:
try connect-other-port 'python3 -c "import socket,os; socket.create_connection((\"127.0.0.1\", int(os.environ[\"OTHER_PORT\"])), 3)"'
try connect-branch 'python3 -c "import socket,os; socket.create_connection((\"127.0.0.1\", int(os.environ[\"PGPORT\"])), 3)"'
# Files beside the configuration, and the whole tree (in a view):
try write-beside-config 'echo v > consort.toml.timestamp-1.mjs && grep -q v consort.toml.timestamp-1.mjs && mkdir -p .tool-cache && echo w > .tool-cache/x'
try walk-the-tree 'find -L . -type f > /dev/null'
# The links that stand for what judges it:
try remove-a-link 'rm consort.toml'
try rename-a-link 'mv tests tests2'
try replace-a-link 'ln -sf /tmp consort.toml'
try make-a-link 'ln -s /tmp elsewhere'
# Processes, sockets, ptys and shared memory of its own:
try posix-shm-workers 'python3 -c "
import multiprocessing as mp
def work(q, lock, n):
    with lock:
        q.put(n * n)
if __name__ == \"__main__\":
    ctx = mp.get_context(\"fork\")
    q, lock = ctx.Queue(), ctx.Lock()
    ps = [ctx.Process(target=work, args=(q, lock, n)) for n in range(3)]
    [p.start() for p in ps]
    [p.join(20) for p in ps]
    assert sorted(q.get(timeout=5) for _ in ps) == [0, 1, 4]
"'
try serve-on-loopback 'python3 -c "
import socket, threading
s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(1)
threading.Thread(target=lambda: s.accept()[0].sendall(b\"hi\"), daemon=True).start()
c = socket.create_connection(s.getsockname(), 3)
assert c.recv(2) == b\"hi\"
"'
try open-a-pty 'python3 -c "
import os, pty
m, s = pty.openpty(); os.write(s, b\"x\"); assert os.read(m, 1) == b\"x\"
"'
try another-runs-pty 'echo x > "$OTHER_PTY"'
try shm-of-its-own 'echo probe > /dev/shm/consort-sandbox-probe && test -z "$(ls /dev/shm | grep -v consort-sandbox-probe | grep -v "^sem\.mp-" | grep -v "^mp-" || true)"'
"#;

#[tokio::test]
async fn a_confined_run_cannot_touch_what_judges_it_but_can_use_its_scratch_and_caches() {
    if let SandboxSupport::Unavailable(why) = SandboxSupport::probe() {
        panic!("this machine must offer Landlock for this suite: {why}");
    }
    let tree = tree_of(&[
        ("tests/t1.sql", "SELECT 1;\n"),
        ("src/a.sql", "SELECT 2;\n"),
        ("consort.toml", "[feature]\n"),
        (".git/hooks/README", "hooks\n"),
        (".consort/ledger.jsonl", "{}\n"),
        ("attempts.sh", attempts(TRIES).as_str()),
        ("node_modules/vitest/index.js", "// the test tool\n"),
        (".venv/bin/pytest", "# the test tool\n"),
    ]);
    std::fs::create_dir_all(tree.path().join("target")).expect("cache dir");
    // Consort's private state may hold a directory no run may list (the embedded cluster's,
    // the server user's `0700`): a tool that walks its tree must never meet it.
    let private = tree.path().join(".consort/pg");
    std::fs::create_dir_all(&private).expect("private dir");
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .expect("chmod");
    let before = hash_dir(tree.path()).expect("hash");
    let other = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let other_port = other.local_addr().expect("addr").port();
    let cluster = common::cluster().await;
    // The writable caches as the verifier finds them: `target`, and in `node_modules` (the
    // test tools' own directory, read-only) only the caches tools keep there.
    let caches = consort_actors::WorkTree::open(tree.path())
        .and_then(|t| t.cache_dirs())
        .expect("the caches");
    assert!(
        caches.contains(&tree.path().join("node_modules/.vite")),
        "{caches:?}"
    );
    assert!(
        !caches
            .iter()
            .any(|c| c.ends_with("node_modules") || c.ends_with(".venv"))
    );
    let ctx = confined(tree.path(), caches).await;
    // In namespaces of its own (or as root), each run gets a /dev/shm of its own (empty, and
    // gone with its scratch).
    let namespaced = matches!(ctx.jail.confinement(), Confinement::Namespaced { .. });
    let private_shm = namespaced || nix::unistd::geteuid().is_root();
    // A pty of this process, outside every run.
    let other_pty = nix::pty::openpty(None, None).expect("a pty");
    let other_pty_path = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&other_pty.slave)
    ))
    .expect("the pty's path");

    let mut cfg = CommandRunnerConfig::new("sh attempts.sh");
    cfg.env
        .set
        .push(("OTHER_PORT".into(), other_port.to_string()));
    cfg.env
        .set
        .push(("OTHER_PTY".into(), other_pty_path.display().to_string()));
    cfg.env.set.push((
        "PW_FILE".into(),
        cluster.dir().join("admin.pw").display().to_string(),
    ));
    // In the tree itself, and in a view of it: the same rules, but a view lets the tool
    // create its own files (beside its configuration) and walk a tree whose private state
    // it would not be let into.
    for view in [false, true] {
        let r = run_in(&mut cfg, view, &ctx).await;
        let in_view = ["write-beside-config", "walk-the-tree"];
        let mut allowed = vec![
            "read-tests",
            "write-scratch",
            "write-cache",
            "write-tool-cache",
            "connect-branch",
            "posix-shm-workers",
        ];
        if private_shm {
            allowed.push("shm-of-its-own");
        }
        if namespaced {
            allowed.extend(["serve-on-loopback", "open-a-pty"]);
        }
        let mut denied = vec![
            "write-test",
            "move-tests-aside",
            "delete-test",
            "new-test",
            "edit-harness",
            "git-hook",
            "write-code",
            "rewrite-test-tool",
            "replace-test-tool",
            "plant-a-package",
            "rewrite-venv-tool",
            "read-consort-state",
            "read-cluster-password",
            "environ-of-consort",
            "memory-of-consort",
            "connect-other-port",
            "another-runs-pty",
            "remove-a-link",
            "rename-a-link",
            "replace-a-link",
            "make-a-link",
        ];
        if view {
            allowed.extend(in_view);
        } else {
            denied.extend(in_view);
        }
        for (names, want, how) in [
            (&allowed, TestStatus::Passed, "work inside"),
            (&denied, TestStatus::Failed, "be refused by"),
        ] {
            for name in names {
                assert_eq!(
                    status(&r, name),
                    Some(want),
                    "{name} must {how} the sandbox (view: {view}):\n{}",
                    r.output_excerpt
                );
            }
        }
        assert_eq!(
            r.outcomes.len(),
            allowed.len() + denied.len() + usize::from(!private_shm) + 2 * usize::from(!namespaced)
        );
        if private_shm {
            assert!(
                !Path::new("/dev/shm/consort-sandbox-probe").exists(),
                "what a run puts in its /dev/shm stays in its own"
            );
        }
        std::fs::remove_file(tree.path().join("target/out")).expect("the cache write landed");
        std::fs::remove_dir_all(tree.path().join("node_modules/.vite/vitest"))
            .expect("the tool's cache write landed");
        assert_eq!(
            std::fs::read_to_string(tree.path().join("node_modules/vitest/index.js"))
                .expect("the tool"),
            "// the test tool\n",
            "the test tool is untouched"
        );
        assert_eq!(
            hash_dir(tree.path()).expect("hash"),
            before,
            "the tree is untouched (view: {view})"
        );
    }
    assert_eq!(
        ctx.jail.confinement(),
        Confinement::Namespaced {
            abi: 7,
            own_network: true
        },
        "this machine gives runs namespaces of their own (Landlock ABI 7): {}",
        SandboxSupport::probe()
    );
    assert!(
        !tree.path().join("consort.toml.timestamp-1.mjs").exists(),
        "what a run writes beside a configuration stays in its own view"
    );
}

#[tokio::test]
async fn a_setup_file_is_sql_and_never_a_psql_script() {
    let (tree, r) = psql_run(&[
        (
            "tests/t1.sql",
            "DO $$ BEGIN ASSERT false, 'the real test fails'; END $$;\n",
        ),
        (
            "src/evil.sql",
            "\\! mv tests /tmp/consort-moved-aside\nSELECT 1;\n",
        ),
    ])
    .await;
    assert!(
        r.output_excerpt
            .starts_with("setup file src/evil.sql failed"),
        "{}",
        r.output_excerpt
    );
    consort_testkit::verify::assert_contains(&r.output_excerpt, "syntax error");
    assert_eq!(status(&r, "tests/t1.sql"), Some(TestStatus::Errored));
    assert!(
        tree.path().join("tests/t1.sql").exists(),
        "the tests stay in place"
    );
    assert!(!Path::new("/tmp/consort-moved-aside").exists());
}

#[tokio::test]
async fn settings_and_schemas_the_code_stores_do_not_reach_the_tests() {
    let (_tree, r) = psql_run(&[
            (
                "src/items.sql",
                "CREATE TABLE items (n int);\nINSERT INTO items VALUES (1), (2);\n\
                 DO $$ BEGIN NULL; END $$;\n\
                 ALTER ROLE CURRENT_USER SET plpgsql.check_asserts = off;\n\
                 ALTER ROLE CURRENT_USER SET transform_null_equals = on;\n\
                 DO $$ BEGIN EXECUTE format('ALTER ROLE %I SET search_path = %I, public', current_user, current_user); END $$;\n\
                 DO $$ BEGIN EXECUTE format('CREATE SCHEMA %I', current_user); \
                 EXECUTE format('CREATE TABLE %I.items (n int)', current_user); END $$;\n",
            ),
            (
                "tests/t1_asserts_are_on.sql",
                "DO $$ BEGIN ASSERT false, 'asserts still judge'; END $$;\n",
            ),
            (
                "tests/t2_the_real_table.sql",
                "DO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 2, 'the plan''s table is read'; END $$;\n",
            ),
            (
                "tests/t3_null_is_not_equal.sql",
                "DO $$ BEGIN ASSERT (SELECT count(*) FROM items WHERE n = NULL) = 0; END $$;\n",
            ),
    ])
    .await;
    assert_eq!(
        status(&r, "tests/t1_asserts_are_on.sql"),
        Some(TestStatus::Failed),
        "ASSERT is still checked although the role switched it off:\n{}",
        r.output_excerpt
    );
    assert_eq!(
        status(&r, "tests/t2_the_real_table.sql"),
        Some(TestStatus::Passed),
        "the role's own schema does not shadow the plan's table:\n{}",
        r.output_excerpt
    );
    assert_eq!(
        status(&r, "tests/t3_null_is_not_equal.sql"),
        Some(TestStatus::Passed),
        "{}",
        r.output_excerpt
    );
}

fn args(runner: Arc<dyn TestRunner>, provider: Arc<dyn BranchProvider>) -> LakebaseArgs {
    LakebaseArgs {
        pool: consort_testkit::cluster::pool_config(1),
        ..LakebaseArgs::new(provider, runner)
    }
}

async fn verify(args: LakebaseArgs, tree: &Path) -> TestRunReceipt {
    verify_or_fault(args, tree)
        .await
        .unwrap_or_else(|e| panic!("an infrastructure error, not a verdict: {e:?}"))
}

async fn verify_or_fault(
    args: LakebaseArgs,
    tree: &Path,
) -> Result<TestRunReceipt, consort_actors::InfraError> {
    run_request(args, consort_testkit::verify::request(7, tree, Vec::new())).await
}

async fn run_request(
    args: LakebaseArgs,
    req: VerifyRequest,
) -> Result<TestRunReceipt, consort_actors::InfraError> {
    let (actor, join) = LakebaseActor::spawn(args).await.expect("spawn");
    let answer = consort_testkit::verify::verify(&actor, req, Duration::from_secs(180)).await;
    actor.stop(None);
    let _ = join.await;
    answer
}

/// A run that fails on what its confinement refused it is a harness fault that names what was
/// refused and the way to allow it — never a verdict a RED or a GREEN could be taken from. One
/// case per kind: the network outside the run's own, a path it may only read, a device (as
/// root, whose file modes would let it write the device), and Consort's private state.
#[tokio::test]
async fn a_run_the_confinement_refused_is_a_harness_fault_never_a_verdict() {
    let tree = tree_of(&[
        ("tests/t1.sql", "SELECT 1;\n"),
        (".consort/ledger.jsonl", "{}\n"),
    ]);
    let ctx = confined(tree.path(), Vec::new()).await;
    let mut cases = vec![
        (
            "python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), 3)'",
            "outside the run's own network",
        ),
        ("echo broken >> tests/t1.sql", "writing tests/t1.sql"),
        (
            "cat .consort/ledger.jsonl",
            "ledger.jsonl: Consort's private state",
        ),
    ];
    if nix::unistd::geteuid().is_root() {
        cases.push(("echo x > /dev/loop-control", "writing /dev/loop-control"));
    }
    for (command, named) in cases {
        let e = CommandRunner::new(CommandRunnerConfig::new(command))
            .run(&ctx)
            .await
            .expect_err("no report of a refused run");
        assert_eq!(
            e.infra_fault(),
            InfraFault::SandboxRefused,
            "{command}: {e}"
        );
        let said = e.to_string();
        assert!(said.contains(named), "{command}: {said}");
        assert!(said.contains("no verdict on the code"), "{said}");
    }
    // Through verification: no receipt, so no RED can be accepted and nobody charged.
    let runner: Arc<dyn TestRunner> = Arc::new(CommandRunner::new(CommandRunnerConfig::new(
        "echo broken >> tests/t1.sql",
    )));
    let fault = verify_or_fault(args(runner, common::dyn_provider().await), tree.path())
        .await
        .expect_err("a harness fault, not a receipt");
    consort_testkit::verify::assert_fault(
        &fault,
        InfraFault::SandboxRefused,
        "writing tests/t1.sql",
    );
}

#[tokio::test]
async fn a_session_the_code_ends_itself_is_a_verdict_not_a_database_fault() {
    let tree = tree_of(&[(
        "tests/t1_cut.sql",
        "SELECT pg_terminate_backend(pg_backend_pid());\n",
    )]);
    let runner: Arc<dyn TestRunner> =
        Arc::new(PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner"));
    let receipt = verify(args(runner, common::dyn_provider().await), tree.path()).await;
    assert_eq!(
        receipt.status_of("tests/t1_cut.sql"),
        Some(TestStatus::Errored)
    );
    excerpt_says(&receipt.output_excerpt, "the code under test ended it");
    assert!(receipt.confinement.is_confined());
}

#[tokio::test]
async fn a_run_that_changes_the_tree_is_void_and_names_the_paths() {
    let tree = tree_of(&[("src/a.sql", "SELECT 1;\n")]);
    std::fs::create_dir_all(tree.path().join("target")).expect("cache");
    // Unconfined (the only way code can write the tree): the after-run comparison still sees
    // it, and the cache does not count.
    let runner: Arc<dyn TestRunner> = Arc::new(CommandRunner::new(CommandRunnerConfig::new(
        "echo new > src/b.sql; echo changed >> src/a.sql; echo ok > target/x",
    )));
    let mut a = args(runner, common::dyn_provider().await);
    a.sandbox = SandboxMode::Off;
    let receipt = verify(a, tree.path()).await;
    assert_eq!(receipt.tree_changes, vec!["src/a.sql", "src/b.sql"]);
    assert_eq!(receipt.confinement, Confinement::Off);
}

/// A run that finds another tree than the one its request named says which paths differ
/// (added, changed, removed), for the machine to name when it refuses the receipt; a run of the
/// very tree named says none.
#[tokio::test]
async fn a_run_of_another_tree_than_its_request_named_says_which_paths_differ() {
    let tree = tree_of(&[("src/a.sql", "SELECT 1;\n"), ("src/b.sql", "SELECT 2;\n")]);
    let asked = WorkTree::open(tree.path())
        .and_then(|w| w.file_hashes())
        .expect("the tree's files");
    let mut req = consort_testkit::verify::request(7, tree.path(), Vec::new());
    req.workspace_hash = ContentHash::of(&asked);
    req.files = Some(asked);
    let runner = || -> Arc<dyn TestRunner> {
        Arc::new(CommandRunner::new(CommandRunnerConfig::new("echo ran")))
    };
    let provider = common::dyn_provider().await;
    let same = run_request(args(runner(), provider.clone()), req.clone())
        .await
        .expect("a receipt");
    assert_eq!(same.workspace_hash, req.workspace_hash);
    assert!(same.changed_since_request.is_empty(), "{same:?}");
    // What an editor, a watcher or a hand edit does between a request and its run.
    let path = |p: &str| tree.path().join(p);
    std::fs::write(path("src/a.sql"), "SELECT 3;\n").expect("edit");
    std::fs::write(path("app.log"), "started\n").expect("log");
    std::fs::remove_file(path("src/b.sql")).expect("remove");
    let moved = run_request(args(runner(), provider), req.clone())
        .await
        .expect("a receipt");
    assert_ne!(moved.workspace_hash, req.workspace_hash);
    assert_eq!(
        moved.changed_since_request,
        vec!["app.log", "src/a.sql", "src/b.sql"]
    );
}

#[tokio::test]
async fn a_run_that_rewrites_a_file_and_puts_its_mtime_back_is_still_caught() {
    let tree = tree_of(&[("src/a.sql", "SELECT 1;\n"), ("src/b.sql", "SELECT 3;\n")]);
    // Let the tree grow older than the hash cache's racy margin (3 s), so the snapshot before
    // the run trusts the files' stats and only the stat comparison can see the change. (Were
    // the wait too short, the files would be read again: the test would pass, proving less.)
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    // Same size, same inode, the old mtime put back with utimensat: only the ctime tells.
    let runner: Arc<dyn TestRunner> = Arc::new(CommandRunner::new(CommandRunnerConfig::new(
        "t=$(stat -c %y src/a.sql); printf 'SELECT 2;\\n' > src/a.sql; touch -d \"$t\" src/a.sql",
    )));
    let mut a = args(runner, common::dyn_provider().await);
    a.sandbox = SandboxMode::Off;
    let receipt = verify(a, tree.path()).await;
    assert_eq!(receipt.tree_changes, vec!["src/a.sql"]);
}

/// A TAP suite whose earlier test passes every other run (a marker in a cache directory, which
/// runs may write and which outlives them, flips each time), beside a test that always fails
/// and the new test of the step.
const EVERY_OTHER_RUN: &str = r#"
if [ -e target/flip ]; then rm target/flip; echo "not ok 1 - earlier-racy"
else touch target/flip; echo "ok 1 - earlier-racy"; fi
if [ -e broken-too ]; then echo "not ok 2 - earlier-broken"; else echo "ok 2 - earlier-broken"; fi
echo "not ok 3 - the-new-one"
echo "1..3"
"#;

/// An earlier-green test that fails in a step is run once more on a fresh branch: one that
/// passes then is flaky (recorded in the receipt, which is the second run's, where it passed),
/// one that fails again is broken. The step's own test never causes a second run.
#[tokio::test]
async fn a_test_that_passes_every_other_run_is_flaky_and_one_that_always_fails_is_not() {
    let tree = tree_of(&[("suite.sh", EVERY_OTHER_RUN)]);
    std::fs::create_dir_all(tree.path().join("target")).expect("cache dir");
    let runner: Arc<dyn TestRunner> =
        Arc::new(CommandRunner::new(CommandRunnerConfig::new("sh suite.sh")));
    let run = |focus: &str| {
        let mut req = consort_testkit::verify::request(9, tree.path(), Vec::new());
        req.purpose = consort_actors::VerifyPurpose::Red;
        req.tests = vec!["earlier-racy".into(), "earlier-broken".into(), focus.into()];
        req.focus = Some(focus.into());
        req
    };
    let provider = common::dyn_provider().await;
    let (actor, join) = LakebaseActor::spawn(args(runner, provider))
        .await
        .expect("spawn");
    let ask = |req| consort_testkit::verify::verify(&actor, req, Duration::from_secs(180));

    // The step's own test fails and every earlier one passes: one run, nothing flaky.
    let r = ask(run("the-new-one")).await.expect("receipt");
    assert!(r.flaky.is_empty());
    assert!(tree.path().join("target/flip").exists(), "one run only");

    // Now the racy test fails first and passes on the second run.
    let r = ask(run("the-new-one")).await.expect("receipt");
    assert_eq!(r.flaky, ["earlier-racy"]);
    assert_eq!(r.status_of("earlier-racy"), Some(TestStatus::Passed));
    assert_eq!(r.status_of("the-new-one"), Some(TestStatus::Failed));
    excerpt_says(
        &r.output_excerpt,
        "flaky, not broken: earlier-racy passed on this fresh branch",
    );

    // A test that fails on every run is broken, never flaky (the racy one, failing on the
    // first run again, is flaky again).
    std::fs::write(tree.path().join("broken-too"), "").expect("write");
    let r = ask(run("the-new-one")).await.expect("receipt");
    assert_eq!(r.flaky, ["earlier-racy"]);
    assert_eq!(r.status_of("earlier-broken"), Some(TestStatus::Failed));
    excerpt_says(&r.output_excerpt, "failed again here: earlier-broken");
    actor.stop(None);
    let _ = join.await;
}

/// A lane's run reads its own tree (in the hidden lanes' directory) and no other lane's, one
/// made after its confinement was built included; a view of its tree still works.
#[tokio::test]
async fn a_lane_s_run_reads_its_own_tree_and_no_other_lane_even_one_made_later() {
    let lanes = tempfile::tempdir().expect("lanes");
    let write = |path: &str, text: &str| {
        let path = lanes.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write("f1/tests/t1.sql", "SELECT 1;\n");
    write("f2/src/secret.sql", "SELECT 'f2';\n");
    write(
        "f1/attempts.sh",
        &attempts(
            r#"try read-own 'cat tests/t1.sql'
try read-other-lane 'cat "$LANES/f2/src/secret.sql"'
try read-later-lane 'cat "$LANES/f3/src/new.sql"'
"#,
        ),
    );
    let own = lanes.path().join("f1");
    let (_p, _b, ctx) = common::confined_branch_hiding(
        &own,
        &BaseSpec::default(),
        Vec::new(),
        vec![lanes.path().to_path_buf()],
    )
    .await;
    write("f3/src/new.sql", "SELECT 'f3';\n");
    let mut cfg = CommandRunnerConfig::new("sh attempts.sh");
    cfg.env
        .set
        .push(("LANES".into(), lanes.path().display().to_string()));
    for view in [false, true] {
        let r = run_in(&mut cfg, view, &ctx).await;
        assert_eq!(
            status(&r, "read-own"),
            Some(TestStatus::Passed),
            "{}",
            r.output_excerpt
        );
        for other in ["read-other-lane", "read-later-lane"] {
            assert_eq!(
                status(&r, other),
                Some(TestStatus::Failed),
                "{other} (view: {view}): {}",
                r.output_excerpt
            );
        }
    }
}

/// Every test of this module again, as an unprivileged user (`nobody`), when this suite runs as
/// root (as CI does): the namespaces, the forwarded branch, the ptys and every refusal hold for
/// a normal user too, who gets its namespaces from a user namespace of its own. Run as a
/// normal user, the module's tests already are that run.
#[test]
fn every_sandbox_test_holds_for_an_unprivileged_user_too() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let home = tempfile::tempdir().expect("a home for nobody");
    let nobody = (
        nix::unistd::Uid::from_raw(65534),
        nix::unistd::Gid::from_raw(65534),
    );
    nix::unistd::chown(home.path(), Some(nobody.0), Some(nobody.1)).expect("chown");
    let exe = std::env::current_exe().expect("this test binary");
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "env",
            "-i",
        ])
        .arg(format!("HOME={}", home.path().display()))
        .arg(format!("TMPDIR={}", home.path().display()))
        .arg(format!(
            "PATH={}",
            std::env::var("PATH").unwrap_or_default()
        ))
        .arg(exe)
        .args([
            "sandbox::",
            "--skip",
            "every_sandbox_test_holds_for_an_unprivileged_user_too",
            "--test-threads=2",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv (util-linux) starts");
    let said = consort_testkit::process::text(&out);
    assert!(out.status.success(), "{said}");
    let passed = said
        .lines()
        .filter(|l| l.starts_with("test sandbox::") && l.ends_with(" ok"))
        .count();
    assert!(passed >= 8, "every sandbox test ran as nobody: {said}");
}

/// Two runs at once, each in a network of its own: both listen on the same port (in one
/// network the second could not), neither reaches a listener the other opened, this process
/// (Consort's side: its MCP or `serve` port, the store) reaches neither, and each still
/// reaches its own branch through its forwarder.
#[tokio::test]
async fn concurrent_runs_each_have_a_network_of_their_own() {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let (theirs, both) = (free(), free());
    let listen = |port: u16| {
        format!(
            "s{port} = socket.socket(); s{port}.bind(('127.0.0.1', {port})); s{port}.listen(8)\n"
        )
    };
    let first = format!(
        "import socket, time\n{}{}time.sleep(4)\n",
        listen(theirs),
        listen(both)
    );
    let second = format!(
        "import socket, time, os\n{}time.sleep(1)\n\
         try:\n    socket.create_connection(('127.0.0.1', {theirs}), 2)\n    raise SystemExit('reached the other run')\n\
         except OSError:\n    pass\n\
         socket.create_connection((os.environ['PGHOST'], int(os.environ['PGPORT'])), 3)\n",
        listen(both)
    );
    let tree = tree_of(&[("first.py", &first), ("second.py", &second)]);
    let (a, b) = (
        confined(tree.path(), Vec::new()).await,
        confined(tree.path(), Vec::new()).await,
    );
    let run = |ctx: RunContext, script: &'static str| async move {
        CommandRunner::new(CommandRunnerConfig::new(format!("python3 {script}")))
            .run(&ctx)
            .await
            .expect("the run is reported")
    };
    let host_probe = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        tokio::net::TcpStream::connect(("127.0.0.1", theirs)).await
    };
    let (first, second, probe) = tokio::join!(run(a, "first.py"), run(b, "second.py"), host_probe);
    for r in [&first, &second] {
        assert!(r.exit.success(), "{}", r.output_excerpt);
    }
    assert!(
        probe.is_err(),
        "a listener a run opened is not on this machine's loopback"
    );
}

/// Even unconfined (`sandbox = "off"`), a lane's run does not write the main tree's
/// dependencies through its links: they are mounted read-only in its mount namespace, the
/// caches tools keep there excepted, while the rest of the tree stays writable.
#[tokio::test]
async fn an_unconfined_lane_does_not_write_the_main_tree_s_dependencies_through_its_links() {
    let main = tree_of(&[
        ("node_modules/vitest/index.js", "// the test tool\n"),
        ("node_modules/.vite/results.json", "{}\n"),
    ]);
    let lane = tree_of(&[("src/a.js", "// code\n")]);
    std::fs::create_dir_all(lane.path().join("node_modules")).expect("the lane's node_modules");
    std::os::unix::fs::symlink(
        main.path().join("node_modules/vitest"),
        lane.path().join("node_modules/vitest"),
    )
    .expect("link");
    let caches = vec![main.path().join("node_modules/.vite")];
    let (_, _, ctx) = common::branch_context(
        lane.path(),
        &BaseSpec::default(),
        caches,
        Vec::new(),
        SandboxMode::Off,
    )
    .await;
    let mut cfg = CommandRunnerConfig::new(
        "echo evil > node_modules/vitest/index.js; s1=$?; \
         chmod 000 node_modules/vitest/index.js; s2=$?; \
         echo '{}' > \"$MAIN_MODULES/.vite/results.json\"; s3=$?; \
         echo code >> src/a.js; s4=$?; \
         no() { [ \"$1\" -ne 0 ] && echo refused || echo allowed; }; \
         echo \"write $(no $s1), chmod $(no $s2), cache $(no $s3), code $(no $s4)\"",
    );
    cfg.env.set.push((
        "MAIN_MODULES".into(),
        main.path().join("node_modules").display().to_string(),
    ));
    let r = CommandRunner::new(cfg)
        .run(&ctx)
        .await
        .expect("the run is reported");
    excerpt_says(
        &r.output_excerpt,
        "write refused, chmod refused, cache allowed, code allowed",
    );
    assert_eq!(
        std::fs::read_to_string(main.path().join("node_modules/vitest/index.js")).expect("tool"),
        "// the test tool\n"
    );
    assert_eq!(ctx.jail.confinement(), Confinement::Off);
}

/// Where the kernel gives runs no namespaces (Landlock alone), the port rule refuses a test
/// that serves on loopback: that refusal is a harness fault naming the address — the
/// supertest case that was once taken for a RED — and so is a pty the run could not open.
#[tokio::test]
async fn under_landlock_alone_a_refused_connection_or_pty_is_a_harness_fault() {
    let tree = tree_of(&[("tests/t1.sql", "SELECT 1;\n")]);
    let (_, _, ctx) = common::branch_context(
        tree.path(),
        &BaseSpec::default(),
        Vec::new(),
        Vec::new(),
        SandboxMode::LandlockAlone,
    )
    .await;
    assert!(matches!(
        ctx.jail.confinement(),
        Confinement::Landlock { network: true, .. }
    ));
    let serve = "node -e \"const s = require('net').createServer().listen(0, '127.0.0.1', () => \
                 require('net').connect(s.address().port, '127.0.0.1').on('error', (e) => \
                 { console.error(e.message); process.exit(1); }))\"";
    let e = CommandRunner::new(CommandRunnerConfig::new(serve))
        .run(&ctx)
        .await
        .expect_err("no report of a refused run");
    assert_eq!(e.infra_fault(), InfraFault::SandboxRefused, "{e}");
    assert!(
        e.to_string().contains("a TCP connection to 127.0.0.1:"),
        "the address is named: {e}"
    );
    let pty = "python3 -c 'import pty; pty.openpty()'";
    let e = CommandRunner::new(CommandRunnerConfig::new(pty))
        .run(&ctx)
        .await
        .expect_err("no report of a refused run");
    assert_eq!(e.infra_fault(), InfraFault::SandboxRefused, "{e}");
    assert!(e.to_string().contains("a pseudo-terminal"), "{e}");
}
