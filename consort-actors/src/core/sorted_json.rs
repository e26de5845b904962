//! JSON with sorted object keys, written straight from a `Serialize` value.
//!
//! The canonical form of a value (what its [`ContentHash`](crate::ContentHash) and a ledger
//! line are made of) is defined on the `serde_json::Value` the value serialises to: that
//! `Value`'s objects are B-tree maps, so it writes its keys sorted. Building the `Value` tree
//! only to write it out and drop it was the largest cost of hashing and of a ledger append.
//! This serializer writes the very same bytes without the tree: every object's fields are
//! written into the output in the order they come, then put in key order (the last of
//! duplicate keys wins, as in a `Value`) when the object ends.
//!
//! Byte-for-byte equality with the `Value` route is the contract; the tests check it on the
//! artifact types, on every serde shape, and on arbitrary JSON.

use std::borrow::Cow;
use std::fmt::Display;
use std::ops::Range;

use serde::ser::{self, Error as _, Impossible, Serialize};
use serde_json::Error;
use serde_json::ser::{CompactFormatter, Formatter};

/// How string values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strings {
    /// As serde_json writes them.
    Plain,
    /// With `\r\n` and a lone `\r` written as `\n` (object keys stay as they are).
    NormaliseNewlines,
}

/// Appends the sorted-key compact JSON of `value` to `out`. On `Err`, `out` holds a partial
/// text that the caller must discard.
pub(crate) fn write<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    strings: Strings,
) -> Result<(), Error> {
    value.serialize(Sorted { out, strings })
}

/// The sorted-key compact JSON text of `value`.
pub(crate) fn to_string<T: Serialize + ?Sized>(
    value: &T,
    strings: Strings,
) -> Result<String, Error> {
    let mut out = Vec::with_capacity(512);
    write(&mut out, value, strings)?;
    // Only JSON text (UTF-8) is ever written.
    String::from_utf8(out).map_err(Error::custom)
}

fn write_str(out: &mut Vec<u8>, s: &str, strings: Strings) -> Result<(), Error> {
    use serde::Serializer as _;
    match strings {
        Strings::Plain => serde_json::Serializer::new(out).serialize_str(s),
        Strings::NormaliseNewlines => {
            serde_json::Serializer::with_formatter(out, crate::core::hash::Canonical::default())
                .serialize_str(s)
        }
    }
}

fn write_display(out: &mut Vec<u8>, n: impl Display) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{n}");
}

/// Writes the integer `n` when a `Value` number can hold it (`fits`); an error otherwise.
fn write_integer(out: &mut Vec<u8>, n: impl Display, fits: bool) -> Result<(), Error> {
    if fits {
        write_display(out, n);
        Ok(())
    } else {
        Err(Error::custom("number out of range"))
    }
}

fn write_f64(out: &mut Vec<u8>, f: f64) -> Result<(), Error> {
    // A `Value` holds no NaN or infinity: they become `null`.
    if f.is_finite() {
        CompactFormatter.write_f64(out, f).map_err(Error::io)
    } else {
        out.extend_from_slice(b"null");
        Ok(())
    }
}

/// The serializer: appends to `out`.
struct Sorted<'a> {
    out: &'a mut Vec<u8>,
    strings: Strings,
}

impl<'a> Sorted<'a> {
    /// Starts an object whose entries are sorted when it ends.
    fn object(self) -> Object<'a> {
        let start = self.out.len();
        Object {
            out: self.out,
            strings: self.strings,
            start,
            entries: Vec::new(),
            key: None,
            variant: false,
        }
    }

    /// `{"variant":` … `}` around an externally tagged variant's content.
    fn open_variant(&mut self, variant: &str) -> Result<(), Error> {
        self.out.push(b'{');
        write_str(self.out, variant, Strings::Plain)?;
        self.out.push(b':');
        Ok(())
    }
}

/// The narrower integers are written as the 64-bit integer of their sign: a `Value` number holds
/// them so.
macro_rules! widened {
    ($($method:ident($narrow:ty) => $wide:ident($to:ty)),* $(,)?) => {$(
        fn $method(self, v: $narrow) -> Result<(), Error> {
            self.$wide(<$to>::from(v))
        }
    )*};
}

