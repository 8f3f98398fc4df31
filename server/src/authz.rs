//! What a caller may read: a controller gets from the tier exactly what its own identity could
//! `list` and `watch` itself. [`Authorizer`] asks the API server with SubjectAccessReviews and
//! keeps each decision in a bounded cache for [`AuthzConfig::recheck`] (a denial for
//! [`AuthzConfig::denial_ttl`], so a new RoleBinding takes effect quickly), with one review per
//! question in flight: review traffic grows with identities and resources, never with the rate
//! of calls. The same reviews guard the operator API, on non-resource paths
//! ([`Authorizer::may`] with [`Access::Path`]).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{Api, Client, api::PostParams};
use tonic::Status;
use tracing::warn;

use crate::auth::Identity;

/// The verbs a caller needs on a resource to be given its objects: what its own informer would
/// use.
pub const READ_VERBS: [&str; 2] = ["list", "watch"];

/// A resource a caller asks to read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResourceAccess {
    /// API group (`""` for the core group).
    pub group: String,
    /// Resource (plural), e.g. `configmaps`.
    pub resource: String,
    /// Namespace; empty for every namespace.
    pub namespace: String,
}

impl std::fmt::Display for ResourceAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resource = if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        };
        if self.namespace.is_empty() {
            write!(f, "{resource} in every namespace")
        } else {
            write!(f, "{resource} in namespace {}", self.namespace)
        }
    }
}

/// What a caller asks to do something to: a resource, or a non-resource path (as a
/// ClusterRole's `nonResourceURLs` grants it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// A resource, in a namespace or in every namespace.
    Resource(ResourceAccess),
    /// A non-resource path, for example `/kube-dispatch/status`.
    Path(&'static str),
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Resource(r) => r.fmt(f),
            Self::Path(path) => f.write_str(path),
        }
    }
}

/// Settings of the authorizer. The defaults are the binaries' flags' defaults.
#[derive(Clone, Debug)]
pub struct AuthzConfig {
    /// Longest an allowed decision is trusted: a revoked RoleBinding ends the caller's
    /// sessions within this, plus one poll.
    pub recheck: Duration,
    /// Longest a denial is remembered.
    pub denial_ttl: Duration,
    /// Most decisions remembered at once; about 400 bytes each.
    pub cache_capacity: u64,
}

impl Default for AuthzConfig {
    fn default() -> Self {
        Self {
            recheck: Duration::from_secs(120),
            denial_ttl: Duration::from_secs(10),
            cache_capacity: 10_000,
        }
    }
}

/// Why a caller was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The API server said no.
    #[error("{user} may not {verb} {access}{reason}: {}", grant_hint(access))]
    Denied {
        /// The caller.
        user: String,
        /// The verb refused.
        verb: &'static str,
        /// What was asked.
        access: Access,
        /// The authorizer's reason, if it gave one (with a leading separator).
        reason: String,
    },
    /// The review could not be made; the call may be retried.
    #[error("cannot check access now: {0}")]
    Unavailable(String),
}

/// How to grant what was refused.
fn grant_hint(access: &Access) -> &'static str {
    match access {
        Access::Resource(_) => {
            "grant it with a Role or ClusterRole, as its own informer would need"
        }
        Access::Path(_) => "grant it with a ClusterRole's nonResourceURLs",
    }
}

impl From<Refused> for Status {
    fn from(e: Refused) -> Self {
        match e {
            Refused::Denied { .. } => Status::permission_denied(e.to_string()),
            Refused::Unavailable(_) => Status::unavailable(e.to_string()),
        }
    }
}

type Question = (Arc<Identity>, &'static str, Access);

#[derive(Clone, Debug)]
struct Decision {
    allowed: bool,
    reason: String,
}

struct DecisionExpiry(AuthzConfig);

impl moka::Expiry<Question, Decision> for DecisionExpiry {
    fn expire_after_create(
        &self,
        _: &Question,
        d: &Decision,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(if d.allowed {
            self.0.recheck
        } else {
            self.0.denial_ttl
        })
    }
}

/// Decides with SubjectAccessReviews, through a bounded cache.
pub struct Authorizer {
    client: Client,
    config: AuthzConfig,
    cache: moka::future::Cache<Question, Decision>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("config", &self.config)
            .field("cached", &self.cache.entry_count())
            .finish()
    }
}

