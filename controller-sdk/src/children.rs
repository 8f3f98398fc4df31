//! The children of the object being reconciled, as the dispatcher's watches of its owned
//! objects know them: read them in the reconcile instead of listing them from the API server.
//!
//! A request for an object whose kind a controller `owns` carries the objects it controls (one
//! level down, each with its uid and resourceVersion, no body), at least as new as the change
//! that caused the request, and whether that view is complete (CONTRACT.md, "Children").
//!
//! ```no_run
//! # async fn reconcile() -> Result<(), kube::Error> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube_dispatch_controller::children;
//!
//! // Inside a reconcile of an owner that `owns::<ConfigMap>()`:
//! match children::of_this_reconcile().filter(|c| c.is_complete()) {
//!     Some(children) => {
//!         for child in children.of::<ConfigMap>() {
//!             println!("{} at {}", child.name, child.resource_version);
//!         }
//!     }
//!     // Not known whole (a watch is listing) or not given (a kind not owned): list them.
//!     None => { /* Api::<ConfigMap>::list(...) */ }
//! }
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use kube::Resource;
use kube_dispatch_proto::v1::{ChildrenState, ReconcileRequest};

tokio::task_local! {
    /// The children of the request being reconciled by this task.
    static CHILDREN: Option<Arc<Children>>;
}

/// An owner's children, as its request carried them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Children {
    children: Vec<Child>,
    complete: bool,
    truncated: bool,
}

/// A child: an object the owner controls, as the dispatcher's watch last showed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Child {
    /// API group; empty for the core group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Namespace; empty for a cluster-scoped object.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Uid: a precondition for a delete or update of exactly this object.
    pub uid: String,
    /// The resourceVersion the watch last showed.
    pub resource_version: String,
    /// The child as JSON at that version, when the dispatcher sent it (it holds children's
    /// bodies within its body pool, and the answer had room); empty otherwise.
    /// [`crate::reads::children`] takes it instead of reading the child.
    pub object_json: Vec<u8>,
}

impl Child {
    /// The child as the request carried it ([`Child::object_json`]), if it did, it is of
    /// `K`'s group, version and kind (the body is in the version of the subscription that
    /// watched it: another served version is read from the API server instead), and it reads
    /// as a `K`: what a reconcile would otherwise read from the API server.
    pub fn object<K>(&self) -> Option<K>
    where
        K: Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        if self.object_json.is_empty()
            || self.group != K::group(&())
            || self.version != K::version(&())
            || self.kind != K::kind(&())
        {
            return None;
        }
        serde_json::from_slice(&self.object_json).ok()
    }
}

impl Children {
    /// The children a request carries, or `None` if it carries none because its kind is no
    /// owned subscription's owner (or the dispatcher does not send children).
    pub fn from_request(request: &ReconcileRequest) -> Option<Self> {
        let state = ChildrenState::try_from(request.children_state).ok()?;
        if state == ChildrenState::Unspecified {
            return None;
        }
        let children = request
            .children
            .iter()
            .map(|c| {
                let object = c.object.clone().unwrap_or_default();
                Child {
                    group: object.group,
                    version: object.version,
                    kind: object.kind,
                    namespace: object.namespace,
                    name: object.name,
                    uid: c.uid.clone(),
                    resource_version: c.resource_version.clone(),
                    object_json: c.object_json.clone(),
                }
            })
            .collect();
        Some(Self {
            children,
            complete: state == ChildrenState::Complete,
            truncated: state == ChildrenState::Truncated,
        })
    }

    /// Every child, in key order.
    pub fn iter(&self) -> impl Iterator<Item = &Child> {
        self.children.iter()
    }

    /// The children of type `K`.
    pub fn of<K: Resource<DynamicType = ()>>(&self) -> impl Iterator<Item = &Child> {
        let (group, kind) = (K::group(&()), K::kind(&()));
        self.children
            .iter()
            .filter(move |c| c.group == group && c.kind == kind)
    }

