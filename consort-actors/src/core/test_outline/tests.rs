//! Each language: what a RED may add beside accepted tests, and each cheat that may not ride
//! along (issue 45, point 2), refused with a reason naming it.

use super::judge;

/// `new` is accepted as a RED's version of `old`.
fn allowed(path: &str, old: &str, new: &str) {
    if let Err(e) = judge(path, old, new, None) {
        panic!("refused, but it only adds: {e}\n--- new:\n{new}");
    }
}

/// `new` is refused, with a reason that says `says`.
fn refused(path: &str, old: &str, new: &str, says: &str) {
    match judge(path, old, new, None) {
        Ok(()) => panic!("accepted, but it should be refused ({says})\n--- new:\n{new}"),
        Err(e) => assert!(
            e.to_string().contains(says),
            "the refusal `{e}` does not say `{says}`"
        ),
    }
}

const PY: &str = r#""""Queue statistics."""
import pytest
from broker.stats import queue_stats

@pytest.fixture
def client(db):
    return make_client(db)

def make_client(db):
    return db.client()

def test_counts_messages(client, db):
    assert queue_stats(client)["messages"] == 0

class TestDepth:
    def test_empty(self, client):
        assert queue_stats(client)["depth"] == 0
"#;

fn py_with(extra: &str) -> String {
    format!("{PY}{extra}")
}

#[test]
fn python_a_red_may_add_tests_imports_fixtures_and_helpers() {
    let new = PY.replace(
        "from broker.stats import queue_stats",
        "from broker.stats import queue_stats, queue_age\nimport json",
    ) + r#"
@pytest.fixture
def aged(client):
    return client.age()

def age_of(x):
    return queue_age(x)

def test_reports_age(client, aged):
    assert age_of(client) == json.loads("0")

class TestAge:
    def setup_method(self):
        self.x = 1

    def test_zero(self, client):
        assert queue_age(client) == 0
"#;
    allowed("tests/func/test_queue_stats.py", PY, &new);
    // A new test method in a class that holds accepted ones.
    let new = PY.replace(
        "        assert queue_stats(client)[\"depth\"] == 0\n",
        "        assert queue_stats(client)[\"depth\"] == 0\n\n    def test_one(self, client):\n        assert queue_stats(client)[\"depth\"] == 1\n",
    );
    allowed("tests/func/test_queue_stats.py", PY, &new);
}

#[test]
fn a_name_an_accepted_test_binds_itself_may_be_defined_beside_it() {
    let old = "def test_a():\n    conn = 1\n    for row in [conn]:\n        assert row\n";
    allowed(
        "tests/test_a.py",
        old,
        &format!("{old}\n\ndef conn():\n    return 2\n\n\ndef test_b():\n    assert conn() == 2\n"),
    );
    let old = "test('a', () => {\n  const res = 1;\n  expect(res).toBe(1);\n});\n";
    allowed(
        "a.test.js",
        old,
        &format!("{old}\nconst res = 2;\ntest('b', () => {{\n  expect(res).toBe(2);\n}});\n"),
    );
    // A parameter of a pytest test is a fixture it asks for: a new definition of it shadows.
    refused(
        "tests/test_a.py",
        "def test_a(conn):\n    assert conn\n",
        "def test_a(conn):\n    assert conn\n\n\ndef conn():\n    return 2\n",
        "defines `conn`, a name the accepted tests of this file use",
    );
}

