//! kube-runtime's `Controller::new(api, watcher_config)`, `owns(api, watcher_config)` and
//! `watches(api, watcher_config, mapper)`, taking the same arguments, for a port that keeps
//! them: it changes the names it calls, not what it passes.

use k8s_openapi::NamespaceResourceScope;
use kube::{
    Api, Resource,
    runtime::{reflector::ObjectRef, watcher},
};
use serde::de::DeserializeOwned;

use crate::{
    Controller,
    controller::{Watched, resource_ref},
};

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

impl<K> Controller<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    /// kube-runtime's `watches(api, config, mapper)`, with its arguments, where the objects of
    /// the controller name the watched ones at a field: the controller also says where, with
    /// [`Controller::references`] for the same kind `C`, and the dispatchers then reconcile
    /// the objects that name a `C` when it is created, changed or deleted. The mapper is not
    /// called: it maps the events of a watch of every `C`, which a stateless replica does not
    /// run, and the dispatchers' index of the named objects does its work. The selectors of
    /// `config` narrow the named objects that count, as they narrowed kube-runtime's watch
    /// (they apply to the `references` of `C` unless it has its own); the namespace of `api` is
    /// the controller's, as the named objects are in the namespaces of the objects that name
    /// them.
    ///
    /// Without a `references` of `C`, [`Controller::run`] yields [`Error::Unserved`](crate::Error::Unserved) and ends:
    /// a mapper of another shape (by label, across namespaces, computed) has no counterpart
    /// in the tier, and the error says what to do instead.
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    /// # use kube::{Api, ResourceExt, runtime::{reflector::ObjectRef, watcher}};
    /// # use kube_dispatch_controller::Controller;
    /// # fn f(client: kube::Client) {
    /// // Pods name the ConfigMaps they mount, and the controller marks each ConfigMap with the
    /// // Pod that mounts it; the kube-rs mapper follows the mark. On the tier the `references`
    /// // line says where Pods name ConfigMaps, and a changed ConfigMap reconciles the Pods that
    /// // name it: the same Pods, when the mark and the field agree, as a port requires.
    /// Controller::for_api(Api::<Pod>::namespaced(client.clone(), "default"), watcher::Config::default())
    ///     .watches(Api::<ConfigMap>::namespaced(client, "default"), watcher::Config::default(), |cm: ConfigMap| {
    ///         cm.annotations().get("example.com/pod").map(|pod| ObjectRef::new(pod).within("default"))
    ///     })
    ///     .references::<ConfigMap>(["spec.volumes[*].configMap.name"]);
    /// # }
    /// ```
    #[must_use]
    pub fn watches<C, I>(
        mut self,
        _api: Api<C>,
        config: watcher::Config,
        _mapper: impl Fn(C) -> I + Send + Sync + 'static,
    ) -> Self
    where
        C: Resource<DynamicType = ()>,
        I: IntoIterator<Item = ObjectRef<K>>,
    {
        self.watched.push(Watched {
            resource: resource_ref::<C>(&()),
            label_selector: config.label_selector.unwrap_or_default(),
            field_selector: config.field_selector.unwrap_or_default(),
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
    use kube::runtime::watcher;

    use kube_dispatch_proto::v1::Subscription;

    use super::*;
    use crate::{Error, controller::serve_watched};

    fn client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:1".parse().expect("a URL"));
        kube::Client::try_from(config).expect("a client")
    }

    fn pods() -> Controller<Pod> {
        Controller::for_api(
            Api::namespaced(client(), "default"),
            watcher::Config::default(),
        )
    }

    /// A controller of Pods with a `watches` of ConfigMaps.
    fn watching_configmaps() -> Controller<Pod> {
        pods().watches(
            Api::<ConfigMap>::namespaced(client(), "default"),
            watcher::Config::default(),
            |_: ConfigMap| None::<ObjectRef<Pod>>,
        )
    }

    fn resolved(mut c: Controller<Pod>) -> Result<Vec<Subscription>, Error<std::io::Error>> {
        let watched = std::mem::take(&mut c.watched);
        serve_watched(&mut c.owned, watched).map(|()| c.owned)
    }

    #[tokio::test]
    async fn a_watches_is_served_by_the_references_of_its_kind_with_its_selectors() {
        let c = pods()
            .watches(
                Api::<ConfigMap>::namespaced(client(), "default"),
                watcher::Config::default().labels("mounted=yes"),
                |cm: ConfigMap| Some(ObjectRef::<Pod>::new(&cm.metadata.name.unwrap_or_default())),
            )
            .references::<ConfigMap>(["spec.volumes[*].configMap.name"]);
        let subscriptions = resolved(c).expect("served");
        assert_eq!(subscriptions.len(), 1);
        assert_eq!(subscriptions[0].label_selector, "mounted=yes");
    }

    #[tokio::test]
    async fn a_watches_of_a_kind_no_references_names_is_refused_with_what_to_do() {
        let c = watching_configmaps().references::<Secret>(["spec.volumes[*].secret.secretName"]);
        let refused = resolved(c).expect_err("refused");
        let message = refused.to_string();
        assert!(message.contains("watches(ConfigMap)"), "{message}");
        assert!(message.contains(".references::<ConfigMap>"), "{message}");
        assert!(message.contains(".reconcile_on"), "{message}");
    }

    #[tokio::test]
    async fn run_yields_the_refusal_and_ends_before_any_session() {
        use futures::StreamExt;
        let c = watching_configmaps().dispatchers(["127.0.0.1:1"]);
        let outcomes: Vec<_> = c
            .run(
                |_, _: std::sync::Arc<()>| async {
                    Ok::<_, std::io::Error>(crate::Action::await_change())
                },
                |_, _, _| crate::Action::await_change(),
                std::sync::Arc::new(()),
            )
            .collect()
            .await;
        assert!(
            matches!(outcomes.as_slice(), [Err(Error::Unserved { call, .. })] if call == "watches(ConfigMap)"),
            "{outcomes:?}"
        );
    }
}
