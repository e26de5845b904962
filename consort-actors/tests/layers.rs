//! The crate's layers, read from its own sources: the pure core (`src/core/`), then the ledger
//! (`src/ledger.rs`), then the work tree (`src/worktree.rs`, `src/worktree/`), then the runtime
//! (`src/runtime/`). A file may name its own layer and the layers before it, never one after:
//! so there is no import circle between them, and the core can be read, tested and replayed
//! without the rest.
//!
//! Every `crate::` path in the code counts (in `use` lines, grouped imports and inline paths);
//! comments do not. The check is a function over plain text, tested once against the real
//! sources and once against sources broken on purpose.

use std::path::{Path, PathBuf};

/// The layers in order: a file may use its own and the ones before it.
const LAYERS: &[&str] = &["core", "ledger", "worktree", "runtime"];

/// The layer of a source file, from its path under `src/` (`None`: the crate root, which wires
/// the layers together).
fn layer_of(rel: &str) -> Option<usize> {
    let first = rel.split('/').next().unwrap_or(rel);
    let module = first.strip_suffix(".rs").unwrap_or(first);
    LAYERS.iter().position(|layer| *layer == module)
}

/// The source without its comments (line comments, doc comments included).
fn code_only(source: &str) -> String {
    source
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every layer a `crate::` path in `source` names, with the line its name is on.
fn named_layers(source: &str) -> Vec<(usize, &'static str)> {
    let code = code_only(source);
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let after = at + "crate::".len();
        let rest = &code[after..];
        // `crate::{a::x, b::{y, z}}`: the first name of each top-level entry, each with its
        // offset in the code.
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
            if let Some(layer) = LAYERS.iter().find(|l| **l == ident) {
                let line = code[..offset + skipped].matches('\n').count() + 1;
                found.push((line, *layer));
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

/// Every use of a later layer, as `file:line uses crate::layer`.
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, source) in files {
        let Some(own) = layer_of(rel) else { continue };
        for (line, layer) in named_layers(source) {
            if layer_of(layer).is_some_and(|named| named > own) {
                found.push(format!(
                    "{rel}:{line} ({}) uses crate::{layer}",
                    LAYERS[own]
                ));
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crate's sources: (path under `src/` with `/`, text).
fn sources() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(&src).expect("under src");
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let text = std::fs::read_to_string(&file).expect("a source file is readable");
            (rel.join("/"), text)
        })
        .collect()
}

#[test]
fn each_layer_uses_only_itself_and_the_layers_before_it() {
    let files = sources();
    for layer in LAYERS {
        assert!(
            files
                .iter()
                .any(|(rel, _)| layer_of(rel) == layer_of(layer)),
            "the layer {layer} has sources"
        );
    }
    assert_eq!(violations(&files), Vec::<String>::new());
}

#[test]
fn a_use_of_a_later_layer_is_caught_in_every_spelling() {
    let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let files = [
        file("core/artifact.rs", "use crate::runtime::gate::BoxFuture;\n"),
        file(
            "ledger.rs",
            "use crate::{\n    core::hash::ContentHash,\n    worktree::WorkTree,\n};\n",
        ),
        file(
            "core/machine/mod.rs",
            "fn f() {\n    let _ = crate::ledger::Ledger::open;\n}\n",
        ),
        file(
            "core/step.rs",
            "// crate::runtime in a comment\n/// [`crate::runtime`] in a doc link\nuse crate::core::role::Role;\n",
        ),
        file(
            "runtime/conductor/mod.rs",
            "use crate::{core::x, ledger::y, worktree::z};\n",
        ),
        file("lib.rs", "use crate::runtime::conductor;\n"),
    ];
    assert_eq!(
        violations(&files),
        [
            "core/artifact.rs:1 (core) uses crate::runtime",
            "ledger.rs:3 (ledger) uses crate::worktree",
            "core/machine/mod.rs:2 (core) uses crate::ledger",
        ]
    );
}
