//! The objects a watch receives, decoded only as far as routing needs.
//!
//! A watch hands an object on to the groups whose keys it names, and forgets it. Decoding it
//! whole (every field into a `serde_json::Value` tree, as `DynamicObject` does) and encoding it
//! again for the replica took about 110 µs of CPU per 2 KiB ConfigMap, most of a cold start's
//! work in a dispatcher; and on a ring keyed by name two thirds of what each dispatcher decodes
//! belongs to another. A [`WatchedObject`] keeps the JSON text the API server sent and decodes
//! from it only what routing reads: the metadata's name, namespace, resourceVersion, uid and
//! owner references. A replica's body is that text itself, or its metadata spliced out of it.
//! An object the API server sent in protobuf keeps its protobuf bytes instead, and its JSON is
//! written only if something asks for it (`super::protobuf::Encoded`).

use std::{borrow::Cow, num::NonZeroU64, ops::Range, sync::Arc};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{
    Resource,
    api::{ApiResource, TypeMeta},
    core::DynamicResourceScope,
};
use kube_dispatch_core::subscription::Parts;
use serde::{Deserialize, Deserializer, de::IgnoredAny};
use serde_json::value::RawValue;
use xxhash_rust::xxh64::Xxh64;

use super::protobuf::{Encoded, Untranscodable};

/// An object of a watch or list: its JSON text (or its protobuf bytes, the JSON written when
/// first asked for), and the metadata fields routing reads.
#[derive(Clone, Debug)]
pub struct WatchedObject {
    /// Name, generateName, namespace, resourceVersion, uid and ownerReferences; nothing else
    /// is decoded.
    meta: ObjectMeta,
    /// The object as the API server sent it.
    text: Text,
    /// Whether the object's JSON has its own `apiVersion` and `kind` (the API server leaves
    /// them out of a list's items; a watch writes them into its protobuf lists' items).
    has_api_version: bool,
    has_kind: bool,
}

/// An object as the API server sent it.
#[derive(Clone, Debug)]
enum Text {
    /// In JSON: its text, and where its `metadata` is in it (empty when it has none).
    Json {
        json: Arc<str>,
        metadata: Range<usize>,
    },
    /// In protobuf, its JSON written when first asked for.
    Protobuf(Arc<Encoded>),
}

/// The metadata fields routing reads; serde skips the others (labels, annotations,
/// managedFields) without building them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RoutingMeta {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
}

/// The top level of an object: whether it names its type, and where its metadata is. Read in
/// the same pass that finds where the object ends (`super::list_reader`), so a list's object
/// is scanned once.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Head<'a> {
    api_version: Option<IgnoredAny>,
    kind: Option<IgnoredAny>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
}

/// What a [`Head`] says of the object it was read from.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// Where the metadata is in the object's text (empty when it has none).
    metadata: Range<usize>,
    /// Whether the object names its `apiVersion` and its `kind`.
    has_api_version: bool,
    has_kind: bool,
}

impl Head<'_> {
    /// The layout of `text`, the object this head was read from.
    pub(super) fn layout(&self, text: &str) -> Layout {
        let metadata = self.metadata.map_or(0..0, |raw| {
            let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
            start..start + raw.get().len()
        });
        Layout {
            metadata,
            has_api_version: self.api_version.is_some(),
            has_kind: self.kind.is_some(),
        }
    }
}

impl WatchedObject {
    /// Decodes the routing fields of the object `json`.
    pub fn from_json(json: Arc<str>) -> serde_json::Result<Self> {
        let head: Head<'_> = serde_json::from_str(&json)?;
        let layout = head.layout(&json);
        Self::from_layout(json, layout)
    }

    /// Decodes the routing fields of the object `json`, whose [`Head::layout`] is known: only
    /// its metadata is read.
    pub(super) fn from_layout(
        json: Arc<str>,
        Layout {
            metadata,
            has_api_version,
            has_kind,
        }: Layout,
    ) -> serde_json::Result<Self> {
        let meta = match json.get(metadata.clone()).filter(|m| !m.is_empty()) {
            Some(text) => {
                let m: RoutingMeta = serde_json::from_str(text)?;
                ObjectMeta {
                    name: m.name,
                    generate_name: m.generate_name,
                    namespace: m.namespace,
                    resource_version: m.resource_version,
                    uid: m.uid,
                    owner_references: m.owner_references,
                    ..ObjectMeta::default()
                }
            }
            None => ObjectMeta::default(),
        };
        Ok(Self {
            meta,
            text: Text::Json { json, metadata },
            has_api_version,
            has_kind,
        })
    }

