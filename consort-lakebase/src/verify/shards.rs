//! A suite split over database branches: which test files each shard runs, when the verdict
//! is already a failure so the rest can stop, and whether the shards' tests add up to the
//! whole suite. Pure: `sharded.rs` runs the shards.
//!
//! **The shards add up to the suite.** Every test the runner collects for the whole suite is
//! reported by the one shard that ran its file, and every passing test a shard reports is one
//! the runner collected in that shard's files ([`union`]); tests are told apart by file and
//! name, so one name in two files (Go's `TestNew` in two packages) is two tests. A test that a
//! shard which failed did not report is a failure of the run (the shard crashed, or stopped at
//! a file that does not load), whichever shard ended last. A test no shard ran, one a shard
//! that passed left out, one run twice, one a shard made up, or a file the listing could not
//! load whose shard reported no failure is a runner fault, never a pass.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use consort_actors::{TestOutcome, TestStatus, VerifyPurpose};

use crate::runner::Suite;

/// How a verification splits the suite (`[runner] shards`, `[runner] split_above_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shards {
    /// Most shards the suite is balanced over, besides the first shard of the likely
    /// failures; 1 runs the suite whole, in one process on one branch.
    pub max: usize,
    /// The suite is split only once a run of it has taken at least this long, tests alone
    /// (the first verification of a process runs whole and times it): each shard pays the
    /// runner's start and the listing of the suite, which a short suite does not win back.
    /// 0 splits from the first run.
    pub split_above_ms: u64,
}

impl Shards {
    /// The suite runs whole.
    pub const OFF: Shards = Shards {
        max: 1,
        split_above_ms: 0,
    };

    /// The default threshold of [`Shards::split_above_ms`]: 4 s, about what a split on two
    /// cores needs to win back a runner's start per shard and the suite's listing.
    pub const SPLIT_ABOVE_MS: u64 = 4_000;

    /// Whether suites are split at all.
    pub fn on(self) -> bool {
        self.max > 1
    }
}

impl Default for Shards {
    fn default() -> Self {
        Shards::OFF
    }
}

/// Whether selecting the first file also runs the second (see
/// [`crate::TestRunner::selection_reaches`]).
pub(crate) type Reaches<'a> = &'a (dyn Fn(&str, &str) -> bool + Sync);

/// The files of the suite but `likely` (they ran first, in a shard of their own), balanced
/// over at most `max` shards by their expected cost: the costliest group first onto the least
/// loaded shard. Files one of whose selection runs another (`reaches`) are one group, kept on
/// one shard, so no test runs on two. Empty when no file is left.
pub(crate) fn plan(
    suite: &Suite,
    likely: &[String],
    max: usize,
    costs: &Costs,
    reaches: Reaches<'_>,
) -> Vec<Vec<String>> {
    let files = files_of(suite);
    let rest: Vec<&String> = files.keys().filter(|f| !likely.contains(f)).collect();
    let mut by_cost: Vec<(f64, Vec<String>)> = groups(&rest, reaches)
        .into_iter()
        .map(|g| (g.iter().map(|f| costs.of(f, files[f])).sum(), g))
        .collect();
    by_cost.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut loads: Vec<(f64, Vec<String>)> = vec![(0.0, Vec::new()); max.min(by_cost.len())];
    for (cost, group) in by_cost {
        if let Some(least) = loads.iter_mut().min_by(|a, b| a.0.total_cmp(&b.0)) {
            least.0 += cost;
            least.1.extend(group);
        }
    }
    loads
        .into_iter()
        .map(|(_, mut files)| {
            files.sort();
            files
        })
        .collect()
}

/// `files` in groups that no selection reaches out of: two files are in one group when
/// selecting either runs the other, or through a chain of such files.
fn groups(files: &[&String], reaches: Reaches<'_>) -> Vec<Vec<String>> {
    let mut root: Vec<usize> = (0..files.len()).collect();
    fn find(root: &mut [usize], mut i: usize) -> usize {
        while root[i] != i {
            root[i] = root[root[i]];
            i = root[i];
        }
        i
    }
    for i in 0..files.len() {
        for j in i + 1..files.len() {
            if reaches(files[i], files[j]) || reaches(files[j], files[i]) {
                let (a, b) = (find(&mut root, i), find(&mut root, j));
                root[a] = b;
            }
        }
    }
    let mut by_root: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        let r = find(&mut root, i);
        by_root.entry(r).or_default().push((*f).clone());
    }
    by_root.into_values().collect()
}

