//! The features of the wire API a dispatcher serves and a client understands beyond the API's
//! first form (`kubedispatch/v1/versions.md`, "Capabilities"): a dispatcher lists those it serves
//! in `OpenSessionResponse.capabilities`, a client those it understands in
//! `OpenSessionRequest.capabilities`. A dispatcher that lists none predates them all: it would
//! take an owner or `referenced_by` subscription, whose fields it does not know, for a plain
//! one, so a client that needs a feature it does not list must not use the session.
//!
//! ```
//! use kube_dispatch_proto::capabilities::{self, REFERENCES};
//! let offered = vec!["children".to_owned()];
//! assert_eq!(capabilities::missing(&[REFERENCES], &offered), vec![REFERENCES]);
//! ```

/// Subscriptions with an `owner`, and the children listed in each request of an owner.
pub const CHILDREN: &str = "children";
/// Subscriptions with `referenced_by`.
pub const REFERENCES: &str = "references";
/// The `Trigger` call.
pub const TRIGGERS: &str = "triggers";
/// `Subscription.only_changes_of`. Never needed: a dispatcher without it delivers every change.
pub const CHANGE_FILTERS: &str = "change-filters";

/// `OwnedObject.object_json`: the bodies of an owner's children in its requests, sent to the
/// sessions of a client that lists it. Never needed: without it a reconcile reads the children.
pub const CHILDREN_BODIES: &str = "children-bodies";

/// Every capability of this release, in the order they came.
pub const ALL: [&str; 5] = [
    CHILDREN,
    REFERENCES,
    TRIGGERS,
    CHANGE_FILTERS,
    CHILDREN_BODIES,
];

/// What a dispatcher reads, writes and serves of the Leases and the Peer service beyond
/// release 0.1.0's form, listed on its Lease
/// ([`crate::lease::CAPABILITIES_ANNOTATION`]; `kubedispatch/v1/versions.md`, "Capabilities of
/// the tier"). A Lease without the list is a 0.1.0 dispatcher's, which has none of them. A
/// change to the Leases or to Peer that a dispatcher of the previous release could not follow
/// gets a name here, and is made only towards those whose Lease lists it (a Peer call), or only
/// while every Lease lists it (a Lease format).
pub mod tier {
    /// Writes `kube-dispatch.dev/awaits-release` and reads a release as written for the ring
    /// a member awaits only when written after it adopted that ring.
    pub const AWAITS_RELEASE: &str = "awaits-release";
    /// Writes `kube-dispatch.dev/warming` while it warms up, and counts no Lease so marked a
    /// member.
    pub const WARMING: &str = "warming";
    /// Lists its sessions on its Lease (`kube-dispatch.dev/sessions`), carries replicas'
    /// reports of ended ones (`kube-dispatch.dev/ended-sessions`), and ends its wait for a
    /// member that died once every session that member listed is reported ended.
    pub const SESSION_REPORTS: &str = "session-reports";
    /// Serves `Peer.Groups`.
    pub const PEER_GROUPS: &str = "peer-groups";
    /// Serves `Peer.List`: makes one LIST of the API server for the peers that need the same.
    pub const PEER_LISTS: &str = "peer-lists";

    /// Every tier capability of this release, in the order they came.
    pub const ALL: [&str; 5] = [
        AWAITS_RELEASE,
        WARMING,
        SESSION_REPORTS,
        PEER_GROUPS,
        PEER_LISTS,
    ];
}

/// Those of `needed` that `offered` lacks, in the order needed.
pub fn missing<'a>(needed: &[&'a str], offered: &[String]) -> Vec<&'a str> {
    needed
        .iter()
        .copied()
        .filter(|n| !offered.iter().any(|o| o == n))
        .collect()
}

/// The capabilities a session with `subscriptions` needs of its dispatcher (triggers are needed
/// by whoever calls `Trigger`, which the subscriptions do not say).
pub fn needed_by(subscriptions: &[crate::v1::Subscription]) -> Vec<&'static str> {
    let mut needed = Vec::new();
    if subscriptions.iter().any(|s| s.owner.is_some()) {
        needed.push(CHILDREN);
    }
    if subscriptions.iter().any(|s| s.referenced_by.is_some()) {
        needed.push(REFERENCES);
    }
    needed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{References, ResourceRef, Subscription};

    #[test]
    fn owner_and_referenced_by_subscriptions_need_their_features() {
        let plain = Subscription::default();
        let owned = Subscription {
            owner: Some(ResourceRef::default()),
            ..Subscription::default()
        };
        let referenced = Subscription {
            referenced_by: Some(References::default()),
            ..Subscription::default()
        };
        assert!(needed_by(std::slice::from_ref(&plain)).is_empty());
        assert_eq!(
            needed_by(&[plain, owned, referenced]),
            vec![CHILDREN, REFERENCES]
        );
        let offered: Vec<String> = ALL.iter().map(|c| (*c).to_owned()).collect();
        assert!(missing(&ALL, &offered).is_empty());
        assert_eq!(
            missing(&[CHILDREN, TRIGGERS], &[]),
            vec![CHILDREN, TRIGGERS]
        );
    }
}
