//! How a runner names the tests it reports, so that the design lane can refuse a test-list
//! entry no run could ever report (its run would never find the test, and the feature would be
//! frozen with a test list it cannot finish).
//!
//! | identity | a test's name | example |
//! |---|---|---|
//! | [`TestIdentity::FilePath`] | its file's path (one test per file: psql) | `tests/t1_add_item.sql` |
//! | [`TestIdentity::JunitFile`] | `<file path>::<test name>` (vitest, jest with Consort's reporter settings) | `test/orders.test.js::places an order` |
//! | [`TestIdentity::JunitModule`] | `<dotted module>::<function>` (pytest's JUnit) | `tests.test_orders::test_places_an_order` |
//! | [`TestIdentity::Junit`] | `<classname>::<name>` as the report gives them | `OrdersTest::placesAnOrder` |
//! | [`TestIdentity::Libtest`] | the test's path in its crate (`cargo test`) | `orders::tests::places_an_order` |
//! | [`TestIdentity::GoTest`] | the test function, `/subtest` for a subtest (`go test -json`) | `TestPlaceOrder/empty` |
//! | [`TestIdentity::Described`] | whatever the runner prints (TAP descriptions; runs without per-test results) | — |

use serde::{Deserialize, Serialize};

use crate::core::artifact::TestEntry;

/// How the project's runner names a test (see the module documentation).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TestIdentity {
    /// Names are not checked: the runner prints its own (TAP), or gives no per-test results.
    #[default]
    Described,
    /// One test per file, named by the file's path.
    FilePath,
    /// JUnit, the class name being the test file's path: `<path>::<name>`.
    JunitFile,
    /// JUnit, the class name being the file's dotted module (pytest): `<module>::<name>`.
    JunitModule,
    /// JUnit with a class name Consort cannot derive from the path: `<classname>::<name>`.
    Junit,
    /// Rust's libtest: the test's path in its crate.
    Libtest,
    /// `go test -json`: the test function, with `/<subtest>` for a subtest.
    GoTest,
}

