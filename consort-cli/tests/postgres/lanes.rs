//! Lanes: features of one backlog at once, each in its own git worktree on its own database
//! branches, through the embedding API and the `consort` binary, on the embedded PostgreSQL
//! with the psql runner and real git.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use consort::actors::{
    ApproveAs, Approver, BoxFuture, GateApproval, GateKind, GateRequest, RunOutcome,
};
use consort::lanes::{LaneOptions, LaneReport, run_lanes};
use consort_testkit::process::text;

use crate::backlog::{Plan, f1, git, scripted_project};
use crate::common::{
    approve_lane_gate, approving_run, assert_exit, assert_exit_saying, assert_halted, consort,
    consort_in, dir_arg, feature_add, run, says, status_json, write,
};

/// Orders: a table and a function of its own, nothing of f1's.
pub(crate) fn orders() -> Plan<'static> {
    Plan {
        feature: "f2-orders",
        story: "Orders",
        migration: (
            "0001_orders",
            "CREATE TABLE orders (id int PRIMARY KEY, sku text NOT NULL);",
        ),
        test: (
            "tests/f2_t1_orders.sql",
            "INSERT INTO orders VALUES (1, 'A');\nDO $$ BEGIN IF order_count() <> 1 THEN RAISE EXCEPTION 'orders: %', order_count(); END IF; END $$;\n",
        ),
        red_extra: "",
        green_file: "src/orders.sql",
        green: "CREATE FUNCTION order_count() RETURNS int LANGUAGE sql AS $$ SELECT count(*)::int FROM orders $$;\n".into(),
        repair: None,
    }
}

/// Labels: its own table and function, and on the side a `stock_level` of its own that
/// answers 0, which breaks f1's test once both are merged (and nothing in its own lane).
fn labels() -> Plan<'static> {
    Plan {
        feature: "f2-labels",
        story: "Labels",
        migration: (
            "0001_labels",
            "CREATE TABLE labels (sku text PRIMARY KEY, label text NOT NULL);",
        ),
        test: (
            "tests/f2_t1_label.sql",
            "INSERT INTO labels VALUES ('A', 'apple');\nDO $$ BEGIN IF label_of('A') <> 'apple' THEN RAISE EXCEPTION 'label: %', label_of('A'); END IF; END $$;\n",
        ),
        red_extra: "",
        green_file: "src/zz_label.sql",
        green: "CREATE FUNCTION label_of(s text) RETURNS text LANGUAGE sql AS $$ SELECT label FROM labels WHERE sku = s $$;\nCREATE OR REPLACE FUNCTION stock_level(s text) RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 0; END $$;\n".into(),
        repair: None,
    }
}

/// A git project `shop` in a fresh temporary directory, whose backlog is f1 (stock levels)
/// and `second`, each played by its script.
fn shop(second: &Plan<'_>) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("shop");
    scripted_project(&dir, &[&f1(), second]);
    write(
        &dir,
        &[(
            "second.md",
            &format!("# {}\n\nThe second feature.\n", second.story),
        )],
    );
    consort::git::GitRepo::init_with_commit(&dir, "Test Author", "before Consort").expect("git");
    let o = run(&mut feature_add(
        &dir.join("second.md"),
        second.feature,
        &dir,
    ));
    assert_exit(&o, 0, "the second feature is added");
    (tmp, dir)
}

