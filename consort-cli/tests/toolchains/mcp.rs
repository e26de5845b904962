//! `consort mcp` with the official MCP SDK for Python as the client: a small feature whose
//! Navigator and Driver are `backend = "mcp"` (the design roles scripted) runs to done on the
//! embedded PostgreSQL with the psql runner, while `tests/fixtures/mcp/play.py` plays both
//! roles over two stdio sessions ("nav" and "drv") and is refused the review of its own code.
//! A session that took RED ends and a new one of the same identity answers it; GREEN is
//! submitted while the run is killed, and the resumed run takes it.
//!
//! Needs `psql` and `python3` with the `mcp` package (`.ci/run` installs them).

use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::script::Design;
use crate::common::{consort, dir_arg, says, toolchain, write};
use consort::actors::{Event, Role};
use consort::project::Project;
use consort_testkit::process::text;

const CONFIG: &str = r#"[feature]
id = "f1-stock"
request = "feature.md"

[pool]
size = 1
max_concurrent = 1
keep_failed = false

[agents.default]
backend = "script"
path = ".consort/agents/design.toml"

[agents.roles.navigator]
backend = "mcp"

[agents.roles.driver]
backend = "mcp"
"#;

fn project(dir: &Path) {
    let design = Design {
        feature: "f1-stock",
        story: "Stock levels",
        migration: (
            "0001_stock",
            "CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);",
        ),
        test_path: "tests/t1_level.sql",
        test_name: None,
    }
    .toml();
    write(
        dir,
        &[
            ("consort.toml", CONFIG),
            (
                "feature.md",
                "# Stock levels\n\nShow the stock level of a SKU.\n",
            ),
            ("src/.keep", ""),
            (".consort/agents/design.toml", &design),
        ],
    );
}

/// The step record (`.mcp.json` transcript) of a produced event: step file name and who
/// submitted it.
fn submitted_by(dir: &Path, transcript: &str) -> String {
    let path = Project::open(dir)
        .expect("project")
        .transcript_dir()
        .join(transcript);
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the step's record")).expect("JSON");
    record["submitted_by"]
        .as_str()
        .expect("submitted_by")
        .to_string()
}

/// `consort run --approve-as tester` in the background, its output appended to `log`.
fn start_run(dir: &Path, log: &Path) -> std::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    consort()
        .arg("run")
        .args(dir_arg(dir))
        .args(["--approve-as", "tester"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("consort run starts")
}

/// The project in a fresh temporary directory (kept while the test runs), once the machine's
/// python3 has the MCP SDK.
fn mcp_project() -> (tempfile::TempDir, PathBuf) {
    toolchain::python3_imports("mcp", "python3 with the MCP SDK (pip install mcp)");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("shop");
    project(&dir);
    (tmp, dir)
}

#[test]
fn coding_clients_play_navigator_and_driver_to_done_across_restarts_and_never_review_their_own_code()
 {
    let (tmp, dir) = mcp_project();
    let doctor = common::in_dir(&["doctor"], &dir);
    says(&doctor, "navigator: played through `consort mcp`");

    let started = Instant::now();
    let signals = tmp.path().join("signals");
    std::fs::create_dir(&signals).expect("mkdir");
    let log_path = tmp.path().join("run.log");
    let run_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut run = start_run(&dir, &log_path);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/play.py");
    let mut client = Command::new("python3")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_consort"))
        .arg(&dir)
        .arg(&signals)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    // The client asks for the run to be killed while GREEN waits, and restarted.
    let (mut killed, mut restarted) = (false, false);
    while client.try_wait().expect("waitable").is_none() {
        if !killed && signals.join("kill").exists() {
            run.kill().expect("SIGKILL");
            let _ = run.wait();
            std::fs::write(signals.join("killed"), "").expect("signal");
            killed = true;
        }
        if killed && !restarted && signals.join("restart").exists() {
            run = start_run(&dir, &log_path);
            std::fs::write(signals.join("restarted"), "").expect("signal");
            restarted = true;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the client did not finish"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = client.wait_with_output().expect("the client's output");
    if !client.status.success() {
        let _ = run.kill();
        let _ = run.wait();
    }
    assert!(
        client.status.success(),
        "the client: {}\nthe run: {}",
        text(&client),
        run_log()
    );
    assert!(killed && restarted, "the run was killed and resumed");
    let status = loop {
        if let Some(s) = run.try_wait().expect("waitable") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the run did not end: {}",
            run_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "the run: {}", run_log());
    let said = text(&client);
    println!("{said}\nthe run:\n{}", run_log());
    assert!(said.contains("RED: accepted"), "{said}");
    assert!(
        run_log().contains("navigator, driver played by coding clients over MCP"),
        "the run says which steps wait for a client: {}",
        run_log()
    );

    // The ledger: every build step produced by the role actor of its role, each with the
    // record of the MCP identity that answered it.
    let project = Project::open(&dir).expect("project");
    let events = consort_testkit::ledger::events(&project.ledger_path());
    let mut seen = Vec::new();
    for e in &events {
        if let Event::Produced {
            author,
            transcript: Some(t),
            usage,
            ..
        } = e
        {
            let by = submitted_by(&dir, &t.path);
            assert_eq!(usage.model.as_deref(), Some(format!("mcp:{by}").as_str()));
            seen.push((t.path.clone(), author.role, by));
        }
    }
    let step = |prefix: &str| {
        seen.iter()
            .find(|(p, _, _)| p.starts_with(prefix))
            .map(|(_, role, by)| (*role, by.clone()))
            .unwrap_or_else(|| panic!("no {prefix} step in {seen:?}"))
    };
    assert_eq!(step("red"), (Role::Navigator, "nav".to_string()));
    assert_eq!(step("green"), (Role::Driver, "drv".to_string()));
    assert_eq!(step("refactor"), (Role::Driver, "drv".to_string()));
    assert_eq!(step("review"), (Role::Navigator, "nav".to_string()));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Gate { approval } if approval.approver == "tester"))
    );
    let code = std::fs::read_to_string(dir.join("src/level.sql")).expect("the code");
    assert!(code.contains("stock_level"), "{code}");
}

