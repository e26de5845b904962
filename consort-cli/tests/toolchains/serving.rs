//! Suites that serve and connect on loopback, and open ptys, run to done with the sandbox on:
//! the runner conformance matrix's cases for what real projects do — an Express API tested
//! with supertest (jest 29), a vitest test that starts an HTTP server, Go's
//! `httptest.NewServer`, and a pytest test that serves from a thread and writes to a pty.
//! Each RED and GREEN is a real verdict in a run confined in namespaces of its own (a
//! network with only its branch forwarded in, a devpts instance), and each receipt says so.

use std::path::Path;

use crate::adopt::{GO_SHELF, adopt_and_run, adopt_and_run_with, repo_of, script};
use crate::common::{ledger_text, toolchain, write};

/// Every run of the project in `dir` had a network and ptys of its own: the receipts say
/// `namespaced` with `own_network`, and none says otherwise.
fn every_run_had_a_network_of_its_own(dir: &Path) {
    let ledger = ledger_text(dir);
    let confined = ledger.matches("\"own_network\":true").count();
    assert!(
        confined >= 3,
        "RED, GREEN and the reviews ran namespaced: {ledger}"
    );
    assert!(!ledger.contains("\"own_network\":false"), "{ledger}");
    assert!(!ledger.contains("\"confinement\":\"off\""), "{ledger}");
}

/// An Express API tested with supertest (jest 29, CommonJS): every test starts the app on an
/// ephemeral loopback port and connects to it.
#[test]
fn an_express_api_tested_with_supertest_runs_to_done_confined() {
    let modules = toolchain::npm(
        "jest29-supertest",
        &[
            "jest@29",
            "jest-junit@16",
            "pg@8",
            "express@4",
            "supertest@7",
        ],
        "jest",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(
        dir,
        &[
            (
                "package.json",
                r#"{"name":"shelf-api","version":"1.0.0","private":true,"devDependencies":{"jest":"*","pg":"^8","express":"^4","supertest":"^7"}}"#,
            ),
            (
                "src/counts.js",
                "exports.total = async function total(client) {\n  throw new Error('not built yet');\n};\n",
            ),
            (
                "src/app.js",
                r#"const express = require('express');
const { total } = require('./counts');

exports.makeApp = function makeApp(client) {
  const app = express();
  app.get('/health', (req, res) => res.json({ ok: true }));
  app.get('/total', (req, res, next) => {
    total(client).then((t) => res.json({ total: t }), next);
  });
  return app;
};
"#,
            ),
            (
                "test/health.test.js",
                r#"const request = require('supertest');
const { makeApp } = require('../src/app');

test('the API answers its health check', async () => {
  const res = await request(makeApp(null)).get('/health');
  expect(res.status).toBe(200);
});
"#,
            ),
            (
                "migrations/0001_counts.sql",
                "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
            ),
        ],
    );
    toolchain::install_node_modules(&modules, dir);
    let test = r#"const pg = require('pg');
const request = require('supertest');
const { makeApp } = require('../src/app');

test('the total is served', async () => {
  const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query("INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)");
    const res = await request(makeApp(client)).get('/total');
    expect(res.status).toBe(200);
    expect(res.body.total).toBe(7);
  } finally {
    await client.end();
  }
});
"#;
    let code = "exports.total = async function total(client) {\n  const r = await client.query('SELECT coalesce(sum(qty), 0)::int AS t FROM counts');\n  return r.rows[0].t;\n};\n";
    let doctor = served_total_runs(dir, "jest", test, code);
    assert!(doctor.contains("collects 1 test file ("), "{doctor}");
    every_run_had_a_network_of_its_own(dir);
}

