//! A test command read as the shell reads it, for `consort doctor`: a chain of simple commands
//! (`&&`, `||`, `;`, `|`), each with its `NAME=value` assignments, its shell builtins (which
//! start no program), and the `PATH` that the commands before it set.
//!
//! The words come from the library's one shell lexer
//! ([`consort::config::runner_harness::simple_commands`]), the one that decides which files the
//! commands name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use consort::config::runner_harness::{Word, is_assignment, simple_commands};

/// Shell builtins and keywords: they start no program, so nothing needs installing.
const BUILTINS: [&str; 38] = [
    "export", "cd", "set", "unset", "source", ".", ":", "true", "false", "test", "[", "echo",
    "printf", "umask", "ulimit", "trap", "eval", "readonly", "shift", "wait", "alias", "local",
    "declare", "typeset", "pushd", "popd", "if", "then", "else", "elif", "fi", "for", "do", "done",
    "while", "until", "case", "esac",
];

/// Builtins that set up the commands after them (their environment, their directory, an
/// activated virtual environment): repeated before a collection run, which runs the user's
/// own command as they would.
const SETUP_BUILTINS: [&str; 7] = ["export", "cd", "set", "unset", "umask", ".", "source"];

/// One simple command of a chain.
#[derive(Debug, Clone)]
pub(super) struct Simple {
    /// `NAME=value` words before the program.
    pub(super) assignments: Vec<String>,
    /// The program and its arguments (empty: a command of assignments only).
    pub(super) words: Vec<Word>,
}

impl Simple {
    /// The program it starts, unless it is a builtin or there is none.
    pub(super) fn program(&self) -> Option<&str> {
        let first = self.words.first()?.text.as_str();
        (!BUILTINS.contains(&first)).then_some(first)
    }

    /// Whether it only sets up what comes after it (assignments, `export`, `cd`, …).
    fn is_setup(&self) -> bool {
        self.words
            .first()
            .is_none_or(|w| SETUP_BUILTINS.contains(&w.text.as_str()))
    }

    /// Its text as `sh` reads it back: plain words as they are, words with an expansion in
    /// double quotes (so it still expands), any other in single quotes.
    pub(super) fn text(&self) -> String {
        let assignment = |a: &str| {
            a.split_once('=')
                .map(|(name, value)| format!("{name}={}", double_quoted(value)))
        };
        self.assignments
            .iter()
            .filter_map(|a| assignment(a))
            .chain(self.words.iter().map(|w| match assignment(&w.text) {
                Some(a) if is_assignment(&w.text) => a,
                _ if w.dynamic => double_quoted(&w.text),
                _ => super::quoted(&w.text),
            }))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The `bin` directory of the virtual environment it activates (`. .venv/bin/activate`),
    /// which then leads the `PATH` of the commands after it.
    fn activated(&self) -> Option<&str> {
        match self.words.as_slice() {
            [source, script, ..] if matches!(source.text.as_str(), "." | "source") => {
                script.text.strip_suffix("/activate")
            }
            _ => None,
        }
    }

    /// The `NAME=value` pairs it sets for the commands after it: its own assignments when it
    /// has no program, and what an `export` names.
    fn exported(&self) -> Vec<&str> {
        match self.words.first().map(|w| w.text.as_str()) {
            None => self.assignments.iter().map(String::as_str).collect(),
            Some("export") => self.words[1..]
                .iter()
                .map(|w| w.text.as_str())
                .filter(|w| is_assignment(w))
                .collect(),
            Some(_) => Vec::new(),
        }
    }
}

/// A command line as a chain of simple commands.
#[derive(Debug, Clone)]
pub(super) struct Chain(Vec<Simple>);

impl Chain {
    /// Reads `command` as `sh` would.
    pub(super) fn read(command: &str) -> Chain {
        Chain(
            simple_commands(command)
                .into_iter()
                .map(|words| {
                    let n = words.iter().take_while(|w| is_assignment(&w.text)).count();
                    Simple {
                        assignments: words[..n].iter().map(|w| w.text.clone()).collect(),
                        words: words[n..].to_vec(),
                    }
                })
                .collect(),
        )
    }

    /// Its simple commands, in order.
    pub(super) fn commands(&self) -> &[Simple] {
        &self.0
    }

