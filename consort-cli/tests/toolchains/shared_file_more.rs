//! The shared-file feature of `shared_file.rs` on jest, vitest and `go test`: three entries in
//! the project's own test file, each RED adding its test beside the accepted ones (and the
//! names it needs to an import the accepted tests share), a file-wide hook refused on the way.
//! The last RED names what is not written yet — a module (jest, vitest), a function (go) — so
//! the file (the package) does not load: that is its RED, while the project's other tests run.

use crate::adopt::adopt_and_run;
use crate::common::{ledger_text, toolchain, write};
use crate::shared_file::{Entry, assert_hook_refused_once, feature_script};

/// What the three entries' tests check, as (test title or function, the call, the answer).
const CHECKS: [(&str, &str, &str); 3] = [
    ("the total sums the quantities", "total(c)", "7"),
    ("the count of one sku", "countOf(c, 'B')", "4"),
    ("the skus are listed", "skus(c)", "['A', 'B']"),
];

/// The JavaScript of each function, in order.
/// The third is in a module of its own, `src/listing.js`, that T3's RED names before it exists.
const FUNCTIONS: [&str; 3] = [
    "async function total(client) {\n  const r = await client.query('SELECT coalesce(sum(qty), 0)::int AS t FROM counts');\n  return r.rows[0].t;\n}\n",
    "async function countOf(client, sku) {\n  const r = await client.query('SELECT qty FROM counts WHERE sku = $1', [sku]);\n  return r.rows[0].qty;\n}\n",
    "async function skus(client) {\n  const r = await client.query('SELECT sku FROM counts ORDER BY sku');\n  return r.rows.map((row) => row.sku);\n}\n",
];
const NAMES: [&str; 3] = ["total", "countOf", "skus"];

/// The project's test file with the first `n` of the feature's tests, importing the names they
/// need; `hook` adds a top-level `beforeEach` (a cheat).
fn js_tests(esm: bool, n: usize, hook: bool) -> String {
    let names = NAMES[..n.clamp(1, 2)].join(", ");
    let mut s = if esm {
        format!(
            "import {{ test, expect, beforeEach }} from 'vitest';\nimport pg from 'pg';\nimport {{ {names} }} from '../src/counts.js';\n"
        )
    } else {
        format!("const pg = require('pg');\nconst {{ {names} }} = require('../src/counts');\n")
    };
    if n >= 3 {
        s.push_str(if esm {
            "import { skus } from '../src/listing.js';\n"
        } else {
            "const { skus } = require('../src/listing');\n"
        });
    }
    s.push_str(
        "\nasync function withClient(fn) {\n  const c = new pg.Client({ connectionString: process.env.DATABASE_URL });\n  await c.connect();\n  try {\n    await c.query('BEGIN');\n    await c.query(\"INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)\");\n    return await fn(c);\n  } finally {\n    await c.query('ROLLBACK');\n    await c.end();\n  }\n}\n\ntest('the module loads', () => {\n  expect(typeof total).toBe('function');\n});\n",
    );
    for (title, call, want) in &CHECKS[..n] {
        s.push_str(&format!(
            "\ntest('{title}', async () => {{\n  expect(await withClient((c) => {call})).toEqual({want});\n}});\n"
        ));
    }
    if hook {
        s.push_str(
            "\nbeforeEach(() => {\n  process.env.DATABASE_URL = 'postgresql://nowhere';\n});\n",
        );
    }
    s
}

/// `src/counts.js` with the first `n` of its two functions written and the rest still to come.
fn js_code(esm: bool, n: usize) -> String {
    let mut s = String::new();
    for (i, f) in FUNCTIONS[..2].iter().enumerate() {
        let f = if i < n {
            f.to_string()
        } else {
            let head = f.lines().next().expect("a line");
            format!("{head}\n  throw new Error('not built yet');\n}}\n")
        };
        s.push_str(&f);
        s.push('\n');
    }
    s.push_str(&exports(esm, &NAMES[..2]));
    s
}

/// `src/listing.js`, which T3's GREEN writes.
fn js_listing(esm: bool) -> String {
    format!("{}\n{}", FUNCTIONS[2], exports(esm, &NAMES[2..]))
}

/// The line that exports `names`.
fn exports(esm: bool, names: &[&str]) -> String {
    let names = names.join(", ");
    if esm {
        format!("export {{ {names} }};\n")
    } else {
        format!("module.exports = {{ {names} }};\n")
    }
}

