//! Feature after feature on one project, through the `consort` binary, on the embedded
//! PostgreSQL with the psql runner and real git: each feature has its own record and branch,
//! every earlier feature's tests are the regression suite of the later ones, and only a
//! human's retirement releases one of them.
//!
//! Needs `psql` and `git` (`.ci/run` installs them).

use std::path::Path;

use crate::common::script::{Design, REFACTOR_AND_REVIEW, change_entry, write_change};
use crate::common::{
    approving_run, assert_exit, assert_exit_saying, consort, dir_arg, feature_add, in_dir, run,
    says, write,
};
use consort::actors::{Event, RuleViolation};
use consort::project::Project;
use consort_testkit::process::text;

pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let o = run(std::process::Command::new("git")
        .args(args)
        .current_dir(dir));
    assert!(o.status.success(), "git {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One feature's design and build, as its script answers them.
pub(crate) struct Plan<'a> {
    pub feature: &'a str,
    pub story: &'a str,
    pub migration: (&'a str, &'a str),
    pub test: (&'a str, &'a str),
    /// What RED writes besides the test (an earlier test rewritten or deleted).
    pub red_extra: &'a str,
    /// The file GREEN writes, with what it holds, then the repairs' (when GREEN breaks
    /// something).
    pub green_file: &'a str,
    pub green: String,
    pub repair: Option<String>,
}

fn script(p: &Plan<'_>) -> String {
    let (test_path, test_sql) = p.test;
    let mut s = Design {
        feature: p.feature,
        story: p.story,
        migration: p.migration,
        test_path,
        test_name: None,
    }
    .toml();
    s.push_str(REFACTOR_AND_REVIEW);
    s.push_str(&change_entry(
        "red/T1",
        "T1",
        &format!("{}{}", write_change(test_path, test_sql), p.red_extra),
    ));
    s.push_str(&change_entry(
        "green/T1",
        "the rule",
        &write_change(p.green_file, &p.green),
    ));
    if let Some(repair) = &p.repair {
        s.push_str(&change_entry(
            "repair/T1/*",
            "the rule, and the earlier one kept",
            &write_change(p.green_file, repair),
        ));
    }
    s
}

const LEVEL: &str = "CREATE FUNCTION stock_level(s text) RETURNS int LANGUAGE sql AS $$ SELECT qty FROM stock WHERE sku = s $$;\n";
const AVAILABLE: &str = "CREATE FUNCTION stock_available(s text) RETURNS int LANGUAGE sql AS $$ SELECT qty - reserved FROM stock WHERE sku = s $$;\n";
const LEVEL_IN_PACKS: &str = "CREATE FUNCTION stock_level(s text) RETURNS int LANGUAGE sql AS $$ SELECT qty / pack FROM stock WHERE sku = s $$;\n";
const F1_TEST: &str = "tests/t1_level.sql";

pub(crate) fn f1() -> Plan<'static> {
    Plan {
        feature: "f1-stock",
        story: "Stock levels",
        migration: (
            "0001_stock",
            "CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);",
        ),
        test: (
            F1_TEST,
            "INSERT INTO stock (sku, qty) VALUES ('A', 5);\nDO $$ BEGIN IF stock_level('A') <> 5 THEN RAISE EXCEPTION 'level is %', stock_level('A'); END IF; END $$;\n",
        ),
        red_extra: "",
        green_file: "src/level.sql",
        green: LEVEL.into(),
        repair: None,
    }
}

/// Reservations: its first GREEN replaces `src/level.sql` with the new function alone, which
/// breaks f1's test; the repair keeps both.
fn f2() -> Plan<'static> {
    Plan {
        feature: "f2-reserve",
        story: "Reservations",
        migration: (
            "0002_reserved",
            "ALTER TABLE stock ADD COLUMN reserved int NOT NULL DEFAULT 0;",
        ),
        test: (
            "tests/f2_t1_available.sql",
            "INSERT INTO stock (sku, qty, reserved) VALUES ('B', 5, 2);\nDO $$ BEGIN IF stock_available('B') <> 3 THEN RAISE EXCEPTION 'available is %', stock_available('B'); END IF; END $$;\n",
        ),
        red_extra: "",
        green_file: "src/level.sql",
        green: AVAILABLE.into(),
        repair: Some(format!("{LEVEL}{AVAILABLE}")),
    }
}

