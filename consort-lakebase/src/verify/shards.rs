//! A suite split over database branches: which test files each shard runs, when the verdict
//! is already a failure so the rest can stop, and whether the shards' tests add up to the
//! whole suite. Pure: `sharded.rs` runs the shards.
//!
//! **The shards add up to the suite.** Every test the runner collects for the whole suite is
//! reported by exactly one shard, and every passing test a shard reports is one the runner
//! collected in that shard's files ([`union_fault`]): a test no shard ran, one run twice, or
//! one a shard made up is a runner fault, never a pass.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use consort_actors::{TestOutcome, VerifyPurpose};

use crate::runner::SuiteTest;

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
    suite: &[SuiteTest],
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

/// Each test file of the suite with its number of tests, in path order.
fn files_of(suite: &[SuiteTest]) -> BTreeMap<String, usize> {
    let mut files = BTreeMap::new();
    for t in suite {
        *files.entry(t.file.clone()).or_insert(0) += 1;
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
/// failure, so the other shards can stop: any failing test, except in RED, where the new test
/// is meant to fail, so only a failure in a shard without the focus's file counts.
pub(crate) fn certain_failure(
    purpose: VerifyPurpose,
    holds_focus: bool,
    outcomes: &[TestOutcome],
) -> bool {
    let failed = outcomes.iter().any(TestOutcome::is_failure);
    failed && (purpose != VerifyPurpose::Red || !holds_focus)
}

/// The test a subtest is part of, for a name with a `/` (Go's `TestA/case`): a listing
/// names the tests, and a run reports their subtests too.
fn parent_test(name: &str) -> Option<&str> {
    name.split_once('/').map(|(parent, _)| parent)
}

/// What is wrong with shards that all ran to their end, each with its files and outcomes,
/// against the suite the runner collected: `None` when they add up (see the module's note).
pub(crate) fn union_fault(
    suite: &[SuiteTest],
    shards: &[(&[String], &[TestOutcome])],
) -> Option<String> {
    let collected: HashMap<&str, &str> = suite
        .iter()
        .map(|t| (t.name.as_str(), t.file.as_str()))
        .collect();
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    let mut problems = Vec::new();
    for (i, (files, outcomes)) in shards.iter().enumerate() {
        for o in outcomes.iter() {
            if !reported.insert(o.name.as_str()) && !o.is_failure() {
                problems.push(format!(
                    "{} was reported twice (again by shard {})",
                    o.name,
                    i + 1
                ));
            }
            if o.is_failure() {
                continue;
            }
            match collected
                .get(o.name.as_str())
                .or_else(|| collected.get(parent_test(&o.name)?))
            {
                Some(file) if files.iter().any(|f| f == file) => {}
                Some(file) => problems.push(format!(
                    "shard {} reported {} passing, which is in {file}, not among its files",
                    i + 1,
                    o.name
                )),
                None => problems.push(format!(
                    "shard {} reported {} passing, which the whole suite does not have",
                    i + 1,
                    o.name
                )),
            }
        }
    }
    let missing: Vec<&str> = suite
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !reported.contains(n))
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "no shard ran {} of the suite's tests: {}",
            missing.len(),
            list(&missing)
        ));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
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
    use consort_actors::TestStatus;

    use super::*;

    fn suite(files: &[(&str, usize)]) -> Vec<SuiteTest> {
        files
            .iter()
            .flat_map(|(f, n)| {
                (0..*n).map(move |i| SuiteTest {
                    file: f.to_string(),
                    name: format!("{f}::t{i}"),
                })
            })
            .collect()
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
        let files: Vec<String> = s.iter().map(|t| t.file.clone()).collect();
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
                    .map(|f| s.iter().filter(|t| &t.file == f).count())
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
        assert!(plan(&[], &[], 4, &Costs::default(), EXACT).is_empty());
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
        assert!(certain_failure(VerifyPurpose::Green, true, &failed));
        assert!(
            !certain_failure(VerifyPurpose::Red, true, &failed),
            "RED's new test fails"
        );
        assert!(certain_failure(VerifyPurpose::Red, false, &failed));
        assert!(!certain_failure(
            VerifyPurpose::Green,
            false,
            &passed(&["x"])
        ));
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
            union_fault(
                &s,
                &w.iter()
                    .map(|(f, o)| (*f, o.as_slice()))
                    .collect::<Vec<_>>(),
            )
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
        assert!(
            fault.contains("not among its files") && fault.contains("twice"),
            "{fault}"
        );
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
}