/// `seeds` with every file of `universe` that a selection of them would run, or whose own
/// selection would run one of them, until none is left: what a shard of `seeds` runs, and
/// what no other shard may select.
pub(crate) fn closed_over(
    seeds: Vec<String>,
    universe: &[String],
    reaches: Reaches<'_>,
) -> Vec<String> {
    let mut set: BTreeSet<String> = seeds.into_iter().collect();
    loop {
        let more: Vec<String> = universe
            .iter()
            .filter(|u| !set.contains(*u) && set.iter().any(|s| reaches(s, u) || reaches(u, s)))
            .cloned()
            .collect();
        if more.is_empty() {
            return set.into_iter().collect();
        }
        set.extend(more);
    }
}

/// Each test file of the suite with its number of tests (a file that did not load counts as
/// one), in path order.
pub(crate) fn files_of(suite: &Suite) -> BTreeMap<String, usize> {
    let mut files = BTreeMap::new();
    for t in &suite.tests {
        *files.entry(t.file.clone()).or_insert(0) += 1;
    }
    for f in &suite.unloaded {
        files.entry(f.clone()).or_insert(1);
    }
    files
}

/// What a test file is expected to cost: what its tests took in the last split run that ran
/// them, or, for a file never timed, its number of tests at the mean time per test.
#[derive(Debug, Clone, Default)]
pub(crate) struct Costs {
    /// Milliseconds per test, per file.
    per_test: HashMap<String, f64>,
    /// The files of the tests that failed in the last split run.
    failures: Vec<String>,
    /// What the last run's tests took, added over its processes (`None` before any run).
    serial_ms: Option<u64>,
    /// The runner could not list a suite whose whole run then passed: it cannot list (a tool
    /// too old to), so its suites run whole from then on.
    unlisted: bool,
}

impl Costs {
    fn of(&self, file: &str, tests: usize) -> f64 {
        let per = self.per_test.get(file).copied().unwrap_or_else(|| {
            if self.per_test.is_empty() {
                1.0
            } else {
                self.per_test.values().sum::<f64>() / self.per_test.len() as f64
            }
        });
        per * tests as f64
    }

    /// Whether a suite whose last run took `serial_ms` is worth splitting under `shards`.
    pub(crate) fn worth_splitting(&self, shards: Shards) -> bool {
        shards.on()
            && !self.unlisted
            && (shards.split_above_ms == 0
                || self.serial_ms.is_some_and(|ms| ms >= shards.split_above_ms))
    }

    /// Remembers that the runner cannot list its suites (see `unlisted`).
    pub(crate) fn could_not_list(&mut self) {
        self.unlisted = true;
    }

    /// Remembers what a run's tests took, added over its processes.
    pub(crate) fn timed(&mut self, serial_ms: u64) {
        self.serial_ms = Some(serial_ms);
    }

    /// The files of the tests that failed in the last split run: likely to fail again, so
    /// run first.
    pub(crate) fn recent_failures(&self) -> &[String] {
        &self.failures
    }

    /// Remembers the files of the tests that failed in the last split run.
    pub(crate) fn failed(&mut self, files: Vec<String>) {
        self.failures = files;
    }

    /// Learns from a shard that ran to its end: `run_ms` over its `tests` tests in `files`.
    pub(crate) fn learn(&mut self, files: &[String], tests: usize, run_ms: u64) {
        if tests == 0 {
            return;
        }
        let per = run_ms as f64 / tests as f64;
        for f in files {
            self.per_test.insert(f.clone(), per);
        }
    }
}

/// Whether `outcomes`, from a shard that ended, already make the verification's verdict a
/// failure, so the other shards can stop: any failing test but a quarantined one (whose
/// failures judge nothing), except in RED, where the new test is meant to fail, so only a
/// failure in a shard without the focus's file counts; and never in the baseline, which must
/// name every test that fails.
pub(crate) fn certain_failure(
    (purpose, quarantined): (VerifyPurpose, &[String]),
    holds_focus: bool,
    outcomes: &[TestOutcome],
) -> bool {
    let failed = outcomes
        .iter()
        .any(|o| o.is_failure() && !quarantined.contains(&o.name));
    failed && purpose != VerifyPurpose::Baseline && (purpose != VerifyPurpose::Red || !holds_focus)
}

/// The test a subtest is part of, for a name with a `/` (Go's `TestA/case`): a listing
/// names the tests, and a run reports their subtests too.
fn parent_test(name: &str) -> Option<&str> {
    name.split_once('/').map(|(parent, _)| parent)
}

