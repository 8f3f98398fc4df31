//! Who may do what on a dispatcher (`proto/kubedispatch/v1/security.md`):
//!
//! - every call but health checks is authenticated ([`kube_dispatch_server::auth`]);
//! - a session gets a group's keys only while its caller may `list` and `watch` every resource
//!   the group subscribes to (owned kinds included), checked at OpenSession and again on polls
//!   once the decision is older than `--authorization-recheck`;
//! - groups are scoped by identity (`kube_dispatch_server::auth::GroupId`), and a session
//!   belongs to the identity that opened it (`crate::table`);
//! - `Operator/Key` answers for a group only when the caller may `get` its resources
//!   ([`Guard::may_get_in`]);
//! - only the dispatchers' own identity may call the Peer service;
//! - the operator API asks a SubjectAccessReview on a non-resource path
//!   ([`STATUS_PATH`], [`DRAIN_PATH`], [`RECONCILE_PATH`]).

use std::sync::Arc;

use kube::Client;
use kube_dispatch_core::subscription::GroupSpec;
use kube_dispatch_proto::credentials::Credentials;
use kube_dispatch_server::{
    auth::{self, AuthConfig, Authentication, Authenticator, Caller, Identity},
    authz::{Access, Authorizer, AuthzConfig, Refused, ResourceAccess},
    tls::Transport,
};
use tonic::Status;
use tracing::info;

/// The non-resource path whose `get` lets a caller read the operator API (Status, Key).
pub const STATUS_PATH: &str = "/kube-dispatch/status";
/// The non-resource path whose `post` lets a caller drain a dispatcher.
pub const DRAIN_PATH: &str = "/kube-dispatch/drain";
/// The non-resource path whose `post` lets a caller reconcile a key through the operator API.
pub const RECONCILE_PATH: &str = "/kube-dispatch/reconcile";

/// The security settings of a dispatcher.
#[derive(Clone, Debug)]
pub struct SecurityConfig {
    /// TLS, or plaintext (`--insecure`).
    pub transport: Transport,
    /// How callers are authenticated; `None` takes anonymous calls (`--allow-anonymous`), and
    /// then nothing is authorized either.
    pub authentication: Option<AuthConfig>,
    /// How read access is checked and cached.
    pub authorization: AuthzConfig,
    /// How this dispatcher reaches its peers: TLS trust and its own token.
    pub peer_credentials: Credentials,
    /// The users allowed to call Peer; `None`: this dispatcher's own user, as the API server
    /// names it (a SelfSubjectReview at start), which every replica of the StatefulSet shares.
    pub peer_users: Option<Vec<String>>,
}

impl SecurityConfig {
    /// Plaintext, anonymous, and peers called without credentials: for a dispatcher on a
    /// trusted loopback only.
    pub fn insecure() -> Self {
        Self {
            transport: Transport::Plaintext,
            authentication: None,
            authorization: AuthzConfig::default(),
            peer_credentials: Credentials::plaintext(),
            peer_users: None,
        }
    }
}

/// The security settings, put to work.
#[derive(Debug)]
pub struct Guard {
    authentication: Authentication,
    authorizer: Option<Authorizer>,
    peer_users: Option<Vec<String>>,
    /// How this dispatcher reaches its peers.
    pub peer_credentials: Credentials,
}

impl Guard {
    /// Builds the authenticator and the authorizer on `client`, and learns this dispatcher's
    /// own user when Peer callers are not listed.
    pub async fn new(config: &SecurityConfig, client: &Client) -> Result<Self, kube::Error> {
        let Some(auth_config) = &config.authentication else {
            return Ok(Self {
                authentication: Authentication::Anonymous,
                authorizer: None,
                peer_users: None,
                peer_credentials: config.peer_credentials.clone(),
            });
        };
        let peer_users = match &config.peer_users {
            Some(users) => users.clone(),
            None => {
                let own = auth::own_identity(client).await?;
                info!(user = %own.username, "Peer calls are taken from this dispatcher's own user only");
                vec![own.username]
            }
        };
        // Token and access reviews take their turns, so a reconnect storm cannot make this
        // dispatcher open a connection to the API server per review.
        let reviews = kube_dispatch_server::client::for_reviews(client.clone());
        Ok(Self {
            authentication: Authentication::Required(Arc::new(Authenticator::new(
                reviews.clone(),
                auth_config.clone(),
            ))),
            authorizer: Some(Authorizer::new(reviews, config.authorization.clone())),
            peer_users: Some(peer_users),
            peer_credentials: config.peer_credentials.clone(),
        })
    }