    /// Whether these are every child the watches had shown: no list of theirs was running.
    /// When not, a child may be missing (or one deleted meanwhile still here); the owner is
    /// delivered again if the list changes them. Rare: the dispatcher holds an owner up to 5 s
    /// for such a list to end (CONTRACT.md, "Children").
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Whether there were more than the request carries (1000): the first by key are here.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

/// The versions of its children a reconcile knows hold what it wants, for one desired state,
/// kept in the key's [memo](crate::memo) for the next reconcile: it then reads only a child
/// whose version is newer than the one recorded (changed by someone else since) or that was
/// never recorded, where a cached controller reads none and a stateless one without this reads
/// them all.
///
/// `desired` names what the children are made from (the owner's `metadata.generation`, a hash
/// of the fields they copy, the versions of the objects they name): when it changes, nothing
/// recorded counts. Record a child after writing it (with the version the write returned) or
/// after reading it and finding it as wanted; leave the record at the end of the reconcile.
///
/// A child the request shows at an *older* version than the one recorded holds too: the
/// dispatcher has not seen the write yet (a reconcile's own writes come back one by one, and
/// the owner is delivered again at the first), and whatever changes the child after that write
/// comes with a newer version. Versions are compared as integers, as Kubernetes 1.35 and later
/// guarantee for the objects of one resource (KEP-5504); a child whose version is not such an
/// integer is not recorded, and is read by the next reconcile.
///
/// Each child takes 6 bytes of the memo (a fingerprint of its group, kind, namespace and name)
/// and its version as a LEB128 varint, protobuf's (5 bytes below 34 billion): about 45 fit;
/// past the memo's bound [`Checked::leave`] fails and the next reconcile reads them all. A memo
/// an older SDK left (format 2, whose fingerprint lacked the namespace) is not read: its
/// children are read once more.
///
/// ```no_run
/// # async fn reconcile(owner_generation: i64) -> Result<(), Box<dyn std::error::Error>> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_dispatch_controller::children::{self, Checked};
///
/// let mut checked = Checked::for_desired(owner_generation.to_string());
/// if let Some(known) = children::of_this_reconcile().filter(|c| c.is_complete()) {
///     for child in known.of::<ConfigMap>() {
///         if checked.holds(child) {
///             continue; // as this controller left it: no read
///         }
///         // GET it, write it if it differs, then: checked.record(&written_configmap);
///     }
/// }
/// checked.leave()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    desired: [u8; 8],
    /// Each child's fingerprint and the newest version recorded, in the order first recorded.
    children: Vec<([u8; NAME_PRINT], u64)>,
}

/// The bytes of a child's fingerprint in the memo.
const NAME_PRINT: usize = 6;

impl Checked {
    /// The memo's format: its first byte. Format 2 fingerprinted a child without its
    /// namespace, so same-named children of a cluster-scoped owner in two namespaces shared one
    /// record.
    const FORMAT: u8 = 3;

    /// What the last reconcile recorded for `desired`, or nothing if it recorded for another
    /// desired state (or left no memo here, or one in another format).
    pub fn for_desired(desired: impl AsRef<[u8]>) -> Self {
        let desired = fingerprint(&[desired.as_ref()]);
        let children = crate::memo::previous()
            .and_then(|memo| Self::parse(&memo, desired))
            .unwrap_or_default();
        Self { desired, children }
    }

    fn parse(memo: &[u8], desired: [u8; 8]) -> Option<Vec<([u8; NAME_PRINT], u64)>> {
        let (&format, rest) = memo.split_first()?;
        let (given, mut rest) = rest.split_first_chunk::<8>()?;
        if format != Self::FORMAT || *given != desired {
            return None;
        }
        let mut children = Vec::new();
        while !rest.is_empty() {
            let (print, after) = rest.split_first_chunk::<NAME_PRINT>()?;
            let (version, after) = read_varint(after)?;
            children.push((*print, version));
            rest = after;
        }
        Some(children)
    }

    /// Whether `child`, as the request shows it, is at or before a version recorded for this
    /// desired state.
    pub fn holds(&self, child: &Child) -> bool {
        let Some(version) = resource_version(&child.resource_version) else {
            return false;
        };
        let print = name_print(&child.group, &child.kind, &child.namespace, &child.name);
        self.children
            .iter()
            .any(|(p, recorded)| *p == print && version <= *recorded)
    }

    /// Records `object` (as a write returned it, or as read and found as wanted) as holding
    /// this desired state at its resourceVersion (ignored if that is not an integer).
    pub fn record<K: Resource<DynamicType = ()>>(&mut self, object: &K) {
        let meta = object.meta();
        let Some(version) = resource_version(meta.resource_version.as_deref().unwrap_or_default())
        else {
            return;
        };
        let print = name_print(
            &K::group(&()),
            &K::kind(&()),
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default(),
        );
        match self.children.iter_mut().find(|(p, _)| *p == print) {
            Some((_, recorded)) => *recorded = (*recorded).max(version),
            None => self.children.push((print, version)),
        }
    }

