//! kube-runtime's `Controller::new(api, watcher_config)` and `owns(api, watcher_config)`,
//! taking the same arguments, for a port that keeps them: it changes the names it calls, not
//! what it passes.

use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Resource, runtime::watcher};
use serde::de::DeserializeOwned;

use crate::Controller;

impl<K> Controller<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    /// A controller of the objects `api` reaches (its namespace, or every namespace for
    /// `Api::all`) that match `config`'s label and field selectors, with the client `api`
    /// holds: what kube-runtime's `Controller::new(api, config)` watches. Its group is named
    /// after the kind's plural (`configmaps`); every replica of the controller builds the same
    /// one (`Controller::new` names it otherwise). The rest of `config` tunes a watch that the
    /// dispatchers make now (page size, timeouts, list semantics, bookmarks) and has no
    /// effect here.
    pub fn for_api(api: Api<K>, config: watcher::Config) -> Self {
        let namespace = api.namespace().map(str::to_owned);
        let mut this = Self::new(api.into_client(), K::plural(&()).into_owned());
        if let Some(namespace) = namespace {
            this = this.namespace(namespace);
        }
        if let Some(labels) = config.label_selector {
            this = this.labels(labels);
        }
        if let Some(fields) = config.field_selector {
            this = this.fields(fields);
        }
        this
    }

    /// [`Controller::owns`] with kube-runtime's arguments: the children of type `C` that match
    /// `config`'s label and field selectors, in the controller's namespace (the namespace of
    /// `api` is the controller's when it was made from an `Api` of the same namespace).
    #[must_use]
    pub fn owns_api<C: Resource<DynamicType = ()>>(
        self,
        _api: Api<C>,
        config: watcher::Config,
    ) -> Self {
        let mut this = self.owns::<C>();
        if let Some(owned) = this.owned.last_mut() {
            owned.label_selector = config.label_selector.unwrap_or_default();
            owned.field_selector = config.field_selector.unwrap_or_default();
        }
        this
    }
}
