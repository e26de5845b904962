//! The library examples a newcomer copies from run to done as they stand: `embed` (the README's
//! "Embedding" code) and `custom_agent` (one role swapped for an agent of your own).

use std::process::{Command, Stdio};

use consort_testkit::process::{built_example, text};

fn run(name: &str) -> String {
    let out = Command::new(built_example(name))
        .stdin(Stdio::null())
        .output()
        .expect("the example starts");
    let said = text(&out);
    assert!(out.status.success(), "{name}: {said}");
    assert!(said.contains("outcome: done"), "{name}: {said}");
    said
}

#[test]
fn the_embedding_example_runs_to_done_followed_by_a_subscriber() {
    let said = run("embed");
    // A StockFlow run records well over a hundred entries; the subscriber saw each one.
    let followed: usize = said
        .lines()
        .find_map(|l| l.strip_prefix("followed ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("the subscriber's count: {said}"));
    assert!(followed > 100, "{said}");
}

#[test]
fn a_navigator_of_your_own_reviews_every_test_and_the_run_reaches_done() {
    let said = run("custom_agent");
    for t in 1..=10 {
        let line = said
            .lines()
            .find(|l| l.starts_with(&format!("review/T{t}/0: approve: read ")))
            .unwrap_or_else(|| panic!("no review of T{t} by the custom agent: {said}"));
        assert!(
            line.contains("tests/"),
            "the review read the entry's test: {line}"
        );
    }
}

#[test]
fn the_guide_s_embedding_code_is_the_example_that_runs() {
    let example = include_str!("../examples/embed.rs");
    let page = include_str!("../docs/guide/src/embedding.md");
    let block = page
        .split("# Embedding\n")
        .nth(1)
        .and_then(|s| s.split("```rust,no_run\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("the guide's Embedding page has a rust block");
    let code: String = example
        .lines()
        .skip_while(|l| l.starts_with("//!") || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        block, code,
        "the guide's Embedding code differs from examples/embed.rs"
    );
}
