//! Lanes on real stacks, as a user adopts a project of their own and drives two features at
//! once with `consort run --parallel 2`: vitest 1 with `node_modules` installed in the
//! project's tree only, and pytest with a `.venv` in it, each lane a whole workspace (the
//! project's dependencies linked in, a package installed after the project's first commit
//! included), the lanes outside the project's tree (its own runner, run in its tree while the
//! lanes stand, collects none of their files), doctor trying the command in a lane, and both
//! features to done with `consort verify` passing. No hand step.

use std::path::{Path, PathBuf};

use super::adopt::{node_files, pytest_project, script_of};
use crate::common::script::{Design, REFACTOR_AND_REVIEW, change_entry, write_change};
use crate::common::{
    approve_lane_gate, approving_run, assert_exit, consort, consort_in, doctor, feature_add, run,
    status_json, toolchain, write,
};
use consort_testkit::process::text;

/// The second feature's request.
const F2_REQUEST: &str = "# Prices\n\nShow each price in euros.\n";

/// Adopts the project in `dir` as its user would: `consort init`, one script per feature
/// (`.consort/agents/{feature}.toml`: `scripts` for F1 and F2), F2 added to the backlog, a
/// git repository that ignores `ignored`; doctor must pass, in the project and in a lane.
/// Returns doctor's output.
fn adopt_two(dir: &Path, scripts: [&str; 2], ignored: &str) -> String {
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init adopts the repository");
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("consort.toml");
    let config = config.replace(
        "path = \".consort/agents/script.toml\"",
        "path = \".consort/agents/{feature}.toml\"",
    );
    assert!(config.contains("{feature}.toml"), "{config}");
    write(
        dir,
        &[
            ("consort.toml", &config),
            (".consort/agents/F1.toml", scripts[0]),
            (".consort/agents/F2.toml", scripts[1]),
            ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
            (".gitignore", ignored),
        ],
    );
    let request = dir.with_file_name("f2.md");
    std::fs::write(&request, F2_REQUEST).expect("the second request");
    let o = run(&mut feature_add(&request, "F2", dir));
    assert_exit(&o, 0, "the second feature joins the backlog");
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let o = doctor(dir).0;
    assert_exit(&o, 0, "doctor passes");
    text(&o)
}

/// Where the lanes of the project in `dir` live: beside it.
fn lanes_of(dir: &Path) -> PathBuf {
    let name = dir.file_name().expect("a name").to_string_lossy();
    dir.with_file_name(format!("{name}.consort-lanes"))
}

/// Approves the design of every lane waiting at its design gate, as a person does from the
/// command line; returns how many.
fn approve_waiting_designs(dir: &Path) -> usize {
    let status = status_json(dir);
    let lanes = status["lanes"].as_array().expect("lanes");
    for lane in lanes {
        assert_eq!(lane["pending_gate"]["gate"], "design", "{lane:#}");
        approve_lane_gate(dir, lane);
    }
    lanes.len()
}

/// Both features in lanes at once: first to their design gates (both lanes stand, and
/// `while_lanes_stand` runs then), then approved and on to done; `consort verify` passes and
/// no lane is left.
fn two_lanes_to_done(dir: &Path, while_lanes_stand: impl FnOnce()) {
    let o = run(consort_in("run", dir).args(["--parallel", "2"]));
    assert_exit(&o, 3, "both lanes wait at their design gates");
    assert!(lanes_of(dir).join("F1").is_dir() && lanes_of(dir).join("F2").is_dir());
    assert!(!dir.join(".consort/lanes").exists(), "no lane in the tree");
    while_lanes_stand();
    assert_eq!(approve_waiting_designs(dir), 2);
    let o = run(approving_run(dir).args(["--parallel", "2"]));
    assert_exit(&o, 0, "both lanes run to done");
    let out = text(&o);
    assert!(
        out.contains("F1: done") && out.contains("F2: done"),
        "{out}"
    );
    assert_exit(&run(&mut consort_in("verify", dir)), 0, "verify passes");
    assert!(!lanes_of(dir).exists(), "no lane is left");
}

