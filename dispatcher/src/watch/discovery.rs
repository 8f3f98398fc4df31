//! Resolves the resources that subscriptions name, by API discovery, so any built-in or custom
//! resource works.

use std::{collections::HashMap, time::Duration};

use kube::{Client, core::GroupVersion, discovery};
use kube_dispatch_proto::v1::ResourceRef;
use tokio::sync::Mutex;

use kube_dispatch_core::subscription::ResourceId;

/// Why a resource could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The API server does not serve it.
    #[error("the API server serves no resource {0}")]
    NotFound(String),
    /// Discovery itself failed.
    #[error("API discovery failed for {resource}: {source}")]
    Discovery {
        /// What was being resolved.
        resource: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
}

/// How long a resource the API server does not serve is answered NOT_FOUND without asking it
/// again: a caller naming made-up group/versions cannot turn OpenSession into a discovery call
/// each. A resource installed since (a new CRD) is found at most this long after its miss.
pub const MISS_TTL: Duration = Duration::from_secs(10);
/// Most resources remembered as not served.
pub const MAX_MISSES: u64 = 1024;

type CacheKey = (String, String, String, String);

/// Resolves and remembers resources. The cache holds one entry per distinct resource the API
/// server serves and some subscription named, so it is bounded by the API server's resources;
/// misses are remembered apart, at most [`MAX_MISSES`] for [`MISS_TTL`].
pub struct Resolver {
    client: Client,
    cache: Mutex<HashMap<CacheKey, ResourceId>>,
    misses: moka::sync::Cache<CacheKey, ()>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

impl Resolver {
    /// A resolver that asks the API server behind `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(HashMap::new()),
            misses: moka::sync::Cache::builder()
                .max_capacity(MAX_MISSES)
                .time_to_live(MISS_TTL)
                .build(),
        }
    }

    /// Resolves a resource by group, version and kind or plural.
    pub async fn resolve(&self, r: &ResourceRef) -> Result<ResourceId, ResolveError> {
        let cache_key = (
            r.group.clone(),
            r.version.clone(),
            r.kind.clone(),
            r.plural.clone(),
        );
        if let Some(hit) = self.cache.lock().await.get(&cache_key) {
            return Ok(hit.clone());
        }
        let name = describe(r);
        if self.misses.contains_key(&cache_key) {
            return Err(ResolveError::NotFound(name));
        }
        let missed = |name| {
            self.misses.insert(cache_key.clone(), ());
            ResolveError::NotFound(name)
        };
        let gv = GroupVersion::gv(&r.group, &r.version);
        let group = match discovery::pinned_group(&self.client, &gv).await {
            Ok(group) => group,
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(missed(name)),
            Err(source) => {
                return Err(ResolveError::Discovery {
                    resource: name,
                    source,
                });
            }
        };
        let found = group
            .versioned_resources(&r.version)
            .into_iter()
            .find(|(ar, _)| {
                // Subresources (pods/status) are not watchable objects.
                !ar.plural.contains('/')
                    && (r.kind.is_empty() || ar.kind == r.kind)
                    && (r.plural.is_empty() || ar.plural == r.plural)
            })
            .ok_or_else(|| missed(name))?;
        let (ar, caps) = found;
        let id = ResourceId {
            group: ar.group,
            version: ar.version,
            kind: ar.kind,
            plural: ar.plural,
            namespaced: caps.scope == discovery::Scope::Namespaced,
        };
        self.cache.lock().await.insert(cache_key, id.clone());
        Ok(id)
    }
}

fn describe(r: &ResourceRef) -> String {
    let what = if r.kind.is_empty() {
        &r.plural
    } else {
        &r.kind
    };
    if r.group.is_empty() {
        format!("{}/{what}", r.version)
    } else {
        format!("{}/{}/{what}", r.group, r.version)
    }
}
