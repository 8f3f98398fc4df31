//! What every part of the runtime shares: the controller's types with their bounds
//! ([`Types`]), and the replica's state (`Shared`).

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    marker::PhantomData,
    sync::{Arc, Mutex, atomic::AtomicUsize},
};

use kube::{Resource, runtime::reflector::ObjectRef};
use kube_dispatch_proto::{
    credentials::AuthChannel,
    v1::{OpenSessionRequest, dispatcher_client::DispatcherClient},
};
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc};

use crate::{Action, Error, Health, metrics::ControllerMetrics};

/// The types a controller is generic over, with the bounds every part of the runtime needs:
/// stated once here, not on every function.
pub(crate) trait Types: Send + Sync + 'static {
    /// The object reconciled.
    type K: Resource<DynamicType: Clone + Send + Sync + 'static>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;
    /// What the reconciler is given besides the object.
    type Ctx: Send + Sync + 'static;
    /// The reconciler's error.
    type E: std::error::Error + Send + Sync + 'static;
    /// The reconciler's future.
    type F: Future<Output = Result<Action, Self::E>> + Send + 'static;
}

/// [`Types`] for the type parameters of [`run`]. Only a marker: never built, and `Send` and
/// `Sync` whatever its parameters.
pub(crate) struct Bound<K, Ctx, E, F>(PhantomData<Params<K, Ctx, E, F>>);

type Params<K, Ctx, E, F> = fn() -> (K, Ctx, E, F);

impl<K, Ctx, E, F> Types for Bound<K, Ctx, E, F>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
{
    type K = K;
    type Ctx = Ctx;
    type E = E;
    type F = F;
}

pub(super) type Reconciler<T> =
    Arc<dyn Fn(Arc<<T as Types>::K>, Arc<<T as Types>::Ctx>) -> <T as Types>::F + Send + Sync>;
pub(super) type ErrorPolicy<T> = Arc<
    dyn Fn(Arc<<T as Types>::K>, &<T as Types>::E, Arc<<T as Types>::Ctx>) -> Action + Send + Sync,
>;
/// What the controller's stream yields for each reconcile or failure.
pub(super) type Outcome<T> = Result<(ObjectRef<<T as Types>::K>, Action), Error<<T as Types>::E>>;

/// What every session and delivery of the replica shares.
pub(super) struct Shared<T: Types> {
    pub(super) dyntype: <T::K as Resource>::DynamicType,
    pub(super) client: kube::Client,
    pub(super) reconcile: Reconciler<T>,
    pub(super) error_policy: ErrorPolicy<T>,
    pub(super) context: Arc<T::Ctx>,
    pub(super) permits: Arc<Semaphore>,
    /// Told when a reconcile gives its slot back (`reconcile::Held`): a session loop whose
    /// polls wait for a free slot polls again then.
    pub(super) slot_freed: tokio::sync::Notify,
    /// Deliveries waiting for a free slot (asked for ahead, [`super::prefetch`], or another
    /// session took the slots a poll counted on), counted from when their poll answered: the
    /// next poll asks for that many fewer, so no more wait than the polls of the open sessions
    /// asked for at once (the bound [`super::prefetch`] gives).
    pub(super) waiting: Arc<AtomicUsize>,
    /// How many deliveries a poll asks for beyond the free slots.
    pub(super) prefetch: super::prefetch::Prefetch,
    /// Keys being reconciled in this replica: never two of one key at once.
    pub(super) running: Mutex<HashSet<String>>,
    pub(super) outcomes: mpsc::Sender<Outcome<T>>,
    pub(super) open: OpenSessionRequest,
    pub(super) health: Health,
    /// The primary subscription carries whole objects: bodies can be decoded as `K`.
    pub(super) full_payload: bool,
    /// How sessions reach the dispatchers.
    pub(super) credentials: kube_dispatch_proto::credentials::Credentials,
    /// This controller's metrics.
    pub(super) metrics: ControllerMetrics,
    /// The objects reconciled last, for deliveries of a version already held.
    pub(super) recent: Arc<super::recent::Recent<T::K>>,
    /// What each key's reconciles wrote here, until its requests show it.
    pub(super) written: Arc<crate::own_writes::Written>,
    /// The open sessions, by dispatcher address: where triggers go (`reconcile_on`). At most
    /// one per assigned dispatcher.
    pub(super) live: Mutex<HashMap<String, LiveSession>>,
    /// Signalled when a session opens, for triggers waiting for one.
    pub(super) session_opened: tokio::sync::Notify,
    /// Sessions ended on dispatchers that died, and the dispatchers named dead.
    pub(super) endings: super::endings::Endings,
    /// Closes the dispatchers did not confirm, asked again (`close_again`), at most
    /// `close_again::MAX_CLOSING_AGAIN`.
    pub(super) closing_again: std::sync::atomic::AtomicUsize,
}

impl<T: Types> Shared<T> {
    /// Forgets what is kept of `key`'s object and of its writes: the object was deleted.
    pub(super) fn forget(&self, key: &str) {
        self.recent.forget(key);
        self.written.forget(key);
    }
}

/// An open session, as a trigger reaches its dispatcher.
#[derive(Clone)]
pub(super) struct LiveSession {
    pub(super) client: DispatcherClient<AuthChannel>,
    pub(super) session_id: String,
}
