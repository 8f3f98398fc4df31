//! An object read in protobuf whose JSON is written only when something asks for it.
//!
//! On a ring keyed by name each dispatcher reads every object and keeps a third. Not writing the
//! JSON of the objects it then drops took about a fifth off the CPU spent in a dispatcher's own
//! code at a cold start (`perf`, 100 000 ConfigMaps; `bench/HISTORY.md`, 2026-12-03 08:23). An [`Encoded`] object keeps its protobuf bytes; the fields
//! routing reads come from them directly ([`routing_meta`]), and its JSON is written once, the
//! first time a body, a change filter or a reference needs it.
//!
//! What the table of types cannot read in an object is found when its JSON is written, so
//! later than when the whole object was written at once: the watch writes the JSON of every
//! object it keeps before it hands it on (`super::super::fan_out`), and reads the resource in
//! JSON when that fails, as it does when a list or an event fails.

use std::{
    fmt,
    ops::Range,
    sync::{Arc, OnceLock},
};

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::TypeMeta;

use super::{
    Untranscodable,
    json::{self, Fields, Wire, as_text, unexpected},
    table::{Field, Shape, Table},
};

/// The JSON of an object and where its `metadata` is in it, or why it could not be written.
type Written = Result<(Arc<str>, Range<usize>), Untranscodable>;

/// An object's protobuf encoding, and its JSON once asked for.
pub(crate) struct Encoded {
    table: &'static Table,
    /// The object's message type in `table`.
    ty: u32,
    /// The object's bytes (the `raw` of its envelope, or an item of a list).
    raw: Bytes,
    /// The `apiVersion` and `kind` written first in its JSON: its envelope's, or for the items
    /// of a list the watch's (none where not given, as a list's items have none in JSON).
    types: Option<Arc<TypeMeta>>,
    json: OnceLock<Written>,
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoded")
            .field("type", &self.table.types[self.ty as usize].name)
            .field("bytes", &self.raw.len())
            .field("written", &self.json.get().map(Result::is_ok))
            .finish()
    }
}

impl Encoded {
    /// The object `raw` of message type `ty` (a type of `table`), with the `types` its
    /// envelope gave, if any; and the fields of its metadata that routing reads.
    pub(crate) fn read(
        table: &'static Table,
        ty: u32,
        raw: Bytes,
        types: Option<Arc<TypeMeta>>,
    ) -> Result<(ObjectMeta, Self), Untranscodable> {
        let meta = routing_meta(table, ty, &raw)?;
        let encoded = Self {
            table,
            ty,
            raw,
            types,
            json: OnceLock::new(),
        };
        Ok((meta, encoded))
    }

    /// The object's JSON, as the API server would have sent it, and where its `metadata` is in
    /// it; written at the first call.
    pub(crate) fn json(&self) -> &Written {
        self.json.get_or_init(|| {
            let types = self.types.as_deref().map(|t| (&*t.api_version, &*t.kind));
            json::object(self.table, self.ty, &self.raw, types)
                .map(|(text, metadata)| (Arc::from(text), metadata))
        })
    }

    /// Bytes held: the protobuf's, and the JSON's once written.
    pub(crate) fn len(&self) -> usize {
        let written = self.json.get().and_then(|w| w.as_ref().ok());
        self.raw.len() + written.map_or(0, |(text, _)| text.len())
    }
}

/// The fields of the metadata of `raw`, an object of type `ty`, that routing reads: name,
/// generateName, namespace, resourceVersion, uid and ownerReferences, as the JSON reader reads
/// them (an empty string is no value, as `omitempty` leaves it out of JSON). Fields the table
/// does not know are left to [`Encoded::json`] to report, and so is what only malformed input
/// has (a `metadata` given twice: the last is read; an owner reference without its name or
/// uid: read as empty), which the API server never sends.
pub(crate) fn routing_meta(
    table: &Table,
    ty: u32,
    raw: &[u8],
) -> Result<ObjectMeta, Untranscodable> {
    let mut meta = ObjectMeta::default();
    for field in known(table, ty, raw) {
        let (f, value) = field?;
        if f.name.as_deref() == Some("metadata") {
            let Shape::Message(m) = f.shape else {
                let name = &table.types[ty as usize].name;
                return Err(unexpected(format!("{name}'s metadata is not a message")));
            };
            meta = object_meta(table, m, bytes(value)?)?;
        }
    }
    Ok(meta)
}

/// The fields of `raw`, a message of type `ty`, that `table` knows, each with its description;
/// the others are skipped.
fn known<'a>(
    table: &'a Table,
    ty: u32,
    raw: &'a [u8],
) -> impl Iterator<Item = Result<(&'a Field, Wire<'a>), Untranscodable>> {
    let t = &table.types[ty as usize];
    Fields(raw).filter_map(move |field| match field {
        Ok((number, value)) => t.field(number).map(|i| Ok((&t.fields[i], value))),
        Err(e) => Some(Err(e)),
    })
}

fn bytes(value: Wire<'_>) -> Result<&[u8], Untranscodable> {
    match value {
        Wire::Bytes(b) => Ok(b),
        Wire::Varint(_) => Err(unexpected("a varint where bytes belong")),
    }
}

/// A string field; `None` when empty.
fn text(value: Wire<'_>) -> Result<Option<String>, Untranscodable> {
    let b = bytes(value)?;
    Ok((!b.is_empty()).then(|| as_text(b).into_owned()))
}

