//! What controller groups subscribe to, validated and resolved: the domain side of
//! `OpenSessionRequest.subscriptions`.

use std::time::Duration;

use kube_dispatch_proto::v1::{self, ObjectPart, PayloadMode};

use crate::references::{FieldPath, MAX_FIELD_PATHS};

/// Most subscriptions one session may send.
pub const MAX_SUBSCRIPTIONS: usize = 32;
/// Longest group name, replica id, namespace or selector accepted (bytes).
pub const MAX_FIELD_LEN: usize = 1024;

/// A resource resolved by discovery.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    /// API group; empty for core.
    pub group: String,
    /// Version served.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name (the URL segment).
    pub plural: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// One watch against the API server; subscriptions with equal keys share it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    /// The resource.
    pub resource: ResourceId,
    /// One namespace, or empty for all.
    pub namespace: String,
    /// Label selector, possibly empty.
    pub label_selector: String,
    /// Field selector, possibly empty.
    pub field_selector: String,
}

/// How much of the object a delivery carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Payload {
    /// The whole object.
    Full,
    /// apiVersion, kind and metadata.
    Metadata,
    /// Nothing.
    KeyOnly,
}

impl From<PayloadMode> for Payload {
    fn from(mode: PayloadMode) -> Self {
        match mode {
            PayloadMode::Unspecified | PayloadMode::Full => Self::Full,
            PayloadMode::Metadata => Self::Metadata,
            PayloadMode::KeyOnly => Self::KeyOnly,
        }
    }
}

/// The parts of an object whose change a subscription's deliveries wait for
/// (`Subscription.only_changes_of`): none means every change (keys.md, "Change filters").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Parts(u8);

impl Parts {
    /// Every change is delivered.
    pub const ALL_CHANGES: Self = Self(0);
    /// `metadata.generation`.
    pub const GENERATION: Self = Self(1);
    /// `metadata.labels`.
    pub const LABELS: Self = Self(2);
    /// `metadata.annotations`.
    pub const ANNOTATIONS: Self = Self(4);

    /// The parts `values` list (`Subscription.only_changes_of`), or the first value this
    /// server does not know.
    pub fn from_wire(values: &[i32]) -> Result<Self, i32> {
        values.iter().try_fold(Self::ALL_CHANGES, |parts, &value| {
            let part = match ObjectPart::try_from(value) {
                Ok(ObjectPart::Generation) => Self::GENERATION,
                Ok(ObjectPart::Labels) => Self::LABELS,
                Ok(ObjectPart::Annotations) => Self::ANNOTATIONS,
                Ok(ObjectPart::Unspecified) | Err(_) => return Err(value),
            };
            Ok(parts.with(part))
        })
    }

    /// These parts and `other`.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether `part` is among them.
    pub const fn contains(self, part: Self) -> bool {
        self.0 & part.0 == part.0 && part.0 != 0
    }

    /// Whether every change is delivered.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// The kind that owned objects map to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerKind {
    /// API group of the owner; empty for core.
    pub group: String,
    /// Version the controller uses for the owner (reported in deliveries).
    pub version: String,
    /// Kind of the owner.
    pub kind: String,
    /// Whether the kind is namespaced: an owner's key takes its children's namespace (owners
    /// of namespaced objects are in their namespace), or none for a cluster-scoped kind.
    pub namespaced: bool,
}

/// One resolved subscription.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionSpec {
    /// The watch that feeds it.
    pub watch: WatchKey,
    /// Payload of its deliveries.
    pub payload: Payload,
    /// When set, objects are keyed by their controlling owner of this kind.
    pub owner: Option<OwnerKind>,
    /// When set, objects are keyed by the objects that name them
    /// ([`crate::references`]).
    pub named_by: Option<NamedBy>,
    /// The parts whose change is delivered; empty for every change. Only for a primary
    /// subscription.
    pub changes_of: Parts,
}

impl SubscriptionSpec {
    /// Whether its objects are reconciled themselves: neither mapped to an owner nor to the
    /// objects that name them.
    pub fn is_primary(&self) -> bool {
        self.owner.is_none() && self.named_by.is_none()
    }
}

/// The objects that name those of a `referenced_by` subscription, and where.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamedBy {
    /// API group of the naming kind; empty for core.
    pub group: String,
    /// The naming kind (a primary subscription of the same group).
    pub kind: String,
    /// Where a naming object holds a name.
    pub paths: Vec<FieldPath>,
}