/// Both features in lanes through the embedding API, each feature's gates decided by its
/// approver in `approvers` (a feature without one stops at its gates).
fn lanes_with(dir: &Path, approvers: Vec<(&str, Arc<dyn Approver>)>) -> Vec<LaneReport> {
    let opts = LaneOptions {
        parallel: 2,
        approvers: approvers
            .into_iter()
            .map(|(feature, approver)| (feature.to_string(), approver))
            .collect(),
        ..LaneOptions::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime
        .block_on(run_lanes(dir, opts))
        .expect("the lanes run; one lane's end does not end the others")
}

/// Both features in lanes, `approved` approved as it goes and the other left at its gates;
/// how each ended.
fn lanes_approving_only(dir: &Path, approved: &str) -> BTreeMap<String, RunOutcome> {
    let ada: Arc<dyn Approver> = Arc::new(ApproveAs { name: "ada".into() });
    lanes_with(dir, vec![(approved, ada)])
        .into_iter()
        .map(|r| (r.feature, r.outcome.expect("the lane ran").outcome))
        .collect()
}

/// Both features in lanes, only `f2-orders` approved: f1 waits at its gate; how each ended.
fn f1_left_at_its_gate(dir: &Path) -> BTreeMap<String, RunOutcome> {
    let ended = lanes_approving_only(dir, "f2-orders");
    assert!(
        matches!(ended["f1-stock"], RunOutcome::AtGate { .. }),
        "f1 waits at its gate: {ended:?}"
    );
    ended
}

/// Where feature `id`'s lane of the project in `dir` lives: `shop.consort-lanes/<id>` beside
/// the project (a repository of its own).
fn lane_of(dir: &Path, id: &str) -> PathBuf {
    let name = dir.file_name().expect("a name").to_string_lossy();
    dir.with_file_name(format!("{name}.consort-lanes")).join(id)
}

/// The design gate of `feature`'s lane, as the status lists it: approved on the command line.
fn approve_waiting_lane(dir: &Path, feature: &str) {
    let status = status_json(dir);
    let lanes = status["lanes"].as_array().expect("lanes");
    assert_eq!(lanes.len(), 1, "one lane waits: {status:#}");
    assert_eq!(lanes[0]["feature"], feature);
    assert_eq!(lanes[0]["phase"], "design-gate");
    approve_lane_gate(dir, &lanes[0]);
}

fn worktrees(dir: &Path) -> usize {
    git(dir, &["worktree", "list", "--porcelain"])
        .lines()
        .filter(|l| l.starts_with("worktree "))
        .count()
}

#[test]
fn two_lanes_run_at_once_and_a_lane_at_a_gate_does_not_hold_the_other() {
    let (_tmp, dir) = shop(&orders());
    let ended = f1_left_at_its_gate(&dir);
    assert_eq!(ended["f2-orders"], RunOutcome::Done, "f2 went on to done");
    // f2 merged into the base; its lane is gone, f1's stays with f1's work only.
    assert!(
        dir.join("tests/f2_t1_orders.sql").is_file(),
        "f2 merged into main"
    );
    // The lanes live beside the repository, none inside the project's tree.
    assert!(!lane_of(&dir, "f2-orders").exists());
    assert!(lane_of(&dir, "f1-stock").join("feature.md").is_file());
    assert!(!dir.join(".consort/lanes").exists());
    assert_eq!(worktrees(&dir), 2, "the project's tree and f1's lane");

    approve_waiting_lane(&dir, "f1-stock");
    let o = run(approving_run(&dir).args(["--parallel", "2"]));
    assert_exit(&o, 0, "f1 resumes in its lane to done");
    let out = text(&o);
    assert!(out.contains("f1-stock: done"), "{out}");
    assert!(
        out.contains("[f1-stock] "),
        "progress names its lane: {out}"
    );
    // f1 merged after f2's tests passed on the merge: the base holds both, no lane is left.
    for file in [
        "tests/t1_level.sql",
        "tests/f2_t1_orders.sql",
        "src/level.sql",
    ] {
        assert!(dir.join(file).is_file(), "{file} in the base");
    }
    assert_eq!(worktrees(&dir), 1, "no worktree is left");
    assert_eq!(status_json(&dir)["lanes"], serde_json::json!([]));
    let log = git(&dir, &["log", "--format=%s", "main"]);
    assert!(log.contains("Merge feature f1-stock into main"), "{log}");
    // Both designs chose version 0001; each lane's file carries its feature, so both stand.
    let mut files: Vec<String> = std::fs::read_dir(dir.join("migrations"))
        .expect("migrations")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["0001_f1-stock_S1_stock.sql", "0001_f2-orders_S1_orders.sql"],
        "distinct, ordered migration files"
    );
    let verify = run(&mut consort_in("verify", &dir));
    assert_exit(&verify, 0, "every receipt verifies");
    // f1's merge check (with f2's work) is on record: receipted, verified, in the report.
    assert!(
        text(&verify).contains("ok    merge check: req-")
            && text(&verify).contains("merged with f2-orders"),
        "{}",
        text(&verify)
    );
    let report = run(consort_in("report", &dir).args(["--feature", "f1-stock"]));
    assert_exit(&report, 0, "the report is written");
    let page = std::fs::read_to_string(
        text(&report)
            .lines()
            .find_map(|l| l.split_whitespace().find(|w| w.ends_with(".html")))
            .expect("the report's path"),
    )
    .expect("the report");
    assert!(
        page.contains("Merge check: merged with f2-orders"),
        "{page}"
    );
}