/// Levels in packs: it contradicts f1's test, which its RED deletes.
fn f3() -> Plan<'static> {
    Plan {
        feature: "f3-packs",
        story: "Levels in packs",
        migration: (
            "0003_packs",
            "ALTER TABLE stock ADD COLUMN pack int NOT NULL DEFAULT 5;",
        ),
        test: (
            "tests/f3_t1_packs.sql",
            "INSERT INTO stock (sku, qty) VALUES ('C', 10);\nDO $$ BEGIN IF stock_level('C') <> 2 THEN RAISE EXCEPTION 'level is %', stock_level('C'); END IF; END $$;\n",
        ),
        red_extra: "[[entry.artifact.body.changes]]\nop = \"delete\"\npath = \"tests/t1_level.sql\"\n",
        green_file: "src/level.sql",
        green: format!("{LEVEL_IN_PACKS}{AVAILABLE}"),
        repair: None,
    }
}

/// `consort.toml` of the backlog projects: f1 first, one warm branch, each feature played by
/// its script in `.consort/agents/`.
const SCRIPTED_CONFIG: &str = "[feature]\nid = \"f1-stock\"\nrequest = \"feature.md\"\n\n[pool]\nsize = 1\nmax_concurrent = 1\nkeep_failed = false\n\n[agents.default]\nbackend = \"script\"\npath = \".consort/agents/{feature}.toml\"\n";