    /// How the server authenticates.
    pub fn authentication(&self) -> &Authentication {
        &self.authentication
    }

    /// Ok if `caller` may read each of `accesses` (a group's, [`accesses`]). Anonymous callers
    /// are only let through when authentication is off.
    pub async fn may_read(
        &self,
        caller: &Caller,
        accesses: &[ResourceAccess],
    ) -> Result<(), Status> {
        let Some((authorizer, identity)) = self.authorizing(caller)? else {
            return Ok(());
        };
        authorizer
            .may_read(identity, accesses)
            .await
            .map_err(Status::from)
    }

    /// Whether `caller` may `get` the object of a key in `namespace` (empty: cluster-scoped)
    /// through every one of `accesses` (a group's watched resources): what a group knows of a
    /// key comes from those objects, so an operator who may not read them learns nothing of
    /// the key from that group. UNAVAILABLE when a review cannot be made.
    pub async fn may_get_in(
        &self,
        caller: &Caller,
        accesses: &[ResourceAccess],
        namespace: &str,
    ) -> Result<bool, Status> {
        let Some((authorizer, identity)) = self.authorizing(caller)? else {
            return Ok(true);
        };
        for access in accesses {
            let access = ResourceAccess {
                namespace: if access.namespace.is_empty() {
                    namespace.to_owned()
                } else {
                    access.namespace.clone()
                },
                ..access.clone()
            };
            match authorizer
                .may(identity, "get", Access::Resource(access))
                .await
            {
                Ok(()) => {}
                Err(Refused::Denied { .. }) => return Ok(false),
                Err(e @ Refused::Unavailable(_)) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    /// Ok if `caller` may `verb` the operator API's non-resource `path`. Anonymous callers
    /// are only let through when authentication is off.
    pub async fn may_operate(
        &self,
        caller: &Caller,
        verb: &'static str,
        path: &'static str,
    ) -> Result<(), Status> {
        let Some((authorizer, identity)) = self.authorizing(caller)? else {
            return Ok(());
        };
        authorizer
            .may(identity, verb, Access::Path(path))
            .await
            .map_err(Status::from)
    }

    /// The authorizer and `caller`'s identity; `None` when authorization is off (anonymous
    /// dispatchers), and UNAUTHENTICATED for an anonymous caller when it is on.
    fn authorizing<'a>(
        &'a self,
        caller: &'a Caller,
    ) -> Result<Option<(&'a Authorizer, &'a Arc<Identity>)>, Status> {
        let Some(authorizer) = &self.authorizer else {
            return Ok(None);
        };
        match caller.identity() {
            Some(identity) => Ok(Some((authorizer, identity))),
            None => Err(Status::unauthenticated(
                "this dispatcher requires an authenticated caller",
            )),
        }
    }

    /// Ok if `caller` may call the Peer service.
    pub fn may_call_peer(&self, caller: &Caller) -> Result<(), Status> {
        let Some(users) = &self.peer_users else {
            return Ok(());
        };
        match caller.identity() {
            Some(identity) if users.contains(&identity.username) => Ok(()),
            _ => Err(Status::permission_denied(format!(
                "{} may not call the Peer service: only the dispatchers' own identity may",
                caller.name()
            ))),
        }
    }
}

/// What a caller must be able to read to be given `spec`'s keys: each subscription's
/// resource, in its namespace or in every namespace, owned kinds included.
pub fn accesses(spec: &GroupSpec) -> Vec<ResourceAccess> {
    let mut accesses: Vec<ResourceAccess> = spec
        .subscriptions
        .iter()
        .map(|s| ResourceAccess {
            group: s.watch.resource.group.clone(),
            resource: s.watch.resource.plural.clone(),
            namespace: s.watch.namespace.clone(),
        })
        .collect();
    accesses.sort_by(|a, b| {
        (&a.group, &a.resource, &a.namespace).cmp(&(&b.group, &b.resource, &b.namespace))
    });
    accesses.dedup();
    accesses
}