impl Authorizer {
    /// Reviews through `client` (whose identity may create `subjectaccessreviews`).
    pub fn new(client: Client, config: AuthzConfig) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(config.cache_capacity)
            .expire_after(DecisionExpiry(config.clone()))
            .build();
        Self {
            client,
            config,
            cache,
        }
    }

    /// Ok if `who` may `list` and `watch` every one of `accesses`.
    pub async fn may_read(
        &self,
        who: &Arc<Identity>,
        accesses: &[ResourceAccess],
    ) -> Result<(), Refused> {
        for access in accesses {
            for verb in READ_VERBS {
                self.may(who, verb, Access::Resource(access.clone()))
                    .await?;
            }
        }
        Ok(())
    }

    /// Ok if `who` may `verb` `access`.
    pub async fn may(
        &self,
        who: &Arc<Identity>,
        verb: &'static str,
        access: Access,
    ) -> Result<(), Refused> {
        let question = (who.clone(), verb, access.clone());
        let decision = self
            .cache
            .try_get_with(question, self.review(who, verb, &access))
            .await
            .map_err(|e: Arc<Refused>| (*e).clone())?;
        if decision.allowed {
            return Ok(());
        }
        Err(Refused::Denied {
            user: who.username.clone(),
            verb,
            access,
            reason: if decision.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", decision.reason)
            },
        })
    }

    async fn review(
        &self,
        who: &Identity,
        verb: &str,
        access: &Access,
    ) -> Result<Decision, Refused> {
        let (resource_attributes, non_resource_attributes) = match access {
            Access::Resource(access) => (
                Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    group: Some(access.group.clone()),
                    resource: Some(access.resource.clone()),
                    namespace: (!access.namespace.is_empty()).then(|| access.namespace.clone()),
                    ..ResourceAttributes::default()
                }),
                None,
            ),
            Access::Path(path) => (
                None,
                Some(NonResourceAttributes {
                    verb: Some(verb.to_owned()),
                    path: Some((*path).to_owned()),
                }),
            ),
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.username.clone()),
                uid: (!who.uid.is_empty()).then(|| who.uid.clone()),
                groups: Some(who.groups.clone()),
                extra: (!who.extra.is_empty()).then(|| who.extra.clone()),
                resource_attributes,
                non_resource_attributes,
            },
            ..SubjectAccessReview::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                warn!(error = %e, "SubjectAccessReview failed");
                Refused::Unavailable(format!("SubjectAccessReview failed: {e}"))
            })?;
        let status = reviewed.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_names_the_verb_the_resource_and_the_namespace() {
        let e = Refused::Denied {
            user: "system:serviceaccount:team:hasher".into(),
            verb: "watch",
            access: Access::Resource(ResourceAccess {
                group: "apps".into(),
                resource: "deployments".into(),
                namespace: "team".into(),
            }),
            reason: String::new(),
        };
        let status = Status::from(e);
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().starts_with(
                "system:serviceaccount:team:hasher may not watch deployments.apps in namespace team"
            ),
            "{}",
            status.message()
        );
        let everywhere = ResourceAccess {
            group: String::new(),
            resource: "configmaps".into(),
            namespace: String::new(),
        };
        assert_eq!(everywhere.to_string(), "configmaps in every namespace");
        let path = Refused::Denied {
            user: "alice".into(),
            verb: "post",
            access: Access::Path("/kube-dispatch/drain"),
            reason: String::new(),
        };
        assert_eq!(
            path.to_string(),
            "alice may not post /kube-dispatch/drain: grant it with a ClusterRole's nonResourceURLs"
        );
    }
}
