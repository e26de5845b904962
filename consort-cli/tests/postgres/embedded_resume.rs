//! The embedded cluster across ended runs (issue 16, items 8 and 9), through the `consort`
//! binary: a run killed (`SIGKILL` of the `consort` process alone, so its server survives, as
//! an outside kill leaves it) during the cluster's start-up or during a test run resumes at
//! once to done; a run ended by `SIGTERM` or `SIGINT` stops its server before it exits; and
//! `consort branches --sweep` removes the clusters placed outside projects that no longer
//! exist, and only those.
//!
//! The project is the reliability suite's small scripted one (`tests/fixtures/reliability/`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::common::{
    approving_run, assert_exit, consort, consort_in, dir_arg, run, run_to_done_and_verify,
};
use consort_testkit::process::{descendant_named, eventually, servers_of, text};
use consort_testkit::verify::assert_contains;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/reliability");

/// Writes the fixture project into `dir`.
fn project(dir: &Path) {
    std::fs::create_dir_all(dir.join(".consort/agents")).expect("mkdir");
    for d in [dir, &dir.join(".consort"), &dir.join(".consort/agents")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    for (from, to) in [
        ("consort.toml", "consort.toml"),
        ("feature.md", "feature.md"),
        ("script.toml", ".consort/agents/tally.toml"),
    ] {
        std::fs::copy(Path::new(FIXTURE).join(from), dir.join(to)).expect("copy the fixture");
    }
}

/// A fixture project in a fresh directory under /tmp the server user can reach (the cluster
/// lives in the project, at `.consort/pg`).
fn reachable_project(prefix: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = consort_testkit::cluster::tmp_dir(prefix, 0o755);
    let dir = tmp.path().join("p");
    project(&dir);
    (tmp, dir)
}

fn data_dir(project: &Path) -> PathBuf {
    project.join(".consort/pg/data")
}

/// `consort run --approve-as ada`, started and not waited for.
fn start_run(dir: &Path) -> Child {
    approving_run(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn consort run")
}

/// Waits until `reached` holds for the running `child` (panics if the run ends first).
fn wait_for(child: &mut Child, what: &str, mut reached: impl FnMut(u32) -> bool) {
    let pid = child.id();
    let mut ended = None;
    let got = eventually(300, || {
        if let Ok(Some(status)) = child.try_wait() {
            ended = Some(status);
            return true;
        }
        reached(pid)
    });
    assert!(got, "the run reaches {what}");
    assert!(ended.is_none(), "the run ended ({ended:?}) before {what}");
}

/// Runs `consort run --approve-as ada` to its end, which must be done.
fn resume_to_done(dir: &Path, after: &str) {
    run_to_done_and_verify(dir, &format!("the run resumed after {after} is done"));
}

/// [`resume_to_done`], then waits for no server to be left for the project's data directory.
fn resume_to_done_leaving_no_server(dir: &Path, after: &str) {
    resume_to_done(dir, after);
    assert!(
        eventually(30, || servers_of(&data_dir(dir)).is_empty()),
        "no server is left for the data directory"
    );
}

#[test]
fn a_run_killed_during_the_clusters_start_up_resumes_at_once() {
    let (_tmp, dir) = reachable_project("consort-kill-start-");
    let pid_file = data_dir(&dir).join("postmaster.pid");
    // Kill points, one run each, every run started right after the previous one was killed:
    // in the fresh project the first `postgres` below consort is initdb's; then the server's
    // lock file just written; then (the data made) the server just spawned.
    let spawned = |pid: u32| descendant_named(pid, "postgres").is_some();
    let locked = |_: u32| pid_file.exists();
    let points: [(&str, &dyn Fn(u32) -> bool); 3] = [
        ("initdb", &spawned),
        ("the server's lock file", &locked),
        ("the server's spawn", &spawned),
    ];
    for (what, reached) in points {
        let mut child = start_run(&dir);
        wait_for(&mut child, what, reached);
        child.kill().expect("SIGKILL consort");
        child.wait().expect("reap");
    }
    resume_to_done_leaving_no_server(&dir, "kills during the cluster's start-up");
}

#[test]
fn a_run_killed_during_a_test_run_resumes_at_once() {
    let (_tmp, dir) = reachable_project("consort-kill-test-");
    // Twice: the second kill hits a run that resumed at once after the first. Then once with
    // the watchdog killed too, so the server is left with no one to stop it: the resumed run
    // must stop and replace it, not attach to it (it would run on after the run's end).
    let mut killed = Vec::new();
    for with_watchdog in [false, false, true] {
        let mut child = start_run(&dir);
        wait_for(&mut child, "a test run", |pid| {
            descendant_named(pid, "psql").is_some()
        });
        killed.push(child.id());
        if with_watchdog {
            let watchdogs: Vec<u32> = consort::lakebase::procinfo::children_of(child.id())
                .into_iter()
                .filter(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("consort-pg-watchdog"))
                })
                .collect();
            assert_eq!(watchdogs.len(), 1, "the run's server has one watchdog");
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(watchdogs[0] as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("SIGKILL the watchdog");
        }
        // consort alone: its server (and, but for the last round, its watchdog) live on, as
        // after an outside kill.
        child.kill().expect("SIGKILL consort");
        child.wait().expect("reap");
    }
    resume_to_done_leaving_no_server(&dir, "kills during test runs");
    let left = scratch_of(&killed);
    assert!(
        left.is_empty(),
        "the killed runs' scratch directories are removed: {left:?}"
    );
}

/// The run scratch directories under the temporary directory whose owner record names one of
/// `pids`.
fn scratch_of(pids: &[u32]) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("consort-run-"))
        })
        .filter(|p| {
            std::fs::read_to_string(p.join("owner")).is_ok_and(|o| {
                o.split_whitespace()
                    .next()
                    .is_some_and(|pid| pids.iter().any(|k| k.to_string() == pid))
            })
        })
        .collect()
}