fn object_meta(table: &Table, ty: u32, raw: &[u8]) -> Result<ObjectMeta, Untranscodable> {
    let mut meta = ObjectMeta::default();
    for field in known(table, ty, raw) {
        let (f, value) = field?;
        match f.name.as_deref().unwrap_or_default() {
            "name" => meta.name = text(value)?,
            "generateName" => meta.generate_name = text(value)?,
            "namespace" => meta.namespace = text(value)?,
            "resourceVersion" => meta.resource_version = text(value)?,
            "uid" => meta.uid = text(value)?,
            "ownerReferences" => {
                let Shape::List(item) = &f.shape else {
                    return Err(unexpected("ownerReferences that are not a list"));
                };
                let Shape::Message(r) = **item else {
                    return Err(unexpected("ownerReferences of no message type"));
                };
                let reference = owner_reference(table, r, bytes(value)?)?;
                meta.owner_references
                    .get_or_insert_with(Vec::new)
                    .push(reference);
            }
            _ => {}
        }
    }
    Ok(meta)
}

fn owner_reference(table: &Table, ty: u32, raw: &[u8]) -> Result<OwnerReference, Untranscodable> {
    let mut reference = OwnerReference::default();
    for field in known(table, ty, raw) {
        let (f, value) = field?;
        let flag = || match value {
            Wire::Varint(v) => Ok(Some(v != 0)),
            Wire::Bytes(_) => Err(unexpected("bytes where a bool belongs")),
        };
        match f.name.as_deref().unwrap_or_default() {
            "apiVersion" => reference.api_version = text(value)?.unwrap_or_default(),
            "kind" => reference.kind = text(value)?.unwrap_or_default(),
            "name" => reference.name = text(value)?.unwrap_or_default(),
            "uid" => reference.uid = text(value)?.unwrap_or_default(),
            "controller" => reference.controller = flag()?,
            "blockOwnerDeletion" => reference.block_owner_deletion = flag()?,
            _ => {}
        }
    }
    Ok(reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{
        object::WatchedObject,
        protobuf::{table::BUILT_IN, testing::Msg},
    };

    /// A ConfigMap in `namespace` whose metadata has every field routing reads, and others.
    fn config_map(namespace: &str) -> Bytes {
        // OwnerReference: kind 1, name 3, uid 4, apiVersion 5, controller 6,
        // blockOwnerDeletion 7.
        let reference = |name: &str, controller: u64| {
            Msg::default()
                .str(1, "ReplicaSet")
                .str(3, name)
                .str(4, &format!("u-{name}"))
                .str(5, "apps/v1")
                .varint(6, controller)
        };
        // ObjectMeta: name 1, generateName 2, namespace 3, uid 5, resourceVersion 6,
        // generation 7, labels 11, ownerReferences 13.
        let meta = Msg::default()
            .str(1, "x")
            .str(2, "x-")
            .str(3, namespace)
            .str(5, "u-1")
            .str(6, "7")
            .varint(7, 2)
            .msg(11, Msg::default().str(1, "app").str(2, "web"))
            .msg(13, reference("rs", 1))
            .msg(13, reference("other", 0).varint(7, 1))
            .msg(
                13,
                Msg::default()
                    .str(1, "Node")
                    .str(3, "n")
                    .str(4, "u-n")
                    .str(5, "v1"),
            );
        let data = Msg::default().str(1, "k").str(2, "v");
        Bytes::from(Msg::default().msg(1, meta).msg(2, data).0)
    }

    fn config_maps() -> u32 {
        BUILT_IN.kind("v1", "ConfigMap").expect("ConfigMap")
    }

    #[test]
    fn routing_fields_read_from_protobuf_are_those_its_json_gives() {
        for namespace in ["ns", ""] {
            let raw = config_map(namespace);
            let (meta, encoded) =
                Encoded::read(&BUILT_IN, config_maps(), raw.clone(), None).expect("a ConfigMap");
            assert_eq!(encoded.len(), raw.len(), "no JSON until asked for");
            let (json, _) = encoded.json().as_ref().expect("its JSON");
            let from_json = WatchedObject::from_json(json.clone()).expect("JSON");
            assert_eq!(&meta, kube::Resource::meta(&from_json), "in {namespace:?}");
            assert_eq!(meta.namespace.is_none(), namespace.is_empty());
            let references = meta.owner_references.as_deref().unwrap_or_default();
            let flags: Vec<_> = references
                .iter()
                .map(|r| (r.name.as_str(), r.controller, r.block_owner_deletion))
                .collect();
            assert_eq!(
                flags,
                [
                    ("rs", Some(true), None),
                    ("other", Some(false), Some(true)),
                    ("n", None, None)
                ]
            );
            // Written once.
            assert_eq!(encoded.len(), raw.len() + json.len());
            let again = &encoded.json().as_ref().expect("its JSON").0;
            assert!(Arc::ptr_eq(json, again));
        }
    }

    #[test]
    fn metadata_of_the_wrong_shape_is_an_error_and_unknown_fields_wait_for_the_json() {
        let varint_name = Msg::default().msg(1, Msg::default().varint(1, 5));
        let error = Encoded::read(&BUILT_IN, config_maps(), Bytes::from(varint_name.0), None);
        assert!(matches!(error, Err(Untranscodable::Unexpected(_))));
        // A metadata field and an object field the table does not know: routing reads what
        // it knows, and writing the JSON says what it does not.
        let newer = Msg::default()
            .msg(1, Msg::default().str(1, "x").str(99, "new"))
            .str(98, "new");
        let (meta, encoded) = Encoded::read(&BUILT_IN, config_maps(), Bytes::from(newer.0), None)
            .expect("read for routing");
        assert_eq!(meta.name.as_deref(), Some("x"));
        assert!(matches!(
            encoded.json(),
            Err(Untranscodable::UnknownField { .. })
        ));
    }
}