#[test]
fn python_cheats_are_refused() {
    let path = "tests/func/test_queue_stats.py";
    let cases: Vec<(String, &str)> = vec![
        (
            PY.replace(
                "def test_counts_messages(client, db):\n",
                "def test_counts_messages(client, db):\n    return\n",
            ),
            "test `test_counts_messages` (line 12) was changed",
        ),
        (
            PY.replace("== 0\n\nclass", "== 1\n\nclass"),
            "`test_counts_messages` (line 12) was changed",
        ),
        (
            PY.replace(
                "def test_counts_messages",
                "@pytest.mark.skip\ndef test_counts_messages",
            ),
            "test `test_counts_messages`",
        ),
        (
            PY.replace(
                "def test_counts_messages",
                "@pytest.mark.xfail\ndef test_counts_messages",
            ),
            "test `test_counts_messages`",
        ),
        (
            py_with(
                "\n@pytest.fixture(autouse=True)\ndef patched(monkeypatch):\n    monkeypatch.setattr('x', 1)\n",
            ),
            "would apply to the accepted tests",
        ),
        (
            py_with("\npytestmark = pytest.mark.skip\n"),
            "would apply to the accepted tests",
        ),
        (
            py_with("\npytest.skip('later', allow_module_level=True)\n"),
            "would apply to the accepted tests",
        ),
        (
            py_with("\ndef setup_module():\n    pass\n"),
            "would apply to the accepted tests",
        ),
        (
            py_with("\n@pytest.fixture\ndef db():\n    return None\n"),
            "defines `db`, a name the accepted tests of this file use",
        ),
        (
            py_with("\ndef make_client(db):\n    return None\n"),
            "defines `make_client`, a name the accepted tests of this file already have defined",
        ),
        (
            py_with("\nqueue_stats = lambda c: {}\n"),
            "defines `queue_stats`",
        ),
        (
            PY.replace(
                "    assert queue_stats(client)[\"messages\"] == 0\n",
                "    stats = queue_stats(client)\n    assert stats[\"messages\"] == 0\n",
            ) + "\nstats = None\n",
            "`test_counts_messages` (line 12) was changed",
        ),
        (
            PY.replace("return db.client()", "return db.other()"),
            "`def make_client(db):` (line 9), which the accepted tests share, is gone or changed",
        ),
        (
            PY.replace(
                "from broker.stats import queue_stats",
                "from broker.fake import queue_stats",
            ),
            "`from broker.stats import queue_stats`",
        ),
        (
            PY.replace(
                "def test_counts_messages",
                "def test_counts_messages_renamed",
            ),
            "test `test_counts_messages` (line 12) is gone",
        ),
        (
            py_with("\ndef test_counts_messages(client):\n    assert False\n"),
            "has the name of an accepted test",
        ),
    ];
    for (new, says) in cases {
        refused(path, PY, &new, says);
    }
}

#[test]
fn python_class_cheats_and_broken_files_are_refused() {
    let path = "tests/func/test_queue_stats.py";
    let cases: Vec<(String, &str)> = vec![
        (
            PY.replace("class TestDepth:", "@pytest.mark.skip\nclass TestDepth:"),
            "the header of group `TestDepth`",
        ),
        (
            PY.replace(
                "class TestDepth:\n",
                "class TestDepth:\n    def setup_method(self):\n        pass\n\n",
            ),
            "in `TestDepth` would apply to the accepted tests",
        ),
        (py_with("\ndef test_broken(:\n"), "does not parse"),
    ];
    for (new, says) in cases {
        refused(path, PY, &new, says);
    }
}

#[test]
fn a_redo_opens_only_the_named_test() {
    let path = "tests/func/test_queue_stats.py";
    let rewritten = PY.replace("[\"messages\"] == 0", "[\"messages\"] == 3");
    judge(
        path,
        PY,
        &rewritten,
        Some("tests.func.test_queue_stats::test_counts_messages"),
    )
    .expect("the redone test may be written again");
    let neighbour = PY.replace("[\"depth\"] == 0", "[\"depth\"] == 3");
    let refusal = judge(
        path,
        PY,
        &neighbour,
        Some("tests.func.test_queue_stats::test_counts_messages"),
    )
    .expect_err("its neighbour stays frozen");
    assert!(
        refusal.to_string().contains("test `test_empty`"),
        "{refusal}"
    );
    // The open test may also be dropped and written anew under its own name.
    let dropped = PY.replace("def test_counts_messages(client, db):\n    assert queue_stats(client)[\"messages\"] == 0\n", "");
    judge(
        path,
        PY,
        &dropped,
        Some("tests.func.test_queue_stats::test_counts_messages"),
    )
    .expect("the open test may be replaced");
}

const JS: &str = r#"const request = require('supertest');
const { createApp } = require('../../app');

let app;