/// A package installed in the project after its first commit, as `npm install` leaves it.
fn install_money_package(dir: &Path) {
    write(
        dir,
        &[
            (
                "node_modules/shelf-money/package.json",
                r#"{"name":"shelf-money","version":"1.0.0","type":"module","main":"index.js","exports":"./index.js"}"#,
            ),
            (
                "node_modules/shelf-money/index.js",
                "export function euros(cents) {\n  return (cents / 100).toFixed(2);\n}\n",
            ),
        ],
    );
}

/// F2 of the Node project: a price in euros through the `shelf-money` package, in a module
/// the feature creates (its first test imports it statically, as people write it: a RED),
/// its table of its own.
fn money_script() -> String {
    let test_path = "test/t2_price.test.js";
    let name = "a price reads in euros";
    script_of(
        &Design {
            feature: "F2",
            story: "Prices",
            migration: (
                "0003_prices",
                "CREATE TABLE prices (sku text PRIMARY KEY, cents int NOT NULL);",
            ),
            test_path,
            test_name: Some(&format!("{test_path}::{name}")),
        },
        // The pause makes F2 the second to merge, as a rule: its promotion then carries the
        // project's existing migration, on the table F1's merged migration changed, which is
        // no clash (the project's migrations are every lane's).
        &format!(
            "import {{ test, expect }} from 'vitest';\nimport {{ price }} from '../src/money.js';\n\ntest('{name}', async () => {{\n  await new Promise((r) => setTimeout(r, 2000));\n  expect(price(1234)).toBe('12.34 EUR');\n}});\n"
        ),
        (
            "src/money.js",
            "import { euros } from 'shelf-money';\n\nexport function price(cents) {\n  return `${euros(cents)} EUR`;\n}\n",
        ),
    )
}

/// How many tests the project's own vitest finds when run in its tree.
fn vitest_counts(dir: &Path) -> u64 {
    let o = run(std::process::Command::new("npx")
        .args(["vitest", "run", "--reporter=json"])
        .env("CI", "true")
        .current_dir(dir));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("vitest's JSON report: {e}: {}", text(&o)));
    report["numTotalTests"].as_u64().expect("numTotalTests")
}

