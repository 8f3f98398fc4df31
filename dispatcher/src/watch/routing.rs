//! How one watch event becomes request keys: the rules, apart from the fan-out
//! (`super::fan_out`) that applies them, so each is unit-tested without an API server.
//!
//! - A primary subscription keys an object by itself ([`object_key`]); a subscription to owned
//!   objects keys it by its controlling owner of the subscribed kind ([`owner_key`]).
//! - An object the group reconciles names the objects at its `referenced_by` field paths
//!   ([`named_keys`]); a change to one of those reconciles it.
//! - A key owned elsewhere on the ring only has its deletion remembered, in case it moves here
//!   ([`place`]); a dispatcher off its own ring owns nothing but keeps its index.
//! - A body is serialized at most once per payload mode, whatever the number of groups
//!   ([`Bodies`]).
//! - The end of a re-list sweeps the keys of the watch's kind and namespace ([`in_watch`]).

use std::sync::Arc;

use kube::{ResourceExt, api::TypeMeta};
use kube_dispatch_core::{
    handover::Slice,
    key::KeyRef,
    references::MAX_NAMES_PER_OBJECT,
    subscription::{GroupSpec, OwnerKind, Payload, ResourceId, WatchKey},
};
use kube_dispatch_proto::RequestKey;

use super::object::WatchedObject;

/// The request key of an object of `resource`, for the watch's primary subscribers.
pub fn object_key(resource: &ResourceId, obj: &WatchedObject) -> RequestKey {
    RequestKey::new(
        &resource.group,
        &resource.kind,
        obj.namespace().unwrap_or_default(),
        obj.name_any(),
    )
}

/// The request keys of the objects `obj`, an object of `resource` that `spec` reconciles,
/// names at the field paths of `spec`'s `referenced_by` subscriptions (in `obj`'s namespace
/// when the named resource is namespaced); and whether names past
/// [`MAX_NAMES_PER_OBJECT`] were left out.
pub fn named_keys(
    spec: &GroupSpec,
    resource: &ResourceId,
    obj: &WatchedObject,
) -> (Vec<String>, bool) {
    let mut keys = Vec::new();
    let mut truncated = false;
    let mut names = Vec::new();
    let Some(Ok(root)) = obj
        .json()
        .map(serde_json::from_str::<&serde_json::value::RawValue>)
    else {
        return (keys, truncated);
    };
    for (target, named_by) in spec.named_from(resource) {
        let namespace = if target.namespaced {
            obj.namespace().unwrap_or_default()
        } else {
            String::new()
        };
        names.clear();
        for path in &named_by.paths {
            truncated |= path.names_at(root, &mut names, MAX_NAMES_PER_OBJECT - keys.len());
        }
        keys.extend(names.drain(..).map(|name| {
            RequestKey::new(&target.group, &target.kind, &namespace, name).to_string()
        }));
    }
    keys.sort_unstable();
    keys.dedup();
    (keys, truncated)
}

/// The request key of an owned object: its controlling owner, if that is of the `owner` kind
/// (an object has at most one controlling owner; other owner references do not count).
pub fn owner_key(obj: &WatchedObject, owner: &OwnerKind) -> Option<RequestKey> {
    let reference = obj
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))?;
    let group = reference
        .api_version
        .rsplit_once('/')
        .map_or("", |(group, _version)| group);
    (group == owner.group && reference.kind == owner.kind).then(|| {
        // A namespaced owner is in its child's namespace; a cluster-scoped one in none.
        let namespace = if owner.namespaced {
            obj.namespace().unwrap_or_default()
        } else {
            String::new()
        };
        RequestKey::new(group, &reference.kind, namespace, &reference.name)
    })
}

/// Where the event of a key goes on this dispatcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// To the group, which decides under its lock whether it serves the key, holds it for a
    /// handover, or keeps it in its index.
    Here,
    /// Owned by another member: only a deletion matters, remembered in case the key moves here.
    Elsewhere,
}

/// Where the event of `key` goes, given the slice this dispatcher serves. A cheap early filter,
/// so no body is made for keys owned elsewhere; the group checks again against the slice current
/// then.
pub fn place(slice: &Slice, key: KeyRef<'_>) -> Place {
    if slice.owned_elsewhere(key) {
        Place::Elsewhere
    } else {
        Place::Here
    }
}

/// Whether `key`, a request key's text, is one the primary subscription of `watch` feeds: of its
/// kind and, for a watch of one namespace, in it.
pub fn in_watch(watch: &WatchKey, key: &str) -> bool {
    let r = &watch.resource;
    key.strip_prefix(r.group.as_str())
        .and_then(|k| k.strip_prefix('/'))
        .and_then(|k| k.strip_prefix(r.kind.as_str()))
        .and_then(|k| k.strip_prefix('/'))
        .is_some_and(|rest| {
            watch.namespace.is_empty() || rest.split('/').next() == Some(watch.namespace.as_str())
        })
}

/// The bodies of one object, made at most once per payload mode, whatever the number of groups.
pub struct Bodies<'a> {
    types: &'a TypeMeta,
    full: Option<Arc<[u8]>>,
    metadata: Option<Arc<[u8]>>,
}