describe('bookmarks', () => {
  beforeEach(async () => {
    app = await createApp();
  });

  test('lists bookmarks', async () => {
    const res = await request(app).get('/bookmarks');
    expect(res.status).toBe(200);
  });
});

it('serves health', async () => {
  expect((await request(app).get('/health')).status).toBe(200);
});
"#;

#[test]
fn javascript_a_red_may_add_tests_groups_and_imports() {
    let path = "lib/bookmarks/__tests__/functional-test.js";
    let new = JS.replace(
        "  });\n});\n",
        "  });\n\n  test('adds a bookmark', async () => {\n    const res = await request(app).post('/bookmarks');\n    expect(res.status).toBe(201);\n  });\n});\n",
    ) + r#"
const { tagOf } = require('../tags');

describe('tags', () => {
  beforeEach(() => {
    jest.resetModules();
  });

  test('tags a bookmark', () => {
    expect(tagOf('x')).toBe('x');
  });
});
"#;
    allowed(path, JS, &new);
    // A CommonJS require may gain names the same way.
    allowed(
        path,
        JS,
        &(JS.replace("{ createApp }", "{ createApp, tagOf: tag }")
            + "\ntest('tags', () => {\n  expect(tag('x')).toBe('x');\n});\n"),
    );
    refused(
        path,
        JS,
        &JS.replace("{ createApp }", "{ makeApp: createApp }"),
        "which the accepted tests share, is gone or changed",
    );
    let esm = "import { a } from './a';\n\ntest('one', () => {\n  expect(a()).toBe(1);\n});\n";
    allowed(
        "src/a.test.ts",
        esm,
        &(esm.replace("import { a }", "import { a, b }")
            + "\ntest('two', () => {\n  expect(b()).toBe(2);\n});\n"),
    );
}

#[test]
fn javascript_cheats_are_refused() {
    let path = "lib/bookmarks/__tests__/functional-test.js";
    let add = |extra: &str| format!("{JS}{extra}");
    // (what the file said, what the RED makes it say, what the refusal says)
    let rewrites = [
        (
            "    const res = await request(app).get('/bookmarks');\n",
            "    return;\n    const res = await request(app).get('/bookmarks');\n",
            "test `lists bookmarks` (line 11) in `bookmarks` was changed",
        ),
        (
            "toBe(200);\n  });\n});",
            "toBe(404);\n  });\n});",
            "`lists bookmarks`",
        ),
        (
            "it('serves health'",
            "it.only('serves health'",
            "`serves health`",
        ),
        (
            "const request",
            "import './setup';\nconst request",
            "would apply to the accepted tests",
        ),
        (
            "  test('lists bookmarks'",
            "  afterEach(() => {});\n\n  test('lists bookmarks'",
            "in `bookmarks` would apply to the accepted tests",
        ),
        (
            "describe('bookmarks'",
            "describe.skip('bookmarks'",
            "the header of group `bookmarks`",
        ),
        (
            "test('lists bookmarks'",
            "test('lists all bookmarks'",
            "test `lists bookmarks` (line 11) in `bookmarks` is gone",
        ),
        (
            "require('../../app')",
            "require('../../fake')",
            "which the accepted tests share, is gone or changed",
        ),
    ];
    for (from, to, says) in rewrites {
        assert!(JS.contains(from), "the case rewrites nothing: {from}");
        refused(path, JS, &JS.replace(from, to), says);
    }
    // (what the RED adds at the end of the file, what the refusal says)
    let additions = [
        ("\ntest.only('new one', () => {});\n", "marked to run alone"),
        (
            "\nfdescribe('new', () => {\n  test('x', () => {});\n});\n",
            "marked to run alone",
        ),
        ("\nconst createApp = () => null;\n", "defines `createApp`"),
        (
            "\nfunction expect() {}\n",
            "defines `expect`, a name the accepted tests of this file use",
        ),
        (
            "\ntest('serves health', () => {});\n",
            "has the name of an accepted test",
        ),
    ];
    for (extra, says) in additions {
        refused(path, JS, &add(extra), says);
    }
    for marked in ["test.skip", "test.todo"] {
        let new = JS.replace("  test('lists", &format!("  {marked}('lists"));
        refused(path, JS, &new, "`lists bookmarks`");
    }
    // Hooks, mocks and imports at the top of the file reach every accepted test.
    for hook in [
        "beforeEach(() => { app = null; });",
        "beforeAll(() => {});",
        "afterEach(() => {});",
        "jest.mock('../../app');",
        "vi.mock('../../app');",
        "require('./setup');",
    ] {
        let new = add(&format!("\n{hook}\n"));
        refused(path, JS, &new, "would apply to the accepted tests");
    }
}

