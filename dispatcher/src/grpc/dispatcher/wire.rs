//! A delivery as the wire carries it: a `ReconcileRequest`, with the owner's children.

use kube_dispatch_core::{children::OwnerChildren, queue::Delivery};
use kube_dispatch_proto::{
    RequestKey,
    v1::{self, ReconcileRequest},
};

use crate::group::Group;

/// The wire's name of the object `key` names, at `version`.
fn object_key(key: RequestKey, version: String) -> v1::ObjectKey {
    v1::ObjectKey {
        group: key.group,
        version,
        kind: key.kind,
        namespace: key.namespace,
        name: key.name,
    }
}

/// A delivery as the wire carries it.
pub(super) fn to_wire(
    group: &Group,
    d: Delivery,
    children: Option<OwnerChildren>,
) -> ReconcileRequest {
    let (children, children_state) = match children {
        None => (Vec::new(), v1::ChildrenState::Unspecified),
        Some(of) => {
            let state = if of.truncated {
                v1::ChildrenState::Truncated
            } else if of.complete {
                v1::ChildrenState::Complete
            } else {
                v1::ChildrenState::Incomplete
            };
            let children = of
                .children
                .into_iter()
                .map(|c| {
                    let key = RequestKey::parse(&c.key)
                        .unwrap_or_else(|_| RequestKey::new("", "", "", &*c.key));
                    let version = group
                        .spec
                        .owned_version_of(&key.group, &key.kind)
                        .unwrap_or_default()
                        .to_owned();
                    v1::OwnedObject {
                        object: Some(object_key(key, version)),
                        uid: c.uid.into(),
                        resource_version: c.resource_version.into(),
                        object_json: c.body.map(|b| b.to_vec()).unwrap_or_default(),
                    }
                })
                .collect();
            (children, state)
        }
    };
    let key = RequestKey::parse(&d.key).unwrap_or_else(|_| RequestKey::new("", "", "", &d.key));
    let version = group
        .spec
        .version_of(&key.group, &key.kind)
        .unwrap_or_default()
        .to_owned();
    ReconcileRequest {
        delivery_id: d.id,
        key: d.key,
        object: Some(object_key(key, version)),
        reason: d.reason as i32,
        resource_version: d.resource_version,
        uid: d.uid,
        object_json: d.body.map(|b| b.to_vec()).unwrap_or_default(),
        deleted: d.deleted,
        attempt: d.attempt,
        traceparent: d.trace.map(|t| t.to_string()).unwrap_or_default(),
        children,
        children_state: children_state as i32,
        memo: d.memo.map(|m| m.to_vec()).unwrap_or_default(),
        // Keys of the listed lane give way to changes by design: their wait is no latency.
        waited: d
            .queued
            .filter(|_| !d.listed)
            .and_then(|q| prost_types::Duration::try_from(q).ok()),
    }
}
