//! Canonical serialisation and SHA-256 content hashes.
//!
//! Every artifact hashes the same way on every machine: it is serialised to JSON with object
//! keys sorted, no insignificant white space, and every string's line endings normalised to
//! `\n`. The SHA-256 of those bytes is the artifact's [`ContentHash`].

use std::fmt;
use std::io;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
use sha2::{Digest, Sha256};

use crate::core::sorted_json::{self, Strings};

/// A SHA-256 digest, shown and serialised as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentHash([u8; 32]);

impl ContentHash {
    /// A hash given by its 32 bytes.
    pub const fn from_raw(bytes: [u8; 32]) -> Self {
        ContentHash(bytes)
    }

    /// The hash of raw bytes.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::of_pieces([bytes])
    }

    /// The hash of the concatenation of `pieces`, without building it.
    pub fn of_pieces<'a, P: AsRef<[u8]> + ?Sized + 'a>(
        pieces: impl IntoIterator<Item = &'a P>,
    ) -> Self {
        let mut hasher = Sha256::new();
        for piece in pieces {
            hasher.update(piece.as_ref());
        }
        Self::finish(hasher)
    }

    /// The hash of everything `reader` yields, read through `buf`: the same as
    /// [`ContentHash::of_bytes`] of those bytes, without holding them all.
    pub(crate) fn of_reader(mut reader: impl io::Read, buf: &mut [u8]) -> io::Result<Self> {
        let mut hasher = Sha256::new();
        loop {
            match reader.read(buf) {
                Ok(0) => return Ok(Self::finish(hasher)),
                Ok(n) => hasher.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn finish(hasher: Sha256) -> Self {
        let mut out = [0u8; 32];
        out.copy_from_slice(hasher.finalize().as_slice());
        ContentHash(out)
    }

    /// The hash of a value's canonical serialisation (see [`canonical_json`]).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Self {
        let mut text = Vec::with_capacity(1024);
        match sorted_json::write(&mut text, value, Strings::NormaliseNewlines) {
            Ok(()) => Self::of_bytes(&text),
            Err(e) => Self::of_bytes(format!("!unserialisable:{e}").as_bytes()),
        }
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64-digit lower-case hex form.
    pub fn to_hex(&self) -> String {
        self.hex_digits().iter().copied().map(char::from).collect()
    }

    /// The 64 lower-case hex digits, as ASCII bytes.
    fn hex_digits(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (i, byte) in self.0.iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(byte >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(byte & 0x0f)];
        }
        out
    }

    /// The first 12 hex digits, for humans.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", self.short())
    }
}

/// Why a string is not a [`ContentHash`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a SHA-256 hash (want 64 hex digits): `{0}`")]
pub struct ParseHashError(pub String);

impl FromStr for ContentHash {
    type Err = ParseHashError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shown: String = s.chars().take(80).collect();
        if s.len() != 64 {
            return Err(ParseHashError(shown));
        }
        let bytes = hex::decode(s).map_err(|_| ParseHashError(shown.clone()))?;
        let mut out = [0u8; 32];
        out.copy_from_slice(&bytes);
        Ok(ContentHash(out))
    }
}

impl Serialize for ContentHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let digits = self.hex_digits();
        // ASCII hex digits are always UTF-8; written without a heap allocation.
        match std::str::from_utf8(&digits) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.serialize_str(&self.to_hex()),
        }
    }
}

impl<'de> Deserialize<'de> for ContentHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for ContentHash {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ContentHash".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9a-f]{64}$",
            "description": "SHA-256, 64 lower-case hex digits"
        })
    }
}

/// The canonical JSON text of a value: keys sorted, compact, `\r\n` and `\r` turned into `\n`.
///
/// Serialising an in-memory artifact cannot fail (all keys are strings); should a foreign type
/// fail, its error text is hashed instead so that the function stays total.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> String {
    sorted_json::to_string(value, Strings::NormaliseNewlines)
        .unwrap_or_else(|e| format!("!unserialisable:{e}"))
}

/// [`canonical_json`] the long way, through a `serde_json::Value` (whose map is a B-tree, so
/// its keys come out sorted): the definition the sorted writer is tested against.
#[cfg(test)]
pub(crate) fn canonical_json_via_value(value: &serde_json::Value) -> String {
    let mut out = Vec::with_capacity(256);
    // Writing a `Value` into a Vec cannot fail.
    let _ = write_sorted(&mut out, value);
    String::from_utf8(out).unwrap_or_default()
}

/// The SHA-256 of the canonical text of `value`, written straight into the hasher, for a value
/// that already serialises its object keys in sorted order: a `serde_json::Value`, or a struct
/// whose fields are declared in sorted order and hold such values. Same bytes as
/// [`canonical_json`], without re-building the value to sort it.
pub(crate) fn hash_sorted<T: Serialize + ?Sized>(value: &T) -> ContentHash {
    let mut w = HashWriter(Sha256::new());
    match write_sorted(&mut w, value) {
        Ok(()) => ContentHash::finish(w.0),
        Err(e) => ContentHash::of_bytes(format!("!unserialisable:{e}").as_bytes()),
    }
}

