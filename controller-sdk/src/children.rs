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
    /// delivered again if the list changes them.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Whether there were more than the request carries (1000): the first by key are here.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
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

    #[test]
    fn the_state_says_how_far_to_trust_them() {
        assert!(Children::from_request(&request(ChildrenState::Unspecified)).is_none());
        let partial = Children::from_request(&request(ChildrenState::Incomplete));
        assert!(partial.is_some_and(|c| !c.is_complete() && !c.is_truncated()));
        let cut = Children::from_request(&request(ChildrenState::Truncated));
        assert!(cut.is_some_and(|c| !c.is_complete() && c.is_truncated()));
    }
}