#[test]
fn with_mcp_approve_configured_a_client_approves_the_gate_as_consort_approve_does() {
    let (_tmp, dir) = mcp_project();
    let config = dir.join("consort.toml");
    let text_of = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{text_of}\n[mcp]\napprove = true\n")).expect("config");
    let o = common::in_dir(&["run"], &dir);
    common::assert_exit(&o, 3, "the run waits at the design gate");

    let client = common::run(&mut mcp_client("approve.py", &dir));
    assert!(client.status.success(), "the client: {}", text(&client));
    println!("{}", text(&client));
    let events =
        consort_testkit::ledger::events(&Project::open(&dir).expect("project").ledger_path());
    let approval = events
        .iter()
        .find_map(|e| match e {
            Event::Gate { approval } => Some(approval),
            _ => None,
        })
        .expect("the approval is in the ledger");
    assert_eq!(approval.approver, "ada");
    assert_eq!(approval.note, "via MCP");
    assert_eq!(approval.decision, consort::actors::GateDecision::Approve);
}

/// Three features of one project in lanes (`consort run --parallel 2`), their Navigator and
/// Driver played through one `consort mcp` server per identity, without `--feature`: each
/// session takes whatever waits for its role in any lane and submits it with its feature.
/// Two lanes reach done; the third's base does not build, and the submission of its RED is
/// answered with the halt, not "the run goes on".
#[test]
fn one_mcp_server_per_identity_plays_every_lane_and_a_halt_is_answered_at_once() {
    toolchain::python3_imports("mcp", "python3 with the MCP SDK (pip install mcp)");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("shop");
    let design = |feature: &str, story: &str, migration: (&str, &str), test_path: &str| {
        Design {
            feature,
            story,
            migration,
            test_path,
            test_name: None,
        }
        .toml()
    };
    let config = CONFIG.replace(
        ".consort/agents/design.toml",
        ".consort/agents/{feature}.toml",
    );
    write(
        &dir,
        &[
            ("consort.toml", &config),
            (
                "feature.md",
                "# Stock levels\n\nShow the stock level of a SKU.\n",
            ),
            ("src/.keep", ""),
            (
                ".consort/agents/f1-stock.toml",
                &design(
                    "f1-stock",
                    "Stock levels",
                    (
                        "0001_stock",
                        "CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);",
                    ),
                    "tests/t1_level.sql",
                ),
            ),
            (
                ".consort/agents/f2-orders.toml",
                &design(
                    "f2-orders",
                    "Orders",
                    (
                        "0002_orders",
                        "CREATE TABLE orders (id int PRIMARY KEY, sku text NOT NULL);",
                    ),
                    "tests/t1_orders.sql",
                ),
            ),
            (
                ".consort/agents/f3-broken.toml",
                &design(
                    "f3-broken",
                    "Broken",
                    ("0003_broken", "ALTER TABLE nowhere ADD COLUMN x int;"),
                    "tests/t1_broken.sql",
                ),
            ),
        ],
    );
    consort::git::GitRepo::init_with_commit(&dir, "Test Author", "before Consort").expect("git");
    for (id, title) in [("f2-orders", "Orders"), ("f3-broken", "Broken")] {
        let request = tmp.path().join(format!("{id}.md"));
        std::fs::write(&request, format!("# {title}\n\nThe {id} feature.\n")).expect("request");
        let o = common::run(&mut common::feature_add(&request, id, &dir));
        common::assert_exit(&o, 0, "the feature joins the backlog");
    }

    let log_path = tmp.path().join("run.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut run = consort()
        .arg("run")
        .args(dir_arg(&dir))
        .args(["--approve-as", "tester", "--parallel", "2"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("consort run starts");
    let client = common::run(&mut mcp_client("lanes.py", &dir));
    let run_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    if !client.status.success() {
        let _ = run.kill();
    }
    let status = run.wait().expect("the run ends");
    assert!(
        client.status.success(),
        "the client: {}\nthe run: {}",
        text(&client),
        run_log()
    );
    println!("{}\nthe run:\n{}", text(&client), run_log());
    assert_eq!(
        status.code(),
        Some(4),
        "the worst lane halted: {}",
        run_log()
    );
    let o = common::in_dir(&["status", "--json"], &dir);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    let phases: Vec<(String, String)> = report["features"]
        .as_array()
        .expect("features")
        .iter()
        .map(|f| {
            (
                f["id"].as_str().expect("id").to_string(),
                f["state"].as_str().expect("state").to_string(),
            )
        })
        .collect();
    assert_eq!(
        phases,
        [
            ("f1-stock".to_string(), "done".to_string()),
            ("f2-orders".to_string(), "done".to_string()),
            ("f3-broken".to_string(), "halted".to_string()),
        ],
        "{report:#}"
    );
}

/// The MCP client fixture `script` (in `tests/fixtures/mcp`), run with python3 against the
/// `consort` under test on the project in `dir`.
fn mcp_client(script: &str, dir: &Path) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mcp")
            .join(script),
    )
    .arg(env!("CARGO_BIN_EXE_consort"))
    .arg(dir);
    cmd
}
