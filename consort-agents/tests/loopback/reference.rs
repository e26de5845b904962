//! `docs/ARTIFACTS.md` is the reference of every artifact's fields, generated from the schemas;
//! this test fails when the file in the repository is not what the schemas say today.
//! `CONSORT_BLESS=1 cargo test -p consort-agents --test loopback -- reference::` rewrites it.

use std::path::PathBuf;

fn reference_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/ARTIFACTS.md")
}

#[test]
fn the_artifact_reference_is_up_to_date() {
    let path = reference_path();
    let fresh = consort_agents::artifact_reference();
    if std::env::var_os("CONSORT_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write docs/ARTIFACTS.md");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("docs/ARTIFACTS.md cannot be read ({e}); write it with CONSORT_BLESS=1")
    });
    assert!(
        on_disk == fresh,
        "docs/ARTIFACTS.md is stale: the artifact schemas changed. Regenerate it with \
         `CONSORT_BLESS=1 cargo test -p consort-agents --test loopback -- reference::` and commit it."
    );
}