impl TestIdentity {
    /// The documented form, for the runner facts and the guide.
    pub fn form(self) -> &'static str {
        match self {
            TestIdentity::Described => "the name the runner reports for it",
            TestIdentity::FilePath => "the test file's path (one test per file)",
            TestIdentity::JunitFile => {
                "`<test file path>::<test name>`, as the JUnit report gives class name and name (e.g. `test/orders.test.js::places an order`; a test inside `describe` blocks is named with them, as the tool reports it)"
            }
            TestIdentity::JunitModule => {
                "`<dotted module>::<test function>`, as pytest's JUnit report gives them (e.g. `tests.test_orders::test_places_an_order` for tests/test_orders.py, `tests.test_orders.TestOrders::test_x` in a class)"
            }
            TestIdentity::Junit => "`<classname>::<name>`, as the JUnit report gives them",
            TestIdentity::Libtest => {
                "the test's path in its crate, as `cargo test` prints it (e.g. `orders::tests::places_an_order`; in tests/orders.rs just `places_an_order`)"
            }
            TestIdentity::GoTest => {
                "the test function, as `go test -json` reports it (e.g. `TestPlaceOrder`, or `TestPlaceOrder/empty` for a subtest)"
            }
        }
    }

    /// The name `entry` should have, when it can be told from its path.
    fn expected_for(self, entry: &TestEntry) -> String {
        match self {
            TestIdentity::FilePath => entry.path.clone(),
            TestIdentity::JunitFile => format!("{}::<test name>", entry.path),
            TestIdentity::JunitModule => format!("{}::<test function>", dotted_module(&entry.path)),
            TestIdentity::Junit => "<classname>::<name>".into(),
            TestIdentity::Libtest => "<module>::<test function>".into(),
            TestIdentity::GoTest => "Test<Name>".into(),
            TestIdentity::Described => entry.runner_name().to_string(),
        }
    }

    /// Whether the runner can ever report `entry` under its name; the refusal says the
    /// expected form.
    pub fn check(self, entry: &TestEntry) -> Result<(), String> {
        let name = entry.runner_name();
        let ok = match self {
            TestIdentity::Described => true,
            TestIdentity::FilePath => name == entry.path,
            TestIdentity::JunitFile => name
                .strip_prefix(entry.path.as_str())
                .and_then(|rest| rest.strip_prefix("::"))
                .is_some_and(|n| !n.trim().is_empty()),
            TestIdentity::JunitModule => name.split_once("::").is_some_and(|(class, test)| {
                let module = dotted_module(&entry.path);
                (class == module || class.starts_with(&format!("{module}.")))
                    && !test.trim().is_empty()
            }),
            TestIdentity::Junit => name
                .split_once("::")
                .is_some_and(|(c, n)| !c.trim().is_empty() && !n.trim().is_empty()),
            TestIdentity::Libtest => is_rust_path(name),
            TestIdentity::GoTest => name
                .split('/')
                .next()
                .is_some_and(|f| f.starts_with("Test") && f.chars().all(is_ident_char)),
        };
        if ok {
            return Ok(());
        }
        Err(format!(
            "test {} is named `{name}`, a name the test runner never reports: it names a test {}; give `test_name` as \"{}\"",
            entry.id,
            self.form(),
            self.expected_for(entry)
        ))
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn is_rust_path(name: &str) -> bool {
    !name.is_empty()
        && name.split("::").all(|segment| {
            segment
                .chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && segment.chars().all(is_ident_char)
        })
}

/// pytest's dotted module for a test file: `tests/test_orders.py` → `tests.test_orders`.
fn dotted_module(path: &str) -> String {
    path.strip_suffix(".py").unwrap_or(path).replace('/', ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, name: Option<&str>) -> TestEntry {
        TestEntry {
            id: "T1".into(),
            ac_id: "S1-AC1".into(),
            description: "d".into(),
            path: path.into(),
            test_name: name.map(str::to_string),
        }
    }

    #[test]
    fn each_runner_accepts_its_own_form_and_refuses_a_name_it_never_reports() {
        use TestIdentity::*;
        // Each runner's path, and the names it accepts and refuses for it (`None`: no name).
        let cases = [
            (FilePath, "tests/t1.sql", vec![None], vec![Some("t1")]),
            (
                JunitFile,
                "test/orders.test.js",
                vec![Some("test/orders.test.js::places an order")],
                vec![
                    None,
                    Some("test/other.test.js::places"),
                    Some("test/orders.test.js::"),
                ],
            ),
            (
                JunitModule,
                "tests/test_orders.py",
                vec![
                    Some("tests.test_orders::test_place"),
                    Some("tests.test_orders.TestOrders::test_place"),
                ],
                vec![Some("tests/test_orders.py::test_place"), None],
            ),
            (
                Junit,
                "src/test/OrdersTest.java",
                vec![Some("OrdersTest::places")],
                vec![None],
            ),
            (
                Libtest,
                "tests/orders.rs",
                vec![Some("places_an_order")],
                vec![None],
            ),
            (
                Libtest,
                "src/orders.rs",
                vec![Some("orders::tests::places_an_order")],
                vec![],
            ),
            (
                GoTest,
                "orders_test.go",
                vec![Some("TestPlaceOrder/empty cart")],
                vec![Some("PlaceOrder"), None],
            ),
            (Described, "t/orders.t", vec![None], vec![]),
        ];
        for (identity, path, accepted, refused) in cases {
            for (names, ok) in [(accepted, true), (refused, false)] {
                for name in names {
                    let got = identity.check(&entry(path, name));
                    assert_eq!(got.is_ok(), ok, "{identity:?} {path} {name:?}: {got:?}");
                }
            }
        }
        let refusal = JunitFile
            .check(&entry("test/orders.test.js", None))
            .expect_err("the file path alone is no JUnit name");
        assert!(
            refusal.contains("\"test/orders.test.js::<test name>\""),
            "the refusal gives the expected form: {refusal}"
        );
    }
}
