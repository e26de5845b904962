//! A run in a git repository, with the real `git` program and the `consort` binary on the
//! embedded PostgreSQL: its own branch, one commit per approved design and per accepted RED,
//! GREEN and REFACTOR with their trailers, nothing lost or repeated across a kill, and a dirty
//! tree refused.

use std::path::Path;
use std::process::Command;

use crate::common::{
    approving_run, assert_exit, consort, dir_arg, init_stockflow, run, run_and_kill_after, says,
};
use consort::actors::{CommitKind, Event, Machine, step_commits};
use consort::git::GitRepo;
use consort_testkit::process::text;

const BRANCH: &str = "consort/F1-warehouse-stock";

fn git(dir: &Path, args: &[&str]) -> String {
    let o = run(Command::new("git").arg("-C").arg(dir).args(args));
    assert!(o.status.success(), "git {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A StockFlow project that is a git repository with one commit on `main`.
fn stockflow_repo(dir: &Path) {
    init_stockflow(dir);
    GitRepo::init_with_commit(dir, "Test Author", "the project").expect("git init");
}

/// One commit on the run's branch: subject, author, trailers, files.
struct Commit {
    subject: String,
    author: String,
    trailers: Vec<(String, String)>,
    files: Vec<String>,
}

impl Commit {
    fn trailer(&self, key: &str) -> Option<&str> {
        self.trailers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The run's commits, oldest first.
fn run_commits(dir: &Path) -> Vec<Commit> {
    let shas = git(dir, &["rev-list", "--reverse", &format!("main..{BRANCH}")]);
    shas.lines()
        .map(|sha| {
            let show = |format: &str| git(dir, &["show", "-s", &format!("--format={format}"), sha]);
            let trailers = show("%(trailers:only=true,unfold=true)")
                .lines()
                .filter_map(|l| l.split_once(": "))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let files = git(dir, &["show", "--format=", "--name-only", sha])
                .lines()
                .map(str::to_string)
                .collect();
            Commit {
                subject: show("%s").trim().to_string(),
                author: show("%an <%ae>").trim().to_string(),
                trailers,
                files,
            }
        })
        .collect()
}

fn ledger_events(dir: &Path) -> Vec<Event> {
    consort_testkit::ledger::events(
        &consort::project::Project::open(dir)
            .expect("project")
            .ledger_path(),
    )
}

#[test]
fn every_verified_step_is_one_commit_with_its_trailers_across_a_kill_and_resume() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    stockflow_repo(dir);
    run_and_kill_after(dir, 7);
    let before = run_commits(dir).len();
    assert!(before >= 1, "commits are made while the run goes");
    let o = run(&mut approving_run(dir));
    assert_exit(&o, 0, "resumes to the end");
    says(&o, &format!("on branch {BRANCH}"));

    assert_eq!(
        git(dir, &["symbolic-ref", "--short", "HEAD"]).trim(),
        BRANCH
    );
    let commits = run_commits(dir);
    let events = ledger_events(dir);
    let machine = Machine::new(
        consort::project::Project::open(dir)
            .expect("project")
            .machine()
            .expect("machine")
            .config()
            .clone(),
    );
    let planned = step_commits(&machine, &events);
    assert_eq!(
        commits.len(),
        planned.len(),
        "one commit per accepted step, none repeated"
    );
    let design = commits[0]
        .trailer("Consort-Design")
        .expect("design")
        .to_string();
    for (c, p) in commits.iter().zip(&planned) {
        assert_eq!(c.trailer("Consort-Feature"), Some("F1-warehouse-stock"));
        assert_eq!(
            c.trailer("Consort-Step"),
            Some(p.step.as_str()),
            "{}",
            c.subject
        );
        assert_eq!(c.trailer("Consort-Design"), Some(design.as_str()));
        assert!(c.subject.starts_with(p.kind.label()), "{}", c.subject);
        match p.kind {
            CommitKind::Design => {
                assert_eq!(c.author, "Consort DBA <dba@consort.invalid>");
                assert!(
                    c.files.iter().all(|f| f.starts_with("migrations/")),
                    "{:?}",
                    c.files
                );
                assert!(!c.files.is_empty());
            }
            kind => {
                let receipt = p.receipt.as_ref().expect("receipt");
                assert_eq!(c.trailer("Consort-Receipt"), Some(p.key().as_str()));
                assert_eq!(
                    c.trailer("Consort-Branch"),
                    Some(receipt.branch_id.as_str())
                );
                let (who, tests_only) = match kind {
                    CommitKind::Red => ("Consort Navigator <navigator@consort.invalid>", true),
                    _ => ("Consort Driver <driver@consort.invalid>", false),
                };
                assert_eq!(c.author, who, "{}", c.subject);
                assert_eq!(
                    c.files.iter().all(|f| f.starts_with("tests/")),
                    tests_only,
                    "{}: {:?}",
                    c.subject,
                    c.files
                );
            }
        }
    }
    let keys: std::collections::BTreeSet<_> = commits
        .iter()
        .filter_map(|c| c.trailer("Consort-Receipt"))
        .collect();
    assert_eq!(
        keys.len(),
        commits.len() - 1,
        "every receipt is committed once"
    );
    // Read from git alone: each of StockFlow's ten tests has exactly one RED and one GREEN.
    for t in 1..=10 {
        for kind in ["RED", "GREEN"] {
            let prefix = format!("{kind} T{t}: ");
            let n = commits
                .iter()
                .filter(|c| c.subject.starts_with(&prefix))
                .count();
            assert_eq!(n, 1, "{prefix}");
        }
    }
    let status = run(consort().args(["status", "--json"]).args(dir_arg(dir)));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(status["git"]["branch"], BRANCH);
    assert_eq!(
        status["git"]["head"].as_str(),
        Some(git(dir, &["rev-parse", BRANCH]).trim())
    );
    // Ready to merge: the branch's tip is the tree on disk, nothing left uncommitted.
    assert_eq!(git(dir, &["status", "--porcelain"]), "", "a clean tree");
}

#[test]
fn a_dirty_tree_is_refused_unless_allowed_and_a_resumed_run_stays_on_its_branch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    stockflow_repo(dir);
    std::fs::write(dir.join("feature.md"), "# edited but not committed\n").expect("edit");
    // Caches are never Consort's to commit: they do not make the tree dirty.
    std::fs::create_dir_all(dir.join("target/debug")).expect("cache");
    std::fs::write(dir.join("target/debug/out"), "x").expect("cache file");
    std::fs::create_dir_all(dir.join("tests/__pycache__")).expect("cache");
    std::fs::write(dir.join("tests/__pycache__/t.pyc"), "x").expect("cache file");
    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_exit(&o, 1, "a dirty tree is refused");
    assert!(
        text(&o).contains("uncommitted changes (feature.md)") && text(&o).contains("--allow-dirty"),
        "{}",
        text(&o)
    );
    assert!(
        !consort::project::Project::open(dir)
            .expect("project")
            .ledger_path()
            .exists(),
        "nothing started"
    );
    assert_eq!(
        git(dir, &["symbolic-ref", "--short", "HEAD"]).trim(),
        "main"
    );

    let o = run(consort().arg("run").arg("--allow-dirty").args(dir_arg(dir)));
    assert_exit(
        &o,
        3,
        "with --allow-dirty the run starts and stops at the design gate",
    );
    assert_eq!(
        git(dir, &["symbolic-ref", "--short", "HEAD"]).trim(),
        BRANCH
    );
    assert_eq!(
        git(dir, &["status", "--porcelain"]),
        " M feature.md\n?? migrations/\n?? target/\n?? tests/\n",
        "the user's change stays theirs; the design's migrations wait for approval, uncommitted"
    );

    git(dir, &["stash", "-q"]);
    git(dir, &["switch", "-q", "main"]);
    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_exit(&o, 1, "a resumed run off its branch is refused");
    says(&o, &format!("git switch {BRANCH}"));

    let other = tempfile::tempdir().expect("tempdir");
    stockflow_repo(other.path());
    git(other.path(), &["branch", BRANCH]);
    let o = run(consort().arg("run").args(dir_arg(other.path())));
    assert_exit(&o, 1, "a new run does not take over an existing branch");
    says(&o, "exists already");
}
