//! Built-in objects read in protobuf (`application/vnd.kubernetes.protobuf`), the encoding
//! the API server writes at less than half JSON's CPU (`bench/METHOD.md`, "What the API server
//! spends on the tier's lists"), and handed on in the JSON it would have written (written only
//! for the objects a dispatcher hands on, `encoded.rs`).
//!
//! Every protobuf message the API server sends starts with the four bytes `k8s\0` and is a
//! `runtime.Unknown`: the object's `apiVersion` and `kind` beside its bytes. `object` reads
//! one into a [`WatchedObject`] through the table of types (`table.rs`, made by
//! `dispatcher/k8s-protobuf`); the transcoder (`json.rs`) writes its JSON when something asks
//! for it (`encoded.rs`).

mod encoded;
mod json;
mod stream;
pub(crate) mod table;
#[cfg(test)]
pub(crate) mod testing;

pub(crate) use self::encoded::Encoded;
pub use self::json::Untranscodable;
use self::json::unexpected;
pub(crate) use self::stream::{ACCEPT_LIST, ListReader, send, watch};

use std::sync::Arc;

use bytes::Bytes;
use kube::api::TypeMeta;

use self::table::Table;
use super::object::WatchedObject;

/// The bytes every protobuf message of the API server starts with.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// The media type a request names to be answered in protobuf.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// A `runtime.Unknown`: an object's type and its bytes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Unknown<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub raw: &'a [u8],
}

/// Length-delimited fields of a message, by number; any other wire type is an error.
fn fields(buf: &[u8]) -> Result<Vec<(u32, &[u8])>, Untranscodable> {
    json::numbered(buf)?
        .into_iter()
        .map(|(number, value)| match value {
            json::Wire::Bytes(bytes) => Ok((number, bytes)),
            json::Wire::Varint(_) => Err(unexpected(format!(
                "a varint in field {number} of an envelope"
            ))),
        })
        .collect()
}

fn text(bytes: &[u8]) -> Result<&str, Untranscodable> {
    std::str::from_utf8(bytes).map_err(|_| unexpected("a type name that is not UTF-8"))
}

/// A `runtime.TypeMeta`'s apiVersion and kind.
fn type_meta(bytes: &[u8]) -> Result<(&str, &str), Untranscodable> {
    let (mut api_version, mut kind) = ("", "");
    for (n, v) in fields(bytes)? {
        match n {
            1 => api_version = text(v)?,
            2 => kind = text(v)?,
            _ => {}
        }
    }
    Ok((api_version, kind))
}

impl<'a> Unknown<'a> {
    /// Reads an envelope, its magic included.
    pub(crate) fn read(message: &'a [u8]) -> Result<Self, Untranscodable> {
        let body = message
            .strip_prefix(MAGIC)
            .ok_or_else(|| unexpected("a message without the protobuf magic"))?;
        let mut unknown = Self::default();
        for (number, value) in fields(body)? {
            match number {
                1 => (unknown.api_version, unknown.kind) = type_meta(value)?,
                2 => unknown.raw = value,
                // contentEncoding and contentType: empty for what the API server sends.
                3 | 4 if value.is_empty() => {}
                _ => return Err(unexpected(format!("envelope field {number}"))),
            }
        }
        Ok(unknown)
    }
}

/// The type of the kind `kind` of `api_version` in `table`.
fn kind_type(table: &Table, api_version: &str, kind: &str) -> Result<u32, Untranscodable> {
    table
        .kind(api_version, kind)
        .ok_or_else(|| Untranscodable::UnknownKind(format!("{api_version} {kind}")))
}

/// Whether the resource of `api_version` and `kind` can be read in protobuf: a built-in type
/// the table knows.
pub(crate) fn readable(api_version: &str, kind: &str) -> bool {
    table::BUILT_IN.kind(api_version, kind).is_some()
}

/// The Kubernetes release the built-in table of types was made from, for logs.
pub(crate) fn table_source() -> &'static str {
    &table::BUILT_IN.source
}

/// Whether `error`, met reading a list or a watch, says the table of types could not read
/// what the API server sent ([`Untranscodable`], but for a bound of the dispatcher's, which
/// JSON meets too): JSON reads it.
pub(crate) fn needs_json(error: &kube::Error) -> bool {
    let kube::Error::ReadEvents(e) = error else {
        return false;
    };
    e.get_ref()
        .and_then(|e| e.downcast_ref::<Untranscodable>())
        .is_some_and(|e| !matches!(e, Untranscodable::Bound(_)))
}

/// An error reading a response, as the watch's errors carry it: [`Untranscodable`] marks what
/// only JSON can read ([`needs_json`]).
fn io_error(e: Untranscodable) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// `error`, met writing the JSON of an object read in protobuf, as the error of the list or
/// watch that read it.
pub(crate) fn read_error(error: Untranscodable) -> kube::Error {
    kube::Error::ReadEvents(io_error(error))
}

/// The JSON the API server would have sent for `message`, a protobuf envelope of an object, a
/// list or a Status, as the table of types built into this dispatcher reads it.
pub fn to_json(message: &[u8]) -> Result<String, Untranscodable> {
    let table = &*table::BUILT_IN;
    let unknown = Unknown::read(message)?;
    let ty = kind_type(table, unknown.api_version, unknown.kind)?;
    let types = Some((unknown.api_version, unknown.kind));
    json::object(table, ty, unknown.raw, types).map(|(text, _)| text)
}

/// The object of `message` (an envelope), its JSON written when first asked for; with the
/// type `watched` (the watch's, shared) when its envelope names that one, as it does.
pub(crate) fn object(
    table: &'static Table,
    message: &Bytes,
    watched: Option<&Arc<TypeMeta>>,
) -> Result<WatchedObject, Untranscodable> {
    let unknown = Unknown::read(message)?;
    let ty = kind_type(table, unknown.api_version, unknown.kind)?;
    let types = match watched {
        Some(t) if t.api_version == unknown.api_version && t.kind == unknown.kind => t.clone(),
        _ => Arc::new(TypeMeta {
            api_version: unknown.api_version.to_owned(),
            kind: unknown.kind.to_owned(),
        }),
    };
    let (meta, encoded) = Encoded::read(table, ty, message.slice_ref(unknown.raw), Some(types))?;
    Ok(WatchedObject::from_protobuf(meta, encoded, true))
}