/// Everything a group subscribes to; every session of a group must send the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// Sorted, so two sessions listing the same subscriptions in another order agree.
    pub subscriptions: Vec<SubscriptionSpec>,
}

impl GroupSpec {
    /// A spec from resolved subscriptions, in canonical order.
    pub fn new(mut subscriptions: Vec<SubscriptionSpec>) -> Self {
        subscriptions.sort();
        subscriptions.dedup();
        Self { subscriptions }
    }

    /// Whether keys are queued by changes to other objects than their own: owned ones,
    /// named ones.
    pub fn has_related(&self) -> bool {
        self.subscriptions.iter().any(|s| !s.is_primary())
    }

    /// Whether a primary subscription watches every object of `kind` that a watch of children
    /// in `namespace` (empty: all) can name as an owner (namespaced owners are in their
    /// children's namespace): of that kind and scope, in every namespace or that one (any, for
    /// a cluster-scoped kind), with no selector. Its watch then lists those owners itself; an
    /// owner kind need not be watched so.
    pub fn lists_owners_of(&self, kind: &OwnerKind, namespace: &str) -> bool {
        self.subscriptions.iter().any(|s| {
            let (w, r) = (&s.watch, &s.watch.resource);
            s.is_primary()
                && r.group == kind.group
                && r.kind == kind.kind
                && r.namespaced == kind.namespaced
                && w.label_selector.is_empty()
                && w.field_selector.is_empty()
                && (w.namespace.is_empty() || w.namespace == namespace)
        })
    }

    /// The subscriptions whose objects those of `resource` name, if `resource` is one the
    /// group reconciles: what its objects name, and where.
    pub fn named_from<'a>(
        &'a self,
        resource: &'a ResourceId,
    ) -> impl Iterator<Item = (&'a ResourceId, &'a NamedBy)> + 'a {
        self.subscriptions.iter().filter_map(move |s| {
            let n = s.named_by.as_ref()?;
            (n.group == resource.group && n.kind == resource.kind).then_some((&s.watch.resource, n))
        })
    }

    /// The version to report for children of `group`/`kind`: from the subscription to owned
    /// objects of that kind.
    pub fn owned_version_of(&self, group: &str, kind: &str) -> Option<&str> {
        self.subscriptions.iter().find_map(|s| {
            let r = &s.watch.resource;
            (s.owner.is_some() && r.group == group && r.kind == kind).then_some(r.version.as_str())
        })
    }

    /// The version to report for keys of `group`/`kind`: from the subscription of that kind,
    /// or from an owner mapping to it.
    pub fn version_of(&self, group: &str, kind: &str) -> Option<&str> {
        self.subscriptions
            .iter()
            .find_map(|s| {
                let r = &s.watch.resource;
                (s.is_primary() && r.group == group && r.kind == kind).then_some(r.version.as_str())
            })
            .or_else(|| {
                self.subscriptions.iter().find_map(|s| {
                    let o = s.owner.as_ref()?;
                    (o.group == group && o.kind == kind).then_some(o.version.as_str())
                })
            })
    }
}