    /// Leaves the record in the memo for the next reconcile of this object.
    pub fn leave(&self) -> Result<(), crate::memo::MemoError> {
        let mut memo = Vec::with_capacity(9 + (NAME_PRINT + 5) * self.children.len());
        memo.push(Self::FORMAT);
        memo.extend_from_slice(&self.desired);
        for (print, version) in &self.children {
            memo.extend_from_slice(print);
            prost::encoding::encode_varint(*version, &mut memo);
        }
        crate::memo::leave(memo)
    }
}

/// A resourceVersion as Kubernetes 1.35 and later make it comparable: a positive decimal
/// integer without leading zeros; `None` for anything else.
fn resource_version(version: &str) -> Option<u64> {
    if version.starts_with('0') || !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    version.parse().ok()
}

/// The varint at the start of `bytes` and what follows it; `None` if cut short or past 64 bits
/// (protobuf's varint, which Go's `binary.Uvarint` reads alike).
fn read_varint(mut bytes: &[u8]) -> Option<(u64, &[u8])> {
    let value = prost::encoding::decode_varint(&mut bytes).ok()?;
    Some((value, bytes))
}

/// The first 8 bytes of the SHA-256 of `parts`, each ended by a zero byte.
fn fingerprint(parts: &[&[u8]]) -> [u8; 8] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for p in parts {
        hash.update(p);
        hash.update([0]);
    }
    let digest = hash.finalize();
    let mut out = [0; 8];
    out.copy_from_slice(&digest[..8]);
    out
}

/// A child's fingerprint in the memo: the first [`NAME_PRINT`] bytes of the fingerprint of its
/// group, kind, namespace (empty for a cluster-scoped child) and name.
fn name_print(group: &str, kind: &str, namespace: &str, name: &str) -> [u8; NAME_PRINT] {
    let print = fingerprint(&[
        group.as_bytes(),
        kind.as_bytes(),
        namespace.as_bytes(),
        name.as_bytes(),
    ]);
    let mut out = [0; NAME_PRINT];
    out.copy_from_slice(&print[..NAME_PRINT]);
    out
}

/// The children of the object the calling task is reconciling, or `None` outside a reconcile,
/// in a task it spawned, or for a kind the controller does not `own` anything of.
pub fn of_this_reconcile() -> Option<Arc<Children>> {
    CHILDREN.try_with(Clone::clone).ok().flatten()
}

