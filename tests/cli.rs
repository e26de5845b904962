//! The `consort` command and the StockFlow example, end to end, in temporary directories, on
//! the embedded PostgreSQL.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn consort() -> Command {
    Command::new(env!("CARGO_BIN_EXE_consort"))
}

fn example() -> PathBuf {
    // Integration tests live in target/<profile>/deps; examples in target/<profile>/examples.
    let exe = std::env::current_exe().expect("test exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    profile_dir.join("examples").join("stockflow")
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .expect("the command starts")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn dir_arg(dir: &Path) -> [&std::ffi::OsStr; 2] {
    ["--dir".as_ref(), dir.as_os_str()]
}

fn status_json(dir: &Path) -> serde_json::Value {
    let o = run(consort().arg("status").args(dir_arg(dir)).arg("--json"));
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("status is JSON")
}

fn pending_gate(dir: &Path) -> (String, String) {
    let s = status_json(dir);
    let g = &s["pending_gate"];
    (
        g["gate"].as_str().expect("gate").to_string(),
        g["hash"].as_str().expect("hash").to_string(),
    )
}

fn approve(dir: &Path, gate: &str, hash: &str) -> Output {
    run(consort()
        .args(["approve", gate, "--hash", hash, "--by", "ada"])
        .args(dir_arg(dir)))
}

fn branches_left(dir: &Path) -> usize {
    let o = run(consort().arg("branches").args(dir_arg(dir)));
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines().filter(|l| l.starts_with("consort-")).count()
}

#[test]
fn init_run_gate_approve_resume_done_verify() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let o = run(consort()
        .arg("init")
        .arg(dir)
        .args(["--example", "stockflow"]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(dir.join("consort.toml").exists() && dir.join("feature.md").exists());
    let again = run(consort().arg("init").arg(dir));
    assert_eq!(
        again.status.code(),
        Some(1),
        "init refuses to overwrite: {}",
        text(&again)
    );

    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_eq!(
        o.status.code(),
        Some(3),
        "stops at the design gate: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("consort approve design --hash"),
        "{}",
        text(&o)
    );
    let (gate, hash) = pending_gate(dir);
    assert_eq!(gate, "design");

    let wrong = "0".repeat(64);
    let o = approve(dir, "design", &wrong);
    assert_ne!(o.status.code(), Some(0), "a wrong hash is refused");
    assert!(
        text(&o).contains(&hash),
        "the refusal names the hash that waits: {}",
        text(&o)
    );
    let o = approve(dir, "deploy", &hash);
    assert_ne!(
        o.status.code(),
        Some(0),
        "another gate is refused: {}",
        text(&o)
    );
    let o = approve(dir, "design", &hash);
    assert!(o.status.success(), "{}", text(&o));

    // Through the build lane to the deploy gate, then the promote gate, then done.
    let mut outcome = None;
    for _ in 0..3 {
        let o = run(consort().arg("run").args(dir_arg(dir)));
        match o.status.code() {
            Some(0) => {
                outcome = Some(0);
                break;
            }
            Some(3) => {
                let (gate, hash) = pending_gate(dir);
                assert!(gate == "deploy" || gate == "promote", "{gate}");
                assert!(approve(dir, &gate, &hash).status.success());
            }
            other => panic!("unexpected exit {other:?}: {}", text(&o)),
        }
    }
    assert_eq!(outcome, Some(0), "the run finishes");
    assert_eq!(status_json(dir)["phase"], "done");
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "verify passes: {}", text(&o));
    let o = run(consort().arg("log").args(dir_arg(dir)));
    assert!(text(&o).contains("verify-completed"), "{}", text(&o));
    assert_eq!(branches_left(dir), 0);
}

#[test]
fn a_run_killed_during_the_build_lane_resumes_to_the_end() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    assert!(
        run(consort()
            .arg("init")
            .arg(dir)
            .args(["--example", "stockflow"]))
        .status
        .success()
    );
    let mut child = consort()
        .arg("run")
        .args(dir_arg(dir))
        .args(["--approve-as", "ada"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    // Wait until the build lane has recorded a few verified runs, then kill without warning.
    let ledger = dir.join(".consort/ledger.jsonl");
    let start = Instant::now();
    loop {
        let verified = std::fs::read_to_string(&ledger)
            .unwrap_or_default()
            .matches("\"verify-completed\"")
            .count();
        if verified >= 3 {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the run ended before it could be killed: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "the build lane never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert_ne!(status_json(dir)["phase"], "done");

    let o = run(consort()
        .arg("run")
        .args(dir_arg(dir))
        .args(["--approve-as", "ada"]));
    assert_eq!(o.status.code(), Some(0), "resumes to the end: {}", text(&o));
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "verify passes: {}", text(&o));
    assert_eq!(
        branches_left(dir),
        0,
        "no branch with Consort's prefix is left"
    );
}

#[test]
fn the_example_runs_to_the_end_with_approve_as_and_stops_without_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let done = tmp.path().join("done");
    let o = run(Command::new(example())
        .args(["--approve-as", "ada", "--dir"])
        .arg(&done));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("approving every gate as ada"), "{out}");
    assert!(
        out.contains("summary") && out.contains("branches:") && out.contains("ledger:"),
        "{out}"
    );
    let ledger = std::fs::read_to_string(done.join(".consort/ledger.jsonl")).expect("ledger");
    assert!(
        ledger.contains("\"approver\":\"ada\""),
        "the ledger records who approved"
    );
    let o = run(consort().arg("verify").args(dir_arg(&done)));
    assert!(o.status.success(), "{}", text(&o));

    let stopped = tmp.path().join("stopped");
    let o = run(Command::new(example()).arg("--dir").arg(&stopped));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("consort approve design --hash"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_configuration_is_a_usage_error_naming_the_key() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    assert!(run(consort().arg("init").arg(dir)).status.success());
    let cfg = std::fs::read_to_string(dir.join("consort.toml")).expect("read");
    std::fs::write(
        dir.join("consort.toml"),
        cfg.replace("max_repairs = 3", "max_repairz = 3"),
    )
    .expect("write");
    let o = run(consort().arg("status").args(dir_arg(dir)));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("max_repairz"), "{}", text(&o));
    let o = run(consort().arg("frobnicate"));
    assert_eq!(o.status.code(), Some(2));
}

/// `consort.toml` from `consort init` with its `[runner]` lines replaced.
fn with_runner(cfg: &str, runner: &str) -> String {
    cfg.lines()
        .filter(|l| !l.starts_with("setup = ") && !l.starts_with("tests = [\"tests/**/*.sql\"]"))
        .map(|l| {
            if l.starts_with("kind = \"psql\"") {
                runner.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_runner_configuration_is_harness_and_checked_against_the_test_paths() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    assert!(run(consort().arg("init").arg(dir)).status.success());
    let cfg = std::fs::read_to_string(dir.join("consort.toml")).expect("read");
    let write = |text: &str| std::fs::write(dir.join("consort.toml"), text).expect("write");

    // psql test globs the test paths do not cover: a configuration error naming both keys.
    write(&cfg.replace("tests = [\"tests/**/*.sql\"]", "tests = [\"**/*.sql\"]"));
    let o = run(consort().arg("status").args(dir_arg(dir)));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("`runner.tests`") && text(&o).contains("`paths.tests`"),
        "{}",
        text(&o)
    );

    // A runner script inside the test paths: refused, naming the command's key.
    write(&with_runner(
        &cfg,
        "kind = \"command\"\ncommand = \"./tests/run.sh\"",
    ));
    let o = run(consort().arg("status").args(dir_arg(dir)));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("`runner.command`") && text(&o).contains("tests/run.sh"),
        "{}",
        text(&o)
    );

    // A command runner: doctor lists what it protects.
    write(&with_runner(
        &cfg,
        "kind = \"command\"\ncommand = \"sh scripts/run-tests.sh && python -m pytest -q\"",
    ));
    let o = run(consort().arg("doctor").args(dir_arg(dir)));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("harness from [runner] (no agent may change these):"),
        "{out}"
    );
    assert!(
        out.contains("scripts/run-tests.sh (run by runner.command)"),
        "{out}"
    );
    assert!(
        out.contains("Python configuration, at any depth outside the test paths: pyproject.toml"),
        "{out}"
    );
}