/// A project whose first feature is f1 (stock levels), with the script of each of `plans`
/// in `.consort/agents/` (f1's among them).
pub(crate) fn scripted_project(dir: &Path, plans: &[&Plan<'_>]) {
    let scripts: Vec<(String, String)> = plans
        .iter()
        .map(|p| (format!(".consort/agents/{}.toml", p.feature), script(p)))
        .collect();
    let mut files = vec![
        ("consort.toml", SCRIPTED_CONFIG),
        (
            "feature.md",
            "# Stock levels\n\nShow the stock level of a SKU.\n",
        ),
        ("src/.keep", ""),
    ];
    files.extend(scripts.iter().map(|(p, s)| (p.as_str(), s.as_str())));
    write(dir, &files);
}

/// A backlog project of f1, f2 and f3, with the requests of f2 and f3 in `requests`
/// (outside the project).
fn project(dir: &Path, requests: &Path) {
    scripted_project(dir, &[&f1(), &f2(), &f3()]);
    write(
        requests,
        &[
            (
                "f2-reserve.md",
                "# Reservations\n\nReserved units are not available.\n",
            ),
            (
                "f3-packs.md",
                "# Levels in packs\n\nLevels are counted in packs of five.\n",
            ),
        ],
    );
}

fn run_to_done(dir: &Path, what: &str) -> String {
    let o = run(&mut approving_run(dir));
    assert_exit(&o, 0, what);
    text(&o)
}

pub(crate) fn events(dir: &Path, feature: &str) -> Vec<Event> {
    let project = Project::open_feature(dir, Some(feature)).expect("project");
    consort_testkit::ledger::events(&project.ledger_path())
}

fn promoted(events: &[Event]) -> (Vec<String>, Vec<String>) {
    events
        .iter()
        .find_map(|e| match e {
            Event::Promoted { report } => {
                Some((report.already_applied.clone(), report.applied.clone()))
            }
            _ => None,
        })
        .expect("promoted")
}

#[test]
fn features_run_one_after_another_each_held_to_the_earlier_tests() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, requests) = (tmp.path().join("shop"), tmp.path().join("requests"));
    project(&dir, &requests);
    consort::git::GitRepo::init_with_commit(&dir, "Test Author", "before Consort").expect("git");

    // The first feature, on its own branch and record; the summary says what was built.
    let out = run_to_done(&dir, "f1 runs to done");
    for said in [
        "feature:   Stock levels (f1-stock)",
        "stories:   S1 Stock levels",
        "schema:    1 migration: 0001_stock",
        "files:     2 written: tests/t1_level.sql, src/level.sql",
        "receipts:  3 verified runs: 1 failed (every RED",
        "calls, no tokens spent\n",
    ] {
        assert!(out.contains(said), "{said:?} in:\n{out}");
    }
    let time = out
        .lines()
        .find(|l| l.starts_with("time:"))
        .unwrap_or_default();
    // Which phases reach the 10 ms shown depends on the machine; their order does not.
    use consort_actors::Phase;
    let rank = |name: &str| Phase::ALL.iter().position(|p| p.as_str() == name);
    let shown: Vec<Option<usize>> = time
        .trim_start_matches("time:")
        .split(',')
        .map(|part| part.split_whitespace().next().and_then(rank))
        .collect();
    assert!(
        shown.contains(&rank("build"))
            && shown.iter().all(Option::is_some)
            && shown.windows(2).all(|w| w[0] < w[1]),
        "phases in lifecycle order, the build among them: {time}"
    );
    assert!(
        dir.join(".consort/features/f1-stock/ledger.jsonl")
            .is_file()
    );
    assert!(dir.join(".consort/features/f1-stock/design.json").is_file());
    let o = in_dir(&["run"], &dir);
    says(&o, "every feature of the backlog is done");

    // The backlog: a duplicate id is refused; two more features wait.
    let add = |file: &str| {
        run(consort()
            .args(["feature", "add"])
            .arg(requests.join(file))
            .args(dir_arg(&dir)))
    };
    assert_exit(&add("f2-reserve.md"), 0, "add f2");
    let o = add("f2-reserve.md");
    assert_exit(&o, 2, "a duplicate id is a usage error");
    says(&o, "already has a feature `f2-reserve`");
    assert_exit(&add("f3-packs.md"), 0, "add f3");
    let o = in_dir(&["status", "--feature", "nope"], &dir);
    assert_exit(&o, 2, "an unknown feature is a usage error");
    says(&o, "has no feature `nope`");
    let o = in_dir(&["feature", "list"], &dir);
    let list = text(&o);
    assert!(list.contains("f1-stock") && list.contains("done"), "{list}");
    assert!(
        list.contains("→  2  f2-reserve") && list.contains("waiting"),
        "{list}"
    );

    // The second feature starts from where the first was merged, and not before.
    git(&dir, &["checkout", "-q", "main"]);
    let o = in_dir(&["run", "--approve-as", "ada"], &dir);
    assert_exit_saying(
        &o,
        1,
        "f1's work is not merged",
        "merge its branch consort/f1-stock",
    );
    git(&dir, &["merge", "-q", "--ff-only", "consort/f1-stock"]);
    let out = run_to_done(&dir, "f2 runs to done");
    assert!(out.contains("feature f2-reserve"), "{out}");
    let f2_events = events(&dir, "f2-reserve");
    let inherited = match f2_events.first() {
        Some(Event::Start { inherited, .. }) => inherited.clone(),
        other => panic!("f2 starts with a start event, not {other:?}"),
    };
    assert_eq!(inherited.tests.len(), 1);
    assert_eq!(inherited.tests[0].key(), "f1-stock/T1");
    // Its first GREEN broke f1's test: not green, repaired, then done.
    let green_failed = f2_events.iter().any(|e| {
        matches!(e, Event::VerifyCompleted { receipt }
            if receipt.outcomes.iter().any(|o| o.name == F1_TEST && o.status != consort::actors::TestStatus::Passed))
    });
    assert!(green_failed, "f1's test failed in f2's first GREEN");
    let driver_changes = f2_events
        .iter()
        .filter(|e| matches!(e, Event::Produced { author, artifact: consort::actors::Artifact::ChangeSet(c), .. }
            if author.role == consort::actors::Role::Driver && !c.changes.is_empty()))
        .count();
    assert_eq!(driver_changes, 2, "one GREEN and one repair");
    assert_eq!(
        promoted(&f2_events),
        (vec!["0001_stock".into()], vec!["0002_reserved".into()]),
        "the parent holds f1's migration and gets f2's"
    );
    assert!(dir.join("migrations/0001_S1_stock.sql").is_file());
    assert!(dir.join("migrations/0002_S1_reserved.sql").is_file());
    let log = git(&dir, &["log", "--format=%B", "consort/f2-reserve"]);
    assert!(
        log.contains("Consort-Feature: f1-stock") && log.contains("Consort-Feature: f2-reserve"),
        "f2's branch grows from f1's merged work:\n{log}"
    );

    // The third feature contradicts f1's test: its RED deleting it halts, typed.
    git(&dir, &["checkout", "-q", "main"]);
    git(&dir, &["merge", "-q", "--ff-only", "consort/f2-reserve"]);
    let o = in_dir(&["run", "--approve-as", "ada"], &dir);
    assert_exit(&o, 4, "f3's RED halts");
    let halted = in_dir(&["status", "--json"], &dir);
    let status: serde_json::Value = serde_json::from_slice(&halted.stdout).expect("status JSON");
    assert_eq!(status["feature"], "f3-packs");
    assert_eq!(status["halted"]["reason"], "earlier-test-contradicted");
    let refusal = events(&dir, "f3-packs").into_iter().find_map(|e| match e {
        Event::Refused { violation, .. } => Some(violation),
        _ => None,
    });
    assert_eq!(
        refusal,
        Some(RuleViolation::EarlierTestFrozen {
            path: F1_TEST.into(),
            feature: "f1-stock".into(),
            test: "T1".into(),
        })
    );
    // A human retires it, with a record; then the RED replaces it and the run is done.
    let o = in_dir(
        &[
            "test",
            "retire",
            "f1-stock/T9",
            "--by",
            "ana",
            "--reason",
            "x",
        ],
        &dir,
    );
    assert_exit_saying(
        &o,
        1,
        "an unknown test",
        "not a test this feature inherited",
    );
    let o = in_dir(
        &[
            "test",
            "retire",
            "f1-stock/T1",
            "--by",
            "ana",
            "--reason",
            "levels are counted in packs now",
        ],
        &dir,
    );
    assert_exit(&o, 0, "retire");
    assert_exit(&in_dir(&["retry", "--by", "ana"], &dir), 0, "retry");
    run_to_done(&dir, "f3 runs to done");
    assert!(
        !dir.join(F1_TEST).exists(),
        "the RED replaced the retired test"
    );
    assert_eq!(
        promoted(&events(&dir, "f3-packs")),
        (
            vec!["0001_stock".into(), "0002_reserved".into()],
            vec!["0003_packs".into()]
        )
    );

    // verify checks every feature, and lists the decision.
    let o = in_dir(&["verify"], &dir);
    let out = text(&o);
    assert_exit(&o, 0, "verify over the three features");
    for f in ["feature f1-stock", "feature f2-reserve", "feature f3-packs"] {
        assert!(out.contains(f), "{out}");
    }
    assert!(
        out.contains("retired test: f1-stock/T1 by ana: levels are counted in packs now"),
        "{out}"
    );
    assert!(
        out.contains("replaced after retirement: tests/t1_level.sql retired by ana for f3-packs"),
        "{out}"
    );
    let o = in_dir(&["verify", "--feature", "f2-reserve"], &dir);
    assert_exit(&o, 0, "verify one feature");
    assert!(
        text(&o).contains("feature f2-reserve") && !text(&o).contains("feature f1-stock"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_project_made_before_backlogs_keeps_its_feature_and_takes_the_next() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (dir, requests) = (tmp.path().join("shop"), tmp.path().join("requests"));
    project(&dir, &requests);
    run_to_done(&dir, "f1 runs to done");
    // The layout of a project made before backlogs: the record in .consort/ itself.
    for file in ["ledger.jsonl", "design.json"] {
        std::fs::rename(
            dir.join(".consort/features/f1-stock").join(file),
            dir.join(".consort").join(file),
        )
        .expect("move");
    }
    std::fs::remove_dir_all(dir.join(".consort/features")).expect("rm");

    let o = in_dir(&["status", "--json"], &dir);
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status JSON");
    assert_eq!(status["phase"], "done", "{}", text(&o));
    assert_exit(&in_dir(&["verify"], &dir), 0, "the old record verifies");

    let o = run(&mut feature_add(
        &requests.join("f2-reserve.md"),
        "f2-reserve",
        &dir,
    ));
    assert_exit(&o, 0, "add");
    run_to_done(&dir, "the second feature runs to done");
    assert!(
        dir.join(".consort/ledger.jsonl").is_file(),
        "the old record stays where it was"
    );
    let f2 = events(&dir, "f2-reserve");
    assert!(
        matches!(f2.first(), Some(Event::Start { inherited, .. }) if inherited.tests.len() == 1)
    );
    let o = in_dir(&["feature", "list"], &dir);
    assert_eq!(text(&o).matches("done").count(), 2, "{}", text(&o));
    assert_exit(&in_dir(&["verify"], &dir), 0, "both verify");
}

/// f1 whose GREEN and every repair return a wrong level: the run halts with the repairs spent,
/// the Driver's unverified `src/level.sql` in the tree.
fn f1_wrong_code() -> Plan<'static> {
    const WRONG: &str =
        "CREATE FUNCTION stock_level(s text) RETURNS int LANGUAGE sql AS $$ SELECT 0 $$;\n";
    Plan {
        green: WRONG.into(),
        repair: Some(WRONG.into()),
        ..f1()
    }
}

