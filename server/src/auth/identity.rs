//! Who a caller is: the user a TokenReview named ([`Identity`]), or nobody when authentication
//! is off ([`Caller`]); and this process's own identity, which the API server tells it.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use kube::{Api, Client, api::PostParams};

/// The authenticated caller of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The Kubernetes user name (`system:serviceaccount:<namespace>:<name>` for a
    /// ServiceAccount).
    pub username: String,
    /// The user's uid, when the authenticator gives one.
    pub uid: String,
    /// The user's groups.
    pub groups: Vec<String>,
    /// Extra attributes (for ServiceAccount tokens: the pod and node bound to it), which
    /// SubjectAccessReviews pass on.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    pub(super) fn from_user(user: UserInfo) -> Self {
        Self {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        }
    }
}

/// Who is calling, as [`AuthLayer`](super::AuthLayer) puts it on every request it lets through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A verified identity.
    Authenticated(Arc<Identity>),
    /// Nobody checked: the server runs with authentication off (`--allow-anonymous`).
    Anonymous,
}

impl Caller {
    /// The caller of `request`; a request that did not pass through [`AuthLayer`](super::AuthLayer) (a test that
    /// calls a service directly) is anonymous.
    pub fn of<T>(request: &tonic::Request<T>) -> Self {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Anonymous)
    }

    /// The identity, if authenticated.
    pub fn identity(&self) -> Option<&Arc<Identity>> {
        match self {
            Caller::Authenticated(identity) => Some(identity),
            Caller::Anonymous => None,
        }
    }

    /// The user name for logs and errors: `anonymous` when nobody checked.
    pub fn name(&self) -> &str {
        match self {
            Caller::Authenticated(identity) => &identity.username,
            Caller::Anonymous => "anonymous",
        }
    }
}

/// This process's own identity as the API server sees it (a SelfSubjectReview), for servers
/// that admit only their own kind as callers (the dispatchers' Peer service).
pub async fn own_identity(client: &Client) -> Result<Identity, kube::Error> {
    let reviewed = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(Identity::from_user(
        reviewed
            .status
            .and_then(|s| s.user_info)
            .unwrap_or_default(),
    ))
}
