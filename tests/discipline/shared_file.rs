//! Cases 26–31: a RED that writes a file holding accepted tests may add tests, and what they
//! need, but nothing may ride along. Each case is one kind of cheat of issue 45's list, tried in
//! Python and in JavaScript: the feature's two tests share one file, T1 is accepted, and every
//! attempt at T2's RED carries T2 honestly plus the cheat. Each attempt is refused as
//! `FrozenTestChanged` before anything is applied or run, the run halts at `red/T2`, and the file on disk is
//! still T1's RED. The control runs both languages to done, a new helper and (JavaScript) a
//! `describe` block with a hook of its own riding along with T2.
//!
//! The tests run for real: a small runner of each language (Python's `importlib`, Node's
//! `require`) loads the test files and prints TAP, so T1's RED fails for want of the code and
//! its GREEN passes.

use super::*;

/// One language of the cases: its shared test file, its runner, its honest answers and its
/// cheats.
struct Language {
    name: &'static str,
    /// The file both tests live in.
    tests: &'static str,
    /// The code file.
    code: &'static str,
    /// A shell command that runs every test file of the tree and prints TAP.
    runner: &'static str,
    /// The test file after T1's RED.
    t1: &'static str,
    /// What T2's RED adds to it.
    t2: &'static str,
    /// The code after T1's GREEN, and what T2's adds.
    code_t1: &'static str,
    code_t2: &'static str,
    /// T1's and T2's names as the runner reports them.
    names: [&'static str; 2],
}

const PYTHON: Language = Language {
    name: "Python",
    tests: "tests/test_items.py",
    code: "src/items.py",
    runner: r#"PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 - <<'PY'
import importlib.util, pathlib, sys
sys.path.insert(0, '.')
n = 0
for path in sorted(pathlib.Path('tests').glob('test_*.py')):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, test in list(vars(module).items()):
        if name.startswith('test_') and callable(test):
            n += 1
            try:
                test()
                print(f'ok {n} - {name}')
            except Exception:
                print(f'not ok {n} - {name}')
print(f'1..{n}')
PY
"#,
    t1: "def fresh():
    return {}


def test_add_item():
    from src.items import add_item
    shelf = fresh()
    add_item(shelf, 'A-1', 3)
    assert shelf == {'A-1': 3}
",
    t2: "

def test_item_total():
    from src.items import add_item, item_total
    shelf = fresh()
    add_item(shelf, 'A-1', 3)
    add_item(shelf, 'B-2', 4)
    assert item_total(shelf) == 7
",
    code_t1: "def add_item(shelf, sku, qty):
    shelf[sku] = qty
",
    code_t2: "

def item_total(shelf):
    return sum(shelf.values())
",
    names: ["test_add_item", "test_item_total"],
};

const JAVASCRIPT: Language = Language {
    name: "JavaScript",
    tests: "tests/items.test.js",
    code: "src/items.js",
    runner: r#"/usr/bin/node -e '
const fs = require("fs"), path = require("path");
const tests = [];
let hooks = [];
global.describe = (name, body) => { const outer = hooks; hooks = [...hooks]; body(); hooks = outer; };
global.beforeEach = (hook) => hooks.push(hook);
global.test = global.it = (name, body) => {
  const around = hooks;
  tests.push([name, () => { around.forEach((h) => h()); body(); }]);
};
for (const f of fs.readdirSync("tests").filter((f) => f.endsWith(".test.js")).sort()) {
  require(path.resolve("tests", f));
}
let n = 0;
for (const [name, body] of tests) {
  n += 1;
  try { body(); console.log(`ok ${n} - ${name}`); } catch (e) { console.log(`not ok ${n} - ${name}`); }
}
console.log(`1..${n}`);
'
"#,
    t1: "const assert = require('node:assert');

function fresh() {
  return {};
}

test('adds an item', () => {
  const { addItem } = require('../src/items');
  const shelf = fresh();
  addItem(shelf, 'A-1', 3);
  assert.deepStrictEqual(shelf, { 'A-1': 3 });
});
",
    t2: "
test('sums the items', () => {
  const { addItem, itemTotal } = require('../src/items');
  const shelf = fresh();
  addItem(shelf, 'A-1', 3);
  addItem(shelf, 'B-2', 4);
  assert.strictEqual(itemTotal(shelf), 7);
});
",
    code_t1: "exports.addItem = (shelf, sku, qty) => {
  shelf[sku] = qty;
};
",
    code_t2: "
exports.itemTotal = (shelf) => Object.values(shelf).reduce((a, b) => a + b, 0);
",
    names: ["adds an item", "sums the items"],
};

