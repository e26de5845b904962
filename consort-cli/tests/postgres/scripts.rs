//! Scripted agents through the `consort` command, with real processes: the skeleton
//! `consort init` writes, what `consort doctor` says about scripts, and a human retry that
//! does not consume a scripted answer.

use consort::actors::{Artifact, Event, Role};
use consort_testkit::verify::assert_contains;

use crate::common::{assert_exit, consort, in_dir, init_stockflow, run, says, stockflow_tempdir};
use consort_testkit::process::text;
use std::path::Path;

const SKELETON: &str = ".consort/agents/script.toml";

#[test]
fn init_writes_a_skeleton_doctor_calls_not_ready_and_init_keeps_an_existing_script() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init");
    let skeleton = std::fs::read_to_string(dir.join(SKELETON)).expect("the skeleton");
    assert_eq!(skeleton, consort::agents::script_skeleton());
    assert_contains(&skeleton, "docs/ARTIFACTS.md");
    // Init says how to check it.
    says(&o, "consort doctor");

    let o = in_dir(&["doctor"], dir);
    assert_exit(&o, 1, "a fresh skeleton is not ready");
    let out = text(&o);
    let script = dir.join(SKELETON);
    assert!(
        out.contains(&format!(
            "ok    script {} parses: 6 entries",
            script.display()
        )),
        "{out}"
    );
    assert_contains(
        &out,
        "answers, in order: stories, spec/r0, architecture/r0, schema, test-list, ux",
    );
    assert!(
        out.contains(&format!(
            "FAIL  entry 1 for stories ({}:18) still holds the skeleton's placeholders: body.feature_id,",
            script.display()
        )),
        "{out}"
    );
    assert_eq!(
        out.matches("still holds the skeleton's placeholders")
            .count(),
        6
    );
    assert!(
        out.contains(&format!(
            "FAIL  feature request {} is still the placeholder `consort init` wrote",
            dir.join("feature.md").display()
        )),
        "{out}"
    );
    std::fs::write(dir.join("feature.md"), "# Stock levels\n").expect("write");
    let out = text(&in_dir(&["doctor"], dir));
    assert_contains(&out, "has a title and nothing else");
    std::fs::write(
        dir.join("feature.md"),
        "# Stock levels\n\nShow stock per SKU.\n",
    )
    .expect("write");
    let out = text(&in_dir(&["doctor"], dir));
    assert!(
        out.contains(&format!(
            "ok    feature request {}",
            dir.join("feature.md").display()
        )),
        "{out}"
    );

    // A run on the skeleton halts at the first step, naming the entry and its fields.
    let o = in_dir(&["run"], dir);
    assert_exit(&o, 4, "a run on a fresh skeleton halts");
    assert!(
        text(&o).contains("entry 1") && text(&o).contains("body.feature_id"),
        "{}",
        text(&o)
    );

    // init never overwrites the script (nor the feature request), even with --force.
    std::fs::write(dir.join(SKELETON), "# mine\n").expect("write");
    std::fs::write(dir.join("feature.md"), "# Mine\n").expect("write");
    assert_exit(&run(consort().arg("init").arg(dir)), 1, "init refuses");
    let o = run(consort().arg("init").arg(dir).arg("--force"));
    assert_exit(&o, 0, "init --force rewrites consort.toml only");
    assert_eq!(
        std::fs::read_to_string(dir.join(SKELETON)).expect("read"),
        "# mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("feature.md")).expect("read"),
        "# Mine\n"
    );
}

#[test]
fn doctor_explains_a_good_script_and_names_a_broken_entry() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    let script = dir.join(".consort/agents/stockflow.toml");
    let o = in_dir(&["doctor"], dir);
    assert_exit(&o, 0, "the StockFlow script is ready");
    let out = text(&o);
    assert_contains(
        &out,
        "answers, in order: stories, spec/r0, architecture/r0, schema, test-list, ux, red/T1, green/T1, red/T2,",
    );
    assert_contains(
        &out,
        "every design step and every build step of product-owner,",
    );

    // Without its UX entry and with the T1 GREEN removed, both are named as missing.
    let text_before = std::fs::read_to_string(&script).expect("read");
    let without = text_before
        .replacen("step = \"ux\"", "step = \"ux\"\nattempt = 1", 1)
        .replacen("step = \"green/T1\"", "step = \"green/T1\"\nattempt = 3", 1);
    std::fs::write(&script, &without).expect("write");
    let o = in_dir(&["doctor"], dir);
    assert_exit(
        &o,
        0,
        "missing steps are a note: a run halts there, by choice",
    );
    assert_contains(
        &text(&o),
        "no entry (a run halts there): ux (asked only when a story is user-facing), green/T1",
    );
    assert_contains(&text(&o), "ux (attempt 1), red/T1, green/T1 (attempt 3),");

    // A broken entry: the file, the entry, its line and the field.
    let broken = text_before.replacen(
        "feature_id = \"F1-warehouse-stock\"\nsummary",
        "feature_id = 7\nsummary",
        1,
    );
    assert_ne!(broken, text_before);
    std::fs::write(&script, &broken).expect("write");
    let o = in_dir(&["doctor"], dir);
    assert_exit(&o, 1, "a broken entry fails");
    let out = text(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL  script "))
        .unwrap_or_else(|| panic!("a FAIL line for the script: {out}"));
    assert!(
        line.contains(&script.display().to_string())
            && line.contains("entry 2")
            && line.contains("(step spec/r0)")
            && line.contains("body.feature_id: invalid type: integer `7`, expected a string"),
        "{line}"
    );
    assert!(!out.contains("Some("), "no Debug text: {out}");
}