    /// An object the API server sent in protobuf: `meta`, its routing fields, and its bytes,
    /// whose JSON has its own `apiVersion` and `kind` when `typed`.
    pub(super) fn from_protobuf(meta: ObjectMeta, encoded: Encoded, typed: bool) -> Self {
        Self {
            meta,
            text: Text::Protobuf(Arc::new(encoded)),
            has_api_version: typed,
            has_kind: typed,
        }
    }

    /// Whether the API server sent the object in protobuf.
    pub fn read_in_protobuf(&self) -> bool {
        matches!(self.text, Text::Protobuf(_))
    }

    /// The object's JSON and where its metadata is in it: as the API server sent it, or as it
    /// would have sent it, written now if it was not yet; `None` if it cannot be written
    /// ([`Self::transcoded`] says why).
    fn written(&self) -> Option<(&Arc<str>, Range<usize>)> {
        match &self.text {
            Text::Json { json, metadata } => Some((json, metadata.clone())),
            Text::Protobuf(encoded) => {
                let (json, metadata) = encoded.json().as_ref().ok()?;
                Some((json, metadata.clone()))
            }
        }
    }

    /// Writes the object's JSON now if the API server sent it in protobuf: what the table of
    /// types cannot read in it is an error here, not a body left out later.
    pub fn transcoded(&self) -> Result<(), Untranscodable> {
        match &self.text {
            Text::Json { .. } => Ok(()),
            Text::Protobuf(encoded) => encoded.json().as_ref().map(|_| ()).map_err(Clone::clone),
        }
    }

    /// The object as the API server sent it in JSON, or would have; `None` where its protobuf
    /// cannot be written as JSON ([`Self::transcoded`]).
    pub fn json(&self) -> Option<&str> {
        self.written().map(|(json, _)| &**json)
    }

    /// The bytes the object holds.
    pub fn held_bytes(&self) -> usize {
        match &self.text {
            Text::Json { json, .. } => json.len(),
            Text::Protobuf(encoded) => encoded.len(),
        }
    }

    /// The whole object, with `types` filled in where the API server left them out; `None`
    /// where its protobuf cannot be written as JSON. The items of a protobuf list read with
    /// their type have it in their JSON already, so their body is that text itself; a JSON
    /// list's items are copied here with it.
    pub fn full_body(&self, types: &TypeMeta) -> Option<Arc<[u8]>> {
        let (json, _) = self.written()?;
        if self.has_api_version && self.has_kind {
            return Some(Arc::from(json.clone()));
        }
        let rest = json.trim_start().strip_prefix('{').unwrap_or("}");
        let mut out = Vec::with_capacity(json.len() + 64);
        out.push(b'{');
        let mut fields = Vec::with_capacity(2);
        if !self.has_api_version {
            fields.push(field("apiVersion", &types.api_version));
        }
        if !self.has_kind {
            fields.push(field("kind", &types.kind));
        }
        out.extend_from_slice(fields.join(",").as_bytes());
        if !rest.trim_start().starts_with('}') {
            out.push(b',');
        }
        out.extend_from_slice(rest.as_bytes());
        Some(Arc::from(out))
    }