/// A shard that ran to its end, as [`union`] judges it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ended<'a> {
    /// The test files it ran.
    pub files: &'a [String],
    /// What it reported.
    pub outcomes: &'a [TestOutcome],
    /// Whether its process ended with success.
    pub exit_ok: bool,
}

impl Ended<'_> {
    /// Whether the shard failed: its process did not succeed, or it reported a failure.
    fn failed(&self) -> bool {
        !self.exit_ok || self.outcomes.iter().any(TestOutcome::is_failure)
    }
}

/// Whether shards that all ran to their end, each with its files and outcomes, add up to the
/// suite the runner collected (see the module's note): the failures to add for the tests a
/// failing shard did not report (by the shard's index), or what is wrong.
pub(crate) fn union(
    suite: &Suite,
    shards: &[Ended<'_>],
) -> Result<Vec<(usize, TestOutcome)>, String> {
    let mut problems = Vec::new();
    let mut unreported = Vec::new();
    // The suite's tests no shard reported, though none failed that would have.
    let mut unrun: Vec<&str> = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        let listed = listed_in(suite, shard.files);
        problems.extend(reports_of(suite, i, shard, &listed));
        let mut said: BTreeMap<&str, usize> = BTreeMap::new();
        for o in shard.outcomes {
            *said.entry(o.name.as_str()).or_insert(0) += 1;
        }
        let missing: Vec<&str> = listed
            .iter()
            .flat_map(|(name, n)| {
                let short = n.saturating_sub(said.get(name).copied().unwrap_or(0));
                std::iter::repeat_n(*name, short)
            })
            .collect();
        if shard.failed() {
            unreported.extend(missing.iter().map(|name| (i, not_reported(name, i))));
        } else {
            unrun.extend(missing);
        }
        let unloaded: Vec<&str> = shard
            .files
            .iter()
            .filter(|f| suite.unloaded.contains(f))
            .map(String::as_str)
            .collect();
        if !unloaded.is_empty() && !shard.failed() {
            problems.push(format!(
                "shard {} passed {}, which the listing could not load",
                i + 1,
                list(&unloaded)
            ));
        }
    }
    let ran: BTreeSet<&str> = shards
        .iter()
        .flat_map(|s| s.files.iter().map(String::as_str))
        .collect();
    unrun.extend(
        suite
            .tests
            .iter()
            .filter(|t| !ran.contains(t.file.as_str()))
            .map(|t| t.name.as_str())
            .chain(
                suite
                    .unloaded
                    .iter()
                    .filter(|f| !ran.contains(f.as_str()))
                    .map(String::as_str),
            ),
    );
    if !unrun.is_empty() {
        problems.push(format!(
            "no shard ran {} of the suite's tests: {}",
            unrun.len(),
            list(&unrun)
        ));
    }
    if problems.is_empty() {
        Ok(unreported)
    } else {
        Err(problems.join("; "))
    }
}

/// The suite's tests in `files`: how many of each name.
fn listed_in<'s>(suite: &'s Suite, files: &[String]) -> BTreeMap<&'s str, usize> {
    let mut listed = BTreeMap::new();
    for t in suite.tests.iter().filter(|t| files.contains(&t.file)) {
        *listed.entry(t.name.as_str()).or_insert(0) += 1;
    }
    listed
}

/// What is wrong with the passing tests shard `i` reported, against the suite's tests in its
/// files (`listed`): one reported more often than its files have it, one of another shard's
/// files, one the suite does not have. A listed test's subtest (`TestA/case`) is its own.
fn reports_of(
    suite: &Suite,
    i: usize,
    shard: &Ended<'_>,
    listed: &BTreeMap<&str, usize>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for o in shard.outcomes {
        let name = o.name.as_str();
        let times = seen.entry(name).or_insert(0);
        *times += 1;
        if o.is_failure() {
            continue;
        }
        if let Some(n) = listed.get(name) {
            if *times > *n {
                problems.push(format!(
                    "{name} was reported twice (again by shard {})",
                    i + 1
                ));
            }
            continue;
        }
        if parent_test(name).is_some_and(|p| listed.contains_key(p)) {
            continue;
        }
        let elsewhere = suite
            .tests
            .iter()
            .find(|t| t.name == name || parent_test(name) == Some(t.name.as_str()));
        problems.push(match elsewhere {
            Some(t) => format!(
                "shard {} reported {name} passing, which is in {}, not among its files",
                i + 1,
                t.file
            ),
            None => format!(
                "shard {} reported {name} passing, which the whole suite does not have",
                i + 1
            ),
        });
    }
    problems
}