/// Runs `reconcile` with `children` as those of the object it reconciles.
pub(crate) async fn scope<F: Future>(children: Option<Children>, reconcile: F) -> F::Output {
    CHILDREN.scope(children.map(Arc::new), reconcile).await
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube_dispatch_proto::v1::{ObjectKey, OwnedObject};

    use super::*;

    #[test]
    fn a_carried_child_is_taken_only_as_its_own_group_version_and_kind() {
        let carried = Child {
            version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "a".into(),
            object_json: br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"v"}}"#.to_vec(),
            ..Child::default()
        };
        let read: ConfigMap = carried.object().expect("carried in its own version");
        assert_eq!(read.data, Some([("k".to_owned(), "v".to_owned())].into()));
        let other_version = Child {
            version: "v2".into(),
            ..carried.clone()
        };
        assert!(other_version.object::<ConfigMap>().is_none());
        assert!(carried.object::<Secret>().is_none(), "another kind");
        let bare = Child {
            object_json: Vec::new(),
            ..carried.clone()
        };
        assert!(bare.object::<ConfigMap>().is_none(), "none carried");
    }

    fn request(state: ChildrenState) -> ReconcileRequest {
        let child = |kind: &str, name: &str| OwnedObject {
            object: Some(ObjectKey {
                group: String::new(),
                version: "v1".into(),
                kind: kind.into(),
                namespace: "ns".into(),
                name: name.into(),
            }),
            uid: format!("uid-{name}"),
            resource_version: "7".into(),
            ..OwnedObject::default()
        };
        ReconcileRequest {
            children: vec![child("ConfigMap", "a"), child("Secret", "s")],
            children_state: state as i32,
            ..ReconcileRequest::default()
        }
    }

    #[tokio::test]
    async fn a_reconcile_reads_the_children_its_request_carried_and_nothing_outside_it() {
        let children = Children::from_request(&request(ChildrenState::Complete));
        let inside = scope(children, async {
            let c = of_this_reconcile().expect("children inside the reconcile");
            let maps: Vec<String> = c.of::<ConfigMap>().map(|c| c.name.clone()).collect();
            let secrets: Vec<String> = c.of::<Secret>().map(|c| c.uid.clone()).collect();
            (maps, secrets, c.is_complete(), c.is_truncated())
        })
        .await;
        assert_eq!(
            inside,
            (vec!["a".to_owned()], vec!["uid-s".to_owned()], true, false)
        );
        assert!(of_this_reconcile().is_none(), "nothing outside a reconcile");
    }

    /// The memo is written as the Go SDK writes it: the cases of
    /// proto/testdata/checked_vectors.json (made by its gen_checked_vectors.py).
    #[tokio::test]
    async fn the_shared_vectors_hold() {
        use k8s_openapi::{
            api::{apps::v1::Deployment, rbac::v1::ClusterRole},
            apimachinery::pkg::apis::meta::v1::ObjectMeta,
        };
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../proto/testdata/checked_vectors.json"))
                .expect("the vectors are JSON");
        let cases = vectors["cases"].as_array().expect("cases");
        assert!(cases.len() >= 4);
        for case in cases {
            let name = case["name"].as_str().unwrap_or_default();
            let slot = crate::memo::Slot::new(Vec::new());
            slot.scope(async {
                let mut checked = Checked::for_desired(case["desired"].as_str().expect("desired"));
                for child in case["children"].as_array().expect("children") {
                    let metadata = ObjectMeta {
                        namespace: child["namespace"]
                            .as_str()
                            .filter(|ns| !ns.is_empty())
                            .map(str::to_owned),
                        name: child["name"].as_str().map(str::to_owned),
                        resource_version: child["resource_version"].as_str().map(str::to_owned),
                        ..ObjectMeta::default()
                    };
                    match (child["group"].as_str(), child["kind"].as_str()) {
                        (Some(""), Some("ConfigMap")) => checked.record(&ConfigMap {
                            metadata,
                            ..ConfigMap::default()
                        }),
                        (Some(""), Some("Secret")) => checked.record(&Secret {
                            metadata,
                            ..Secret::default()
                        }),
                        (Some("apps"), Some("Deployment")) => checked.record(&Deployment {
                            metadata,
                            ..Deployment::default()
                        }),
                        (Some("rbac.authorization.k8s.io"), Some("ClusterRole")) => {
                            checked.record(&ClusterRole {
                                metadata,
                                ..ClusterRole::default()
                            });
                        }
                        other => panic!("{name}: no typed object for {other:?}"),
                    }
                }
                checked.leave().expect("the children fit");
            })
            .await;
            let memo = slot.take();
            let hex: String = memo.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, case["memo_hex"].as_str().expect("memo_hex"), "{name}");
            // Read back: each child holds at the version recorded (unless it cannot be
            // compared), in its own namespace only.
            let next = crate::memo::Slot::new(memo);
            next.scope(async {
                let checked = Checked::for_desired(case["desired"].as_str().expect("desired"));
                for child in case["children"].as_array().expect("children") {
                    let text = |field: &str| child[field].as_str().unwrap_or_default().to_owned();
                    let shown = Child {
                        group: text("group"),
                        kind: text("kind"),
                        namespace: text("namespace"),
                        name: text("name"),
                        resource_version: text("resource_version"),
                        ..Child::default()
                    };
                    let comparable = resource_version(&shown.resource_version).is_some();
                    assert_eq!(checked.holds(&shown), comparable, "{name}: {shown:?}");
                    let elsewhere = Child {
                        namespace: format!("{}-other", shown.namespace),
                        ..shown.clone()
                    };
                    assert!(!checked.holds(&elsewhere), "{name}: {elsewhere:?}");
                }
            })
            .await;
        }
    }

    #[tokio::test]
    async fn checked_children_are_those_recorded_for_the_same_desired_state_at_their_version() {
        let c = Children::from_request(&request(ChildrenState::Complete)).expect("children");
        let child = c.of::<ConfigMap>().next().expect("a ConfigMap").clone();
        let mut written = ConfigMap::default();
        written.metadata.namespace = Some(child.namespace.clone());
        written.metadata.name = Some(child.name.clone());
        written.metadata.resource_version = Some(child.resource_version.clone());
        let slot = crate::memo::Slot::new(Vec::new());
        slot.scope(async {
            let mut checked = Checked::for_desired("gen-1");
            assert!(!checked.holds(&child), "nothing recorded yet");
            checked.record(&written);
            assert!(checked.holds(&child));
            checked.leave().expect("one child fits");
        })
        .await;
        let memo = slot.take();
        assert_eq!(child.resource_version, "7");
        assert_eq!(
            memo.len(),
            9 + 6 + 1,
            "format, desired, the child and its version"
        );
        let next = crate::memo::Slot::new(memo);
        let changed = Child {
            resource_version: "8".into(),
            ..child.clone()
        };
        // The dispatcher has not seen the write yet: what it shows is older than what was
        // written, and nothing can have changed it since without a newer version.
        let lagging = Child {
            resource_version: "6".into(),
            ..child.clone()
        };
        let secret = Child {
            kind: "Secret".into(),
            ..child.clone()
        };
        let seen = next
            .scope(async {
                let same = Checked::for_desired("gen-1");
                let other = Checked::for_desired("gen-2");
                (
                    same.holds(&child),
                    same.holds(&changed),
                    same.holds(&secret),
                    other.holds(&child),
                    same.holds(&lagging),
                )
            })
            .await;
        assert_eq!(seen, (true, false, false, false, true));
    }

    #[tokio::test]
    async fn a_record_past_the_memo_bound_is_refused() {
        let slot = crate::memo::Slot::new(Vec::new());
        let (fit, left) = slot
            .scope(async {
                let mut checked = Checked::for_desired("d");
                let mut fit = 0;
                for i in 0..100 {
                    let mut cm = ConfigMap::default();
                    cm.metadata.name = Some(format!("c{i}"));
                    // A version of a cluster that has made a billion changes: 5 bytes.
                    cm.metadata.resource_version = Some(format!("{}", 1_000_000_000 + i));
                    checked.record(&cm);
                    if checked.leave().is_err() {
                        return (fit, checked.leave());
                    }
                    fit += 1;
                }
                (fit, Ok(()))
            })
            .await;
        assert!(left.is_err());
        assert_eq!(fit, 45, "(512 - 9) / (6 + 5) children fit");
        assert_eq!(slot.take().len(), 9 + 45 * 11, "the last that fit stays");
    }

    #[tokio::test]
    async fn a_version_is_recorded_once_per_child_at_its_newest_and_only_if_an_integer() {
        let slot = crate::memo::Slot::new(Vec::new());
        let cm = |version: &str| {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some("c".into());
            cm.metadata.resource_version = Some(version.into());
            cm
        };
        let child = |version: &str| Child {
            kind: "ConfigMap".into(),
            name: "c".into(),
            resource_version: version.into(),
            ..Child::default()
        };
        let held = slot
            .scope(async {
                let mut checked = Checked::for_desired("d");
                checked.record(&cm("300"));
                checked.record(&cm("200"));
                checked.record(&cm("0300"));
                checked.record(&cm("opaque"));
                checked.leave().expect("fits");
                let again = Checked::for_desired("d");
                [
                    "299",
                    "300",
                    "301",
                    "0300",
                    "opaque",
                    "",
                    "99999999999999999999",
                ]
                .map(|v| again.holds(&child(v)))
            })
            .await;
        assert_eq!(held, [true, true, false, false, false, false, false]);
        assert_eq!(slot.take().len(), 9 + 6 + 2, "one child, 300 in two bytes");
    }

    #[test]
    fn varints_round_trip_and_refuse_what_is_cut_short() {
        for value in [0, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let mut bytes = Vec::new();
            prost::encoding::encode_varint(value, &mut bytes);
            bytes.push(0xaa);
            assert_eq!(read_varint(&bytes), Some((value, &[0xaa][..])), "{value}");
        }
        assert_eq!(read_varint(&[0x80]), None, "cut short");
        assert_eq!(read_varint(&[0xff; 11]), None, "longer than a u64");
        let mut past = vec![0xff; 9];
        past.push(0x02);
        assert_eq!(read_varint(&past), None, "a tenth byte past the 64th bit");
        assert_eq!(
            Checked::parse(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3], [0; 8]),
            None,
            "a child cut short makes the memo unreadable"
        );
    }

    #[test]
    fn the_state_says_how_far_to_trust_them() {
        assert!(Children::from_request(&request(ChildrenState::Unspecified)).is_none());
        let partial = Children::from_request(&request(ChildrenState::Incomplete));
        assert!(partial.is_some_and(|c| !c.is_complete() && !c.is_truncated()));
        let cut = Children::from_request(&request(ChildrenState::Truncated));
        assert!(cut.is_some_and(|c| !c.is_complete() && c.is_truncated()));
    }
}