/// Why an `OpenSessionRequest` is malformed; the message tells the caller what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// A required field is empty.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// A field is longer than [`MAX_FIELD_LEN`].
    #[error("{0} is longer than {MAX_FIELD_LEN} bytes")]
    TooLong(&'static str),
    /// No subscription, or more than [`MAX_SUBSCRIPTIONS`].
    #[error("a session needs between 1 and {MAX_SUBSCRIPTIONS} subscriptions, got {0}")]
    SubscriptionCount(usize),
    /// A resource names neither kind nor plural, or no version.
    #[error("subscription {index}: resource must set version and one of kind or plural")]
    Resource {
        /// Position of the subscription in the request.
        index: usize,
    },
    /// An owner names no kind or no version.
    #[error("subscription {index}: owner must set version and kind")]
    Owner {
        /// Position of the subscription in the request.
        index: usize,
    },
    /// A `referenced_by` that is malformed, or set with `owner`.
    #[error("subscription {index}: referenced_by {reason}")]
    References {
        /// Position of the subscription in the request.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A duration is zero, negative or out of range.
    #[error("{0} must be a positive duration")]
    Duration(&'static str),
    /// A duration longer than this server accepts.
    #[error("{name} must be at most {}s (a week); acknowledge success to wait for the next change", max.as_secs())]
    DurationTooLong {
        /// The field.
        name: &'static str,
        /// The longest accepted.
        max: Duration,
    },
    /// An acknowledgement with no outcome.
    #[error("ack of delivery {0} has no outcome: set success, failure or requeue")]
    NoOutcome(u64),
    /// A memo longer than accepted.
    #[error(
        "the memo of delivery {delivery} is {got} bytes; at most {max} are accepted (keep versions and hashes in it, not objects)"
    )]
    MemoTooLong {
        /// The delivery it was left with.
        delivery: u64,
        /// Its length.
        got: usize,
        /// The most accepted.
        max: usize,
    },
    /// More acknowledgements in one request than accepted.
    #[error("{got} acks in one request; at most {max} are accepted")]
    TooManyAcks {
        /// How many were sent.
        got: usize,
        /// The most accepted.
        max: usize,
    },
    /// `only_changes_of` lists a part this server does not know, or is set with `owner` or
    /// `referenced_by`.
    #[error("subscription {index}: only_changes_of {reason}")]
    ChangeFilter {
        /// Position of the subscription in the request.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// An enum value this server does not know.
    #[error("subscription {index}: unknown payload mode {value}")]
    PayloadMode {
        /// Position of the subscription in the request.
        index: usize,
        /// The value sent.
        value: i32,
    },
}

fn check_len(name: &'static str, value: &str) -> Result<(), InvalidRequest> {
    if value.len() > MAX_FIELD_LEN {
        return Err(InvalidRequest::TooLong(name));
    }
    Ok(())
}

/// Checks the parts of an `OpenSessionRequest` that need no API server.
pub fn validate_open(req: &v1::OpenSessionRequest) -> Result<(), InvalidRequest> {
    if req.group.is_empty() {
        return Err(InvalidRequest::Empty("group"));
    }
    if req.replica_id.is_empty() {
        return Err(InvalidRequest::Empty("replica_id"));
    }
    check_len("group", &req.group)?;
    check_len("replica_id", &req.replica_id)?;
    // Logged as the session opens; the capabilities a client lists are not read (versions.md).
    check_len("client", &req.client)?;
    if req.subscriptions.is_empty() || req.subscriptions.len() > MAX_SUBSCRIPTIONS {
        return Err(InvalidRequest::SubscriptionCount(req.subscriptions.len()));
    }
    if let Some(ttl) = &req.ttl {
        positive_duration("ttl", ttl)?;
    }
    for (index, sub) in req.subscriptions.iter().enumerate() {
        let r = sub
            .resource
            .as_ref()
            .ok_or(InvalidRequest::Resource { index })?;
        if r.version.is_empty() || (r.kind.is_empty() && r.plural.is_empty()) {
            return Err(InvalidRequest::Resource { index });
        }
        if let Some(o) = &sub.owner
            && (o.kind.is_empty() || o.version.is_empty())
        {
            return Err(InvalidRequest::Owner { index });
        }
        if let Some(refs) = &sub.referenced_by {
            named_by(index, sub, refs)?;
        }
        changes_of(index, sub)?;
        if PayloadMode::try_from(sub.payload).is_err() {
            return Err(InvalidRequest::PayloadMode {
                index,
                value: sub.payload,
            });
        }
        for (name, value) in [
            ("resource.group", &r.group),
            ("resource.version", &r.version),
            ("resource.kind", &r.kind),
            ("resource.plural", &r.plural),
        ] {
            check_len(name, value)?;
        }
        if let Some(o) = &sub.owner {
            for (name, value) in [
                ("owner.group", &o.group),
                ("owner.version", &o.version),
                ("owner.kind", &o.kind),
            ] {
                check_len(name, value)?;
            }
        }
        check_len("namespace", &sub.namespace)?;
        check_len("label_selector", &sub.label_selector)?;
        check_len("field_selector", &sub.field_selector)?;
    }
    Ok(())
}

/// The parts subscription `index` filters its changes by, checked.
pub fn changes_of(index: usize, sub: &v1::Subscription) -> Result<Parts, InvalidRequest> {
    let refused = |reason: String| InvalidRequest::ChangeFilter { index, reason };
    let parts = Parts::from_wire(&sub.only_changes_of)
        .map_err(|value| refused(format!("lists {value}, which is not a known object part")))?;
    if !parts.is_empty() && (sub.owner.is_some() || sub.referenced_by.is_some()) {
        return Err(refused(
            "cannot be set with owner or referenced_by: an owner or a naming object is told of every change of the objects it follows".into(),
        ));
    }
    Ok(parts)
}

/// The naming kind and paths of subscription `index`'s `referenced_by`, checked.
pub fn named_by(
    index: usize,
    sub: &v1::Subscription,
    refs: &v1::References,
) -> Result<NamedBy, InvalidRequest> {
    let refused = |reason: String| InvalidRequest::References { index, reason };
    if sub.owner.is_some() {
        return Err(refused(
            "cannot be set with owner: a subscription maps its objects one way".into(),
        ));
    }
    let Some(r) = &refs.resource else {
        return Err(refused("must name the naming resource".into()));
    };
    if r.kind.is_empty() || r.version.is_empty() {
        return Err(refused("resource must set version and kind".into()));
    }
    for value in [&r.group, &r.version, &r.kind] {
        check_len("referenced_by.resource", value)?;
    }
    if refs.field_paths.is_empty() || refs.field_paths.len() > MAX_FIELD_PATHS {
        return Err(refused(format!(
            "needs between 1 and {MAX_FIELD_PATHS} field paths, got {}",
            refs.field_paths.len()
        )));
    }
    let mut paths = refs
        .field_paths
        .iter()
        .map(|p| FieldPath::parse(p).map_err(|e| refused(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    paths.sort();
    paths.dedup();
    Ok(NamedBy {
        group: r.group.clone(),
        kind: r.kind.clone(),
        paths,
    })
}

/// Converts a protobuf duration that must be positive.
pub fn positive_duration(
    name: &'static str,
    d: &prost_types::Duration,
) -> Result<Duration, InvalidRequest> {
    if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) {
        return Err(InvalidRequest::Duration(name));
    }
    Duration::try_from(*d).map_err(|_| InvalidRequest::Duration(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> v1::OpenSessionRequest {
        v1::OpenSessionRequest {
            group: "g".into(),
            replica_id: "r".into(),
            subscriptions: vec![v1::Subscription {
                resource: Some(v1::ResourceRef {
                    version: "v1".into(),
                    kind: "ConfigMap".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ttl: None,
            ..Default::default()
        }
    }

    /// A group's own watch lists the owners a child's list shows only when it selects them
    /// all: of their kind, in their namespace or every one, with no selector.
    #[test]
    fn owners_are_listed_by_a_primary_subscription_that_selects_them_all() {
        let deployments = OwnerKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespaced: true,
        };
        let primary = |kind: &str, namespace: &str, labels: &str| SubscriptionSpec {
            watch: WatchKey {
                resource: ResourceId {
                    group: "apps".into(),
                    version: "v1".into(),
                    kind: kind.into(),
                    plural: String::new(),
                    namespaced: true,
                },
                namespace: namespace.into(),
                label_selector: labels.into(),
                field_selector: String::new(),
            },
            payload: Payload::Full,
            owner: None,
            named_by: None,
            changes_of: Parts::ALL_CHANGES,
        };
        let lists = |sub: SubscriptionSpec, children_in: &str| {
            GroupSpec::new(vec![sub]).lists_owners_of(&deployments, children_in)
        };
        assert!(lists(primary("Deployment", "", ""), "a"));
        assert!(lists(primary("Deployment", "", ""), ""));
        assert!(lists(primary("Deployment", "a", ""), "a"));
        assert!(!lists(primary("Deployment", "a", ""), "b"));
        assert!(
            !lists(primary("Deployment", "a", ""), ""),
            "children of every namespace"
        );
        assert!(!lists(primary("Deployment", "", "tier=web"), "a"));
        assert!(!lists(primary("StatefulSet", "", ""), "a"));
        let mut owned = primary("Deployment", "", "");
        owned.owner = Some(deployments.clone());
        assert!(!lists(owned, "a"), "not a primary subscription");
        // A cluster-scoped owner kind, watched as it must be, in no namespace; not where the
        // two disagree on its scope.
        let mut cluster_scoped = primary("Deployment", "", "");
        cluster_scoped.watch.resource.namespaced = false;
        assert!(!lists(cluster_scoped.clone(), "a"));
        let cluster_owners = OwnerKind {
            namespaced: false,
            ..deployments.clone()
        };
        assert!(GroupSpec::new(vec![cluster_scoped]).lists_owners_of(&cluster_owners, "a"));
    }

    #[test]
    fn accepts_a_minimal_request() {
        assert_eq!(validate_open(&request()), Ok(()));
    }

    /// A `referenced_by` naming Pods as the naming kind, at `paths`.
    fn named_by_pods(paths: &[&str]) -> Option<v1::References> {
        Some(v1::References {
            resource: Some(v1::ResourceRef {
                version: "v1".into(),
                kind: "Pod".into(),
                ..Default::default()
            }),
            field_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        })
    }

    #[test]
    fn rejects_each_malformed_field() {
        type Mutation = fn(&mut v1::OpenSessionRequest);
        let cases: Vec<(Mutation, InvalidRequest)> = vec![
            (|r| r.group.clear(), InvalidRequest::Empty("group")),
            (
                |r| r.replica_id.clear(),
                InvalidRequest::Empty("replica_id"),
            ),
            (
                |r| r.group = "x".repeat(2000),
                InvalidRequest::TooLong("group"),
            ),
            (
                |r| r.subscriptions.clear(),
                InvalidRequest::SubscriptionCount(0),
            ),
            (
                |r| r.subscriptions[0].resource.as_mut().unwrap().kind.clear(),
                InvalidRequest::Resource { index: 0 },
            ),
            (
                |r| r.subscriptions[0].resource = None,
                InvalidRequest::Resource { index: 0 },
            ),
            (
                |r| {
                    r.subscriptions[0].owner = Some(v1::ResourceRef {
                        version: "v1".into(),
                        ..Default::default()
                    })
                },
                InvalidRequest::Owner { index: 0 },
            ),
            (
                |r| {
                    r.ttl = Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 0,
                    })
                },
                InvalidRequest::Duration("ttl"),
            ),
            (
                |r| {
                    r.ttl = Some(prost_types::Duration {
                        seconds: -5,
                        nanos: 0,
                    })
                },
                InvalidRequest::Duration("ttl"),
            ),
            (
                |r| {
                    r.subscriptions[0].referenced_by = named_by_pods(&["spec.volumes[0].name"])
                },
                InvalidRequest::References {
                    index: 0,
                    reason: "field path \"spec.volumes[0].name\": step \"volumes[0]\" must be a member name (letters, digits, '_' or '-'), optionally followed by [*]".into(),
                },
            ),
            (
                |r| {
                    r.subscriptions[0].referenced_by = named_by_pods(&[])
                },
                InvalidRequest::References {
                    index: 0,
                    reason: "needs between 1 and 8 field paths, got 0".into(),
                },
            ),
            (
                |r| {
                    r.subscriptions[0].owner = Some(v1::ResourceRef {
                        version: "v1".into(),
                        kind: "Pod".into(),
                        ..Default::default()
                    });
                    r.subscriptions[0].referenced_by = Some(v1::References::default());
                },
                InvalidRequest::References {
                    index: 0,
                    reason: "cannot be set with owner: a subscription maps its objects one way"
                        .into(),
                },
            ),
            (
                |r| r.subscriptions[0].payload = 99,
                InvalidRequest::PayloadMode {
                    index: 0,
                    value: 99,
                },
            ),
        ];
        for (mutate, want) in cases {
            let mut r = request();
            mutate(&mut r);
            assert_eq!(validate_open(&r), Err(want));
        }
    }

    #[test]
    fn subscription_order_does_not_change_a_spec() {
        let sub = |kind: &str| SubscriptionSpec {
            watch: WatchKey {
                resource: ResourceId {
                    group: String::new(),
                    version: "v1".into(),
                    kind: kind.into(),
                    plural: format!("{}s", kind.to_lowercase()),
                    namespaced: true,
                },
                namespace: String::new(),
                label_selector: String::new(),
                field_selector: String::new(),
            },
            payload: Payload::Full,
            owner: None,
            named_by: None,
            changes_of: Parts::ALL_CHANGES,
        };
        assert_eq!(
            GroupSpec::new(vec![sub("A"), sub("B")]),
            GroupSpec::new(vec![sub("B"), sub("A"), sub("B")])
        );
        assert_eq!(
            GroupSpec::new(vec![sub("A")]).version_of("", "A"),
            Some("v1")
        );
    }
}