/// A project of f1 with wrong code in `dir`, run until it halts with the repairs spent.
fn halted_on_wrong_code(dir: &Path) {
    scripted_project(dir, &[&f1_wrong_code()]);
    halted(dir, "GREEN and its repairs fail");
    assert!(dir.join("src/level.sql").exists(), "the Driver's attempt");
}

fn halted(dir: &Path, what: &str) {
    assert_exit_saying(
        &run(&mut approving_run(dir)),
        4,
        what,
        "GREEN still fails after 3 repair rounds",
    );
}

/// `consort test redo` sets aside the running entry's accepted test, recorded with who and
/// why, and the run goes on from its RED; only that entry's.
#[test]
fn a_person_has_a_wrong_accepted_test_written_again() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("shop");
    halted_on_wrong_code(&dir);
    let o = in_dir(
        &["test", "redo", "T2", "--by", "ana", "--reason", "x"],
        &dir,
    );
    assert_exit_saying(
        &o,
        1,
        "not the running entry",
        "not the entry the build lane is on",
    );
    let o = in_dir(
        &[
            "test",
            "redo",
            "T1",
            "--by",
            "ana",
            "--reason",
            "it checks the level of the wrong SKU",
        ],
        &dir,
    );
    assert_exit_saying(&o, 0, "redo", "goes on from its RED");
    // The script writes the same test again: the redone RED is a RED, the code fails again.
    halted(&dir, "the redone RED is accepted, GREEN fails again");
    let log = text(&in_dir(&["log"], &dir));
    assert!(
        log.contains(
            "T1's test set aside by ana, to be written again: it checks the level of the wrong SKU"
        ),
        "{log}"
    );
    let o = in_dir(&["verify"], &dir);
    assert_exit_saying(&o, 0, "verify", "test written again: T1 by ana");
}