impl<'a> Bodies<'a> {
    /// The bodies of an object of the watched type `types` (filled in where the API server left
    /// it out, as in the items of a list).
    pub fn new(types: &'a TypeMeta) -> Self {
        Self {
            types,
            full: None,
            metadata: None,
        }
    }

    /// The whole of `obj`, made once however often it is asked for; `None` where its protobuf
    /// cannot be written as JSON (its replica reads it).
    pub fn full(&mut self, obj: &WatchedObject) -> Option<Arc<[u8]>> {
        if self.full.is_none() {
            self.full = obj.full_body(self.types);
        }
        self.full.clone()
    }

    /// The body of `obj` for a subscription with `payload`: none, the whole object, or its type
    /// and metadata.
    pub fn get(&mut self, payload: Payload, obj: &WatchedObject) -> Option<Arc<[u8]>> {
        let types = self.types;
        match payload {
            Payload::KeyOnly => None,
            Payload::Full => self.full(obj),
            Payload::Metadata => {
                if self.metadata.is_none() {
                    self.metadata = obj.metadata_body(types);
                }
                self.metadata.clone()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::api::TypeMeta;
    use kube_dispatch_proto::{Ring, RingKey};

    use super::*;

    fn resource(group: &str, kind: &str) -> ResourceId {
        ResourceId {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            namespaced: true,
        }
    }

    fn object_with(
        namespace: Option<&str>,
        name: &str,
        owners: serde_json::Value,
    ) -> WatchedObject {
        let mut value = serde_json::json!({
            "metadata": { "name": name, "resourceVersion": "7", "ownerReferences": owners },
            "data": { "k": "v" },
        });
        if let Some(namespace) = namespace {
            value["metadata"]["namespace"] = namespace.into();
        }
        serde_json::from_str(&value.to_string()).expect("a valid object")
    }

    fn object(namespace: Option<&str>, name: &str) -> WatchedObject {
        object_with(namespace, name, serde_json::json!([]))
    }

    fn owned_by(api_version: &str, kind: &str, name: &str, controller: bool) -> WatchedObject {
        let owner = serde_json::json!({
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "uid": "u-1",
            "controller": controller,
        });
        object_with(Some("ns"), "child", serde_json::json!([owner]))
    }

    fn owner(group: &str, kind: &str) -> OwnerKind {
        OwnerKind {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespaced: true,
        }
    }

    #[test]
    fn an_object_is_keyed_by_its_group_kind_namespace_and_name() {
        let key = object_key(&resource("", "ConfigMap"), &object(Some("a"), "x"));
        assert_eq!(key.to_string(), "/ConfigMap/a/x");
        let key = object_key(&resource("", "Namespace"), &object(None, "kube-system"));
        assert_eq!(key.to_string(), "/Namespace//kube-system");
        let key = object_key(
            &resource("apps", "Deployment"),
            &object(Some("web"), "front"),
        );
        assert_eq!(key.to_string(), "apps/Deployment/web/front");
    }

    #[test]
    fn an_owned_object_is_keyed_by_its_controlling_owner_of_the_subscribed_kind() {
        let child = owned_by("apps/v1", "ReplicaSet", "rs-1", true);
        assert_eq!(
            owner_key(&child, &owner("apps", "ReplicaSet")).map(|k| k.to_string()),
            Some("apps/ReplicaSet/ns/rs-1".into())
        );
        // A core-group owner has no group in its apiVersion.
        let child = owned_by("v1", "Service", "svc", true);
        assert_eq!(
            owner_key(&child, &owner("", "Service")).map(|k| k.to_string()),
            Some("/Service/ns/svc".into())
        );
        // A cluster-scoped owner's key has no namespace, whatever its child's.
        let child = owned_by("example.com/v1", "Cluster", "c1", true);
        let clusters = OwnerKind {
            namespaced: false,
            ..owner("example.com", "Cluster")
        };
        assert_eq!(
            owner_key(&child, &clusters).map(|k| k.to_string()),
            Some("example.com/Cluster//c1".into())
        );
        // Another kind or group, or an owner that is not the controller, keys nothing.
        let child = owned_by("apps/v1", "ReplicaSet", "rs-1", true);
        assert_eq!(owner_key(&child, &owner("apps", "Deployment")), None);
        assert_eq!(owner_key(&child, &owner("", "ReplicaSet")), None);
        let child = owned_by("apps/v1", "ReplicaSet", "rs-1", false);
        assert_eq!(owner_key(&child, &owner("apps", "ReplicaSet")), None);
        assert_eq!(
            owner_key(&object(Some("ns"), "x"), &owner("apps", "ReplicaSet")),
            None
        );
    }

    #[test]
    fn a_key_owned_elsewhere_is_placed_elsewhere_unless_this_dispatcher_is_off_its_ring() {
        for ring_key in [RingKey::Name, RingKey::Namespace] {
            let ring = Ring::with_key(["d0", "d1"], ring_key);
            let text = (0..1000)
                .map(|i| format!("/ConfigMap/ns-{i}/x-{i}"))
                .find(|k| ring.owner_of_hash(ring.place(k)) == Some("d1"))
                .expect("some of 1000 keys fall on d1");
            let key = KeyRef::new(&text);
            let d0 = Slice::fixed("d0", ring.clone());
            assert_eq!(place(&d0, key), Place::Elsewhere);
            let d1 = Slice::fixed("d1", ring.clone());
            assert_eq!(place(&d1, key), Place::Here);
            // Off its own ring (cut off from the API server), a dispatcher keeps its index.
            let off = Slice::fixed("d2", ring);
            assert_eq!(place(&off, key), Place::Here);
        }
    }

    #[test]
    fn a_sweep_covers_the_keys_of_the_watch_kind_and_namespace() {
        let watch = WatchKey {
            resource: resource("", "ConfigMap"),
            namespace: "a".into(),
            label_selector: String::new(),
            field_selector: String::new(),
        };
        assert!(in_watch(&watch, "/ConfigMap/a/x"));
        assert!(!in_watch(&watch, "/ConfigMap/ab/x"));
        assert!(!in_watch(&watch, "/Secret/a/x"));
        assert!(!in_watch(&watch, "apps/ConfigMap/a/x"));
        assert!(!in_watch(&watch, "not a key"));
        let everywhere = WatchKey {
            namespace: String::new(),
            ..watch
        };
        assert!(in_watch(&everywhere, "/ConfigMap/ab/x"));
    }

    #[test]
    fn bodies_are_made_once_per_payload_mode() {
        let obj = object(Some("a"), "x");
        let types = TypeMeta {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
        };
        let mut bodies = Bodies::new(&types);
        assert_eq!(bodies.get(Payload::KeyOnly, &obj), None);
        let full = bodies.get(Payload::Full, &obj).expect("a full body");
        assert!(Arc::ptr_eq(
            &full,
            &bodies.get(Payload::Full, &obj).expect("a full body")
        ));
        let full: serde_json::Value = serde_json::from_slice(&full).expect("JSON");
        assert_eq!(full["data"]["k"], "v");
        assert_eq!(full["kind"], "ConfigMap");
        let metadata = bodies
            .get(Payload::Metadata, &obj)
            .expect("a metadata body");
        let metadata: serde_json::Value = serde_json::from_slice(&metadata).expect("JSON");
        assert_eq!(metadata["kind"], "ConfigMap");
        assert_eq!(metadata["metadata"]["name"], "x");
        assert!(metadata.get("data").is_none(), "{metadata}");
    }

    /// An object names the keys at its group's `referenced_by` paths, in its own namespace for a
    /// namespaced resource and in none for a cluster-scoped one, each once, and at most
    /// [`MAX_NAMES_PER_OBJECT`].
    #[test]
    fn an_object_names_the_keys_at_its_groups_field_paths() {
        use kube_dispatch_core::{
            references::FieldPath,
            subscription::{NamedBy, Parts, SubscriptionSpec},
        };
        let watch = |resource: ResourceId| WatchKey {
            resource,
            namespace: String::new(),
            label_selector: String::new(),
            field_selector: String::new(),
        };
        let named = |resource: ResourceId, paths: &[&str]| SubscriptionSpec {
            watch: watch(resource),
            payload: Payload::KeyOnly,
            owner: None,
            named_by: Some(NamedBy {
                group: "example.com".into(),
                kind: "Site".into(),
                paths: paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect(),
            }),
            changes_of: Parts::ALL_CHANGES,
        };
        let site = resource("example.com", "Site");
        let class = ResourceId {
            namespaced: false,
            ..resource("networking.k8s.io", "IngressClass")
        };
        let spec = GroupSpec::new(vec![
            SubscriptionSpec {
                watch: watch(site.clone()),
                payload: Payload::Full,
                owner: None,
                named_by: None,
                changes_of: Parts::ALL_CHANGES,
            },
            named(
                resource("", "Secret"),
                &["spec.tls[*].secretName", "spec.auth"],
            ),
            named(class, &["spec.className"]),
        ]);
        let obj: WatchedObject = serde_json::from_str(
            r#"{"metadata":{"name":"s","namespace":"web"},"spec":{"className":"public","auth":"basic","tls":[{"secretName":"a"},{"secretName":"basic"},{"secretName":"a"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            named_keys(&spec, &site, &obj),
            (
                vec![
                    "/Secret/web/a".to_owned(),
                    "/Secret/web/basic".to_owned(),
                    "networking.k8s.io/IngressClass//public".to_owned(),
                ],
                false
            )
        );
        assert_eq!(
            named_keys(&spec, &resource("", "Secret"), &obj),
            (Vec::new(), false),
            "a kind the group does not reconcile names nothing"
        );
        let many: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"secretName":"s{i}"}}"#))
            .collect();
        let obj: WatchedObject = serde_json::from_str(&format!(
            r#"{{"metadata":{{"name":"s","namespace":"web"}},"spec":{{"tls":[{}]}}}}"#,
            many.join(",")
        ))
        .unwrap();
        let (keys, truncated) = named_keys(&spec, &site, &obj);
        assert_eq!(keys.len(), MAX_NAMES_PER_OBJECT);
        assert!(truncated);
    }
}
