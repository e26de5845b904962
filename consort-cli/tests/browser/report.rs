//! `consort report`: the StockFlow example run to done, its report loaded from `file://` in
//! headless Chromium (no console errors, every test of the run on the timeline with its RED
//! and GREEN receipts, the approvals, the generated lifecycle, a screenshot), and the report
//! of a run that has not started.

use std::path::{Path, PathBuf};

use crate::common::{approving_run, assert_exit, consort, dir_arg, init_stockflow, run};
use consort::actors::{GateDecision, Phase};
use consort_testkit::browser::Browser;
use serde_json::Value;

/// What a hostile line in the request would do if it were not escaped.
const HOSTILE: &str =
    "<script>window.__injected = 1</script><img src=x onerror=\"window.__injected = 2\">";

/// Where this test keeps what a person may want to look at after it ran.
fn output_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("test-output")
        .join("report")
}

/// A fresh browser with `page` open from `file://`, and the errors its log holds.
async fn opened(page: &Path) -> (Browser, Vec<String>) {
    let browser = Browser::start().await.unwrap_or_else(|e| panic!("{e}"));
    browser
        .open(&Browser::file_url(page))
        .await
        .expect("the page opens");
    let errors = browser.console_errors().await.expect("the browser log");
    (browser, errors)
}

/// StockFlow run to done, its request carrying [`HOSTILE`].
fn stockflow_done(dir: &Path) -> consort::Project {
    init_stockflow(dir);
    let project = consort::Project::open(dir).expect("project");
    let request = dir.join(&project.feature_entry().request);
    let mut body = std::fs::read_to_string(&request).expect("request");
    body.push_str(&format!("\nA note from a hostile user: {HOSTILE}\n"));
    std::fs::write(&request, body).expect("write request");
    let o = run(&mut approving_run(dir));
    assert_exit(&o, 0, "the StockFlow run reaches done");
    project
}

/// Every test-list entry on the page's timeline: its id, and whether it has a RED receipt
/// that failed and a GREEN (or repair) receipt that passed everything.
const TIMELINE: &str = r#"
return [...document.querySelectorAll('#timeline .test')].map(t => ({
  id: t.dataset.test,
  red: [...t.querySelectorAll('.step.red .receipt')].some(r => Number(r.dataset.failed) > 0),
  green: [...t.querySelectorAll('.step.green .receipt, .step.repair .receipt')]
    .some(r => Number(r.dataset.failed) === 0 && Number(r.dataset.passed) > 0),
  authors: [...t.querySelectorAll('.author')].map(a => a.textContent),
}));"#;

#[test]
fn the_report_of_the_stockflow_run_loads_in_chromium_and_shows_every_test() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("stockflow");
    let project = stockflow_done(&dir);
    let state = project.state().expect("state");
    let page = tmp.path().join("report.html");
    let o = run(consort()
        .arg("report")
        .args(dir_arg(&dir))
        .arg("--out")
        .arg(&page));
    assert_exit(&o, 0, "consort report");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        page.display().to_string(),
        "it prints the path it wrote"
    );
    let html = std::fs::read_to_string(&page).expect("the report");
    for external in ["http://", "https://", "<link", "src=\"http"] {
        assert!(!html.contains(external), "the page refers to {external}");
    }
    assert!(!html.contains(HOSTILE), "the request's markup is escaped");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (browser, errors) = opened(&page).await;
        assert!(errors.is_empty(), "the page logs errors: {errors:#?}");
        let injected = browser
            .eval("return window.__injected === undefined")
            .await
            .expect("eval");
        assert_eq!(injected, Value::Bool(true), "the hostile request ran");

        let timeline = browser.eval(TIMELINE).await.expect("timeline");
        let shown: Vec<&str> = timeline
            .as_array()
            .expect("a list")
            .iter()
            .map(|t| t["id"].as_str().unwrap_or_default())
            .collect();
        let planned: Vec<&str> = state
            .test_list
            .as_ref()
            .expect("a test list")
            .entries
            .iter()
            .map(|e| e.id.as_str())
            .collect();
        assert_eq!(shown, planned, "the timeline shows every test of the run, in order");
        for t in timeline.as_array().into_iter().flatten() {
            assert_eq!(t["red"], Value::Bool(true), "{} has a failing RED receipt", t["id"]);
            assert_eq!(t["green"], Value::Bool(true), "{} has a passing GREEN receipt", t["id"]);
            let authors = t["authors"].as_array().map_or(0, Vec::len);
            assert!(authors >= 3, "{} names who wrote each step", t["id"]);
        }

        let approvals = browser
            .texts("#approvals tr.approval.approved")
            .await
            .expect("approvals");
        assert_eq!(approvals.len(), state.approvals.len(), "{approvals:#?}");
        for (row, approval) in approvals.iter().zip(&state.approvals) {
            assert!(matches!(approval.decision, GateDecision::Approve));
            assert!(row.contains(&approval.gate.to_string()), "{row}");
            assert!(row.contains("ada"), "{row}");
        }

        let phases = browser
            .eval("return [...document.querySelectorAll('#lifecycle [data-phase]')].map(p => p.dataset.phase)")
            .await
            .expect("phases");
        for phase in Phase::ALL {
            assert!(
                phases.as_array().into_iter().flatten().any(|p| p == phase.as_str()),
                "the lifecycle lacks {phase}"
            );
        }
        let current = browser
            .texts("#lifecycle .phase.current")
            .await
            .expect("current");
        assert_eq!(current, vec!["done".to_string()], "the run's phase is marked");

        let png = output_dir().join("report.png");
        let bytes = browser.screenshot(&png).await.expect("screenshot");
        browser.close().await;
        let written = std::fs::read(&png).expect("the screenshot");
        assert_eq!(written.len() as u64, bytes);
        assert!(written.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
        assert!(bytes > 50_000, "the screenshot shows something: {bytes} bytes");
    });
}

#[test]
fn the_report_of_a_run_that_has_not_started_says_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    init_stockflow(tmp.path());
    let o = run(consort().arg("report").args(dir_arg(tmp.path())));
    assert_exit(&o, 2, "a report before the run is a usage error");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("has not started"), "{err}");
    assert!(err.contains("consort run"), "{err}");
    assert!(
        !tmp.path()
            .join(".consort/features")
            .join("F1-warehouse-stock")
            .join("report.html")
            .exists(),
        "nothing is written"
    );
}

#[test]
fn the_browsers_error_check_sees_a_page_that_throws() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let page = tmp.path().join("broken.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><title>broken</title><script>throw new Error('boom')</script>",
    )
    .expect("write");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (browser, errors) = opened(&page).await;
        browser.close().await;
        assert!(
            errors.iter().any(|e| e.contains("boom")),
            "the thrown error is in the log: {errors:#?}"
        );
    });
}
