//! An object's protobuf encoding turned into the JSON the API server would have sent for it.
//!
//! The API server's JSON for a built-in object is Go's `encoding/json` of the object as
//! protobuf decoded it (its watch cache holds what it decoded from etcd), so the JSON follows
//! from the bytes and the Go types' tags ([`super::table`]): a field on the wire is written
//! (a pointer even when zero), unless `omitempty` leaves out its zero; a pointer, list, map or
//! bytes not on the wire is Go's nil (`null`, unless `omitempty` leaves it out); any other
//! field is always on the wire, so one not on it is a field the API server's release does not
//! have (older than the table), and is not written. What the
//! table cannot account for (a field number it does not know, a shape the wire contradicts,
//! raw JSON that is not JSON) is an error, and the caller reads the resource in JSON instead.

use std::ops::Range;

use base64::Engine as _;
use prost::encoding::{WireType, decode_key, decode_varint};

pub(super) use self::go::as_text;
use self::go::go_duration;
use super::table::{Field, Scalar, Shape, Special, Table, Type};
use crate::watch::list_reader::MAX_OBJECT_BYTES;

/// Why an object could not be turned into JSON.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Untranscodable {
    /// The object's kind is not in the table: not a built-in type, or newer than the table.
    #[error("{0} is not in this dispatcher's table of types")]
    UnknownKind(String),
    /// The object has a field the table does not know: the API server is newer than the table.
    #[error("{ty} has field {number}, which this dispatcher's table of types does not know")]
    UnknownField {
        /// The Go type the field is in.
        ty: Box<str>,
        /// The field's protobuf number.
        number: u32,
    },
    /// The bytes are not what the table says the type's encoding is.
    #[error("{0}")]
    Unexpected(String),
    /// The object is past a bound of the dispatcher's (nesting, size): JSON reads it no better.
    #[error("{0}")]
    Bound(String),
}

/// Most messages nested in one another that an object may hold (serde_json's limit for JSON
/// text is 128 arrays and objects).
const MAX_DEPTH: usize = 100;

type Result<T> = std::result::Result<T, Untranscodable>;

pub(super) fn unexpected(what: impl std::fmt::Display) -> Untranscodable {
    Untranscodable::Unexpected(what.to_string())
}

/// A value as it is on the wire.
#[derive(Clone, Copy, Debug)]
pub(super) enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The JSON of the object `bytes`, of message type `ty`, with `kind` and `apiVersion` written
/// first when `types` gives them (protobuf carries them beside the object, not in it); and
/// where its `metadata` is in that text.
pub(crate) fn object(
    table: &Table,
    ty: u32,
    bytes: &[u8],
    types: Option<(&str, &str)>,
) -> Result<(String, Range<usize>)> {
    let mut out = Writer {
        table,
        out: String::with_capacity(bytes.len() + bytes.len() / 4 + 64),
        metadata: 0..0,
        depth: 0,
        // The API server makes a list's items an empty slice, never a nil one.
        list: types.is_some_and(|(_, kind)| kind.ends_with("List")),
    };
    out.out.push('{');
    let mut first = true;
    if let Some((api_version, kind)) = types {
        out.key(&mut first, "kind");
        out.string(kind);
        out.key(&mut first, "apiVersion");
        out.string(api_version);
    }
    out.fields(ty, bytes, &mut first, true)?;
    out.out.push('}');
    let metadata = out.metadata.clone();
    Ok((out.out, metadata))
}

struct Writer<'t> {
    table: &'t Table,
    out: String,
    /// Where the top-level object's `metadata` was written.
    metadata: Range<usize>,
    /// Whether the top-level object is a list, whose `items` are `[]` when it has none.
    list: bool,
    /// Messages open now.
    depth: usize,
}

/// The fields of a message in the order JSON writes them, each with its index in its type's
/// fields (a repeated field keeps its wire order).
fn entries<'a>(ty: &Type, buf: &'a [u8]) -> Result<Vec<(usize, Wire<'a>)>> {
    let mut found = numbered(buf)?
        .into_iter()
        .map(|(number, value)| match ty.field(number) {
            Some(index) => Ok((index, value)),
            None => Err(Untranscodable::UnknownField {
                ty: ty.name.clone(),
                number,
            }),
        })
        .collect::<Result<Vec<_>>>()?;
    found.sort_by_key(|&(index, _)| index);
    Ok(found)
}

