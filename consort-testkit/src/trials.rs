//! For test binaries with a main of their own (`harness = false` in Cargo.toml) that run
//! `libtest-mimic` trials: the arguments, taking any number of filters as libtest does
//! (`-- case_06 case_11`).

use libtest_mimic::{Arguments, Trial};

/// The options libtest-mimic reads that take a value.
const TAKES_VALUE: [&str; 5] = [
    "--test-threads",
    "--logfile",
    "--skip",
    "--color",
    "--format",
];

/// The trials of a test binary, selected by the command line.
#[derive(Debug)]
pub struct Selection {
    /// libtest-mimic's arguments (without the filters). The trials run one after the other
    /// unless `--test-threads` says otherwise.
    pub args: Arguments,
    /// The trials to run: those whose name contains any filter (all when none is given).
    pub trials: Vec<Trial>,
    /// Whether every trial was selected.
    pub all: bool,
}

/// Reads the command line and selects from `trials`.
pub fn select(trials: Vec<Trial>) -> Selection {
    let mut options = vec![];
    let mut filters: Vec<String> = vec![];
    let mut raw = std::env::args();
    options.extend(raw.next());
    while let Some(a) = raw.next() {
        if TAKES_VALUE.contains(&a.as_str()) {
            options.push(a);
            options.extend(raw.next());
        } else if a.starts_with('-') {
            options.push(a);
        } else {
            filters.push(a);
        }
    }
    let mut args = Arguments::from_iter(options);
    args.test_threads = args.test_threads.or(Some(1));
    let total = trials.len();
    let trials: Vec<Trial> = trials
        .into_iter()
        .filter(|t| filters.is_empty() || filters.iter().any(|f| t.name().contains(f.as_str())))
        .collect();
    let all = trials.len() == total;
    Selection { args, trials, all }
}
