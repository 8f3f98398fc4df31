//! The built-in types' protobuf fields and JSON forms, read from `table.txt`.
//!
//! `table.txt` is written by `dispatcher/k8s-protobuf` from the Go types of the Kubernetes
//! release the dispatcher is built for (its first line names it); its format is described
//! there. It is read once, at the first protobuf watch.

use std::{collections::HashMap, sync::LazyLock};

/// A scalar's protobuf and JSON form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    String,
    Bool,
    Int32,
    Int64,
    /// `[]byte`: base64 in JSON.
    Bytes,
}

/// A type whose JSON its own marshaller writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Special {
    /// `metav1.Time`: RFC 3339 in seconds, `null` when zero.
    Time,
    /// `metav1.MicroTime`: RFC 3339 in microseconds, `null` when zero.
    MicroTime,
    /// `metav1.Duration`: Go's duration text.
    Duration,
    /// `resource.Quantity`: its canonical text.
    Quantity,
    /// `intstr.IntOrString`: a number or a string.
    IntOrString,
    /// `runtime.RawExtension`: its raw JSON.
    RawExtension,
    /// `metav1.FieldsV1`: its raw JSON.
    FieldsV1,
}

/// The shape of a field's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Scalar(Scalar),
    Special(Special),
    /// A message type, by its index in [`Table::types`].
    Message(u32),
    /// A Go pointer: JSON writes it whenever it is on the wire, zero or not.
    Pointer(Box<Shape>),
    /// A repeated field.
    List(Box<Shape>),
    /// A map keyed by strings.
    Map(Box<Shape>),
    /// A named list protobuf wraps in a message whose field 1 holds its items.
    Wrapped(Box<Shape>),
}

/// A field of a message type, in the order JSON writes it.
#[derive(Clone, Debug)]
pub(crate) struct Field {
    /// Its protobuf number; 0 when it is never on the wire.
    pub number: u32,
    /// Its JSON name; `None` for a struct whose fields JSON writes in its parent's object.
    pub name: Option<Box<str>>,
    pub shape: Shape,
    pub omit_empty: bool,
    pub omit_zero: bool,
}

/// A message type.
#[derive(Clone, Debug, Default)]
pub(crate) struct Type {
    /// Its Go name, for errors.
    pub name: Box<str>,
    pub fields: Vec<Field>,
    /// A field's index in `fields` by its protobuf number (`NONE` where none has it).
    by_number: Vec<u16>,
}

const NONE: u16 = u16::MAX;

impl Type {
    /// The index in [`Type::fields`] of the field numbered `number`.
    pub(crate) fn field(&self, number: u32) -> Option<usize> {
        match self.by_number.get(number as usize) {
            Some(&i) if i != NONE => Some(i as usize),
            _ => None,
        }
    }
}

/// Every type and kind of the table.
#[derive(Debug)]
pub(crate) struct Table {
    /// The Kubernetes API module the table was made from, from its first line.
    pub source: Box<str>,
    pub types: Vec<Type>,
    /// A kind's type, by its apiVersion and kind.
    kinds: HashMap<(Box<str>, Box<str>), u32>,
}

/// The table built into the dispatcher.
pub(crate) static BUILT_IN: LazyLock<Table> = LazyLock::new(|| {
    Table::parse(include_str!("table.txt")).expect("dispatcher/src/watch/protobuf/table.txt")
});

impl Table {
    /// The type of the kind `kind` of `api_version`, if the table has it.
    pub(crate) fn kind(&self, api_version: &str, kind: &str) -> Option<u32> {
        self.kinds
            .get(&(Box::from(api_version), Box::from(kind)))
            .copied()
    }

    /// Reads a table in the format `dispatcher/k8s-protobuf` writes.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut table = Self {
            source: text
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("# "))
                .unwrap_or_default()
                .into(),
            types: Vec::new(),
            kinds: HashMap::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let error = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                [] | [""] => {}
                [w, ..] if w.starts_with('#') => {}
                ["t", index, name] => {
                    if index.parse::<usize>().ok() != Some(table.types.len()) {
                        return Err(error("types out of order"));
                    }
                    table.types.push(Type {
                        name: (*name).into(),
                        ..Type::default()
                    });
                }
                ["f", number, name, shape, flags] => {
                    let field = Field {
                        number: number.parse().map_err(|_| error("a field number"))?,
                        name: (*name != "-").then(|| (*name).into()),
                        shape: parse_shape(shape).ok_or_else(|| error("a shape"))?,
                        omit_empty: flags.contains('e'),
                        omit_zero: flags.contains('z'),
                    };
                    let ty = table
                        .types
                        .last_mut()
                        .ok_or_else(|| error("a field before any type"))?;
                    if field.number != 0 {
                        let at = field.number as usize;
                        if at > 1 << 12 {
                            return Err(error("a field number past 4096"));
                        }
                        if ty.by_number.len() <= at {
                            ty.by_number.resize(at + 1, NONE);
                        }
                        if ty.by_number[at] != NONE {
                            return Err(error("a field number twice"));
                        }
                        ty.by_number[at] = ty.fields.len() as u16;
                    }
                    ty.fields.push(field);
                }
                ["k", api_version, kind, index] => {
                    let index: u32 = index.parse().map_err(|_| error("a type index"))?;
                    table
                        .kinds
                        .insert(((*api_version).into(), (*kind).into()), index);
                }
                _ => return Err(error("not a line of the table")),
            }
        }
        let count = table.types.len();
        let in_range = |shape: &Shape| message_of(shape).is_none_or(|i| (i as usize) < count);
        let fields_ok = table
            .types
            .iter()
            .all(|t| t.fields.iter().all(|f| in_range(&f.shape)));
        if !fields_ok || table.kinds.values().any(|&i| i as usize >= count) {
            return Err("a type index past the last type".into());
        }
        Ok(table)
    }
}

