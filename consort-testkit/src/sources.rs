//! Reading a package's own Rust sources, for the tests that check how its modules depend on
//! each other (`consort-actors/tests/machine/layers.rs`, the root's `tests/invariants.rs`).

use std::path::Path;

/// Every `.rs` file under `dir`, sorted, as (path relative to `dir` with `/` between names,
/// text).
pub fn rust_sources(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    collect(dir, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel: Vec<String> = file
                .strip_prefix(dir)
                .expect("under the directory")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let text = std::fs::read_to_string(&file).expect("a source file is readable");
            (rel.join("/"), text)
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without its comments (line comments, doc comments included).
pub fn code_only(source: &str) -> String {
    source
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The source up to its unit-test module (`#[cfg(test)]`), which may use what the module
/// itself must not.
pub fn without_tests(source: &str) -> &str {
    source
        .find("#[cfg(test)]")
        .map_or(source, |at| &source[..at])
}

/// The first name of every `crate::` path in `source` (comments aside), with the line that name
/// is on: `use` lines, grouped imports (`crate::{a::x, b::y}` gives `a` and `b`) and inline
/// paths alike.
pub fn crate_paths(source: &str) -> Vec<(usize, String)> {
    let code = code_only(source);
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let after = at + "crate::".len();
        let rest = &code[after..];
        let names: Vec<(usize, &str)> = match rest.strip_prefix('{') {
            Some(group) => top_level_entries(group)
                .into_iter()
                .map(|(offset, entry)| (after + 1 + offset, entry))
                .collect(),
            None => vec![(after, rest)],
        };
        for (offset, name) in names {
            let skipped = name.len() - name.trim_start().len();
            let ident: String = name[skipped..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !ident.is_empty() {
                let line = code[..offset + skipped].matches('\n').count() + 1;
                found.push((line, ident));
            }
        }
    }
    found
}

/// The top-level entries of a `{…}` group whose opening brace is already consumed, each with
/// its offset in `group`.
fn top_level_entries(group: &str) -> Vec<(usize, &str)> {
    let mut entries = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                entries.push((start, &group[start..i]));
                return entries;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                entries.push((start, &group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    entries
}