/// The fields of `bytes`, a message, in wire order, by their numbers: field 1 (a wrapped
/// list's items, a map entry's key) and so on. Varints and length-delimited values only: no
/// built-in type has another.
pub(super) fn numbered(buf: &[u8]) -> Result<Vec<(u32, Wire<'_>)>> {
    Fields(buf).collect()
}

/// The fields of a message as [`numbered`] reads them, one at a time; nothing after an error.
pub(super) struct Fields<'a>(pub &'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u32, Wire<'a>)> {
        let buf = &mut self.0;
        let (number, wire_type) = decode_key(buf).map_err(unexpected)?;
        let value = match wire_type {
            WireType::Varint => Wire::Varint(decode_varint(buf).map_err(unexpected)?),
            WireType::LengthDelimited => {
                let len = decode_varint(buf).map_err(unexpected)?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l <= buf.len())
                    .ok_or_else(|| unexpected("a length past the message's end"))?;
                let (value, rest) = buf.split_at(len);
                *buf = rest;
                Wire::Bytes(value)
            }
            other => return Err(unexpected(format!("field {number} of wire type {other:?}"))),
        };
        Ok((number, value))
    }
}

/// The last value numbered `number`, as protobuf takes a scalar given twice.
fn last<'a>(fields: &[(u32, Wire<'a>)], number: u32) -> Option<Wire<'a>> {
    fields
        .iter()
        .rev()
        .find(|(n, _)| *n == number)
        .map(|(_, v)| *v)
}

fn varint(value: Option<Wire<'_>>) -> Result<u64> {
    match value {
        None => Ok(0),
        Some(Wire::Varint(v)) => Ok(v),
        Some(other) => Err(unexpected(format!("{other:?} where a varint belongs"))),
    }
}

fn bytes(value: Option<Wire<'_>>) -> Result<Option<&[u8]>> {
    match value {
        None => Ok(None),
        Some(Wire::Bytes(b)) => Ok(Some(b)),
        Some(other) => Err(unexpected(format!("{other:?} where bytes belong"))),
    }
}

/// Go's zero `time.Time` (year 1) in Unix seconds.
const ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// A `metav1.Timestamp`'s seconds and nanoseconds; `None` for the zero time.
fn timestamp(value: Option<Wire<'_>>) -> Result<Option<(i64, i32)>> {
    let fields = numbered(bytes(value)?.unwrap_or_default())?;
    let seconds = varint(last(&fields, 1))? as i64;
    let nanos = varint(last(&fields, 2))? as i64 as i32;
    if fields.is_empty() || (seconds == ZERO_TIME_SECONDS && nanos == 0) {
        return Ok(None);
    }
    Ok(Some((seconds, nanos)))
}