/// The cases, each a kind of cheat: its number and title, and its cheats in each language as
/// (what it is, the file T2's RED writes).
pub(super) const CASES: [&str; 6] = [
    "26 a line added inside an accepted test",
    "27 a skip or mark added to an accepted test",
    "28 a file-wide hook or fixture beside accepted tests",
    "29 a definition that shadows what accepted tests use",
    "30 a shared helper changed",
    "31 an accepted test renamed or moved",
];

/// The honest RED of T2 with `edit` made to the accepted part: what a cheat writes.
fn cheat(l: &Language, from: &str, to: &str) -> String {
    assert!(l.t1.contains(from), "{}: `{from}` is in T1's file", l.name);
    format!("{}{}", l.t1.replacen(from, to, 1), l.t2)
}

/// The honest RED of T2 with `extra` after it.
fn with_extra(l: &Language, extra: &str) -> String {
    format!("{}{}{extra}", l.t1, l.t2)
}

/// Case `number`'s cheats in `l`.
fn cheats(number: usize, l: &Language) -> Vec<String> {
    let python = l.name == "Python";
    match (number, python) {
        (26, true) => vec![
            cheat(
                l,
                "def test_add_item():\n",
                "def test_add_item():\n    return\n",
            ),
            cheat(l, "assert shelf == {'A-1': 3}", "assert shelf is not None"),
        ],
        (26, false) => vec![
            cheat(
                l,
                "test('adds an item', () => {\n",
                "test('adds an item', () => {\n  return;\n",
            ),
            cheat(
                l,
                "assert.deepStrictEqual(shelf, { 'A-1': 3 });",
                "assert.ok(shelf);",
            ),
        ],
        (27, true) => vec![
            cheat(
                l,
                "def test_add_item",
                "import pytest\n\n\n@pytest.mark.skip\ndef test_add_item",
            ),
            cheat(
                l,
                "def test_add_item",
                "import pytest\n\n\n@pytest.mark.xfail\ndef test_add_item",
            ),
        ],
        (27, false) => vec![
            cheat(l, "test('adds an item'", "test.skip('adds an item'"),
            cheat(l, "test('adds an item'", "test.todo('adds an item'"),
            with_extra(l, "\ntest.only('counts one item', () => {});\n"),
        ],
        (28, true) => vec![
            with_extra(
                l,
                "\n\nimport pytest\n\n\n@pytest.fixture(autouse=True)\ndef no_items():\n    yield\n",
            ),
            with_extra(l, "\n\nimport pytest\npytestmark = pytest.mark.skip\n"),
        ],
        (28, false) => vec![
            with_extra(l, "\nbeforeEach(() => {});\n"),
            with_extra(l, "\njest.mock('../src/items');\n"),
        ],
        (29, true) => vec![with_extra(l, "\n\ndef fresh():\n    return {'A-1': 3}\n")],
        (29, false) => vec![with_extra(
            l,
            "\nfunction fresh() {\n  return { 'A-1': 3 };\n}\n",
        )],
        (30, true) => vec![cheat(l, "    return {}\n", "    return {'A-1': 3}\n")],
        (30, false) => vec![cheat(l, "  return {};\n", "  return { 'A-1': 3 };\n")],
        (31, true) => vec![
            cheat(l, "def test_add_item", "def test_adds_an_item"),
            // Moved out of the file: gone from it.
            cheat(l, &l.t1[l.t1.find("def test_add_item").expect("T1")..], ""),
        ],
        (31, false) => vec![
            cheat(l, "test('adds an item'", "test('adds one item'"),
            cheat(
                l,
                &l.t1[l.t1.find("test('adds an item'").expect("T1")..],
                "",
            ),
        ],
        _ => panic!("no shared-file case {number}"),
    }
}