#[test]
fn vitest_1_lanes_run_two_features_at_once_with_node_modules_only_in_the_project() {
    let (modules, tmp) = vitest1();
    let dir = &tmp.path().join("shelf");
    let f1 = node_files(dir, "vitest", &modules, true);
    // A person adds a dependency the second feature needs; the lanes are made after.
    install_money_package(dir);
    let package = std::fs::read_to_string(dir.join("package.json")).expect("package.json");
    write(
        dir,
        &[(
            "package.json",
            &package.replace(r#""pg":"^8""#, r#""pg":"^8","shelf-money":"1.0.0""#),
        )],
    );
    let doctor = adopt_two(dir, [&f1, &money_script()], "node_modules/\n");
    assert!(doctor.contains("in a lane: `npx vitest run"), "{doctor}");
    assert!(doctor.contains("collects 1 test ("), "{doctor}");
    two_lanes_to_done(dir, || {
        assert_eq!(
            vitest_counts(dir),
            1,
            "the project's own vitest collects its one test and no lane's copy"
        );
    });
    assert!(
        dir.join("test/t2_price.test.js").is_file() && dir.join("test/t1_total.test.js").is_file()
    );
}

#[test]
fn pytest_lanes_run_two_features_at_once_with_a_venv_in_the_project() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = &tmp.path().join("service");
    let f1 = pytest_project(dir);
    toolchain::venv_at(
        &dir.join(".venv"),
        &["pytest==8.*", "psycopg[binary]"],
        "pytest, psycopg",
    );
    let doctor = adopt_two(dir, [&f1, &labels_script()], ".venv/\n__pycache__/\n");
    // Init made the test command run the project's own environment, by a path in its tree.
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("consort.toml");
    assert!(
        config.contains("command = \".venv/bin/python -m pytest"),
        "{config}"
    );
    assert!(
        doctor.contains("in a lane: `.venv/bin/python -m pytest"),
        "{doctor}"
    );
    two_lanes_to_done(dir, || {});
    assert!(dir.join("tests/test_t2_label.py").is_file());
    // The first two REDs were refused as not run (a syntax error, a missing package), the
    // third, whose module the feature creates, accepted.
    let f2 = consort::project::Project::open_feature(dir, Some("F2")).expect("F2");
    let refused: Vec<String> = f2
        .events()
        .expect("events")
        .iter()
        .filter_map(|e| match e {
            consort::actors::Event::Refused { violation, .. } => Some(violation.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2, "{refused:#?}");
    for told in &refused {
        assert!(
            told.contains(
                "the run did not report the new test tests.test_t2_label::test_a_label_is_upper_case"
            ),
            "{told}"
        );
    }
}

/// F2 of the Python project: labels, in a module the feature creates. Its Navigator writes
/// the first test three times: with a syntax error, importing a package that is not
/// installed (both refused: the test never ran for what it is about), then importing the
/// new module at the top of the file, as people write it (a RED).
fn labels_script() -> String {
    let test_path = "tests/test_t2_label.py";
    let test = |head: &str| {
        format!("{head}\n\n\ndef test_a_label_is_upper_case():\n    assert label('a1') == 'A1'\n")
    };
    let mut s = Design {
        feature: "F2",
        story: "Labels",
        migration: (
            "V3__labels",
            "CREATE TABLE labels (sku text PRIMARY KEY, label text NOT NULL);",
        ),
        test_path,
        test_name: Some("tests.test_t2_label::test_a_label_is_upper_case"),
    }
    .toml();
    for head in [
        "from app.labels import label\nif True\n    pass",
        "from labelkit import label",
        "from app.labels import label",
    ] {
        s.push_str(&change_entry(
            "red/T1",
            "T1: labels",
            &write_change(test_path, &test(head)),
        ));
    }
    s.push_str(&change_entry(
        "green/T1",
        "labels",
        &write_change("app/labels.py", "def label(sku):\n    return sku.upper()\n"),
    ));
    s.push_str(REFACTOR_AND_REVIEW);
    s
}

/// A lane whose test tool is not installed (the project installed nothing) halts at its first
/// run within seconds, the tool named, and the run is not retried: no registry is asked from
/// inside the confinement.
#[test]
fn lanes_whose_test_tool_is_not_installed_halt_at_once_naming_it() {
    let (modules, tmp) = vitest1();
    let dir = &tmp.path().join("shelf");
    let f1 = node_files(dir, "vitest", &modules, true);
    std::fs::remove_dir_all(dir.join("node_modules")).expect("nothing installed");
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init");
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("consort.toml");
    write(
        dir,
        &[
            (
                "consort.toml",
                &config.replace(
                    ".consort/agents/script.toml",
                    ".consort/agents/{feature}.toml",
                ),
            ),
            (".consort/agents/F1.toml", &f1),
            ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
        ],
    );
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let started = std::time::Instant::now();
    let o = run(approving_run(dir).args(["--parallel", "2"]));
    let took = started.elapsed();
    assert_exit(&o, 4, "the lane halts");
    let out = text(&o);
    assert!(
        out.contains("could not run vitest: it is not installed in this workspace"),
        "{out}"
    );
    println!("halted after {:.1} s", took.as_secs_f64());
    let f1 = consort::project::Project::open_feature(dir, Some("F1")).expect("F1");
    let failed = f1
        .events()
        .expect("events")
        .iter()
        .filter(|e| matches!(e, consort::actors::Event::VerifyFailed { .. }))
        .count();
    assert_eq!(failed, 1, "one failed run, not retried");
}

/// An editable install of the project in its `.venv` points into the project's tree, which
/// every lane links in: doctor says so, with the fix.
#[test]
fn doctor_notes_an_editable_install_of_the_project() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = &tmp.path().join("service");
    pytest_project(dir);
    let site = dir.join(".venv/lib/python3.12/site-packages");
    let src = dir.canonicalize().expect("canonical").join("app");
    write(
        &site,
        &[(
            "__editable__.service-1.0.pth",
            &format!("{}\n", src.display()),
        )],
    );
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init");
    let said = doctor(dir).1;
    assert!(
        said.contains("the .venv holds an editable install that points into the project's tree (.venv/lib/python3.12/site-packages/__editable__.service-1.0.pth)"),
        "{said}"
    );
    assert!(said.contains("pythonpath = [\"src\"]"), "{said}");
}

/// vitest 1 and pg 8 installed once for these tests, and a fresh directory for a project.
fn vitest1() -> (std::path::PathBuf, tempfile::TempDir) {
    let modules = toolchain::npm("vitest1", &["vitest@1", "pg@8"], "vitest");
    (modules, tempfile::tempdir().expect("tempdir"))
}
