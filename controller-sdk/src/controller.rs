//! The controller builder: what to reconcile, where the dispatchers are, how much at once.

use std::{future::Future, marker::PhantomData, pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube::{Client, Resource, runtime::reflector::ObjectRef};
use kube_dispatch_proto::{
    credentials::Credentials,
    v1::{ObjectPart, PayloadMode, References, ResourceRef, Subscription},
};
use serde::de::DeserializeOwned;

use crate::{
    Action, DispatcherService, Error, Health, runtime,
    runtime::{Trigger, TriggerStream},
    targets::Finding,
};

pub(crate) type ShutdownFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A controller of objects of type `K`, fed by kube-dispatch dispatchers instead of informers.
///
/// ```no_run
/// use std::{sync::Arc, time::Duration};
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube_dispatch_controller::{Action, Controller};
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("never fails")]
/// struct Never;
///
/// async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, Never> {
///     println!("reconciling {:?}", cm.metadata.name);
///     Ok(Action::await_change())
/// }
///
/// fn error_policy(_cm: Arc<ConfigMap>, _e: &Never, _ctx: Arc<()>) -> Action {
///     Action::requeue(Duration::from_secs(5))
/// }
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = kube::Client::try_default().await?;
/// // The load balancer says which dispatchers to poll (KD_LOADBALANCER, else the in-cluster
/// // default); `.dispatchers([...])` names them instead.
/// Controller::<ConfigMap>::new(client, "configmap-hasher")
///     .shutdown_on_signal()
///     .run(reconcile, error_policy, Arc::new(()))
///     .for_each(|result| async move {
///         if let Err(e) = result {
///             eprintln!("{e}");
///         }
///     })
///     .await;
/// # Ok(())
/// # }
/// ```
pub struct Controller<K: Resource> {
    pub(crate) dyntype: K::DynamicType,
    pub(crate) client: Client,
    pub(crate) group: String,
    pub(crate) replica_id: String,
    pub(crate) primary: Subscription,
    /// The subscriptions to owned and to named objects.
    pub(crate) owned: Vec<Subscription>,
    /// Where the dispatchers are: [`Controller::dispatchers`], [`Controller::load_balancer`]
    /// and [`Controller::dispatcher_service`].
    pub(crate) finding: Finding,
    pub(crate) credentials: Credentials,
    pub(crate) concurrency: usize,
    /// [`Controller::prefetch`]; `None`: the concurrency.
    pub(crate) prefetch: Option<usize>,
    pub(crate) metrics: bool,
    pub(crate) session_ttl: Duration,
    pub(crate) shutdown: Option<ShutdownFuture>,
    /// What `reconcile_on` and `reconcile_all_on` gave.
    pub(crate) triggers: Vec<TriggerStream>,
    pub(crate) health: Health,
    pub(crate) admin_listen: Option<std::net::SocketAddr>,
    /// Bytes of objects kept as last reconciled ([`Controller::recent_objects`]).
    pub(crate) recent_objects: u64,
    /// What kube-runtime's `watches` gave ([`Controller::watches`]): served by a `references`
    /// of the same kind, refused by `run` otherwise.
    pub(crate) watched: Vec<Watched>,
    _kind: PhantomData<fn() -> K>,
}

/// What [`Controller::recent_objects`] keeps by default: 1 MiB of JSON, hundreds of objects of
/// a few KiB, far more than the reconciles in flight at once whose writes echo back.
const DEFAULT_RECENT_OBJECTS: u64 = 1024 * 1024;

/// A kind given to [`Controller::watches`], with the selectors of its watcher config.
pub(crate) struct Watched {
    pub(crate) resource: ResourceRef,
    pub(crate) label_selector: String,
    pub(crate) field_selector: String,
}

/// Serves each of `watched` by the subscription among `subscriptions` that follows the objects
/// of its kind named by the controller's (giving it the watched selectors where it has none);
/// refuses the first that none serves.
pub(crate) fn serve_watched<E: std::error::Error + 'static>(
    subscriptions: &mut [Subscription],
    watched: Vec<Watched>,
) -> Result<(), Error<E>> {
    for w in watched {
        let Some(named) = subscriptions
            .iter_mut()
            .find(|s| s.referenced_by.is_some() && s.resource.as_ref() == Some(&w.resource))
        else {
            let kind = &w.resource.kind;
            return Err(Error::Unserved {
                call: format!("watches({kind})"),
                instead: format!(
                    "add .references::<{kind}>([field paths]) naming where the controller's objects name a {kind} \
                     (the dispatchers then reconcile them when it changes); a mapper that finds them otherwise \
                     (by label, across namespaces, computed) has no counterpart: keep a watch of your own and \
                     send its keys to .reconcile_on"
                ),
            });
        };
        if named.label_selector.is_empty() && named.field_selector.is_empty() {
            named.label_selector = w.label_selector;
            named.field_selector = w.field_selector;
        }
    }
    Ok(())
}