fn write_sorted<W: io::Write, T: Serialize + ?Sized>(w: W, value: &T) -> serde_json::Result<()> {
    let mut ser = serde_json::Serializer::with_formatter(w, Canonical::default());
    value.serialize(&mut ser)
}

/// Feeds written bytes to SHA-256.
struct HashWriter(Sha256);

impl io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// serde_json's compact output, except that in string *values* `\r\n` and a lone `\r` are
/// written as `\n` (object keys are written as they are). This is the newline normalisation
/// of the canonical form, done while writing instead of on a copy of the value.
#[derive(Default)]
pub(crate) struct Canonical {
    in_key: bool,
    after_cr: bool,
}

impl Formatter for Canonical {
    fn begin_string<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.after_cr = false;
        w.write_all(b"\"")
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        self.after_cr = false;
        w.write_all(fragment.as_bytes())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        if !self.in_key {
            match escape {
                // `\r` becomes `\n`; the `\n` of a `\r\n` pair is then dropped.
                CharEscape::CarriageReturn => {
                    self.after_cr = true;
                    return w.write_all(b"\\n");
                }
                CharEscape::LineFeed if self.after_cr => {
                    self.after_cr = false;
                    return Ok(());
                }
                _ => {}
            }
        }
        self.after_cr = false;
        CompactFormatter.write_char_escape(w, escape)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.in_key = true;
        CompactFormatter.begin_object_key(w, first)
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.in_key = false;
        CompactFormatter.end_object_key(w)
    }
}

/// Turns `\r\n` and lone `\r` into `\n`.
pub(crate) fn normalise_newlines(s: &str) -> String {
    if !s.contains('\r') {
        return s.to_string();
    }
    s.replace("\r\n", "\n").replace('\r', "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_hash_read_in_pieces_is_the_hash_of_the_bytes() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for size in [1, 7, 4096, 65_536] {
            let mut buf = vec![0u8; size];
            let read = ContentHash::of_reader(&bytes[..], &mut buf).expect("read");
            assert_eq!(read, ContentHash::of_bytes(&bytes), "buffer of {size}");
        }
        let mut buf = [0u8; 8];
        assert_eq!(
            ContentHash::of_reader(&[][..], &mut buf).expect("read"),
            ContentHash::of_bytes(b"")
        );
    }

    #[test]
    fn key_order_does_not_change_the_hash() {
        let a = json!({"b": 1, "a": {"y": 2, "x": 3}});
        let b = json!({"a": {"x": 3, "y": 2}, "b": 1});
        assert_eq!(ContentHash::of(&a), ContentHash::of(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":3,"y":2},"b":1}"#);
    }

    #[test]
    fn line_endings_are_normalised() {
        let unix = json!({"sql": "select 1;\nselect 2;\n"});
        let dos = json!({"sql": "select 1;\r\nselect 2;\r\n"});
        assert_eq!(ContentHash::of(&unix), ContentHash::of(&dos));
    }

    /// The canonical text as first defined: a normalised copy of the value, then compact JSON.
    fn reference(v: &serde_json::Value) -> String {
        fn normalise(v: serde_json::Value) -> serde_json::Value {
            use serde_json::Value;
            match v {
                Value::String(s) => Value::String(normalise_newlines(&s)),
                Value::Array(a) => Value::Array(a.into_iter().map(normalise).collect()),
                Value::Object(m) => {
                    Value::Object(m.into_iter().map(|(k, v)| (k, normalise(v))).collect())
                }
                other => other,
            }
        }
        serde_json::to_string(&normalise(v.clone())).expect("serialise")
    }

    #[test]
    fn the_canonical_writer_matches_a_normalised_copy_byte_for_byte() {
        let v = json!({
            "z\r\nkey": "keys keep their \r\n",
            "a": ["one\r\ntwo", "lone\rcr", "cr at end\r", "\r\r\n\n\r", "tab\t\"q\"\\ \u{1}"],
            "m": {"sql": "select 1;\r\nselect 2;\r\n", "n": 1.5, "b": true, "x": null},
            "e": "",
            "u": "ünïcödé\r\n✓"
        });
        assert_eq!(canonical_json(&v), reference(&v));
        assert_eq!(
            ContentHash::of(&v),
            ContentHash::of_bytes(reference(&v).as_bytes())
        );
        assert_eq!(hash_sorted(&v), ContentHash::of(&v));
    }

    #[test]
    fn a_changed_value_changes_the_hash() {
        assert_ne!(
            ContentHash::of(&json!({"a": 1})),
            ContentHash::of(&json!({"a": 2}))
        );
    }

    #[test]
    fn hex_round_trips_and_bad_text_is_refused() {
        let h = ContentHash::of_bytes(b"consort");
        assert_eq!(h.to_hex(), hex::encode(h.as_bytes()));
        assert_eq!(ContentHash::of_pieces(["con", "", "sort"]), h);
        let back: ContentHash = h.to_hex().parse().expect("round trip");
        assert_eq!(h, back);
        assert!("xyz".parse::<ContentHash>().is_err());
        assert!("g".repeat(64).parse::<ContentHash>().is_err());
        let json = serde_json::to_string(&h).expect("serialise");
        assert_eq!(
            serde_json::from_str::<ContentHash>(&json).expect("parse"),
            h
        );
    }
}