impl Writer<'_> {
    fn key(&mut self, first: &mut bool, name: &str) {
        if !std::mem::take(first) {
            self.out.push(',');
        }
        self.string(name);
        self.out.push(':');
    }

    fn string(&mut self, text: &str) {
        // Most strings need no escape: checked 64 bytes at a time without a table or an early
        // exit inside, which the compiler vectorises, and copied whole.
        let plain = text.as_bytes().chunks(64).all(|chunk| {
            !chunk.iter().fold(false, |escape, &b| {
                escape | (b < 0x20) | (b == b'"') | (b == b'\\')
            })
        });
        if plain {
            self.out.reserve(text.len() + 2);
            self.out.push('"');
            self.out.push_str(text);
            self.out.push('"');
        } else {
            self.out
                .push_str(&serde_json::to_string(text).expect("a string always writes"));
        }
    }

    /// Writes the fields of message `ty` from `bytes` into the object being written.
    /// Bounded in nesting ([`MAX_DEPTH`]) and in what it writes ([`MAX_OBJECT_BYTES`], as the
    /// JSON reader bounds an object): a message of no bytes is written with every zero field
    /// its type has, so the JSON may be far larger than the protobuf.
    fn fields(&mut self, ty: u32, bytes: &[u8], first: &mut bool, top: bool) -> Result<()> {
        if self.depth >= MAX_DEPTH {
            let error = format!("an object nested past {MAX_DEPTH} messages");
            return Err(Untranscodable::Bound(error));
        }
        if self.out.len() > MAX_OBJECT_BYTES {
            let error = format!("an object whose JSON is over {MAX_OBJECT_BYTES} bytes");
            return Err(Untranscodable::Bound(error));
        }
        self.depth += 1;
        let written = self.fields_within(ty, bytes, first, top);
        self.depth -= 1;
        written
    }

    fn fields_within(&mut self, ty: u32, bytes: &[u8], first: &mut bool, top: bool) -> Result<()> {
        let table = self.table;
        let ty = &table.types[ty as usize];
        let found = entries(ty, bytes)?;
        let mut at = 0;
        let mut values = Vec::new();
        for (index, field) in ty.fields.iter().enumerate() {
            values.clear();
            while let Some(&(i, value)) = found.get(at).filter(|(i, _)| *i == index) {
                debug_assert_eq!(i, index);
                values.push(value);
                at += 1;
            }
            self.field(field, &values, first, top)?;
        }
        Ok(())
    }

    fn field(
        &mut self,
        field: &Field,
        values: &[Wire<'_>],
        first: &mut bool,
        top: bool,
    ) -> Result<()> {
        let Some(name) = field.name.as_deref() else {
            // A struct JSON writes in its parent's object.
            let Shape::Message(ty) = field.shape else {
                return Err(unexpected("an inline field that is not a struct"));
            };
            let bytes = match values {
                [] => &[][..],
                [Wire::Bytes(b)] => b,
                _ => return Err(unexpected("an inline struct given twice")),
            };
            return self.fields(ty, bytes, first, false);
        };
        match &field.shape {
            Shape::List(element) => {
                if values.is_empty() && top && self.list && name == "items" {
                    self.key(first, name);
                    self.out.push_str("[]");
                    return Ok(());
                }
                if values.is_empty() {
                    return self.nil(field, name, first);
                }
                self.key(first, name);
                self.list(element, values)
            }
            Shape::Map(value) => {
                if values.is_empty() {
                    return self.nil(field, name, first);
                }
                self.key(first, name);
                self.map(value, values)
            }
            Shape::Wrapped(element) => {
                let items = wrapped_items(values)?;
                if items.is_empty() {
                    return self.nil(field, name, first);
                }
                self.key(first, name);
                self.list(element, &items)
            }
            // The API server's protobuf always carries these, zero or not (Kubernetes' generated
            // marshallers write every field that is not a pointer, a list, a map or bytes):
            // not on the wire, the field is one the server's release does not have (a table
            // made for a newer release), and its JSON has none either.
            shape if values.is_empty() && always_on_the_wire(shape) => Ok(()),
            shape => {
                let value = match values {
                    [] => None,
                    [.., v] if scalar_like(shape) => Some(*v),
                    [v] => Some(*v),
                    _ => return Err(unexpected(format!("field {name} given twice"))),
                };
                if field.omit_empty && empty(shape, value)? {
                    return Ok(());
                }
                if field.omit_zero
                    && matches!(shape, Shape::Special(Special::Time | Special::MicroTime))
                    && timestamp(value)?.is_none()
                {
                    return Ok(());
                }
                self.key(first, name);
                let start = self.out.len();
                self.value(shape, value)?;
                if top && name == "metadata" {
                    self.metadata = start..self.out.len();
                }
                Ok(())
            }
        }
    }

    /// A list or map not on the wire: Go's nil, `null` unless `omitempty` leaves it out.
    fn nil(&mut self, field: &Field, name: &str, first: &mut bool) -> Result<()> {
        if !field.omit_empty {
            self.key(first, name);
            self.out.push_str("null");
        }
        Ok(())
    }

    fn list(&mut self, element: &Shape, values: &[Wire<'_>]) -> Result<()> {
        self.out.push('[');
        let mut first = true;
        let mut item = |w: &mut Self, value: Wire<'_>| {
            if !std::mem::take(&mut first) {
                w.out.push(',');
            }
            w.value(element, Some(value))
        };
        for &value in values {
            match (element, value) {
                // A packed list of numbers or booleans.
                (
                    Shape::Scalar(Scalar::Bool | Scalar::Int32 | Scalar::Int64),
                    Wire::Bytes(mut packed),
                ) => {
                    while !packed.is_empty() {
                        let v = decode_varint(&mut packed).map_err(unexpected)?;
                        item(self, Wire::Varint(v))?;
                    }
                }
                _ => item(self, value)?,
            }
        }
        self.out.push(']');
        Ok(())
    }

    fn map(&mut self, value_shape: &Shape, values: &[Wire<'_>]) -> Result<()> {
        let mut pairs = Vec::with_capacity(values.len());
        for &entry in values {
            let fields = numbered(bytes(Some(entry))?.unwrap_or_default())?;
            let key = bytes(last(&fields, 1))?.unwrap_or_default();
            pairs.push((key, last(&fields, 2)));
        }
        // Go writes a map's keys sorted, and a key given twice holds its last value.
        pairs.sort_by(|a, b| a.0.cmp(b.0));
        pairs.reverse();
        pairs.dedup_by(|a, b| a.0 == b.0);
        pairs.reverse();
        self.out.push('{');
        let mut first = true;
        for (key, value) in pairs {
            self.key(&mut first, &as_text(key));
            self.value(value_shape, value)?;
        }
        self.out.push('}');
        Ok(())
    }

    /// Writes one value of `shape`; `None` is Go's zero value of it.
    fn value(&mut self, shape: &Shape, value: Option<Wire<'_>>) -> Result<()> {
        match shape {
            Shape::Scalar(scalar) => self.scalar(*scalar, value),
            Shape::Special(special) => self.special(*special, value),
            Shape::Message(ty) => {
                let bytes = bytes(value)?.unwrap_or_default();
                self.out.push('{');
                self.fields(*ty, bytes, &mut true, false)?;
                self.out.push('}');
                Ok(())
            }
            Shape::Pointer(inner) => match value {
                None => {
                    self.out.push_str("null");
                    Ok(())
                }
                Some(_) => self.value(inner, value),
            },
            Shape::Wrapped(element) => {
                let items = match value {
                    None => Vec::new(),
                    Some(v) => wrapped_items(&[v])?,
                };
                if items.is_empty() {
                    self.out.push_str("null");
                    return Ok(());
                }
                self.list(element, &items)
            }
            Shape::List(_) | Shape::Map(_) => Err(unexpected("a list or map inside a list or map")),
        }
    }

    fn scalar(&mut self, scalar: Scalar, value: Option<Wire<'_>>) -> Result<()> {
        use std::fmt::Write as _;
        match scalar {
            Scalar::String => {
                let text = bytes(value)?.unwrap_or_default();
                self.string(&as_text(text));
            }
            Scalar::Bool => {
                let v = varint(value)? != 0;
                self.out.push_str(if v { "true" } else { "false" });
            }
            // Go encodes a negative int32 as the varint of its sign extension.
            Scalar::Int32 => {
                write!(self.out, "{}", varint(value)? as i64 as i32).expect("a String takes it")
            }
            Scalar::Int64 => {
                write!(self.out, "{}", varint(value)? as i64).expect("a String takes it")
            }
            Scalar::Bytes => match bytes(value)? {
                None => self.out.push_str("null"),
                Some(b) => {
                    self.out.push('"');
                    base64::engine::general_purpose::STANDARD.encode_string(b, &mut self.out);
                    self.out.push('"');
                }
            },
        }
        Ok(())
    }

    fn special(&mut self, special: Special, value: Option<Wire<'_>>) -> Result<()> {
        use std::fmt::Write as _;
        match special {
            Special::Time | Special::MicroTime => match timestamp(value)? {
                None => self.out.push_str("null"),
                Some((seconds, nanos)) => {
                    let micro = special == Special::MicroTime;
                    // Time keeps whole seconds, MicroTime whole microseconds.
                    let nanos = if micro { nanos - nanos % 1000 } else { 0 };
                    let at = jiff::Timestamp::new(seconds, nanos)
                        .map_err(|e| unexpected(format!("a time out of range: {e}")))?;
                    let text = if micro {
                        format!("{at:.6}")
                    } else {
                        format!("{at:.0}")
                    };
                    self.string(&text);
                }
            },
            Special::Duration => {
                let fields = numbered(bytes(value)?.unwrap_or_default())?;
                self.string(&go_duration(varint(last(&fields, 1))? as i64));
            }
            Special::Quantity => {
                let fields = numbered(bytes(value)?.unwrap_or_default())?;
                match bytes(last(&fields, 1))? {
                    None if value.is_none() => self.string("0"),
                    Some(text) if !text.is_empty() => self.string(&as_text(text)),
                    _ => return Err(unexpected("a quantity without its text")),
                }
            }
            Special::IntOrString => {
                let fields = numbered(bytes(value)?.unwrap_or_default())?;
                match varint(last(&fields, 1))? {
                    0 => write!(self.out, "{}", varint(last(&fields, 2))? as i64 as i32)
                        .expect("a String takes it"),
                    1 => {
                        let text = bytes(last(&fields, 3))?.unwrap_or_default();
                        self.string(&as_text(text));
                    }
                    other => return Err(unexpected(format!("an IntOrString of type {other}"))),
                }
            }
            Special::RawExtension | Special::FieldsV1 => {
                let fields = numbered(bytes(value)?.unwrap_or_default())?;
                match bytes(last(&fields, 1))? {
                    None => self.out.push_str("null"),
                    Some([]) if special == Special::FieldsV1 => self.out.push_str("null"),
                    Some(raw) => {
                        // Go writes raw JSON as it is (compacted); anything else it cannot write.
                        let json: &serde_json::value::RawValue = serde_json::from_slice(raw)
                            .map_err(|e| unexpected(format!("raw bytes that are not JSON: {e}")))?;
                        self.out.push_str(json.get());
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether the API server writes a field of `shape` whatever its value: a string, number,
/// boolean or message that is not a pointer. A pointer, a list, a map and bytes are left off the
/// wire when nil.
fn always_on_the_wire(shape: &Shape) -> bool {
    match shape {
        Shape::Scalar(scalar) => *scalar != Scalar::Bytes,
        Shape::Special(_) | Shape::Message(_) => true,
        Shape::Pointer(_) | Shape::List(_) | Shape::Map(_) | Shape::Wrapped(_) => false,
    }
}

/// Whether a value is empty for `omitempty`: a zero scalar, a nil pointer or byte slice.
/// Structs are never empty, special ones included.
fn empty(shape: &Shape, value: Option<Wire<'_>>) -> Result<bool> {
    Ok(match shape {
        Shape::Pointer(_) => value.is_none(),
        Shape::Scalar(Scalar::String | Scalar::Bytes) => bytes(value)?.is_none_or(<[u8]>::is_empty),
        Shape::Scalar(Scalar::Bool | Scalar::Int32 | Scalar::Int64) => varint(value)? == 0,
        _ => false,
    })
}

/// Whether protobuf takes the last of several values of `shape` (a scalar) rather than
/// merging them (a message, which the API server never sends twice).
fn scalar_like(shape: &Shape) -> bool {
    match shape {
        Shape::Scalar(_) => true,
        Shape::Pointer(inner) => scalar_like(inner),
        _ => false,
    }
}

/// The items of a wrapped list, over every occurrence of it.
fn wrapped_items<'a>(values: &[Wire<'a>]) -> Result<Vec<Wire<'a>>> {
    let mut items = Vec::new();
    for &value in values {
        for (number, item) in numbered(bytes(Some(value))?.unwrap_or_default())? {
            if number != 1 {
                return Err(unexpected(format!("field {number} in a wrapped list")));
            }
            items.push(item);
        }
    }
    Ok(items)
}

mod go;
#[cfg(test)]
mod tests;