/// The request key (keys.md) of `object`, of type `K`.
fn request_key<K: Resource>(dyntype: &K::DynamicType, object: &ObjectRef<K>) -> String {
    kube_dispatch_proto::RequestKey::new(
        K::group(dyntype),
        K::kind(dyntype),
        object.namespace.clone().unwrap_or_default(),
        object.name.clone(),
    )
    .to_string()
}

pub(crate) fn resource_ref<K: Resource>(dyntype: &K::DynamicType) -> ResourceRef {
    ResourceRef {
        group: K::group(dyntype).into_owned(),
        version: K::version(dyntype).into_owned(),
        kind: K::kind(dyntype).into_owned(),
        plural: K::plural(dyntype).into_owned(),
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
    /// A controller of a statically typed resource (a k8s-openapi type or a
    /// `#[derive(CustomResource)]` type) in `group`; see [`Controller::new_with`].
    pub fn new(client: Client, group: impl Into<String>) -> Self {
        Self::new_with(client, group, ())
    }

    /// Reconcile the owner when an object of type `C` that it controls (an ownerReference with
    /// `controller: true` to a `K`) changes, like controller-runtime's `Owns`. One level: in
    /// Deployment -> ReplicaSet -> Pod, a Deployment controller that owns ReplicaSets is not
    /// triggered by their Pods (`proto/kubedispatch/v1/keys.md`, "What a subscription
    /// delivers").
    #[must_use]
    pub fn owns<C: Resource<DynamicType = ()>>(self) -> Self {
        self.owns_with::<C>(&())
    }

    /// [`Controller::owns`], for the children of type `C` that match a label selector only
    /// (e.g. `app.kubernetes.io/managed-by=my-controller`), as kube-runtime's
    /// `owns(api, watcher::Config::default().labels(..))` or a controller-runtime cache's
    /// label selector for `C` would watch them. The dispatchers then watch only such children,
    /// and each request lists only them; a child that loses the label is as one deleted.
    #[must_use]
    pub fn owns_labelled<C: Resource<DynamicType = ()>>(self, selector: impl Into<String>) -> Self {
        let mut this = self.owns_with::<C>(&());
        if let Some(owned) = this.owned.last_mut() {
            owned.label_selector = selector.into();
        }
        this
    }

    /// Reconcile an object when an object of type `C` that it names at one of `field_paths`
    /// is created, changed or deleted: a Secret named by `spec.secretName`, ConfigMaps named
    /// by `spec.template.spec.volumes[*].configMap.name`. This is what kube-runtime's
    /// `Controller::watches` with a mapper and controller-runtime's `Watches` with a field
    /// index are used for, with neither a cache nor a mapper in the controller: the
    /// dispatcher reads the paths from the objects it delivers and keeps the index. The
    /// named object is in the naming object's namespace (for a namespaced `C`); a path is
    /// member names separated by dots, with `[*]` after a list member
    /// (`proto/kubedispatch/v1/keys.md`, "References"). The reconciler reads the named object
    /// (a GET) only when it needs its content.
    #[must_use]
    pub fn references<C: Resource<DynamicType = ()>>(
        self,
        field_paths: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.references_with::<C>(&(), field_paths)
    }
}

impl<K> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
{
    /// A controller in `group`: every replica of one controller uses the same group name, and
    /// each key is reconciled by one replica of the group at a time. `dyntype` describes the
    /// resource: `()` for static types, an `ApiResource` for `DynamicObject`. `client` is used
    /// for the SDK's own reads; reconcilers take theirs from the context.
    pub fn new_with(client: Client, group: impl Into<String>, dyntype: K::DynamicType) -> Self {
        let replica_id = std::env::var("POD_NAME")
            .unwrap_or_else(|_| format!("{}-{}", hostname(), std::process::id()));
        let resource = resource_ref::<K>(&dyntype);
        let group = group.into();
        let client = crate::api_requests::counted(
            client,
            std::sync::Arc::new(crate::metrics::api_requests(&group)),
        );
        Self {
            dyntype,
            client,
            group,
            replica_id,
            primary: Subscription {
                resource: Some(resource),
                payload: PayloadMode::Full as i32,
                ..Subscription::default()
            },
            owned: Vec::new(),
            finding: Finding::default(),
            credentials: Credentials::from_env(),
            concurrency: 16,
            prefetch: None,
            metrics: true,
            session_ttl: Duration::from_secs(10),
            shutdown: None,
            triggers: Vec::new(),
            health: Health::default(),
            admin_listen: admin_listen_from_env(),
            recent_objects: DEFAULT_RECENT_OBJECTS,
            watched: Vec::new(),
            _kind: PhantomData,
        }
    }

    /// Only objects in `namespace` (and their owned and named objects there).
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        self.primary.namespace = namespace.clone();
        for o in &mut self.owned {
            o.namespace = namespace.clone();
        }
        self
    }

    /// Only objects matching a label selector, e.g. `app=web`.
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.primary.label_selector = selector.into();
        self
    }

    /// Only objects matching a field selector, e.g. `metadata.name=config`.
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.primary.field_selector = selector.into();
        self
    }

    /// How much of the object each request carries. With [`PayloadMode::Metadata`] or
    /// [`PayloadMode::KeyOnly`] the SDK reads the object from the API server before calling the
    /// reconciler: from its watch cache, at least as new as the change the request delivers.
    #[must_use]
    pub fn payload(mut self, mode: PayloadMode) -> Self {
        self.primary.payload = mode as i32;
        self
    }

    /// Delivers a change of the reconciled objects only when one of `parts` changed, as
    /// kube-runtime's `predicate_filter(predicates::generation)` (or `predicates::labels`,
    /// `predicates::annotations`) filters a watch, but in the dispatcher, for every replica:
    /// with [`ObjectPart::Generation`] a status write is not delivered. Creations, deletions,
    /// resyncs, retries, requeues and changes of owned and named objects always are (keys.md,
    /// "Change filters"). A dispatcher older than 0.2.0 delivers every change.
    ///
    /// ```no_run
    /// # use k8s_openapi::api::apps::v1::Deployment;
    /// # use kube_dispatch_controller::{Controller, ObjectPart};
    /// # fn f(client: kube::Client) {
    /// let controller = Controller::<Deployment>::new(client, "deployments")
    ///     .only_changes_of([ObjectPart::Generation, ObjectPart::Labels]);
    /// # }
    /// ```
    #[must_use]
    pub fn only_changes_of(mut self, parts: impl IntoIterator<Item = ObjectPart>) -> Self {
        self.primary.only_changes_of = parts
            .into_iter()
            .filter(|p| *p != ObjectPart::Unspecified)
            .map(|p| p as i32)
            .collect();
        self
    }

    /// [`Controller::owns`] for a child type described by `dyntype`.
    #[must_use]
    pub fn owns_with<C: Resource>(mut self, dyntype: &C::DynamicType) -> Self {
        self.owned.push(Subscription {
            resource: Some(resource_ref::<C>(dyntype)),
            namespace: self.primary.namespace.clone(),
            payload: PayloadMode::KeyOnly as i32,
            owner: Some(resource_ref::<K>(&self.dyntype)),
            ..Subscription::default()
        });
        self
    }

    /// [`Controller::references`] for a named type described by `dyntype`.
    #[must_use]
    pub fn references_with<C: Resource>(
        mut self,
        dyntype: &C::DynamicType,
        field_paths: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.owned.push(Subscription {
            resource: Some(resource_ref::<C>(dyntype)),
            namespace: self.primary.namespace.clone(),
            payload: PayloadMode::KeyOnly as i32,
            referenced_by: Some(References {
                resource: Some(resource_ref::<K>(&self.dyntype)),
                field_paths: field_paths.into_iter().map(Into::into).collect(),
            }),
            ..Subscription::default()
        });
        self
    }

    /// The client the controller reads with, to give the reconciler (in its context): the one
    /// given to [`Controller::new`], counting each request it sends by verb in the metrics
    /// (`kube_dispatch_api_requests_total`, [`crate::api_requests`]), so what the controller
    /// costs the API server shows beside its reconciles. The [`crate::precondition`] helpers
    /// take an `Api` made from it like any other.
    #[must_use]
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Most reconciles running at once in this replica (default 16).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Most deliveries a poll asks for beyond the free slots (default: the concurrency; 0 for
    /// none), asked for only while the replica's reconciles are quick: every one of the last
    /// twice-the-concurrency held its slot for at most an eighth of the reconcile limit divided
    /// by the sessions open. They wait in the replica for a slot, their deadline running, so
    /// that a slot that frees has work at once instead of after a round trip to the dispatcher;
    /// a cold start of quick reconciles then runs faster. A slow reconcile, or a delivery whose
    /// deadline passed, turns it off until a window of quick ones has followed. A graceful stop
    /// runs what waits before it closes the sessions (handed back, those keys would reach
    /// another replica no sooner, and without their objects), so a stop takes up to that many
    /// more quick reconciles; with `n` above the concurrency a delivery may wait longer than
    /// the quarter of its limit the default keeps it within.
    #[must_use]
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// How the replica reaches the tier: TLS trust and its ServiceAccount token. Default:
    /// [`Credentials::from_env`] (TLS against the CA bundle and with the projected token that
    /// `deploy/` mounts under `/var/run/secrets/kube-dispatch/`).
    #[must_use]
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = credentials;
        self
    }

    /// Poll exactly these dispatchers (`host:port`) instead of asking the load
    /// balancer: every replica then polls every one of them.
    #[must_use]
    pub fn dispatchers<I, S>(mut self, addresses: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.finding.dispatchers = addresses.into_iter().map(Into::into).collect();
        self
    }

    /// The load balancer to register with (`host:port`); it says which dispatchers this
    /// replica polls, and changes that as dispatchers and replicas come and go. This is the
    /// default: without this call or [`Self::dispatchers`], the address comes from the
    /// `KD_LOADBALANCER` environment variable, else
    /// [`DEFAULT_LOAD_BALANCER`](crate::DEFAULT_LOAD_BALANCER).
    #[must_use]
    pub fn load_balancer(mut self, address: impl Into<String>) -> Self {
        self.finding.load_balancer = Some(address.into());
        self
    }

    /// The dispatchers' headless Service, which this replica looks up once it has failed to
    /// register with the load balancer for 10 s (no load balancer leads), and every 5 s after
    /// that: it keeps polling the dispatchers assigned last and adds those the Service names,
    /// so a dispatcher that joins meanwhile is polled too. The next assignment replaces them.
    /// Without this call, `KD_DISPATCHER_SERVICE` (`host:port`, looked up in DNS) if set; else
    /// none, and the replica polls only what it was assigned last. Unused with
    /// [`Self::dispatchers`].
    #[must_use]
    pub fn dispatcher_service(mut self, service: DispatcherService) -> Self {
        self.finding.service = Some(service);
        self
    }

    /// This replica's id (default: the `POD_NAME` environment variable, else host and pid).
    #[must_use]
    pub fn replica_id(mut self, id: impl Into<String>) -> Self {
        self.replica_id = id.into();
        self
    }

    /// Keep the objects this replica reconciled last, up to `bytes` of their JSON in all
    /// (default 1 MiB; 0 keeps none), least recently used out first. A delivery without a body
    /// that names an object at the very version (and uid) a reconcile here was given is handed
    /// that object again instead of reading it: the usual case is the delivery that the
    /// reconcile's own writes of children cause (reason `OWNED`) when the dispatcher did not
    /// keep the object's body for it. A delivery for another object's change that names an
    /// older version of an object a reconcile here wrote since is handed the written one. A version names one state of
    /// one object, so the object is what a read would return unless it changed since the
    /// dispatcher last saw it, and that change is delivered next. Nothing else is served from
    /// it; `kube_dispatch_objects_loaded_total{source="recent"}` counts the reads it saved.
    #[must_use]
    pub fn recent_objects(mut self, bytes: u64) -> Self {
        self.recent_objects = bytes;
        self
    }

    /// Session ttl to ask the dispatchers for (default 10 s). A replica that cannot renew its
    /// session within three quarters of it cancels the reconciles it holds.
    #[must_use]
    pub fn session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// Reconcile the object each item of `trigger` names, when the stream yields it, like
    /// kube-runtime's `reconcile_on`: for objects whose state lives outside the cluster (a
    /// cloud resource, an external queue), or a watch of the controller's own. The request
    /// (reason `TRIGGERED`) goes to the dispatchers this replica has sessions with; the one that
    /// serves the key reconciles it, under the same exclusivity and coalescing as a change (a
    /// key in flight runs again after), if it has seen the object; the others ignore it. Every
    /// replica of the group should run the same stream, so that each dispatcher is asked by a
    /// replica connected to it (a key may then run once per replica for one item; CONTRACT.md,
    /// "Triggers"). What the stream yields before a session is open waits for one. At most
    /// 1000 keys go in one request; the stream is read no faster than the dispatchers take
    /// them. An `ObjectRef` of an object that does not exist reconciles nothing (kube-runtime
    /// reports it as `ObjectNotFound`).
    #[must_use]
    pub fn reconcile_on(
        mut self,
        trigger: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    ) -> Self
    where
        K::DynamicType: Clone + Send + 'static,
    {
        let dyntype = self.dyntype.clone();
        self.triggers.push(Box::pin(
            trigger.map(move |object| Trigger::Key(request_key::<K>(&dyntype, &object))),
        ));
        self
    }

    /// Reconcile every object of the controller each time `trigger` yields, like
    /// kube-runtime's `reconcile_all_on` (a configuration file the reconciler reads changed,
    /// say): each dispatcher this replica has a session with reconciles every key of the group
    /// it serves (reason `TRIGGERED`). For a periodic pass, the dispatchers' resync already
    /// reconciles every key once per `--resync-interval`.
    #[must_use]
    pub fn reconcile_all_on(mut self, trigger: impl Stream<Item = ()> + Send + 'static) -> Self {
        self.triggers.push(Box::pin(trigger.map(|()| Trigger::All)));
        self
    }

    /// Stop when `signal` completes: stop taking work, let running reconciles finish (within
    /// the maximum reconcile time), acknowledge them, and close the sessions so the
    /// dispatchers hand the replica's keys to other replicas at once.
    #[must_use]
    pub fn graceful_shutdown_on(
        mut self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        self.shutdown = Some(Box::pin(signal));
        self
    }

    /// [`Self::graceful_shutdown_on`] SIGTERM or SIGINT.
    #[must_use]
    pub fn shutdown_on_signal(self) -> Self {
        self.graceful_shutdown_on(async {
            let terminate = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = terminate => {}
            }
        })
    }

    /// Whether to record this controller's metrics ([`crate::metrics`]); default true. With
    /// false, its reconciles, deliveries and sessions are not counted (a controller that keeps
    /// metrics of its own); the process figures are still served on the admin endpoint.
    #[must_use]
    pub fn metrics(mut self, record: bool) -> Self {
        self.metrics = record;
        self
    }

    /// Serve the admin endpoint on `address` (plaintext HTTP): `/metrics` (the replica's
    /// metrics, [`crate::metrics`], with controller-runtime's names), `/healthz` (live until
    /// the drain ends) and `/readyz` (at least one dispatcher session open). Default: the
    /// `KD_ADMIN_LISTEN` environment variable, else no admin endpoint. The controllers of one
    /// process that name the same address share one endpoint (the metrics registry is the
    /// process's): its `/readyz` is ready while every one of them has a session open.
    #[must_use]
    pub fn admin_listen(mut self, address: std::net::SocketAddr) -> Self {
        self.admin_listen = Some(address);
        self
    }

    /// A handle on the controller's readiness and liveness, for the replica's probes.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Runs the controller: one session per dispatcher it is assigned, long-polling for
    /// reconcile requests and running `reconcile` on them. The stream yields each outcome; it ends after a graceful
    /// shutdown. A call the tier does not serve ([`Controller::watches`] of a kind no
    /// [`Controller::references`] names) makes the stream yield one [`Error::Unserved`], which
    /// names what to call instead, and end, before any session opens. A reconciler error goes to `error_policy`: [`Action::requeue`] asks the
    /// dispatcher to deliver the key again after that delay, [`Action::await_change`] lets the
    /// dispatcher retry with its per-key exponential backoff.
    pub fn run<Ctx, E, ReconcileFut>(
        self,
        reconcile: impl Fn(Arc<K>, Arc<Ctx>) -> ReconcileFut + Send + Sync + 'static,
        error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
        context: Arc<Ctx>,
    ) -> impl Stream<Item = Result<(ObjectRef<K>, Action), Error<E>>> + Send
    where
        Ctx: Send + Sync + 'static,
        E: std::error::Error + Send + Sync + 'static,
        ReconcileFut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let mut this = self;
        match serve_watched(&mut this.owned, std::mem::take(&mut this.watched)) {
            Ok(()) => runtime::run(this, Arc::new(reconcile), Arc::new(error_policy), context)
                .left_stream(),
            Err(refused) => {
                tracing::error!(group = %this.group, error = %refused, "the controller does not start");
                futures::stream::iter([Err(refused)]).right_stream()
            }
        }
    }
}

/// `KD_ADMIN_LISTEN`, when set; a value that is not an address is reported and ignored.
fn admin_listen_from_env() -> Option<std::net::SocketAddr> {
    let value = std::env::var("KD_ADMIN_LISTEN")
        .ok()
        .filter(|v| !v.is_empty())?;
    match value.parse() {
        Ok(address) => Some(address),
        Err(e) => {
            tracing::error!(%value, error = %e, "KD_ADMIN_LISTEN is not an address such as 0.0.0.0:9080; no admin endpoint");
            None
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "replica".to_owned())
}
