//! The crate's layers, read from its own sources: the pure core (`src/core/`), then the ledger
//! (`src/ledger.rs`), then the work tree (`src/worktree.rs`, `src/worktree/`), then the runtime
//! (`src/runtime/`). A file may name its own layer and the layers before it, never one after:
//! so there is no import circle between them, and the core can be read, tested and replayed
//! without the rest.
//!
//! Every `crate::` path in the code counts (in `use` lines, grouped imports and inline paths);
//! comments do not. The check is a function over plain text, tested once against the real
//! sources and once against sources broken on purpose.

use std::path::Path;

use consort_testkit::sources::{crate_paths, rust_sources};

/// The layers in order: a file may use its own and the ones before it.
const LAYERS: &[&str] = &["core", "ledger", "worktree", "runtime"];

/// The layer of a source file, from its path under `src/` (`None`: the crate root, which wires
/// the layers together).
fn layer_of(rel: &str) -> Option<usize> {
    let first = rel.split('/').next().unwrap_or(rel);
    let module = first.strip_suffix(".rs").unwrap_or(first);
    LAYERS.iter().position(|layer| *layer == module)
}

/// Every layer a `crate::` path in `source` names, with the line its name is on.
fn named_layers(source: &str) -> Vec<(usize, &'static str)> {
    crate_paths(source)
        .into_iter()
        .filter_map(|(line, name)| LAYERS.iter().find(|l| **l == name).map(|l| (line, *l)))
        .collect()
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

/// The crate's sources: (path under `src/` with `/`, text).
fn sources() -> Vec<(String, String)> {
    rust_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
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