/// The StockFlow project with a wrong first GREEN for T1 (it writes a test file, which the
/// Driver may not) before the right one, and no refusal retries.
fn stockflow_with_a_wrong_first_green(dir: &Path) {
    init_stockflow(dir);
    let path = dir.join(".consort/agents/stockflow.toml");
    let script = std::fs::read_to_string(&path).expect("read");
    let at = script.find("step = \"green/T1\"").expect("green/T1");
    let start = script[..at].rfind("[[entry]]").expect("its entry");
    let wrong = "[[entry]]\nstep = \"green/T1\"\n[entry.artifact]\nkind = \"change-set\"\n\
                 [[entry.artifact.body.changes]]\nop = \"write\"\npath = \"tests/wrong.sql\"\n\
                 content = \"select 1;\"\n\n";
    std::fs::write(
        &path,
        format!("{}{wrong}{}", &script[..start], &script[start..]),
    )
    .expect("write");
    set_retries(dir, 0);
}

fn set_retries(dir: &Path, n: u32) {
    let path = dir.join("consort.toml");
    let cfg = std::fs::read_to_string(&path).expect("read");
    let cfg: Vec<String> = cfg
        .lines()
        .map(|l| {
            if l.starts_with("max_agent_retries") {
                format!("max_agent_retries = {n}")
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&path, cfg.join("\n") + "\n").expect("write");
}

/// The change sets the Driver produced, in ledger order.
fn driver_answers(dir: &Path) -> Vec<Artifact> {
    consort_testkit::ledger::events(
        &consort::project::Project::open(dir)
            .expect("project")
            .ledger_path(),
    )
    .into_iter()
    .filter_map(|e| match e {
        Event::Produced {
            author, artifact, ..
        } if author.role == Role::Driver => Some(artifact),
        _ => None,
    })
    .collect()
}

fn approve_design(dir: &Path) {
    let o = in_dir(&["run"], dir);
    assert_exit(&o, 3, "the design gate");
    let o = in_dir(&["status", "--json"], dir);
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    let hash = status["pending_gate"]["hash"].as_str().expect("hash");
    let o = in_dir(&["approve", "design", "--hash", hash, "--by", "ada"], dir);
    assert_exit(&o, 0, "approve");
}

#[test]
fn a_human_retry_gets_the_same_scripted_answer_and_a_refusal_retry_the_next() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    stockflow_with_a_wrong_first_green(dir);
    approve_design(dir);
    let o = in_dir(&["run"], dir);
    assert_exit(
        &o,
        4,
        "the wrong GREEN is refused and, with no retries, halts",
    );
    assert_contains(&text(&o), "tests/wrong.sql is a test path");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("WARN")
            && !String::from_utf8_lossy(&o.stderr).contains('\u{1b}'),
        "the refusal's warning, without colour codes on a pipe: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let first = driver_answers(dir);
    assert_eq!(first.len(), 1, "one GREEN so far");

    // The human retry asks GREEN again as a new first attempt: the same (wrong) answer, not
    // the script's next entry, and no "script exhausted".
    assert_exit(&in_dir(&["retry", "--by", "ada"], dir), 0, "retry");
    let o = in_dir(&["run"], dir);
    assert_exit(&o, 4, "the same answer is refused again");
    assert!(!text(&o).contains("exhausted"), "{}", text(&o));
    assert_contains(&text(&o), "tests/wrong.sql is a test path");
    let second = driver_answers(dir);
    assert_eq!(second.len(), 2);
    assert_eq!(second[1], first[0], "a human retry replays the same answer");

    // Again, with one refusal retry allowed: the refusal retry (attempt 1) takes the step's
    // next entry, and the run goes on through the build lane to the deploy gate.
    set_retries(dir, 1);
    assert_exit(&in_dir(&["retry", "--by", "ada"], dir), 0, "retry");
    let o = in_dir(&["run"], dir);
    assert_exit(&o, 3, "on to the deploy gate");
    let answers = driver_answers(dir);
    assert_eq!(answers[2], first[0], "attempt 0 is still the first entry");
    assert_ne!(answers[3], first[0], "attempt 1 is the next entry");
    let o = in_dir(&["status", "--json"], dir);
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    assert_eq!(status["pending_gate"]["gate"], "deploy", "{status}");
}