/// `consort stop` on a lane waiting at its gate removes its worktree at once (its branch and
/// records stay), not at the next run.
#[test]
fn a_stopped_lane_s_worktree_goes_at_the_stop() {
    let (_tmp, dir) = shop(&orders());
    f1_left_at_its_gate(&dir);
    assert_eq!(worktrees(&dir), 2, "the project's tree and f1's lane");
    let o = run(consort_in("stop", &dir).args(["--feature", "f1-stock", "--by", "ada"]));
    assert_exit(&o, 0, "the stop is recorded");
    assert!(
        text(&o).contains("the lane's worktree") && text(&o).contains("is removed"),
        "{}",
        text(&o)
    );
    assert_eq!(worktrees(&dir), 1, "f1's worktree went with the stop");
    assert!(!lane_of(&dir, "f1-stock").exists());
    let branches = git(&dir, &["branch", "--list", "consort/f1-stock"]);
    assert!(!branches.trim().is_empty(), "its branch stays");
}

#[test]
fn the_merge_check_refuses_a_lane_that_breaks_a_merged_features_tests() {
    let (tmp, dir) = shop(&labels());
    // Labels waits at its design gate while f1 merges; then it builds on what it started from.
    let ended = lanes_approving_only(&dir, "f1-stock");
    assert_eq!(ended["f1-stock"], RunOutcome::Done);
    assert!(matches!(ended["f2-labels"], RunOutcome::AtGate { .. }));

    approve_waiting_lane(&dir, "f2-labels");
    let o = run(approving_run(&dir).args(["--parallel", "2"]));
    assert_exit(&o, 4, "labels halts at its merge check");
    let out = text(&o);
    assert!(
        out.contains("merge check") && out.contains("do not pass: tests/t1_level.sql (f1-stock)"),
        "the refusal names the merged feature's test that broke, and what it said: {out}"
    );
    // Nothing of labels reached the base; its lane stays for a person, halted as integration.
    assert!(!dir.join("tests/f2_t1_label.sql").exists());
    let status = status_json(&dir);
    let lane = &status["lanes"][0];
    assert_eq!(lane["feature"], "f2-labels");
    assert_halted(&lane["halted"], "integration", "merge-refused", "f1-stock");
    // The report page shows the same lane, waiting for a person.
    let page = tmp.path().join("report.html");
    let o = run(consort_in("report", &dir).arg("--out").arg(&page));
    assert_exit(&o, 0, "report");
    let html = std::fs::read_to_string(&page).expect("report page");
    assert!(
        html.contains("<tr data-lane=\"f2-labels\">") && html.contains("halted (merge-refused)"),
        "the page lists the halted lane: {html}"
    );
}

/// An approver that crashes at the first gate it is asked about.
struct Crashes;

impl Approver for Crashes {
    fn decide<'a>(&'a self, _: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async { panic!("the approver crashed") })
    }
}

#[test]
fn a_lane_whose_approver_crashes_stops_at_its_gate_while_the_other_goes_on_to_done() {
    let (_tmp, dir) = shop(&orders());
    let approve: Arc<dyn Approver> = Arc::new(ApproveAs { name: "ada".into() });
    let reports = lanes_with(
        &dir,
        vec![("f1-stock", Arc::new(Crashes)), ("f2-orders", approve)],
    );
    let ended: BTreeMap<_, _> = reports
        .into_iter()
        .map(|r| (r.feature.clone(), r))
        .collect();
    let f2 = ended["f2-orders"].outcome.as_ref().expect("f2 ran");
    assert_eq!(f2.outcome, RunOutcome::Done, "f2 went on to done");
    // Fail closed: the crashed approver answered nothing, so f1 stops at its design gate.
    assert!(
        matches!(
            &ended["f1-stock"].outcome,
            Ok(r) if matches!(r.outcome, RunOutcome::AtGate { .. })
        ),
        "f1 stopped at its gate: {:?}",
        ended["f1-stock"].outcome
    );
    // Nothing of f1 is lost: its lane resumes where it stopped and reaches done.
    assert!(lane_of(&dir, "f1-stock").is_dir(), "f1's lane stays");
    // As an earlier Consort left it, inside the project: found and moved out on resume.
    std::fs::create_dir_all(dir.join(".consort/lanes")).expect("the old lanes' directory");
    git(
        &dir,
        &[
            "worktree",
            "move",
            &lane_of(&dir, "f1-stock").to_string_lossy(),
            &dir.join(".consort/lanes/f1-stock").to_string_lossy(),
        ],
    );
    let o = run(approving_run(&dir).args(["--parallel", "2"]));
    assert_exit(&o, 0, "f1 resumes in its lane to done");
    assert_both_merged_and_nothing_left(&dir);
}

