//! The library examples a newcomer copies from run to done as they stand: `embed` (the guide's
//! "Embedding" code), `custom_agent` (one role swapped for an agent of your own in a builder)
//! and `embed_project` (a project opened from its `consort.toml` with one role of its own).

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

/// `git log` of the feature's branch in `dir`: each commit's tree and subject, oldest first.
fn trees_and_subjects(dir: &std::path::Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "log",
            "--reverse",
            "--format=%T %s",
            "consort/F1-warehouse-stock",
        ])
        .output()
        .expect("git");
    assert!(out.status.success(), "git log: {}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Issue 50's one route: a project opened from its `consort.toml` with one role played by the
/// embedder's own agent reaches done with the same commits (tree for tree) and migration files
/// as the project driven with its configured agents, as `consort run` drives it. Two
/// subscribers to that second run each see every ledger entry once, in order.
#[test]
fn an_embedded_project_with_a_driver_of_its_own_commits_what_consort_run_commits() {
    let root = tempfile::tempdir().expect("tempdir");
    let embedded = root.path().join("embedded");
    std::fs::create_dir(&embedded).expect("mkdir");
    let out = Command::new(built_example("embed_project"))
        .arg(&embedded)
        .stdin(Stdio::null())
        .output()
        .expect("the example starts");
    let said = text(&out);
    assert!(
        out.status.success() && said.contains("outcome: done"),
        "{said}"
    );
    let steps: usize = said
        .lines()
        .find_map(|l| {
            l.strip_prefix("my driver took ")?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the driver's count: {said}"));
    assert!(steps >= 10, "the own driver played every GREEN: {said}");

    // The same project before the run, driven with the configured agents.
    let plain = root.path().join("plain");
    let clone = Command::new("git")
        .args(["clone", "-q", "-b", "main"])
        .arg(&embedded)
        .arg(&plain)
        .output()
        .expect("git clone");
    assert!(clone.status.success(), "{}", text(&clone));
    let script = ".consort/agents/stockflow.toml";
    std::fs::create_dir_all(plain.join(".consort/agents")).expect("mkdir");
    std::fs::copy(embedded.join(script), plain.join(script)).expect("the script");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let outcome = runtime.block_on(async {
        let project = consort::Project::open(&plain).expect("the project");
        let opts = consort::RunOptions {
            approver: Some(std::sync::Arc::new(consort::ApproveAs {
                name: "ada".into(),
            })),
            ..consort::RunOptions::default()
        };
        let ensemble = project.ensemble(opts).await.expect("the ensemble");
        // Two subscribers follow the run; each collects the ledger entries it is sent.
        let followers: Vec<_> = (0..2)
            .map(|_| {
                let mut events = ensemble.subscribe();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    loop {
                        match events.recv().await {
                            Ok(consort::actors::RunEvent::Recorded(e)) => {
                                seen.push((e.seq, e.hash))
                            }
                            Ok(_) => {}
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => break seen,
                            Err(lagged) => panic!("a subscriber lagged: {lagged}"),
                        }
                    }
                })
            })
            .collect();
        let outcome = ensemble.run().await.map(|r| r.outcome);
        ensemble.shutdown().await;
        let mut seen = Vec::new();
        for f in followers {
            seen.push(f.await.expect("a follower"));
        }
        (outcome.expect("the run"), seen)
    });
    let (outcome, seen) = outcome;
    assert_eq!(outcome, consort::RunOutcome::Done);
    // Each saw every ledger entry once, in order: the ledger `consort log` prints.
    let ledger: Vec<_> = consort::Project::open(&plain)
        .expect("the project")
        .entries()
        .expect("the ledger")
        .into_iter()
        .map(|e| (e.seq, e.hash))
        .collect();
    assert!(ledger.len() > 100, "{}", ledger.len());
    for followed in seen {
        assert_eq!(
            followed, ledger,
            "a subscriber saw the ledger, entry for entry"
        );
    }

    let ours = trees_and_subjects(&embedded);
    assert!(ours.len() > 20, "a commit per verified step: {ours:?}");
    assert_eq!(
        ours,
        trees_and_subjects(&plain),
        "the same commits, tree for tree"
    );
    let migrations = |dir: &std::path::Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("migrations"))
            .expect("the design's migrations")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert!(!migrations(&embedded).is_empty());
    assert_eq!(migrations(&embedded), migrations(&plain));
}