/// Sends `signal` to the run once `reached`, and checks it stopped its server before it exited.
fn interrupt_run(
    dir: &Path,
    signal: nix::sys::signal::Signal,
    what: &str,
    reached: impl FnMut(u32) -> bool,
) {
    let mut child = start_run(dir);
    wait_for(&mut child, what, reached);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal)
        .expect("signal consort");
    let out = child.wait_with_output().expect("wait");
    let code = match signal {
        nix::sys::signal::Signal::SIGINT => 130,
        _ => 143,
    };
    assert_eq!(out.status.code(), Some(code), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains(&format!("interrupted by {signal}:")) && said.contains("resumes it"),
        "one line for people: {said}"
    );
    assert!(!said.contains("panicked"), "{said}");
    // At once, no waiting: the server stopped before the process exited.
    let left = servers_of(&data_dir(dir));
    assert!(
        left.is_empty(),
        "after {signal} at {what}, no process of the data directory remains: {left:?}"
    );
}

#[test]
fn a_run_ended_by_sigterm_or_sigint_stops_its_cluster_and_resumes() {
    use nix::sys::signal::Signal;
    let (_tmp, dir) = reachable_project("consort-term-");
    interrupt_run(&dir, Signal::SIGTERM, "a test run", |pid| {
        descendant_named(pid, "psql").is_some()
    });
    let pid_file = data_dir(&dir).join("postmaster.pid");
    interrupt_run(&dir, Signal::SIGINT, "the cluster's start-up", |_| {
        pid_file.exists()
    });
    interrupt_run(&dir, Signal::SIGINT, "a test run", |pid| {
        descendant_named(pid, "psql").is_some()
    });
    resume_to_done(&dir, "SIGTERM and SIGINT");
    assert!(servers_of(&data_dir(&dir)).is_empty());
}

#[test]
fn branches_sweep_removes_the_clusters_of_deleted_projects_only() {
    if !nix::unistd::geteuid().is_root() {
        return; // only root places clusters outside their project
    }
    // Mode 0700: the `postgres` user cannot reach the projects below it, so their clusters
    // are placed in /tmp/consort-pg-<hash>.
    let tmp = consort_testkit::cluster::tmp_dir("consort-sweep-", 0o700);
    let (kept, gone) = (tmp.path().join("kept"), tmp.path().join("gone"));
    let placed = |p: &Path| consort::lakebase::fallback_dir(&p.join(".consort/pg"));
    for p in [&kept, &gone] {
        project(p);
        let o = run(&mut consort_in("branches", p));
        assert_exit(&o, 0, "branches starts the project's cluster");
        assert_contains(
            &text(&o),
            "branches are made in memory, in /dev/shm/consort-branches-",
        );
        assert!(placed(p).join("data/PG_VERSION").exists(), "placed outside");
    }
    // A directory without a record (made before Consort wrote one) is never removed.
    let bare = PathBuf::from(format!("/tmp/consort-pg-{:016x}", std::process::id()));
    std::fs::create_dir_all(bare.join("data")).expect("bare dir");
    std::fs::remove_dir_all(&gone).expect("delete a project");

    let o = run(&mut consort_in("doctor", &kept));
    assert!(
        text(&o).contains("belong to projects that no longer exist")
            || text(&o).contains("belongs to a project that no longer exists"),
        "doctor hints at the orphan: {}",
        text(&o)
    );
    let o = run(consort().args(["branches", "--sweep"]).args(dir_arg(&kept)));
    assert_exit(&o, 0, "branches --sweep");
    let said = text(&o);
    let removed = format!("removed {}", placed(&gone).display());
    assert!(said.contains(&removed) && said.contains(" MB"), "{said}");
    assert!(
        !placed(&gone).exists(),
        "the deleted project's cluster is gone"
    );
    assert!(
        placed(&kept).join("data/PG_VERSION").exists(),
        "the existing project's cluster is kept"
    );
    assert!(
        said.contains(&format!("kept {}", bare.display())) && said.contains("no readable record"),
        "a directory without a record is kept, and said so: {said}"
    );
    assert!(bare.exists());
    let o = run(&mut consort_in("doctor", &kept));
    assert!(!text(&o).contains("no longer exist"), "{}", text(&o));
    std::fs::remove_dir_all(&bare).expect("clean up");
    std::fs::remove_dir_all(placed(&kept)).expect("clean up");
}
