//! `consort serve` end to end: the StockFlow run served on loopback, its gates decided in
//! headless Chromium on the approval page, and what the server refuses: a stale page's hash,
//! a decision without the session's token, another site's origin and a name that is not an
//! address.

use crate::common;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::{consort, consort_in, dir_arg, init_stockflow};
use consort::actors::{Event, GateDecision, GateKind, Ledger};
use consort_testkit::browser::Browser;
use serde_json::{Value, json};

/// Where this test keeps what a person may want to look at after it ran.
fn output_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("test-output")
        .join("serve")
}

/// A running `consort serve`, ended with SIGTERM when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Served {
    fn start(dir: &Path) -> Served {
        let mut child = consort_in("serve", dir)
            .args(["--addr", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("consort serve starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            let line = match lines.next() {
                Some(Ok(line)) => line,
                other => panic!("consort serve ended before it served: {other:?}"),
            };
            if let Some(url) = line
                .split(" at ")
                .nth(1)
                .filter(|u| u.starts_with("http://"))
            {
                break url.trim_end_matches('/').to_string();
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Served { child, base }
    }

    fn port(&self) -> u16 {
        let port = self.base.rsplit(':').next().expect("a port");
        port.parse().expect("a port number")
    }

    /// SIGTERM, and the exit code.
    fn end(mut self) -> Option<i32> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = self.child.wait().expect("wait");
        std::mem::forget(self);
        status.code()
    }
}

/// Runs `test` with a headless browser, on a runtime of its own; closes the browser after it.
fn with_browser(test: impl AsyncFnOnce(&Browser)) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let browser = Browser::start().await.unwrap_or_else(|e| panic!("{e}"));
        test(&browser).await;
        browser.close().await;
    });
}

/// A fresh StockFlow project (in its temporary directory, kept while the test runs), served.
fn served_stockflow() -> (tempfile::TempDir, PathBuf, Served) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("stockflow");
    init_stockflow(&dir);
    let served = Served::start(&dir);
    (tmp, dir, served)
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gate the approval page offers: its kind, hash and the session token in its form.
const GATE: &str = r#"
const f = document.getElementById('decide');
if (!f) return null;
return { gate: f.gate.value, hash: f.hash.value, token: f.token.value,
         shown: document.getElementById('gate-hash').textContent };"#;