impl<'a> ser::Serializer for Sorted<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Array<'a>;
    type SerializeTuple = Array<'a>;
    type SerializeTupleStruct = Array<'a>;
    type SerializeTupleVariant = Array<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
        Ok(())
    }
    widened!(
        serialize_i8(i8) => serialize_i64(i64),
        serialize_i16(i16) => serialize_i64(i64),
        serialize_i32(i32) => serialize_i64(i64),
        serialize_u8(u8) => serialize_u64(u64),
        serialize_u16(u16) => serialize_u64(u64),
        serialize_u32(u32) => serialize_u64(u64),
    );
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        write_integer(self.out, v, true)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        // A `Value` number is a u64, an i64 or an f64.
        let fits = u64::try_from(v).is_ok() || i64::try_from(v).is_ok();
        write_integer(self.out, v, fits)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        write_integer(self.out, v, true)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        write_integer(self.out, v, u64::try_from(v).is_ok())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        // A `Value` keeps an f32 as the f64 it widens to.
        write_f64(self.out, f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        write_f64(self.out, v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        let mut buf = [0u8; 4];
        write_str(self.out, v.encode_utf8(&mut buf), self.strings)
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        write_str(self.out, v, self.strings)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // A `Value` holds bytes as an array of numbers.
        self.out.push(b'[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            write_display(self.out, b);
        }
        self.out.push(b']');
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        write_str(self.out, variant, self.strings)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.open_variant(variant)?;
        value.serialize(Sorted {
            out: self.out,
            strings: self.strings,
        })?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Array<'a>, Error> {
        self.out.push(b'[');
        Ok(Array {
            out: self.out,
            strings: self.strings,
            first: true,
            variant: false,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Array<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Array<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        mut self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Array<'a>, Error> {
        self.open_variant(variant)?;
        self.out.push(b'[');
        Ok(Array {
            out: self.out,
            strings: self.strings,
            first: true,
            variant: true,
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Object<'a>, Error> {
        Ok(self.object())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Object<'a>, Error> {
        Ok(self.object())
    }
    fn serialize_struct_variant(
        mut self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Object<'a>, Error> {
        self.open_variant(variant)?;
        let mut object = self.object();
        object.variant = true;
        Ok(object)
    }
}

/// An array being written.
struct Array<'a> {
    out: &'a mut Vec<u8>,
    strings: Strings,
    first: bool,
    /// Inside `{"variant":` … `}`.
    variant: bool,
}

impl Array<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        value.serialize(Sorted {
            out: self.out,
            strings: self.strings,
        })
    }

    fn finish(self) -> Result<(), Error> {
        self.out.push(b']');
        if self.variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

/// Arrays, tuples, tuple structs and tuple variants all write `[a,b,…]`: the same element and
/// end for each serde trait, which differ only in the element method's name.
macro_rules! array_like {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for Array<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }
            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

array_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

/// One written field of an object: its key and where its value's text lies in the output.
struct Entry {
    key: Cow<'static, str>,
    value: Range<usize>,
}

/// An object being written: field values are appended to the output as they come, without
/// separators; `finish` rewrites that region as `{"key":value,…}` in key order.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    strings: Strings,
    /// Where the object's region begins in `out`.
    start: usize,
    entries: Vec<Entry>,
    /// The key of a map entry whose value comes next.
    key: Option<String>,
    /// Inside `{"variant":` … `}`.
    variant: bool,
}

impl Object<'_> {
    fn field<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), Error> {
        let from = self.out.len();
        value.serialize(Sorted {
            out: self.out,
            strings: self.strings,
        })?;
        self.entries.push(Entry {
            key,
            value: from..self.out.len(),
        });
        Ok(())
    }

    fn finish(mut self) -> Result<(), Error> {
        let region = self.out.split_off(self.start);
        // Stable: among equal keys the last written stays last, and wins below.
        self.entries.sort_by(|a, b| a.key.cmp(&b.key));
        self.out.reserve(region.len() + 16 * self.entries.len() + 2);
        self.out.push(b'{');
        let mut first = true;
        for (i, entry) in self.entries.iter().enumerate() {
            if self
                .entries
                .get(i + 1)
                .is_some_and(|next| next.key == entry.key)
            {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            write_str(self.out, &entry.key, Strings::Plain)?;
            self.out.push(b':');
            let value = entry.value.start - self.start..entry.value.end - self.start;
            self.out.extend_from_slice(&region[value]);
        }
        self.out.push(b'}');
        if self.variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(key.serialize(MapKey)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error::custom("a map value came without its key"))?;
        self.field(Cow::Owned(key), value)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

/// Structs and struct variants both write `{"field":value,…}`, their fields named by `'static`
/// keys: the same field and end for the two serde traits.
macro_rules! struct_like {
    ($($trait:ident),* $(,)?) => {$(
        impl ser::$trait for Object<'_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.field(Cow::Borrowed(key), value)
            }
            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

struct_like!(SerializeStruct, SerializeStructVariant);

/// A map key as a `Value` map holds it: a string, or a bool, number, char or unit variant
/// written as one.
struct MapKey;

fn key_must_be_a_string() -> Error {
    Error::custom("key must be a string")
}

fn float_key(f: f64) -> Result<String, Error> {
    if f.is_finite() {
        let mut out = Vec::new();
        write_f64(&mut out, f)?;
        String::from_utf8(out).map_err(Error::custom)
    } else {
        Err(Error::custom(
            "float key must be finite (got NaN or +/-inf)",
        ))
    }
}

/// A bool or an integer key is written as its own text, as a `Value` map holds it.
macro_rules! as_text {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method(self, v: $ty) -> Result<String, Error> {
            Ok(v.to_string())
        }
    )*};
}

impl ser::Serializer for MapKey {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = Impossible<String, Error>;
    type SerializeTuple = Impossible<String, Error>;
    type SerializeTupleStruct = Impossible<String, Error>;
    type SerializeTupleVariant = Impossible<String, Error>;
    type SerializeMap = Impossible<String, Error>;
    type SerializeStruct = Impossible<String, Error>;
    type SerializeStructVariant = Impossible<String, Error>;

    as_text!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
    );
    fn serialize_f32(self, v: f32) -> Result<String, Error> {
        // Keys keep the f32's own shortest text (unlike values, which widen).
        if v.is_finite() {
            serde_json::to_string(&v)
        } else {
            float_key(f64::from(v))
        }
    }
    fn serialize_f64(self, v: f64) -> Result<String, Error> {
        float_key(v)
    }
    fn serialize_char(self, v: char) -> Result<String, Error> {
        Ok(v.to_string())
    }
    fn serialize_str(self, v: &str) -> Result<String, Error> {
        Ok(v.to_string())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_none(self) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit(self) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, Error> {
        Ok(variant.to_string())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<String, Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        Err(key_must_be_a_string())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(key_must_be_a_string())
    }
}

#[cfg(test)]
mod tests;
