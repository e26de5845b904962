//! The contract: the same bytes as building the `serde_json::Value` and writing it.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::{Value, json};

use super::{Strings, to_string};
use crate::core::hash::canonical_json_via_value;

/// What the `Value` route writes.
fn via_value<T: Serialize + ?Sized>(v: &T) -> Option<String> {
    serde_json::to_value(v)
        .ok()
        .map(|v| serde_json::to_string(&v).expect("a Value serialises"))
}

fn same<T: Serialize + ?Sized + std::fmt::Debug>(v: &T) {
    assert_eq!(
        to_string(v, Strings::Plain).ok(),
        via_value(v),
        "plain: {v:?}"
    );
    assert_eq!(
        to_string(v, Strings::NormaliseNewlines).ok(),
        serde_json::to_value(v)
            .ok()
            .map(|v| canonical_json_via_value(&v)),
        "normalised: {v:?}"
    );
}

#[derive(Debug, Serialize)]
struct Unit;

#[derive(Debug, Serialize)]
struct Newtype(String);

#[derive(Debug, Serialize)]
struct Tuple(u8, &'static str, Option<i32>);

#[derive(Debug, Serialize)]
enum External {
    Unit,
    Newtype(Vec<u32>),
    Tuple(i64, f32),
    Struct { zeta: bool, alpha: Option<String> },
}

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum Internal {
    First { b: u8, a: u8 },
    SecondOne { text: String },
}

#[derive(Debug, Serialize)]
#[serde(tag = "t", content = "c")]
enum Adjacent {
    Only(Tuple),
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Untagged {
    Num(u64),
    Obj { y: i8, x: i8 },
}

#[derive(Debug, Serialize)]
struct Inner {
    q: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<u8>,
}

#[derive(Debug, Serialize)]
struct Zoo {
    z_last: u8,
    a_first: &'static str,
    unit: Unit,
    unit_value: (),
    newtype: Newtype,
    tuple: Tuple,
    externals: Vec<External>,
    internals: Vec<Internal>,
    adjacent: Adjacent,
    untagged: Vec<Untagged>,
    #[serde(flatten)]
    flat: Inner,
    int_keys: BTreeMap<i32, &'static str>,
    bool_keys: BTreeMap<bool, u8>,
    char_keys: BTreeMap<char, u8>,
    enum_keys: BTreeMap<&'static str, External>,
    hash_map: HashMap<String, u8>,
    bytes: serde_bytes_like::Bytes,
    floats: Vec<f64>,
    f32s: Vec<f32>,
    big: (i128, u128, i64, u64),
    text: &'static str,
    character: char,
    nested: Value,
}

/// `serialize_bytes` without a dependency.
mod serde_bytes_like {
    #[derive(Debug)]
    pub(super) struct Bytes(pub Vec<u8>);
    impl serde::Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }
}

fn zoo() -> Zoo {
    Zoo {
        z_last: 1,
        a_first: "first",
        unit: Unit,
        unit_value: (),
        newtype: Newtype("new\r\ntype".into()),
        tuple: Tuple(7, "seven", None),
        externals: vec![
            External::Unit,
            External::Newtype(vec![1, 2, 3]),
            External::Tuple(-5, 0.1),
            External::Struct {
                zeta: true,
                alpha: Some("a\rb".into()),
            },
        ],
        internals: vec![
            Internal::First { b: 2, a: 1 },
            Internal::SecondOne {
                text: "é ✓ \u{1F600} \u{7}".into(),
            },
        ],
        adjacent: Adjacent::Only(Tuple(1, "one", Some(-1))),
        untagged: vec![Untagged::Num(3), Untagged::Obj { y: 2, x: 1 }],
        flat: Inner {
            q: 9,
            skipped: None,
        },
        int_keys: [(-3, "minus three"), (10, "ten"), (2, "two")].into(),
        bool_keys: [(true, 1), (false, 0)].into(),
        char_keys: [('b', 2), ('a', 1)].into(),
        enum_keys: [("k", External::Unit)].into(),
        hash_map: (0..20).map(|i| (format!("key{i}"), i)).collect(),
        bytes: serde_bytes_like::Bytes(vec![0, 127, 255]),
        floats: vec![
            0.0,
            -0.0,
            1.5,
            1e300,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
        ],
        f32s: vec![0.1, 3.25, f32::NEG_INFINITY],
        big: (
            i128::from(i64::MIN),
            u128::from(u64::MAX),
            i64::MIN,
            u64::MAX,
        ),
        text: "tab\t quote\" backslash\\ crlf\r\n lone-cr\r nul\u{0} del\u{7f}",
        character: '\r',
        nested: json!({"b": [1, {"d": null, "c": "x\r\ny"}], "a": {"\r key": true}}),
    }
}

#[test]
fn every_serde_shape_matches_the_value_route() {
    same(&zoo());
    same(&External::Struct {
        zeta: false,
        alpha: None,
    });
    same(&Option::<u8>::None);
    same(&"just a string\r\n");
    same(&Vec::<u8>::new());
    same(&BTreeMap::<String, u8>::new());
}

#[test]
fn numbers_out_of_value_range_are_refused_as_by_the_value_route() {
    let big = u128::from(u64::MAX) + 1;
    assert!(serde_json::to_value(big).is_err());
    assert!(to_string(&big, Strings::Plain).is_err());
    let small = i128::from(i64::MIN) - 1;
    assert!(to_string(&small, Strings::Plain).is_err());
    let bad_key: BTreeMap<Vec<u8>, u8> = [(vec![1], 1)].into();
    assert!(serde_json::to_value(&bad_key).is_err());
    assert!(to_string(&bad_key, Strings::Plain).is_err());
}

/// A map that writes the same key twice: a `Value` keeps the last.
#[derive(Debug)]
struct Duplicates;

impl Serialize for Duplicates {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("b", &1)?;
        m.serialize_entry("a", &2)?;
        m.serialize_entry("b", &3)?;
        m.serialize_entry("a", &json!({"y": 1, "x": 2}))?;
        m.end()
    }
}

#[test]
fn the_last_of_duplicate_keys_wins_as_in_a_value() {
    same(&Duplicates);
    assert_eq!(
        to_string(&Duplicates, Strings::Plain).expect("json"),
        r#"{"a":{"x":2,"y":1},"b":3}"#
    );
}

#[test]
fn the_artifacts_and_events_match_the_value_route() {
    use crate::core::artifact::{ChangeSet, FeatureRequest, FileChange};
    use crate::core::machine::Event;
    let feature = FeatureRequest {
        id: "F1".into(),
        title: "Stock\r\nFlow".into(),
        body: "Track stock.\r".into(),
    };
    same(&Event::Start {
        feature: feature.clone(),
        inherited: Default::default(),
        per_step: Default::default(),
        harness: None,
    });
    same(&ChangeSet {
        summary: "add\r\ntests".into(),
        changes: vec![
            FileChange::Write {
                path: "tests/t1.sql".into(),
                content: "select 1;\r\n".into(),
            },
            FileChange::Delete {
                path: "old.sql".into(),
            },
        ],
    });
    same(&crate::core::machine::State::default());
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z\r\n\t\"\\\\é✓ ]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z\r]{0,4}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn arbitrary_json_matches_the_value_route(v in arb_json()) {
        prop_assert_eq!(to_string(&v, Strings::Plain).ok(), via_value(&v));
        prop_assert_eq!(
            to_string(&v, Strings::NormaliseNewlines).ok(),
            Some(canonical_json_via_value(&v))
        );
    }
}