/// A vitest test that starts an HTTP server on loopback and fetches from it.
#[test]
fn a_vitest_test_serving_on_loopback_runs_to_done_confined() {
    let modules = toolchain::npm("vitest3", &["vitest@3", "pg@8"], "vitest");
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write(
        dir,
        &[
            (
                "package.json",
                r#"{"name":"shelf","version":"1.0.0","private":true,"type":"module","devDependencies":{"vitest":"*","pg":"^8"}}"#,
            ),
            (
                "src/counts.js",
                "export async function total(client) {\n  throw new Error('not built yet');\n}\n",
            ),
            (
                "test/existing.test.js",
                "import { test, expect } from 'vitest';\nimport { total } from '../src/counts.js';\ntest('the module loads', () => {\n  expect(typeof total).toBe('function');\n});\n",
            ),
            (
                "migrations/0001_counts.sql",
                "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
            ),
        ],
    );
    toolchain::install_node_modules(&modules, dir);
    let test = r#"import http from 'node:http';
import pg from 'pg';
import { test, expect } from 'vitest';
import { total } from '../src/counts.js';

test('the total is served', async () => {
  const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  const server = http.createServer(async (req, res) => {
    try {
      res.end(JSON.stringify({ total: await total(client) }));
    } catch (e) {
      res.statusCode = 500;
      res.end(String(e));
    }
  });
  await new Promise((ready) => server.listen(0, '127.0.0.1', ready));
  try {
    await client.query("INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)");
    const res = await fetch(`http://127.0.0.1:${server.address().port}/total`);
    expect(res.status).toBe(200);
    expect((await res.json()).total).toBe(7);
  } finally {
    server.close();
    await client.end();
  }
});
"#;
    let code = "export async function total(client) {\n  const r = await client.query('SELECT coalesce(sum(qty), 0)::int AS t FROM counts');\n  return r.rows[0].t;\n}\n";
    served_total_runs(dir, "vitest", test, code);
    every_run_had_a_network_of_its_own(dir);
}

/// The Node project in `dir`, adopted (init finds `tool`) and run with
/// [`served_total_script`]'s feature; what doctor said.
fn served_total_runs(dir: &Path, tool: &str, test: &str, code: &str) -> String {
    let (init, doctor) = adopt_and_run(dir, &served_total_script(test, code));
    assert!(init.contains(&format!("detected Node ({tool})")), "{init}");
    doctor
}

/// The script of the Node cases' feature: T1's `test` in `test/t1_total.test.js` ("the total
/// is served"), its GREEN's `code` in `src/counts.js`.
fn served_total_script(test: &str, code: &str) -> String {
    let path = "test/t1_total.test.js";
    script(
        path,
        &format!("{path}::the total is served"),
        test,
        "src/counts.js",
        code,
    )
}

/// Go's `httptest.NewServer`: the test serves its handler on loopback and calls it; the
/// branch is reached through `psql`.
#[test]
fn a_go_httptest_server_runs_to_done_confined() {
    let tmp = repo_of(&GO_SHELF);
    let dir = tmp.path();
    let test = r#"package shelf

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"testing"
)

func TestTotalServed(t *testing.T) {
	sql := "INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)"
	if out, err := exec.Command("psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql).CombinedOutput(); err != nil {
		t.Fatalf("psql: %v: %s", err, out)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, Total([]int{3, 4}))
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	if string(body) != "7" {
		t.Fatalf("served %q", body)
	}
}
"#;
    let code = "package shelf\n\n// Total is the sum of the quantities.\nfunc Total(quantities []int) int {\n\tsum := 0\n\tfor _, q := range quantities {\n\t\tsum += q\n\t}\n\treturn sum\n}\n";
    let script = script("total_test.go", "TestTotalServed", test, "shelf.go", code);
    let (init, _) = adopt_and_run(dir, &script);
    assert!(init.contains("detected Go (go test)"), "{init}");
    every_run_had_a_network_of_its_own(dir);
}

/// pytest: the test serves from a thread with `http.server`, fetches from it, and writes what
/// it got to a pty of its own (`pty.openpty`), as CLI tests driven through a terminal do.
#[test]
fn a_pytest_test_serving_from_a_thread_and_opening_a_pty_runs_to_done_confined() {
    let bin = toolchain::pytest8();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    crate::shared_file::counts_project(dir, crate::shared_file::IMPORTS_THE_APP);
    let test = r#"import os
import pty
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.request import urlopen

import psycopg


def test_the_total_is_served_and_shown_on_a_terminal():
    from app import counts

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute("INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)")

        class Total(BaseHTTPRequestHandler):
            def do_GET(self):
                body = str(counts.total(conn)).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = HTTPServer(("127.0.0.1", 0), Total)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            got = urlopen(f"http://127.0.0.1:{server.server_port}/", timeout=10).read()
        finally:
            server.shutdown()
    main, term = pty.openpty()
    os.write(term, got + b"\n")
    assert os.read(main, 16).strip() == b"7"
"#;
    let code = "def total(conn):\n    return conn.execute(\"SELECT coalesce(sum(qty), 0) FROM counts\").fetchone()[0]\n";
    let script = script(
        "tests/test_t1_total.py",
        "tests.test_t1_total::test_the_total_is_served_and_shown_on_a_terminal",
        test,
        "app/counts.py",
        code,
    );
    let path = toolchain::path_with(&bin);
    let (init, _, _) = adopt_and_run_with(dir, &script, Some(&path));
    assert!(init.contains("detected Python (pytest)"), "{init}");
    every_run_had_a_network_of_its_own(dir);
}