/// `consort stop` puts the tree back as the last verified step left it (the Driver's
/// unverified file goes); after the stopped feature's test file changes, whole-project
/// `consort verify` still passes and says the feature was stopped.
#[test]
fn a_stopped_feature_leaves_the_last_verified_tree_and_still_verifies() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("shop");
    halted_on_wrong_code(&dir);
    let o = in_dir(&["stop", "--by", "ana"], &dir);
    assert_exit_saying(
        &o,
        0,
        "stop",
        "put back what the last verified step (red/T1) left",
    );
    says(&o, "src/level.sql (new)");
    assert!(
        !dir.join("src/level.sql").exists(),
        "the unverified code is gone from the tree"
    );
    assert!(dir.join(F1_TEST).exists(), "what RED left stays");

    // The stopped feature's test file changes later: the record still verifies.
    std::fs::remove_file(dir.join(F1_TEST)).expect("remove the stopped feature's test");
    let o = in_dir(&["verify"], &dir);
    assert_exit_saying(&o, 0, "verify", "ok    stopped: the run was stopped");
}

/// `consort stop` never overwrites a file someone changed by hand since the run's last change,
/// and `--keep` leaves the unverified work; both say exactly what they leave.
#[test]
fn stop_leaves_a_hand_edit_and_what_keep_asks_for() {
    let tmp = tempfile::tempdir().expect("tmp");
    for keep in [false, true] {
        let dir = tmp.path().join(format!("shop-{keep}"));
        halted_on_wrong_code(&dir);
        let code = dir.join("src/level.sql");
        if !keep {
            std::fs::write(&code, "-- mine\n").expect("a hand edit");
        }
        let args: &[&str] = if keep {
            &["stop", "--by", "ana", "--keep"]
        } else {
            &["stop", "--by", "ana"]
        };
        let o = in_dir(args, &dir);
        let why = if keep {
            "as --keep asked"
        } else {
            "the tree changed since the run's last change, so nothing was overwritten"
        };
        assert_exit_saying(&o, 0, "stop", why);
        says(&o, "src/level.sql (new)");
        let left = std::fs::read_to_string(&code).expect("the file is left");
        assert_eq!(left == "-- mine\n", !keep, "{left}");
    }
}