/// The message type `shape` ends in, if it does.
fn message_of(shape: &Shape) -> Option<u32> {
    match shape {
        Shape::Message(i) => Some(*i),
        Shape::Pointer(s) | Shape::List(s) | Shape::Map(s) | Shape::Wrapped(s) => message_of(s),
        Shape::Scalar(_) | Shape::Special(_) => None,
    }
}

fn parse_shape(text: &str) -> Option<Shape> {
    let (first, rest) = (text.chars().next()?, &text[1..]);
    let inner = || parse_shape(rest).map(Box::new);
    Some(match first {
        '*' => Shape::Pointer(inner()?),
        '[' => Shape::List(inner()?),
        'w' => Shape::Wrapped(inner()?),
        '{' => {
            // Keys are strings; the key's letter comes first.
            let value = rest.strip_prefix('s')?;
            Shape::Map(Box::new(parse_shape(value)?))
        }
        'm' => Shape::Message(rest.parse().ok()?),
        _ if !rest.is_empty() => return None,
        's' => Shape::Scalar(Scalar::String),
        'b' => Shape::Scalar(Scalar::Bool),
        'i' => Shape::Scalar(Scalar::Int32),
        'l' => Shape::Scalar(Scalar::Int64),
        'y' => Shape::Scalar(Scalar::Bytes),
        'T' => Shape::Special(Special::Time),
        'M' => Shape::Special(Special::MicroTime),
        'D' => Shape::Special(Special::Duration),
        'Q' => Shape::Special(Special::Quantity),
        'I' => Shape::Special(Special::IntOrString),
        'R' => Shape::Special(Special::RawExtension),
        'F' => Shape::Special(Special::FieldsV1),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_table_reads_and_names_the_kinds_a_watch_meets() {
        let table = &*BUILT_IN;
        assert!(table.source.contains("k8s.io/api v0."), "{}", table.source);
        let config_map = &table.types[table.kind("v1", "ConfigMap").unwrap() as usize];
        assert_eq!(&*config_map.name, "k8s.io/api/core/v1.ConfigMap");
        let data = &config_map.fields[config_map.field(2).unwrap()];
        assert_eq!(data.name.as_deref(), Some("data"));
        assert_eq!(
            data.shape,
            Shape::Map(Box::new(Shape::Scalar(Scalar::String)))
        );
        assert!(data.omit_empty);
        for (version, kind) in [
            ("v1", "Status"),
            ("v1", "WatchEvent"),
            ("apps/v1", "Deployment"),
        ] {
            assert!(table.kind(version, kind).is_some(), "{version} {kind}");
        }
        assert_eq!(table.kind("v1", "NoSuchKind"), None);
    }

    #[test]
    fn shapes_read_from_the_left() {
        assert_eq!(
            parse_shape("{sws"),
            Some(Shape::Map(Box::new(Shape::Wrapped(Box::new(
                Shape::Scalar(Scalar::String)
            )))))
        );
        assert_eq!(
            parse_shape("*m12"),
            Some(Shape::Pointer(Box::new(Shape::Message(12))))
        );
        for bad in ["", "x", "sx", "{i", "m", "*"] {
            assert_eq!(parse_shape(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_broken_table_is_refused_with_its_line() {
        for (text, says) in [
            ("t 1 A\n", "types out of order"),
            ("f 1 a s e\n", "a field before any type"),
            ("t 0 A\nf 1 a s e\nf 1 b s e\n", "a field number twice"),
            ("t 0 A\nf 1 a m7 e\n", "past the last type"),
            ("k v1 A 3\n", "past the last type"),
            ("t 0 A\nf 1 a q e\n", "a shape"),
            ("what\n", "not a line"),
        ] {
            let error = Table::parse(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