    /// What a change filter compares of the object (keys.md, "Change filters"): one hash of
    /// the `parts` of its metadata, read from the JSON text as the API server wrote it (map keys
    /// in order); `None` (every change delivered) for no parts, metadata that does not decode,
    /// or a generation part of an object without one (as kube-runtime's generation predicate
    /// lets such objects through), or JSON that cannot be written.
    pub fn fingerprint(&self, parts: Parts) -> Option<NonZeroU64> {
        #[derive(Deserialize)]
        struct Compared<'a> {
            generation: Option<i64>,
            #[serde(borrow)]
            labels: Option<&'a RawValue>,
            #[serde(borrow)]
            annotations: Option<&'a RawValue>,
        }
        if parts.is_empty() {
            return None;
        }
        let (json, metadata) = self.written()?;
        let metadata = json.get(metadata).unwrap_or_default();
        let compared: Compared<'_> = if metadata.is_empty() {
            Compared {
                generation: None,
                labels: None,
                annotations: None,
            }
        } else {
            serde_json::from_str(metadata).ok()?
        };
        let mut hash = Xxh64::new(0);
        if parts.contains(Parts::GENERATION) {
            hash.update(b"g");
            hash.update(&compared.generation?.to_le_bytes());
        }
        for (part, tag, text) in [
            (Parts::LABELS, b"l", compared.labels),
            (Parts::ANNOTATIONS, b"a", compared.annotations),
        ] {
            if parts.contains(part) {
                let text = text.map_or("{}", RawValue::get);
                hash.update(tag);
                hash.update(&(text.len() as u64).to_le_bytes());
                hash.update(text.as_bytes());
            }
        }
        Some(NonZeroU64::new(hash.digest()).unwrap_or(NonZeroU64::MIN))
    }

    /// The object's type and metadata only, for a subscription whose payload is its metadata;
    /// `None` where its protobuf cannot be written as JSON.
    pub fn metadata_body(&self, types: &TypeMeta) -> Option<Arc<[u8]>> {
        let (json, metadata) = self.written()?;
        let metadata = json.get(metadata).unwrap_or_default();
        let metadata = if metadata.is_empty() { "{}" } else { metadata };
        let out = format!(
            "{{{},{},\"metadata\":{metadata}}}",
            field("apiVersion", &types.api_version),
            field("kind", &types.kind)
        );
        Some(Arc::from(out.into_bytes()))
    }
}

/// `"name":"value"`, the value escaped as JSON.
fn field(name: &str, value: &str) -> String {
    let value = serde_json::Value::from(value);
    format!("\"{name}\":{value}")
}

/// Takes the object's text as it stands in the input, so only from `serde_json` reading text,
/// and not from a value serde buffered first (a watch event whose `object` came before its
/// `type`, which the API server never sends).
impl<'de> Deserialize<'de> for WatchedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(deserializer)?;
        let json: Arc<str> = Arc::from(raw.get());
        Self::from_json(json).map_err(serde::de::Error::custom)
    }
}