const GO: &str = r#"package stock

import (
	"testing"
)

func helper(t *testing.T) int { return 1 }

func TestNew(t *testing.T) {
	if helper(t) != 1 {
		t.Fatal("no")
	}
}
"#;

#[test]
fn go_a_red_may_add_tests_and_imports_and_no_hooks() {
    let path = "stock/stock_test.go";
    let new = GO.replace("\t\"testing\"\n", "\t\"strings\"\n\t\"testing\"\n")
        + "\nfunc TestUpper(t *testing.T) {\n\tif strings.ToUpper(\"a\") != \"A\" {\n\t\tt.Fatal(\"no\")\n\t}\n}\n";
    allowed(path, GO, &new);
    let add = |extra: &str| format!("{GO}{extra}");
    for (new, says) in [
        (
            add("\nfunc TestMain(m *testing.M) {}\n"),
            "would apply to the accepted tests",
        ),
        (
            add("\nfunc init() {}\n"),
            "would apply to the accepted tests",
        ),
        (GO.replace("t.Fatal(\"no\")", "t.Skip()"), "test `TestNew`"),
        (
            GO.replace("return 1", "return 2"),
            "which the accepted tests share",
        ),
        (
            GO.replace(
                "\t\"testing\"\n",
                "\t\"testing\"\n\t_ \"example.com/hooks\"\n",
            ),
            "would apply",
        ),
    ] {
        refused(path, GO, &new, says);
    }
}

const RS: &str = r#"use stock::Stock;

#[test]
fn starts_empty() {
    assert_eq!(Stock::new().len(), 0);
}

mod more {
    use super::*;

    #[test]
    fn adds() {
        assert_eq!(Stock::new().len(), 0);
    }
}
"#;

#[test]
fn rust_a_red_may_add_tests_and_no_attributes_on_accepted_ones() {
    let path = "tests/stock.rs";
    let new = RS.replace(
        "    }\n}\n",
        "    }\n\n    #[test]\n    fn removes() {\n        assert!(Stock::new().is_empty());\n    }\n}\n",
    );
    allowed(path, RS, &new);
    for (new, says) in [
        (
            RS.replace(
                "#[test]\nfn starts_empty",
                "#[test]\n#[ignore]\nfn starts_empty",
            ),
            "test `starts_empty`",
        ),
        (
            format!("#![cfg(any())]\n{RS}"),
            "would apply to the accepted tests",
        ),
        (
            RS.replace(
                "    #[test]\n    fn adds",
                "    #[test]\n    #[should_panic]\n    fn adds",
            ),
            "test `adds` (line 11) in `more`",
        ),
    ] {
        refused(path, RS, &new, says);
    }
}

#[test]
fn a_file_no_parser_knows_stays_frozen_whole() {
    let refusal = judge("tests/t1.sql", "select 1;", "select 1;\nselect 2;", None)
        .expect_err("a SQL file is frozen whole");
    assert!(refusal.to_string().contains("frozen whole"), "{refusal}");
}

#[test]
fn a_tsx_file_is_judged_test_by_test_too() {
    let old = "import { render } from '@testing-library/react';\nimport { Stock } from './Stock';\n\ntest('shows the count', () => {\n  render(<Stock count={3} />);\n});\n";
    let path = "src/Stock.test.tsx";
    allowed(
        path,
        old,
        &format!("{old}\ntest('shows none', () => {{\n  render(<Stock count={{0}} />);\n}});\n"),
    );
    refused(
        path,
        old,
        &old.replace("count={3}", "count={4}"),
        "test `shows the count` (line 4) was changed",
    );
}