/// A test file of the project's own beside the feature's: it runs in every run.
fn js_labels_test(esm: bool) -> String {
    let import = if esm {
        "import { test, expect } from 'vitest';\n\n"
    } else {
        ""
    };
    format!(
        "{import}test('labels name their sku', () => {{\n  expect(`sku ${{'A'}}`).toBe('sku A');\n}});\n"
    )
}

/// The shared-file feature on a Node project tested with `tool` at `version`.
fn node_case(tool: &str, version: &str, extra: &[&str]) {
    let spec = format!("{tool}@{version}");
    let mut packages = vec![spec.as_str(), "pg@8"];
    packages.extend(extra);
    let modules = toolchain::npm(&format!("{tool}{version}"), &packages, tool);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let esm = tool == "vitest";
    let path = "test/counts.test.js";
    let package = format!(
        r#"{{"name":"shelf","version":"1.0.0","private":true,{}"devDependencies":{{"{tool}":"*","pg":"^8"}}}}"#,
        if esm { r#""type":"module","# } else { "" }
    );
    write(
        dir,
        &[
            ("package.json", &package),
            ("src/counts.js", &js_code(esm, 0)),
            (path, &js_tests(esm, 0, false)),
            ("test/labels.test.js", &js_labels_test(esm)),
            (
                "migrations/0001_counts.sql",
                "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
            ),
        ],
    );
    toolchain::install_node_modules(&modules, dir);
    let entries: Vec<Entry<'_>> = (1..=3)
        .map(|n| {
            let mut reds = vec![vec![(path, js_tests(esm, n, false))]];
            if n == 2 {
                reds.insert(0, vec![(path, js_tests(esm, n, true))]);
            }
            Entry {
                id: ["T1", "T2", "T3"][n - 1],
                name: format!("{path}::{}", CHECKS[n - 1].0),
                path,
                reds,
                green: if n == 3 {
                    vec![("src/listing.js", js_listing(esm))]
                } else {
                    vec![("src/counts.js", js_code(esm, n))]
                },
            }
        })
        .collect();
    adopt_and_run(dir, &feature_script(&entries));
    assert_eq!(
        std::fs::read_to_string(dir.join(path)).expect("the test file"),
        js_tests(esm, 3, false)
    );
    assert_hook_refused_once(dir);
    // T3's RED named a module not written yet: the shared file did not load, which was its
    // RED (its accepted tests not run because of it), while the project's other file ran.
    let ledger = ledger_text(dir);
    assert!(
        ledger.contains("\"module\":\"src/listing"),
        "the receipt names the missing module: {ledger}"
    );
    assert!(ledger.contains("labels name their sku"), "{ledger}");
    assert_no_red_refusal(&ledger);
}

/// A package of the project beside the feature's: its test runs in every run.
const LABELS: &str = "package labels\n\n// Label names a sku.\nfunc Label(sku string) string {\n\treturn \"sku \" + sku\n}\n";
const LABELS_TEST: &str = "package labels\n\nimport \"testing\"\n\nfunc TestLabel(t *testing.T) {\n\tif Label(\"A\") != \"sku A\" {\n\t\tt.Fatal(Label(\"A\"))\n\t}\n}\n";

#[test]
fn jest_three_tests_in_the_projects_own_test_file_run_to_done() {
    node_case("jest", "29", &["jest-junit@16"]);
}

#[test]
fn vitest_three_tests_in_the_projects_own_test_file_run_to_done() {
    node_case("vitest", "3", &[]);
}

/// The Go test file with the first `n` tests; `hook` adds a `TestMain` (a cheat).
fn go_tests(n: usize, hook: bool) -> String {
    let mut imports = vec!["\t\"testing\""];
    if n >= 1 {
        imports.insert(0, "\t\"os/exec\"");
        imports.insert(1, "\t\"strings\"");
    }
    if hook {
        imports.insert(0, "\t\"os\"");
    }
    let mut s = format!(
        "package shelf\n\nimport (\n{}\n)\n\nfunc TestTheModuleBuilds(t *testing.T) {{\n\t_ = Total\n}}\n",
        imports.join("\n")
    );
    s.push_str(&GO_TESTS[..n].concat());
    if hook {
        s.push_str("\nfunc TestMain(m *testing.M) {\n\tos.Exit(0)\n}\n");
    }
    s
}

/// The feature's three Go tests: the first reaches the branch through `psql`.
const GO_TESTS: [&str; 3] = [
    "\nfunc TestTotal(t *testing.T) {\n\tout, err := exec.Command(\"psql\", \"-XAtq\", \"-v\", \"ON_ERROR_STOP=1\", \"-c\", \"SELECT 3 + 4\").CombinedOutput()\n\tif err != nil {\n\t\tt.Fatalf(\"psql: %v: %s\", err, out)\n\t}\n\tif got, want := Total([]int{3, 4}), strings.TrimSpace(string(out)); want != \"7\" || got != 7 {\n\t\tt.Fatalf(\"Total = %d, the branch says %s\", got, want)\n\t}\n}\n",
    "\nfunc TestMost(t *testing.T) {\n\tif got := Most([]int{3, 9, 4}); got != 9 {\n\t\tt.Fatalf(\"Most = %d\", got)\n\t}\n}\n",
    "\nfunc TestLeast(t *testing.T) {\n\tif got := Least([]int{3, 9, 4}); got != 3 {\n\t\tt.Fatalf(\"Least = %d\", got)\n\t}\n}\n",
];

/// The code after the GREEN of test `n`: the first `n` functions, and before any a stub of
/// `Total` that panics. `Most` and `Least` do not exist before their GREENs: their REDs name
/// a symbol not written yet, so the package does not build.
fn go_code(n: usize) -> String {
    let bodies = [
        (
            "Total is the sum of the quantities.",
            "Total",
            "\tsum := 0\n\tfor _, q := range quantities {\n\t\tsum += q\n\t}\n\treturn sum",
        ),
        (
            "Most is the largest quantity.",
            "Most",
            "\tmost := 0\n\tfor _, q := range quantities {\n\t\tif q > most {\n\t\t\tmost = q\n\t\t}\n\t}\n\treturn most",
        ),
        (
            "Least is the smallest quantity.",
            "Least",
            "\tleast := quantities[0]\n\tfor _, q := range quantities {\n\t\tif q < least {\n\t\t\tleast = q\n\t\t}\n\t}\n\treturn least",
        ),
    ];
    let mut s = "package shelf\n".to_string();
    for (i, (doc, name, body)) in bodies.iter().enumerate().take(n.max(1)) {
        let body = if i < n {
            body
        } else {
            "\tpanic(\"not built yet\")"
        };
        s.push_str(&format!(
            "\n// {doc}\nfunc {name}(quantities []int) int {{\n{body}\n}}\n"
        ));
    }
    s
}

#[test]
fn go_three_tests_in_the_projects_own_test_file_run_to_done() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let path = "shelf_test.go";
    write(
        dir,
        &[
            ("go.mod", "module example.com/shelf\n\ngo 1.19\n"),
            ("shelf.go", &go_code(0)),
            (path, &go_tests(0, false)),
            ("labels/labels.go", LABELS),
            ("labels/labels_test.go", LABELS_TEST),
            (
                "migrations/0001_counts.sql",
                "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
            ),
        ],
    );
    let names = ["TestTotal", "TestMost", "TestLeast"];
    let entries: Vec<Entry<'_>> = (1..=3)
        .map(|n| {
            let mut reds = vec![vec![(path, go_tests(n, false))]];
            if n == 2 {
                reds.insert(0, vec![(path, go_tests(n, true))]);
            }
            Entry {
                id: ["T1", "T2", "T3"][n - 1],
                name: names[n - 1].into(),
                path,
                reds,
                green: vec![("shelf.go", go_code(n))],
            }
        })
        .collect();
    adopt_and_run(dir, &feature_script(&entries));
    assert_eq!(
        std::fs::read_to_string(dir.join(path)).expect("the test file"),
        go_tests(3, false)
    );
    assert_hook_refused_once(dir);
    // T2's and T3's REDs named a function not written yet: the package did not build, which
    // was their RED, while the other package's test ran and passed.
    let ledger = ledger_text(dir);
    for symbol in ["Most", "Least"] {
        assert!(ledger.contains(&format!("undefined: {symbol}")), "{ledger}");
    }
    assert!(
        ledger.contains("example.com/shelf [build failed]"),
        "{ledger}"
    );
    assert!(
        ledger.contains("\"test_file\":\"shelf_test.go\""),
        "the receipt names the package that did not build: {ledger}"
    );
    assert!(ledger.contains("TestLabel"), "{ledger}");
    assert_no_red_refusal(&ledger);
}

/// The ledger records no refusal of a RED for breaking a green test or not running its test.
fn assert_no_red_refusal(ledger: &str) {
    assert!(!ledger.contains("red-broke-green-test"), "{ledger}");
    assert!(!ledger.contains("red-test-not-run"), "{ledger}");
}