impl Resource for WatchedObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;
    use serde_json::{Value, json};

    use super::*;

    fn types() -> TypeMeta {
        TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        }
    }

    fn decode(value: &Value) -> WatchedObject {
        serde_json::from_str(&value.to_string()).expect("an object")
    }

    fn object() -> Value {
        json!({
            "metadata": {
                "name": "x",
                "namespace": "a",
                "resourceVersion": "7",
                "uid": "u-1",
                "labels": { "app": "web" },
                "managedFields": [{ "manager": "kubectl", "fieldsV1": { "f:data": {} } }],
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u-0",
                    "controller": true,
                }],
            },
            "data": { "k": "v \"quoted\" ü" },
        })
    }

    #[test]
    fn a_fingerprint_changes_with_the_parts_it_compares_only() {
        let with = |patch: Value| {
            let mut value = object();
            value["metadata"]["generation"] = 3.into();
            json_patch(&mut value, patch);
            decode(&value)
        };
        let generation = Parts::GENERATION;
        let both = Parts::GENERATION.with(Parts::LABELS);
        let base = with(json!({}));
        let status =
            with(json!({ "status": { "ready": 1 }, "metadata": { "resourceVersion": "8" } }));
        let relabelled = with(json!({ "metadata": { "labels": { "app": "db" } } }));
        let annotated = with(json!({ "metadata": { "annotations": { "note": "x" } } }));
        let respecced = with(json!({ "metadata": { "generation": 4 } }));
        let fp = |o: &WatchedObject, parts| o.fingerprint(parts);
        assert_eq!(fp(&base, Parts::ALL_CHANGES), None, "no filter");
        assert_eq!(fp(&base, generation), fp(&status, generation));
        assert_eq!(fp(&base, generation), fp(&relabelled, generation));
        assert_ne!(fp(&base, generation), fp(&respecced, generation));
        assert_ne!(fp(&base, both), fp(&relabelled, both));
        assert_eq!(fp(&base, both), fp(&annotated, both));
        assert_ne!(
            fp(&base, Parts::ANNOTATIONS),
            fp(&annotated, Parts::ANNOTATIONS)
        );
        // No generation (a ConfigMap): nothing to compare, every change is delivered.
        assert_eq!(decode(&object()).fingerprint(generation), None);
        assert!(decode(&object()).fingerprint(Parts::LABELS).is_some());
    }

    /// Merges `patch` into `value` (objects member by member).
    fn json_patch(value: &mut Value, patch: Value) {
        match (value, patch) {
            (Value::Object(to), Value::Object(from)) => {
                for (k, v) in from {
                    json_patch(to.entry(k).or_insert(Value::Null), v);
                }
            }
            (to, from) => *to = from,
        }
    }

    #[test]
    fn routing_fields_are_decoded_and_nothing_else() {
        let obj = decode(&object());
        assert_eq!(obj.name_any(), "x");
        assert_eq!(obj.namespace().as_deref(), Some("a"));
        assert_eq!(obj.resource_version().as_deref(), Some("7"));
        assert_eq!(obj.uid().as_deref(), Some("u-1"));
        assert_eq!(obj.owner_references()[0].name, "rs");
        assert!(obj.labels().is_empty(), "labels are not decoded");
        assert!(obj.meta().managed_fields.is_none());
    }

    #[test]
    fn a_full_body_is_the_object_with_its_type_filled_in() {
        // A list item has no apiVersion or kind: both are added, the rest kept as it was.
        let obj = decode(&object());
        let body: Value = serde_json::from_slice(&obj.full_body(&types()).unwrap()).expect("JSON");
        let mut expected = object();
        expected["apiVersion"] = "v1".into();
        expected["kind"] = "ConfigMap".into();
        assert_eq!(body, expected);

        // An event's object names its own type: its text is the body, shared, not copied.
        let mut typed = object();
        typed["apiVersion"] = "v1".into();
        typed["kind"] = "ConfigMap".into();
        let obj = decode(&typed);
        let body = obj.full_body(&types()).unwrap();
        assert_eq!(body.as_ptr(), obj.json().unwrap().as_ptr());
        assert_eq!(serde_json::from_slice::<Value>(&body).expect("JSON"), typed);

        // One of the two missing, or an empty object.
        let obj = decode(&json!({ "kind": "ConfigMap", "metadata": { "name": "y" } }));
        let body: Value = serde_json::from_slice(&obj.full_body(&types()).unwrap()).expect("JSON");
        assert_eq!(
            body,
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "y" } })
        );
        let obj = decode(&json!({}));
        let body: Value = serde_json::from_slice(&obj.full_body(&types()).unwrap()).expect("JSON");
        assert_eq!(body, json!({ "apiVersion": "v1", "kind": "ConfigMap" }));
    }

    #[test]
    fn a_metadata_body_is_the_type_and_the_whole_metadata() {
        let obj = decode(&object());
        let body: Value =
            serde_json::from_slice(&obj.metadata_body(&types()).unwrap()).expect("JSON");
        assert_eq!(
            body,
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": object()["metadata"] })
        );
        let obj = decode(&json!({ "data": {} }));
        let body: Value =
            serde_json::from_slice(&obj.metadata_body(&types()).unwrap()).expect("JSON");
        assert_eq!(
            body,
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": {} })
        );
    }

    #[test]
    fn lists_and_watch_events_decode_into_watched_objects() {
        let list = json!({
            "apiVersion": "v1", "kind": "ConfigMapList",
            "metadata": { "resourceVersion": "9", "continue": "c" },
            "items": [object(), object()],
        });
        let list: kube::api::ObjectList<WatchedObject> =
            serde_json::from_str(&list.to_string()).expect("a list");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.metadata.continue_.as_deref(), Some("c"));
        // A watch event names its type before its object (the API server encodes the Go struct
        // `metav1.WatchEvent` in field order), so the object's text is read in place.
        let event = format!(r#"{{"type":"MODIFIED","object":{}}}"#, object());
        let event: kube::api::WatchEvent<WatchedObject> =
            serde_json::from_str(&event).expect("an event");
        let kube::api::WatchEvent::Modified(obj) = event else {
            panic!("a modification");
        };
        assert_eq!(obj.resource_version().as_deref(), Some("7"));
    }
}