/// The failure of a test of shard `i`'s files that the shard, which failed, did not report.
fn not_reported(name: &str, i: usize) -> TestOutcome {
    TestOutcome::new(name, TestStatus::Errored).with_message(&format!(
        "not reported: shard {} failed before it reported this test (a crash, or a file of the shard that does not load stopped it)",
        i + 1
    ))
}

/// At most five names, then how many more.
fn list(names: &[&str]) -> String {
    let shown: Vec<&str> = names.iter().take(5).copied().collect();
    match names.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::SuiteTest;

    fn suite(files: &[(&str, usize)]) -> Suite {
        Suite::of(
            files
                .iter()
                .flat_map(|(f, n)| {
                    (0..*n).map(move |i| SuiteTest {
                        file: f.to_string(),
                        name: format!("{f}::t{i}"),
                    })
                })
                .collect(),
        )
    }

    const EXACT: Reaches<'static> = &|a: &str, b: &str| a == b;

    /// As vitest selects: a file's path as a part of another's.
    const PART: Reaches<'static> = &|a: &str, b: &str| b.contains(a);

    #[test]
    fn files_whose_selection_runs_another_stay_on_one_shard() {
        let s = suite(&[
            ("tests/a.test.js", 3),
            ("src/tests/a.test.js", 3),
            ("tests/b.test.js", 3),
            ("tests/c.test.js", 3),
        ]);
        let shards = plan(&s, &[], 3, &Costs::default(), PART);
        assert_eq!(
            shards,
            vec![
                vec!["src/tests/a.test.js", "tests/a.test.js"],
                vec!["tests/b.test.js"],
                vec!["tests/c.test.js"],
            ]
        );
        let files: Vec<String> = s.tests.iter().map(|t| t.file.clone()).collect();
        assert_eq!(
            closed_over(vec!["src/tests/a.test.js".into()], &files, PART),
            vec!["src/tests/a.test.js", "tests/a.test.js"],
            "a file another's selection runs pulls that one in"
        );
        assert_eq!(
            closed_over(vec!["tests/b.test.js".into()], &files, EXACT),
            vec!["tests/b.test.js"]
        );
    }

    fn passed(names: &[&str]) -> Vec<TestOutcome> {
        names
            .iter()
            .map(|n| TestOutcome::new(*n, TestStatus::Passed))
            .collect()
    }

    #[test]
    fn the_rest_of_the_likely_failures_is_balanced_over_the_shards() {
        let s = suite(&[("a", 4), ("b", 3), ("c", 2), ("d", 2), ("e", 1)]);
        let shards = plan(&s, &["e".into()], 2, &Costs::default(), EXACT);
        let loads: Vec<usize> = shards
            .iter()
            .map(|fs| {
                fs.iter()
                    .map(|f| s.tests.iter().filter(|t| &t.file == f).count())
                    .sum()
            })
            .collect();
        assert_eq!(loads, vec![6, 5], "a+d, b+c: balanced by tests");
        let mut all: Vec<String> = shards.concat();
        all.sort();
        assert_eq!(
            all,
            vec!["a", "b", "c", "d"],
            "every file but the likely one, once"
        );
        assert_eq!(
            plan(&s, &[], 9, &Costs::default(), EXACT).len(),
            5,
            "never more shards than files"
        );
        assert!(plan(&Suite::default(), &[], 4, &Costs::default(), EXACT).is_empty());
    }

    #[test]
    fn learned_costs_move_a_slow_file_onto_its_own_shard() {
        let s = suite(&[("a", 2), ("b", 2), ("c", 2)]);
        let mut costs = Costs::default();
        costs.learn(&["a".into()], 2, 2000);
        costs.learn(&["b".into(), "c".into()], 4, 40);
        assert_eq!(
            plan(&s, &[], 2, &costs, EXACT),
            vec![vec!["a"], vec!["b", "c"]]
        );
    }

    #[test]
    fn a_suite_is_split_only_once_a_run_of_it_took_long_enough() {
        let shards = Shards {
            max: 2,
            split_above_ms: 4000,
        };
        let mut costs = Costs::default();
        assert!(!costs.worth_splitting(shards), "never timed: whole");
        costs.timed(3999);
        assert!(!costs.worth_splitting(shards));
        costs.timed(4000);
        assert!(costs.worth_splitting(shards));
        assert!(!costs.worth_splitting(Shards::OFF));
        let always = Shards {
            max: 2,
            split_above_ms: 0,
        };
        assert!(
            Costs::default().worth_splitting(always),
            "0: split from the first run"
        );
        let mut unlisted = Costs::default();
        unlisted.could_not_list();
        assert!(
            !unlisted.worth_splitting(always),
            "a runner that could not list runs whole"
        );
    }

    #[test]
    fn only_a_failure_the_step_forbids_stops_the_other_shards() {
        let failed = vec![TestOutcome::new("x", TestStatus::Failed)];
        let none: &[String] = &[];
        assert!(certain_failure((VerifyPurpose::Green, none), true, &failed));
        assert!(
            !certain_failure((VerifyPurpose::Red, none), true, &failed),
            "RED's new test fails"
        );
        assert!(certain_failure((VerifyPurpose::Red, none), false, &failed));
        assert!(!certain_failure(
            (VerifyPurpose::Green, none),
            false,
            &passed(&["x"])
        ));
        assert!(
            !certain_failure((VerifyPurpose::Green, &["x".to_string()]), false, &failed),
            "a quarantined test's failure judges nothing"
        );
        assert!(
            !certain_failure((VerifyPurpose::Baseline, none), false, &failed),
            "the baseline names every failing test"
        );
    }

    #[test]
    fn shards_that_do_not_add_up_to_the_suite_are_a_fault() {
        let s = suite(&[("a", 2), ("b", 1)]);
        let (a, b) = (vec!["a".to_string()], vec!["b".to_string()]);
        let whole = [
            (a.as_slice(), passed(&["a::t0", "a::t1"])),
            (b.as_slice(), passed(&["b::t0"])),
        ];
        let view = |w: &[(&[String], Vec<TestOutcome>)]| {
            let ended: Vec<Ended<'_>> = w
                .iter()
                .map(|(files, outcomes)| Ended {
                    files,
                    outcomes,
                    exit_ok: !outcomes.iter().any(TestOutcome::is_failure),
                })
                .collect();
            union(&s, &ended).err()
        };
        assert_eq!(view(&whole), None);
        let missing = [
            (a.as_slice(), passed(&["a::t0"])),
            (b.as_slice(), passed(&["b::t0"])),
        ];
        assert!(view(&missing).expect("a fault").contains("no shard ran 1"));
        let foreign = [
            (a.as_slice(), passed(&["a::t0", "a::t1", "b::t0"])),
            (b.as_slice(), passed(&["b::t0"])),
        ];
        let fault = view(&foreign).expect("a fault");
        assert!(fault.contains("not among its files"), "{fault}");
        let made_up = [
            (a.as_slice(), passed(&["a::t0", "a::t1", "a::t9"])),
            (b.as_slice(), passed(&["b::t0"])),
        ];
        assert!(view(&made_up).expect("a fault").contains("does not have"));
        let failing_extra = [
            (a.as_slice(), passed(&["a::t0", "a::t1"])),
            (
                b.as_slice(),
                vec![
                    TestOutcome::new("b::t0", TestStatus::Passed),
                    TestOutcome::new("(exit)", TestStatus::Errored),
                ],
            ),
        ];
        assert_eq!(
            view(&failing_extra),
            None,
            "a failure outside the suite can make no pass"
        );
        let subtests = [
            (a.as_slice(), passed(&["a::t0", "a::t0/case", "a::t1"])),
            (b.as_slice(), passed(&["b::t0"])),
        ];
        assert_eq!(view(&subtests), None, "a listed test's subtest is its own");
        let subtest_elsewhere = [
            (a.as_slice(), passed(&["a::t0", "a::t1"])),
            (b.as_slice(), passed(&["b::t0", "a::t1/case"])),
        ];
        assert!(
            view(&subtest_elsewhere)
                .expect("a fault")
                .contains("not among its files")
        );
    }

    /// Each shard as it ended: its files, outcomes, and whether its process succeeded.
    fn ended<'a>(shards: &'a [(Vec<String>, Vec<TestOutcome>, bool)]) -> Vec<Ended<'a>> {
        shards
            .iter()
            .map(|(files, outcomes, exit_ok)| Ended {
                files,
                outcomes,
                exit_ok: *exit_ok,
            })
            .collect()
    }

    #[test]
    fn one_name_in_two_files_is_two_tests() {
        // Go: `TestNew` in packages a/ and b/, on two shards or on one.
        let s = Suite::of(vec![
            SuiteTest {
                file: "a/a_test.go".into(),
                name: "TestNew".into(),
            },
            SuiteTest {
                file: "b/b_test.go".into(),
                name: "TestNew".into(),
            },
        ]);
        let (a, b) = (
            vec!["a/a_test.go".to_string()],
            vec!["b/b_test.go".to_string()],
        );
        let apart = [
            (a.clone(), passed(&["TestNew", "TestNew/case"]), true),
            (b.clone(), passed(&["TestNew"]), true),
        ];
        assert_eq!(union(&s, &ended(&apart)), Ok(Vec::new()));
        let together = [(
            vec!["a/a_test.go".to_string(), "b/b_test.go".to_string()],
            passed(&["TestNew", "TestNew"]),
            true,
        )];
        assert_eq!(union(&s, &ended(&together)), Ok(Vec::new()));
        let thrice = [(together[0].0.clone(), passed(&["TestNew"; 3]), true)];
        let fault = union(&s, &ended(&thrice)).expect_err("a fault");
        assert!(fault.contains("reported twice"), "{fault}");
        let one_short = [
            (a.clone(), passed(&["TestNew"]), true),
            (b.clone(), Vec::new(), true),
        ];
        let fault = union(&s, &ended(&one_short)).expect_err("a fault");
        assert!(fault.contains("no shard ran 1"), "{fault}");
    }

    #[test]
    fn a_crashed_shard_s_unreported_tests_fail_the_run_whichever_shard_ends_last() {
        let s = suite(&[("a", 3), ("b", 1)]);
        let crashed = (
            vec!["a".to_string()],
            vec![
                TestOutcome::new("a::t0", TestStatus::Passed),
                TestOutcome::new("(exit)", TestStatus::Errored),
            ],
            false,
        );
        let fine = (vec!["b".to_string()], passed(&["b::t0"]), true);
        // Ended first, the crash settles the verdict: the other shards are stopped.
        assert!(certain_failure(
            (VerifyPurpose::Green, &[]),
            false,
            &crashed.1
        ));
        // Ended last (or with the others in either order), every shard ended: the union check
        // makes its unreported tests failures, never a halt.
        for order in [
            vec![crashed.clone(), fine.clone()],
            vec![fine.clone(), crashed.clone()],
        ] {
            let at = order.iter().position(|s| !s.2).expect("the crashed shard");
            let failures = union(&s, &ended(&order)).expect("no fault");
            let names: Vec<(usize, &str)> = failures
                .iter()
                .map(|(i, o)| (*i, o.name.as_str()))
                .collect();
            assert_eq!(names, vec![(at, "a::t1"), (at, "a::t2")]);
            assert!(failures.iter().all(|(_, o)| o.is_failure()));
            assert!(
                failures[0]
                    .1
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("not reported")),
                "{:?}",
                failures[0].1
            );
        }
    }

    #[test]
    fn a_file_the_listing_could_not_load_must_fail_in_the_shard_that_runs_it() {
        let mut s = suite(&[("a", 1), ("b", 1)]);
        s.unloaded = vec!["c".into()];
        let files = files_of(&s);
        assert_eq!(files.get("c"), Some(&1), "it is planned onto a shard");
        assert_eq!(
            plan(&s, &[], 3, &Costs::default(), EXACT).concat(),
            vec!["a", "b", "c"]
        );
        let a = (vec!["a".to_string()], passed(&["a::t0"]), true);
        let with_c =
            |outcomes: Vec<TestOutcome>, ok| (vec!["b".to_string(), "c".to_string()], outcomes, ok);
        let broken = vec![
            TestOutcome::new("b::t0", TestStatus::Passed),
            TestOutcome::new("c", TestStatus::Errored),
        ];
        assert_eq!(
            union(&s, &ended(&[a.clone(), with_c(broken, false)])),
            Ok(Vec::new()),
            "its failure is the run's"
        );
        let fault =
            union(&s, &ended(&[a.clone(), with_c(passed(&["b::t0"]), true)])).expect_err("a fault");
        assert!(fault.contains("could not load"), "{fault}");
        let fault = union(
            &s,
            &ended(&[a, (vec!["b".to_string()], passed(&["b::t0"]), true)]),
        )
        .expect_err("a fault");
        assert!(
            fault.contains("no shard ran 1") && fault.contains('c'),
            "{fault}"
        );
    }
}