/// Opens the approval page until it offers `gate` (the run gets there on its own).
async fn wait_for_gate(browser: &Browser, base: &str, gate: &str) -> Value {
    let start = Instant::now();
    loop {
        browser
            .open(&format!("{base}/approve"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let offered = browser.eval(GATE).await.unwrap_or_else(|e| panic!("{e}"));
        if offered["gate"] == json!(gate) {
            return offered;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the approval page never offered the {gate} gate (last: {offered})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fills the form as a person does and presses `button`; returns the text of the page it
/// leads to.
async fn decide(browser: &Browser, name: &str, note: &str, button: &str) -> String {
    let script = format!(
        "document.getElementById('name').value = {name};\
         document.getElementById('note').value = {note};\
         document.getElementById({button}).click(); return true;",
        name = json!(name),
        note = json!(note),
        button = json!(button),
    );
    act_then_read(
        browser,
        &script,
        "return document.readyState === 'complete' && !document.getElementById('decide') ? document.body.innerText : null",
        "the decision",
    )
    .await
}

/// Submits a form with `fields` from the page now open, as a page that was loaded earlier would.
async fn submit_stale(browser: &Browser, fields: &Value) -> String {
    let script = format!(
        "const f = document.createElement('form'); f.method = 'post'; f.action = '/decide';\
         for (const [k, v] of Object.entries({fields})) {{\
           const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i); }}\
         document.body.appendChild(f); f.submit(); return true;"
    );
    act_then_read(
        browser,
        &script,
        "const m = document.getElementById('message'); return m ? m.textContent : null",
        "the stale form",
    )
    .await
}

/// Runs `script` on the page, then every 100 ms runs `probe` until it returns text, and returns
/// that; fails when `what` has not answered so after 30 seconds.
async fn act_then_read(browser: &Browser, script: &str, probe: &str, what: &str) -> String {
    browser.eval(script).await.unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = browser.eval(probe).await.unwrap_or_else(|e| panic!("{e}"));
        if let Some(text) = answer.as_str() {
            return text.to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} never answered"
        );
    }
}

/// One raw HTTP request to the server; the status code and the body.
fn raw(port: u16, head: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {answer}"));
    (code, answer)
}

/// What another site (or a script without the page) can send: none of it decides a gate.
fn cross_site_requests_are_refused(port: u16, offered: &Value) {
    let form = |token: &str| {
        format!(
            "token={token}&gate={}&hash={}&name=Mallory&decision=approve",
            offered["gate"].as_str().expect("gate"),
            offered["hash"].as_str().expect("hash")
        )
    };
    let token = offered["token"].as_str().expect("token");
    let post = |host: &str, extra: &str| {
        format!(
            "POST /decide HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded{extra}"
        )
    };
    let here = format!("127.0.0.1:{port}");
    let (code, _) = raw(port, &post(&here, ""), &form("not-the-token"));
    assert_eq!(code, 403, "a decision without the session's token");
    let (code, _) = raw(
        port,
        &post(&here, "\r\nOrigin: http://evil.example"),
        &form(token),
    );
    assert_eq!(
        code, 403,
        "a decision from another origin, even with the token"
    );
    let (code, _) = raw(
        port,
        &post(&here, "\r\nSec-Fetch-Site: cross-site"),
        &form(token),
    );
    assert_eq!(code, 403, "a decision the browser marks cross-site");
    let (code, _) = raw(
        port,
        &post(&format!("evil.example:{port}"), ""),
        &form(token),
    );
    assert_eq!(code, 421, "a name that is not an address (DNS rebinding)");
    let (code, answer) = raw(
        port,
        &format!(
            "OPTIONS /decide HTTP/1.1\r\nHost: {here}\r\nOrigin: http://evil.example\r\nAccess-Control-Request-Method: POST"
        ),
        "",
    );
    assert_ne!(code, 200, "no preflight is granted");
    assert!(
        !answer.to_ascii_lowercase().contains("access-control-allow"),
        "no CORS header: {answer}"
    );
}

/// Waits until `consort status` says the run is in `phase`.
fn wait_for_phase(dir: &Path, phase: &str) {
    let start = Instant::now();
    loop {
        let o = common::run(consort().args(["status", "--json"]).args(dir_arg(dir)));
        let status: Value = serde_json::from_slice(&o.stdout).expect("status JSON");
        if status["phase"] == json!(phase) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "never {phase}: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The gate decisions in the ledger: gate, approver, note.
fn gate_events(dir: &Path) -> Vec<(GateKind, String, String, bool)> {
    let project = consort::Project::open(dir).expect("project");
    Ledger::<Event>::read(project.ledger_path())
        .expect("ledger")
        .into_iter()
        .filter_map(|e| match e.event {
            Event::Gate { approval } => Some((
                approval.gate,
                approval.approver,
                approval.note,
                approval.decision == GateDecision::Approve,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn gates_decided_on_the_served_page_move_the_run_to_done_and_nothing_else_decides_them() {
    let (_tmp, dir, served) = served_stockflow();
    let base = served.base.clone();
    with_browser(async |browser| {
        let design = wait_for_gate(browser, &base, "design").await;
        assert_eq!(
            design["shown"], design["hash"],
            "the page shows the hash it decides"
        );
        let errors = browser
            .console_errors()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            errors.is_empty(),
            "the approval page loads without errors: {errors:?}"
        );
        let design_section = browser
            .texts("#design")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            design_section
                .iter()
                .any(|t| t.contains("0001_stock_records")),
            "the approval page shows what the design gate approves: {design_section:?}"
        );
        let shot = output_dir().join("approve-design.png");
        let bytes = browser
            .screenshot(&shot)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(bytes > 10_000, "a real screenshot at {}", shot.display());

        cross_site_requests_are_refused(served.port(), &design);
        assert!(
            gate_events(&dir).is_empty(),
            "nothing refused reached the ledger"
        );

        let after = decide(browser, "Ada Lovelace", "the stories read right", "approve").await;
        assert!(
            after.contains("The design gate was approved by Ada Lovelace"),
            "the report says what was recorded: {after}"
        );

        // The run goes on by itself to the deploy gate; the design page's hash is stale now.
        let deploy = wait_for_gate(browser, &base, "deploy").await;
        assert_ne!(deploy["hash"], design["hash"]);
        let stale = json!({"token": deploy["token"], "gate": "deploy", "hash": design["hash"],
                           "name": "Ada Lovelace", "note": "", "decision": "approve"});
        let said = submit_stale(browser, &stale).await;
        assert!(
            said.contains("nothing was recorded")
                && said.contains(deploy["hash"].as_str().expect("hash")),
            "a stale page cannot approve the newer hash: {said}"
        );
        assert_eq!(
            gate_events(&dir).len(),
            1,
            "the stale decision was not recorded"
        );

        wait_for_gate(browser, &base, "deploy").await;
        decide(browser, "Grace Hopper", "", "approve").await;
        wait_for_gate(browser, &base, "promote").await;
        decide(
            browser,
            "Grace Hopper",
            "migrations are additive",
            "approve",
        )
        .await;
    });

    // Done: the ledger holds the three decisions as `consort approve` records them.
    wait_for_phase(&dir, "done");
    assert_eq!(
        gate_events(&dir),
        vec![
            (
                GateKind::Design,
                "Ada Lovelace".into(),
                "the stories read right".into(),
                true
            ),
            (GateKind::Deploy, "Grace Hopper".into(), String::new(), true),
            (
                GateKind::Promote,
                "Grace Hopper".into(),
                "migrations are additive".into(),
                true
            ),
        ]
    );
    assert_eq!(
        served.end(),
        Some(0),
        "SIGTERM after done ends the server with the run's code"
    );
}

#[test]
fn a_rejection_on_the_page_needs_a_note_and_halts_the_run_for_a_human() {
    let (_tmp, dir, served) = served_stockflow();
    let base = served.base.clone();
    with_browser(async |browser| {
        wait_for_gate(browser, &base, "design").await;
        let said = decide(browser, "Ada Lovelace", "", "reject").await;
        assert!(said.contains("a rejection needs a note"), "{said}");
        assert!(gate_events(&dir).is_empty(), "nothing was recorded");
        wait_for_gate(browser, &base, "design").await;
        let said = decide(browser, "Ada Lovelace", "S2 must show par levels", "reject").await;
        assert!(
            said.contains("The design gate was rejected by Ada Lovelace"),
            "{said}"
        );
    });
    wait_for_phase(&dir, "halted");
    assert_eq!(
        gate_events(&dir),
        vec![(
            GateKind::Design,
            "Ada Lovelace".into(),
            "S2 must show par levels".into(),
            false
        )]
    );
    assert_eq!(served.end(), Some(4), "a halted run's exit code");
}