    /// Each program the chain starts (builtins left out), with whether it can be found: on
    /// the `PATH` the commands before it set (`export PATH="$PWD/.venv/bin:$PATH"`), or on
    /// its own `PATH=` assignment, with relative entries and paths taken from `dir`.
    pub(super) fn programs(&self, dir: &Path) -> Vec<(String, bool)> {
        let mut path = std::env::var_os("PATH").unwrap_or_default();
        let mut out = Vec::new();
        for simple in &self.0 {
            if let Some(program) = simple.program() {
                let mut own = path.clone();
                for a in &simple.assignments {
                    own = with_path_set(own, a, dir);
                }
                out.push((program.to_string(), installed_on(program, dir, &own)));
            }
            for a in simple.exported() {
                path = with_path_set(path, a, dir);
            }
            if let Some(bin) = simple.activated() {
                let mut dirs = vec![dir.join(bin)];
                dirs.extend(std::env::split_paths(&path));
                path = std::env::join_paths(dirs).unwrap_or(path);
            }
        }
        out
    }

    /// The text of the setup commands before the `i`th (`export …`, `cd …`, assignments),
    /// each followed by ` && `: what a collection run of that command repeats first.
    pub(super) fn setup_before(&self, i: usize) -> String {
        self.0[..i]
            .iter()
            .filter(|s| s.is_setup())
            .map(|s| format!("{} && ", s.text()))
            .collect()
    }

    /// The programs before the `i`th command that a collection run leaves out (they are not
    /// setup: a schema script, a build step).
    pub(super) fn left_out_before(&self, i: usize) -> Vec<String> {
        self.0[..i]
            .iter()
            .filter(|s| !s.is_setup())
            .filter_map(|s| s.program().map(String::from))
            .collect()
    }
}

/// `PATH` after `assignment`, when it sets `PATH`: `$PATH` and `${PATH}` expand to `path`,
/// `$PWD`, `${PWD}` and `$(pwd)` to `dir`. Any other assignment leaves it as it is.
fn with_path_set(path: OsString, assignment: &str, dir: &Path) -> OsString {
    let Some(value) = assignment.strip_prefix("PATH=") else {
        return path;
    };
    let old = path.to_string_lossy().into_owned();
    let here = dir.display().to_string();
    let value = value
        .replace("${PATH}", &old)
        .replace("$PATH", &old)
        .replace("${PWD}", &here)
        .replace("$PWD", &here)
        .replace("$(pwd)", &here);
    OsString::from(value)
}

/// Whether `program` can be started with `path` as `PATH`: a path (relative to `dir`) to a
/// file, or a name found in one of its directories (relative ones taken from `dir`).
pub(super) fn installed_on(program: &str, dir: &Path, path: &OsString) -> bool {
    if program.contains('/') {
        return dir.join(program).is_file();
    }
    std::env::split_paths(path).any(|p: PathBuf| dir.join(p).join(program).is_file())
}

/// `text` in double quotes, with what double quotes do not keep escaped (`"` and `\`).
fn double_quoted(text: &str) -> String {
    if super::is_plain(text) {
        return text.to_string();
    }
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_and_assignments_start_no_program() {
        let dir = tempfile::tempdir().expect("tmp");
        let chain = Chain::read(
            "export PATH=\"$PWD/.venv/bin:$PATH\" && cd . && psql -f schema.sql && python3 -m pytest -q",
        );
        let programs: Vec<String> = chain
            .programs(dir.path())
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(programs, ["psql", "python3"]);
        assert_eq!(
            chain.setup_before(3),
            "export PATH=\"$PWD/.venv/bin:$PATH\" && cd . && "
        );
        assert_eq!(chain.left_out_before(3), ["psql"]);
        assert_eq!(chain.commands()[3].text(), "python3 -m pytest -q");
        let activated = Chain::read(". .venv/bin/activate && python -m pytest");
        assert_eq!(
            activated.setup_before(1),
            ". .venv/bin/activate && ",
            "an activated virtual environment is set up first"
        );
    }

    #[test]
    fn a_program_is_looked_up_on_the_path_the_chain_sets() {
        let dir = consort_testkit::disk::tree_of(&[(".venv/bin/pytest-consort-probe", "")]);
        let probe = "pytest-consort-probe";
        for (command, program, on_the_path, why) in [
            (
                "export PATH=\"$PWD/.venv/bin:$PATH\" && pytest-consort-probe -q",
                probe,
                true,
                "an exported PATH",
            ),
            (
                "PATH=.venv/bin:$PATH pytest-consort-probe",
                probe,
                true,
                "its own assignment, a relative entry",
            ),
            (
                "pytest-consort-probe -q",
                probe,
                false,
                "the machine's PATH",
            ),
            (
                ". .venv/bin/activate && pytest-consort-probe",
                probe,
                true,
                "an activated virtual environment leads the PATH",
            ),
            (
                "FOO=1 sh -c true",
                "sh",
                true,
                "the machine's PATH otherwise",
            ),
        ] {
            assert_eq!(
                Chain::read(command).programs(dir.path()),
                [(program.to_string(), on_the_path)],
                "{command}: {why}"
            );
        }
    }
}