/// The script of a feature whose two tests share `l.tests`: the test list, T1's RED and
/// GREEN, T2's RED as `t2_reds` (attempt by attempt) and T2's GREEN; the rest is honest.
fn feature_script(l: &Language, t2_reds: &[String]) -> String {
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut s = format!(
        "[[entry]]\nstep = \"test-list\"\n[entry.artifact]\nkind = \"test-list\"\n\
         [[entry.artifact.body.entries]]\nid = \"T1\"\nac_id = \"S1-AC1\"\ndescription = \"adding an item stores it\"\npath = {path}\ntest_name = {n1}\n\
         [[entry.artifact.body.entries]]\nid = \"T2\"\nac_id = \"S1-AC2\"\ndescription = \"the total sums the items\"\npath = {path}\ntest_name = {n2}\n",
        path = q(l.tests),
        n1 = q(l.names[0]),
        n2 = q(l.names[1]),
    );
    let code_t2 = format!("{}{}", l.code_t1, l.code_t2);
    s.push_str(&change_entry(
        "red/T1",
        None,
        "T1",
        &[(l.tests, Some(l.t1))],
    ));
    s.push_str(&change_entry(
        "green/T1",
        None,
        "add_item",
        &[(l.code, Some(l.code_t1))],
    ));
    for (attempt, red) in t2_reds.iter().enumerate() {
        let attempt = u32::try_from(attempt).expect("a few attempts");
        s.push_str(&change_entry(
            "red/T2",
            Some(attempt),
            "T2",
            &[(l.tests, Some(red))],
        ));
    }
    s.push_str(&change_entry(
        "green/T2",
        None,
        "item_total",
        &[(l.code, Some(&code_t2))],
    ));
    s
}

/// The TAP runner of `l`.
fn runner(l: &Language) -> Arc<dyn TestRunner> {
    let mut tap = CommandRunnerConfig::new(l.runner);
    tap.tap = true;
    Arc::new(CommandRunner::new(tap))
}

/// Case `number`: in each language, every attempt at T2's RED carries one of the case's
/// cheats; each is refused before it runs, and the run halts at `red/T2` with T1's file as
/// its RED wrote it.
pub(super) async fn case(number: usize, world: &World) -> String {
    let mut said = Vec::new();
    for l in [PYTHON, JAVASCRIPT] {
        let reds = cheats(number, &l);
        let retries = u32::try_from(reds.len() - 1).expect("a few cheats");
        let case = Case::new(machine(retries, 1));
        let builder = case
            .ensemble(world, &feature_script(&l, &reds))
            .runner(runner(&l));
        let (report, events, seen) = case.refused(builder, "red/T2").await;
        let refused = denials(&events);
        assert_eq!(
            refused.len(),
            reds.len(),
            "{}: every attempt refused",
            l.name
        );
        for r in &refused {
            assert!(
                matches!(r, RuleViolation::FrozenTestChanged { path, .. } if path == l.tests),
                "{}: {r}",
                l.name
            );
        }
        // T1's RED and GREEN ran, for real; no cheat ever did.
        let runs = verifications(&seen);
        assert!(
            runs.iter().all(|(_, r)| r.status_of(l.names[1]).is_none()),
            "{}: T2 never ran",
            l.name
        );
        assert_eq!(report.state.build.completed, 1, "{}", l.name);
        assert_eq!(case.file(l.tests).as_deref(), Some(l.t1), "{}", l.name);
        said.push(format!("{} ×{}", l.name, reds.len()));
    }
    format!(
        "FrozenTestChanged for each ({}); halted at red/T2",
        said.join(", ")
    )
}

/// The control: T2's honest RED, with a new helper and (JavaScript) a `describe` block with a
/// hook of its own, is accepted in each language and the feature reaches done.
pub(super) async fn honest_runs_finish(world: &World) {
    let extras = [
        "\n\ndef stocked():\n    return {'A-1': 3}\n",
        "\ndescribe('a stocked shelf', () => {\n  let shelf;\n  beforeEach(() => {\n    shelf = { 'A-1': 3 };\n  });\n  test('keeps its items', () => {\n    assert.strictEqual(shelf['A-1'], 3);\n  });\n});\n",
    ];
    for (l, extra) in [PYTHON, JAVASCRIPT].into_iter().zip(extras) {
        let case = Case::new(machine(1, 1));
        let red = with_extra(&l, extra);
        let builder = case
            .ensemble(world, &feature_script(&l, std::slice::from_ref(&red)))
            .runner(runner(&l));
        let (report, events, seen) = case.run(builder).await;
        assert_eq!(report.outcome, RunOutcome::Done, "{}", l.name);
        assert!(
            refusals(&events).is_empty() && denials(&events).is_empty(),
            "{}",
            l.name
        );
        assert_eq!(accepted_greens(&seen).len(), 2, "{}", l.name);
        assert_eq!(case.file(l.tests), Some(red), "{}", l.name);
    }
}