/// The features whose ledgers hold at least `receipts` verified runs.
fn verified_at_least(dir: &Path, features: &[&str], receipts: usize) -> bool {
    features.iter().all(|f| {
        let ledger = dir.join(format!(".consort/features/{f}/ledger.jsonl"));
        std::fs::read_to_string(ledger)
            .unwrap_or_default()
            .matches("\"verify-completed\"")
            .count()
            >= receipts
    })
}

/// Both lanes done and merged, and nothing of them left: no worktree, no merge tree.
fn assert_both_merged_and_nothing_left(dir: &Path) {
    for file in [
        "tests/t1_level.sql",
        "tests/f2_t1_orders.sql",
        "src/orders.sql",
    ] {
        assert!(dir.join(file).is_file(), "{file} in the base");
    }
    assert_eq!(worktrees(dir), 1, "no worktree is left");
    let lanes = lane_of(dir, "f1-stock");
    let lanes = lanes.parent().expect("the lanes' directory");
    assert!(
        !lanes.exists(),
        "no lane and no merge tree left, nor their directory: {}",
        lanes.display()
    );
    let status = status_json(dir);
    assert_eq!(status["lanes"], serde_json::json!([]));
    let states: Vec<_> = status["features"]
        .as_array()
        .expect("features")
        .iter()
        .map(|f| f["state"].clone())
        .collect();
    assert_eq!(states, ["done", "done"], "{status:#}");
}

#[test]
fn lanes_killed_mid_step_resume_where_they_stopped_from_a_relative_project_dir() {
    let (_tmp, dir) = shop(&orders());
    let mut child = approving_run(&dir)
        .args(["--parallel", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    while !verified_at_least(&dir, &["f1-stock", "f2-orders"], 1) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the lanes ended before they could be killed: {status}");
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(300),
            "no progress"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // A fast lane may have finished between the check above and the kill: what the resume
    // must say depends on what was still open, which depends on the machine's speed.
    let open_at_the_kill: Vec<String> = status_json(&dir)["features"]
        .as_array()
        .expect("features")
        .iter()
        .filter(|f| f["state"] != "done")
        .filter_map(|f| f["id"].as_str().map(str::to_string))
        .collect();
    assert!(
        !open_at_the_kill.is_empty(),
        "a lane was under way at the kill"
    );
    // A kill inside git: what a git killed mid-commit leaves, on each open lane's branch and
    // work tree (removed on resume, since no git of Consort's can hold them).
    let planted = plant_dead_git_locks(&dir, &open_at_the_kill);

    // Resumed from inside the project with the default `--dir .`: every lane's ledger, git
    // index and test run still resolve to the project, not to a lane's worktree.
    let o = run(consort()
        .args(["run", "--approve-as", "ada", "--parallel", "2"])
        .current_dir(&dir));
    assert_exit(&o, 0, "both lanes resume to done");
    let out = text(&o);
    for id in &open_at_the_kill {
        assert!(out.contains(&format!("{id}: done")), "{id}: {out}");
    }
    assert_both_merged_and_nothing_left(&dir);
    for lock in &planted {
        assert!(!lock.exists(), "{} is gone", lock.display());
    }
    assert_exit(
        &run(&mut consort_in("verify", &dir)),
        0,
        "every receipt verifies",
    );
}

/// Leaves, an hour old, the lock files a git killed while committing leaves: each feature's
/// branch lock, and the index and HEAD locks of every lane's work tree. Returns them.
fn plant_dead_git_locks(dir: &std::path::Path, features: &[String]) -> Vec<std::path::PathBuf> {
    let common = String::from_utf8(
        run(std::process::Command::new("git").arg("-C").arg(dir).args([
            "rev-parse",
            "--path-format=absolute",
            "--git-common-dir",
        ]))
        .stdout,
    )
    .expect("utf-8");
    let common = std::path::PathBuf::from(common.trim());
    let mut locks: Vec<std::path::PathBuf> = features
        .iter()
        .map(|f| common.join(format!("refs/heads/consort/{f}.lock")))
        .collect();
    if let Ok(worktrees) = std::fs::read_dir(common.join("worktrees")) {
        for lane in worktrees.flatten() {
            locks.push(lane.path().join("index.lock"));
            locks.push(lane.path().join("HEAD.lock"));
        }
    }
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for lock in &locks {
        if let Some(parent) = lock.parent() {
            std::fs::create_dir_all(parent).expect("lock dir");
        }
        let file = std::fs::File::create(lock).expect("lock");
        file.set_modified(an_hour_ago).expect("mtime");
    }
    assert!(
        locks.len() > features.len(),
        "a lane's work tree is there: {locks:?}"
    );
    locks
}

/// `psql` as the cluster's superuser over TCP.
fn admin_sql(cluster: &consort::lakebase::EmbeddedCluster, password: &str, sql: &str) {
    let o = run(std::process::Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U"])
        .arg(cluster.superuser())
        .arg("-p")
        .arg(cluster.port().to_string())
        .args(["-d", "postgres", "-c", sql])
        .env("PGPASSWORD", password));
    assert!(o.status.success(), "{sql}: {}", text(&o));
}

#[test]
fn two_processes_drive_two_lanes_of_one_project_sharing_only_git_and_the_ledgers() {
    // The database is a server of its own (as Lakebase would be), reached by URL.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = runtime.block_on(consort_testkit::cluster::cluster());
    let password = std::fs::read_to_string(cluster.dir().join("admin.pw")).expect("admin.pw");
    let password = password.trim();
    let parent = consort_testkit::cluster::unique_database("lanes_two");
    admin_sql(&cluster, password, &format!("CREATE DATABASE {parent}"));
    let url = format!(
        "postgres://{}:{password}@127.0.0.1:{}/{parent}",
        cluster.superuser(),
        cluster.port()
    );
    let (_tmp, dir) = shop(&orders());
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    std::fs::write(
        dir.join("consort.toml"),
        format!("{config}\n[database]\nprovider = \"url\"\nurl_env = \"LANES_DATABASE_URL\"\n"),
    )
    .expect("config");
    let start = |feature: &str| {
        approving_run(&dir)
            .args(["--parallel", "1", "--feature", feature])
            .env("LANES_DATABASE_URL", &url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (first, second) = (start("f1-stock"), start("f2-orders"));
    for (child, feature) in [(first, "f1-stock"), (second, "f2-orders")] {
        let o = child.wait_with_output().expect("wait");
        assert_exit(&o, 0, &format!("the process driving {feature}"));
        says(&o, &format!("{feature}: done"));
    }
    assert_both_merged_and_nothing_left(&dir);
    let merges = git(&dir, &["log", "--merges", "--format=%s", "main"]);
    assert!(
        merges.contains("Merge feature f1-stock") || merges.contains("Merge feature f2-orders"),
        "the later lane merged with the earlier one's work: {merges}"
    );
}

/// Approves the design and deploy gates as ada, and leaves the promote gate to a person.
struct AllButPromote;

impl Approver for AllButPromote {
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async move {
            if request.gate == GateKind::Promote {
                return None;
            }
            ApproveAs { name: "ada".into() }.decide(request).await
        })
    }
}

/// A lane whose process died between its merge and its promotion (the base already holds its
/// branch, the parent database none of its migrations): a person's stop is refused, as for any
/// approved promotion, and the next run finishes the promotion without merging again.
#[test]
fn a_promotion_cut_off_after_its_merge_is_finished_by_the_next_run_never_stopped() {
    let (_tmp, dir) = shop(&orders());
    let ended = lanes_with(&dir, vec![("f1-stock", Arc::new(AllButPromote))]);
    let f1 = ended.iter().find(|r| r.feature == "f1-stock").expect("f1");
    assert!(
        matches!(&f1.outcome, Ok(r) if matches!(r.outcome, RunOutcome::AtGate { gate: GateKind::Promote, .. })),
        "f1 waits at its promote gate: {:?}",
        f1.outcome
    );
    let status = status_json(&dir);
    let lane = status["lanes"]
        .as_array()
        .expect("lanes")
        .iter()
        .find(|l| l["feature"] == "f1-stock")
        .expect("f1's lane");
    approve_lane_gate(&dir, lane);
    // The merge reached the base; the process died before the promotion.
    let branch = consort::git::branch_name("f1-stock");
    git(&dir, &["merge", "--ff-only", "-q", &branch]);
    let merged = git(&dir, &["rev-parse", "main"]);

    let o = run(consort_in("stop", &dir).args(["--by", "ada", "--feature", "f1-stock"]));
    assert_exit_saying(&o, 1, "a stop is refused", "`consort run` finishes it");
    // Another person's decision in that moment is recorded and changes nothing pending.
    let o = run(consort()
        .args(["test", "quarantine", "tests.test_other::test_flaky"])
        .args(["--by", "ada", "--reason", "flaky on this machine"])
        .args(["--feature", "f1-stock"])
        .args(dir_arg(&dir)));
    assert_exit(&o, 0, "a quarantine in the promotion's gap is recorded");

    let o = run(approving_run(&dir).args(["--parallel", "1", "--feature", "f1-stock"]));
    assert_exit(&o, 0, "the next run finishes the promotion");
    says(&o, "f1-stock: done");
    assert_eq!(git(&dir, &["rev-parse", "main"]), merged, "no second merge");
    let ledger = std::fs::read_to_string(dir.join(".consort/features/f1-stock/ledger.jsonl"))
        .expect("ledger");
    assert!(ledger.contains("\"promoted\""), "the promotion is recorded");
    let after = &ledger[ledger.find("\"quarantined\"").expect("the quarantine")..];
    assert!(
        after.contains("\"promoted\"") && !after.contains("\"verify-completed\""),
        "after the quarantine, the promotion and no run: {after}"
    );
    let o =
        run(consort_in("exec", &dir).args(["--", "psql", "-tAc", "SELECT count(*) FROM stock"]));
    assert_exit(&o, 0, "f1's table is in the parent database");
}

/// Approves every gate as ada; at the promote gate it first raises `at_promote`, then waits
/// (five minutes at most) until `ready` holds.
struct PromoteWhen {
    at_promote: Arc<AtomicBool>,
    ready: Box<dyn Fn() -> bool + Send + Sync>,
}

impl Approver for PromoteWhen {
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async move {
            if request.gate == GateKind::Promote {
                self.at_promote.store(true, Ordering::SeqCst);
                let start = std::time::Instant::now();
                while !(self.ready)() && start.elapsed() < std::time::Duration::from_secs(300) {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
            let ada = ApproveAs { name: "ada".into() };
            ada.decide(request).await
        })
    }
}

#[test]
fn the_merge_check_refuses_a_lane_whose_migration_takes_a_merged_features_version() {
    // Orders, designed while f1 was, picks f1's version for its own table.
    let mut plan = orders();
    plan.migration.0 = "0001_stock";
    let (_tmp, dir) = shop(&plan);
    // Both lanes build to their promote gates; f1 promotes first, then orders, which meets
    // f1's version at its merge check (not in a test run: no verification ran after f1's).
    let orders_waits = Arc::new(AtomicBool::new(false));
    let f1_ledger = dir.join(".consort/features/f1-stock/ledger.jsonl");
    let waits = Arc::clone(&orders_waits);
    let f1: Arc<dyn Approver> = Arc::new(PromoteWhen {
        at_promote: Arc::new(AtomicBool::new(false)),
        ready: Box::new(move || waits.load(Ordering::SeqCst)),
    });
    let orders: Arc<dyn Approver> = Arc::new(PromoteWhen {
        at_promote: orders_waits,
        ready: Box::new(move || {
            std::fs::read_to_string(&f1_ledger).is_ok_and(|l| l.contains("\"promoted\""))
        }),
    });
    let ended = lanes_with(&dir, vec![("f1-stock", f1), ("f2-orders", orders)]);
    let f1_lane = ended
        .iter()
        .find(|r| r.feature == "f1-stock")
        .expect("f1's lane");
    assert!(
        matches!(&f1_lane.outcome, Ok(r) if r.outcome == RunOutcome::Done),
        "f1 is done"
    );
    let status = status_json(&dir);
    let lane = &status["lanes"][0];
    assert_eq!(lane["feature"], "f2-orders", "{status:#}");
    assert_halted(
        &lane["halted"],
        "integration",
        "merge-refused",
        "its migration 0001_stock has the version of feature f1-stock's migration 0001_stock",
    );
    // Nothing of the lane reached the base.
    assert!(!dir.join("tests/f2_t1_orders.sql").exists());
}
