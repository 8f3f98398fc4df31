//! Shared, non-caching watches against the API server.
//!
//! One watch runs per distinct [`WatchKey`] (resource, namespace, selectors), started by the
//! first group that subscribes to it and stopped a grace period after the last one leaves. Each
//! event is turned into request keys, one per subscribing group; only keys that fall on this
//! dispatcher's slice of the ring go to the group's queue. No object is kept once it has been
//! handed on: the groups' queues are the only index, but for the owner each owned object was
//! last seen with (`super::children`), which tells an owner of a child it lost.
//!
//! Re-lists of the watch itself (the first list, a 410 Gone, an API-server restart) are
//! numbered: every object of a re-list is observed with the list's epoch, and when it ends each
//! group queues as deleted the keys of that subscription the list did not show.
//!
//! When the keys served here grow (a handover completes, a group joins the watch), the objects
//! of the new keys are found by a list run *beside* the stream, which keeps running: every
//! event, deletions above all, is still seen as it happens. The stream stays the authority: an
//! object of the side list is taken only for a key the group does not know yet and that no
//! deletion seen since the list began names (see `SideList`). A group that joins while the
//! watch is still listing gets the rest of that list from the watch itself, so the list beside
//! it stops once past the greatest key the watch had shown (lists come in key order); none is
//! made if the watch had shown nothing yet.
//!
//! Objects are kept as the JSON text the API server sent, with only routing's fields decoded
//! ([`super::object::WatchedObject`]).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kube::{
    Client, ResourceExt,
    api::{Api, ApiResource, ListParams, TypeMeta},
    runtime::watcher::{self, Event},
};
use kube_dispatch_proto::{RingKey, v1::Reason};
use kube_dispatch_runtime::logging;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    children::Children,
    object::WatchedObject,
    routing::{Bodies, Place, in_watch, object_key, owner_key, place},
    shard::sharded_client,
    side_list::{Reach, SideList, next_page},
    whole_list,
};
use crate::{config::ListMode, group::Group};
use kube_dispatch_core::{
    backoff::{Recovery, WatchFailure, WatchRetry},
    handover::Slice,
    key::KeyRef,
    partition::GroupEvent,
    queue::{Change, Observed},
    subscription::{OwnerKind, Payload, ResourceId, WatchKey},
};

/// A group's interest in a watch.
#[derive(Clone, Debug)]
pub struct Subscriber {
    /// The group fed.
    pub group: Arc<Group>,
    /// Payload of the group's deliveries from this watch.
    pub payload: Payload,
    /// Owner mapping, for subscriptions to owned objects.
    pub owner: Option<OwnerKind>,
}

/// Why a watch could not serve a subscription.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WatchError {
    /// The API server rejected the list or watch (bad selector, no permission, ...).
    #[error("the API server rejected the watch of {resource}: {message}")]
    Rejected {
        /// The HTTP status code of the rejection.
        code: u16,
        /// What it was watching.
        resource: String,
        /// The API server's message.
        message: String,
    },
    /// The dispatcher is shutting down.
    #[error("the dispatcher is shutting down")]
    ShuttingDown,
}

/// The state of a watch's first list.
#[derive(Clone, Debug)]
enum Readiness {
    Starting,
    Ready,
    Failed(WatchError),
}

/// What one watch has done since it started, for metrics.
#[derive(Debug, Default)]
pub struct WatchCounts {
    /// Objects added or changed, listed or watched.
    pub applied: AtomicU64,
    /// Objects deleted.
    pub deleted: AtomicU64,
    /// Lists of the whole resource by the watch itself: its first, and each one after an
    /// expired resourceVersion (410 Gone) or an API-server restart.
    pub relists: AtomicU64,
    /// Lists beside the watch, for keys newly served here.
    pub side_lists: AtomicU64,
    /// Errors the watch recovered from (by retrying, or by listing again at once after a 410 Gone).
    pub errors: AtomicU64,
    /// Of those, 410 Gone: the resourceVersion it resumed from had expired.
    pub gone: AtomicU64,
    /// Objects seen whose keys other dispatchers own (decoded for a deletion's memory only).
    pub elsewhere: AtomicU64,
    /// Restarts because the namespaces this dispatcher owns changed (ring keyed by namespace).
    pub reshards: AtomicU64,
    /// Owned objects indexed by their controlling owner now (about 150 bytes each: one per
    /// owned object the watch shows, for owned subscriptions only).
    pub children: AtomicU64,
}

/// One watch's counters, with what it watches, for metrics.
#[derive(Debug)]
pub struct WatchFigures {
    /// The resource (`group/version/plural`).
    pub resource: String,
    /// An opaque id of the namespace and selectors ([`watch_id`]): metrics are served without
    /// authentication, and a namespace or a field selector chosen by a caller may name an
    /// object. The log line that starts the watch gives both.
    pub id: String,
    /// Its counters.
    pub counts: Arc<WatchCounts>,
}

struct Running {
    counts: Arc<WatchCounts>,
    subscribers: Arc<RwLock<Vec<Subscriber>>>,
    readiness: watch::Receiver<Readiness>,
    /// Restarts the watcher (a re-list), e.g. when a group joins a running watch.
    relist: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
    /// Cancels a pending stop when a subscriber comes back within the grace.
    stopping: Option<CancellationToken>,
}

/// All watches of this dispatcher.
pub struct Watches {
    client: Client,
    slice: watch::Receiver<Arc<Slice>>,
    grace: Duration,
    list_mode: ListMode,
    running: Mutex<HashMap<WatchKey, Running>>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Watches {
    /// Watches that feed the keys of `slice`, re-listing when it changes, each starting with
    /// a list made the `list_mode` way; a watch with no subscriber is stopped after `grace`.
    /// Everything stops on `cancel`.
    pub fn new(
        client: Client,
        slice: watch::Receiver<Arc<Slice>>,
        grace: Duration,
        list_mode: ListMode,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            slice,
            grace,
            list_mode,
            running: Mutex::new(HashMap::new()),
            cancel,
        })
    }

    /// Each running watch's counters.
    pub fn figures(&self) -> Vec<WatchFigures> {
        self.running()
            .iter()
            .map(|(key, run)| WatchFigures {
                resource: resource_name(&key.resource),
                id: id_of(key),
                counts: run.counts.clone(),
            })
            .collect()
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<WatchKey, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of running watches.
    pub fn len(&self) -> usize {
        self.running().len()
    }

    /// Whether no watch runs.
    pub fn is_empty(&self) -> bool {
        self.running().is_empty()
    }

    /// Adds a subscriber to the watch of `key`, starting it if needed, and waits until the
    /// watch's first list has started to arrive or failed.
    pub async fn subscribe(&self, key: &WatchKey, sub: Subscriber) -> Result<(), WatchError> {
        let mut readiness = {
            let mut running = self.running();
            match running.get_mut(key) {
                Some(r) => {
                    if let Some(stop) = r.stopping.take() {
                        stop.cancel();
                    }
                    let mut subs = r.subscribers.write().unwrap_or_else(|e| e.into_inner());
                    subs.retain(|s| !Arc::ptr_eq(&s.group, &sub.group));
                    subs.push(sub);
                    // The new group has not seen the objects that exist: list them again. The
                    // groups already subscribed see unchanged versions and deliver nothing.
                    r.relist.notify_one();
                    r.readiness.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(Readiness::Starting);
                    let run = Running {
                        counts: Arc::default(),
                        subscribers: Arc::new(RwLock::new(vec![sub])),
                        readiness: rx.clone(),
                        relist: Arc::new(tokio::sync::Notify::new()),
                        cancel: self.cancel.child_token(),
                        stopping: None,
                    };
                    let task = WatchTask {
                        counts: run.counts.clone(),
                        client: self.client.clone(),
                        list_mode: self.list_mode,
                        key: key.clone(),
                        slice: self.slice.clone(),
                        subscribers: run.subscribers.clone(),
                        relist: run.relist.clone(),
                        readiness: tx,
                        shard: None,
                        unsharded: AtomicBool::new(false),
                        children: Mutex::default(),
                    };
                    tokio::spawn(task.run(run.cancel.clone()));
                    info!(resource = %describe(key), watch = %id_of(key), "starting watch");
                    running.insert(key.clone(), run);
                    rx
                }
            }
        };
        loop {
            let state = readiness.borrow_and_update().clone();
            match state {
                Readiness::Ready => return Ok(()),
                Readiness::Failed(e) => {
                    self.stop_now(key);
                    return Err(e);
                }
                Readiness::Starting => {}
            }
            if readiness.changed().await.is_err() {
                return Err(WatchError::ShuttingDown);
            }
        }
    }

    /// Removes `group`'s subscription to `key`; the watch stops after the grace if no
    /// subscriber is left by then.
    pub fn unsubscribe(self: &Arc<Self>, key: &WatchKey, group: &Arc<Group>) {
        let mut running = self.running();
        let Some(r) = running.get_mut(key) else {
            return;
        };
        let empty = {
            let mut subs = r.subscribers.write().unwrap_or_else(|e| e.into_inner());
            subs.retain(|s| !Arc::ptr_eq(&s.group, group));
            subs.is_empty()
        };
        if !empty || r.stopping.is_some() {
            return;
        }
        let stop = r.cancel.child_token();
        r.stopping = Some(stop.clone());
        let (this, key, grace) = (self.clone(), key.clone(), self.grace);
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = tokio::time::sleep(grace) => this.stop_if_unused(&key),
            }
        });
    }

    fn stop_if_unused(&self, key: &WatchKey) {
        let mut running = self.running();
        let unused = running.get(key).is_some_and(|r| {
            r.subscribers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        });
        if unused && let Some(r) = running.remove(key) {
            info!(resource = %describe(key), "stopping watch: no subscriber left");
            r.cancel.cancel();
        }
    }

    fn stop_now(&self, key: &WatchKey) {
        if let Some(r) = self.running().remove(key) {
            r.cancel.cancel();
        }
    }
}

/// The id of a watch's namespace and selectors in metrics (label `watch`): 16 hex digits of
/// their hash under a key drawn when the process starts, so the same on every scrape of this
/// process and not to be reversed by hashing guessed namespaces.
pub fn watch_id(namespace: &str, label_selector: &str, field_selector: &str) -> String {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(std::hash::RandomState::new);
    format!(
        "{:016x}",
        key.hash_one((namespace, label_selector, field_selector))
    )
}

fn id_of(key: &WatchKey) -> String {
    watch_id(&key.namespace, &key.label_selector, &key.field_selector)
}

fn describe(key: &WatchKey) -> String {
    let mut s = resource_name(&key.resource);
    if !key.namespace.is_empty() {
        s.push_str(&format!(" in {}", key.namespace));
    }
    if !key.label_selector.is_empty() {
        s.push_str(&format!(" labels {:?}", key.label_selector));
    }
    if !key.field_selector.is_empty() {
        s.push_str(&format!(" fields {:?}", key.field_selector));
    }
    s
}

struct WatchTask {
    counts: Arc<WatchCounts>,
    client: Client,
    list_mode: ListMode,
    key: WatchKey,
    slice: watch::Receiver<Arc<Slice>>,
    subscribers: Arc<RwLock<Vec<Subscriber>>>,
    relist: Arc<tokio::sync::Notify>,
    readiness: watch::Sender<Readiness>,
    /// The `shardSelector` the watch asked for when it last (re)started, if any.
    shard: Option<String>,
    /// Whether an object of another dispatcher's namespaces arrived although the watch asked
    /// for this dispatcher's only (the API server ignores the selector), since that start.
    unsharded: AtomicBool,
    /// The owner each owned object was last seen with, for the owned subscriptions.
    children: Mutex<Children>,
}

impl WatchTask {
    async fn run(mut self, cancel: CancellationToken) {
        let r = &self.key.resource;
        let api_resource = ApiResource {
            group: r.group.clone(),
            version: r.version.clone(),
            api_version: if r.group.is_empty() {
                r.version.clone()
            } else {
                format!("{}/{}", r.group, r.version)
            },
            kind: r.kind.clone(),
            plural: r.plural.clone(),
        };
        // On a ring keyed by namespace, ask the API server for this dispatcher's namespaces only.
        let client = if self.slice.borrow().ring.key() == RingKey::Namespace {
            sharded_client(self.client.clone(), self.slice.clone())
        } else {
            self.client.clone()
        };
        let api: Api<WatchedObject> = if self.key.namespace.is_empty() || !r.namespaced {
            Api::all_with(client, &api_resource)
        } else {
            Api::namespaced_with(client, &self.key.namespace, &api_resource)
        };
        let mut config = watcher::Config::default();
        if self.list_mode == ListMode::Stream {
            config = config.streaming_lists();
        }
        if !self.key.label_selector.is_empty() {
            config = config.labels(&self.key.label_selector);
        }
        if !self.key.field_selector.is_empty() {
            config = config.fields(&self.key.field_selector);
        }
        let types = TypeMeta {
            api_version: api_resource.api_version.clone(),
            kind: api_resource.kind.clone(),
        };
        let mut list_params = ListParams::default();
        if !self.key.label_selector.is_empty() {
            list_params = list_params.labels(&self.key.label_selector);
        }
        if !self.key.field_selector.is_empty() {
            list_params = list_params.fields(&self.key.field_selector);
        }
        let mut epoch: u32 = 0;
        // The slice the watch last fed: a list beside it is needed only when the served set may
        // grow ([`Slice::may_serve_more_than`]).
        let mut fed = self.slice.borrow_and_update().clone();
        let mut retry = WatchRetry::default();
        'restart: loop {
            // The shard the watch asks for from here on; a ring change that changes it
            // restarts the watch (a re-list of the namespaces owned then).
            self.shard = self.slice.borrow().shard_selector();
            if self.shard.is_some() {
                debug!(resource = %describe(&self.key), "watching the namespaces this dispatcher owns only (shardSelector)");
            }
            self.unsharded.store(false, Ordering::Relaxed);
            // Polled again after an error once `retry` allows ([`WatchRetry`]): a 410 Gone
            // lists again at once.
            let mut events = match self.list_mode {
                ListMode::Whole => whole_list::watcher(api.clone(), list_params.clone()).boxed(),
                ListMode::Paged | ListMode::Stream => {
                    watcher::watcher(api.clone(), config.clone()).boxed()
                }
            };
            let mut paused: Option<tokio::time::Instant> = None;
            let mut side: Option<SideList> = None;
            // How far the watch's own list has got: `None` while it is not listing, then the
            // greatest key it has shown (request keys of one watch sort as the API server lists
            // objects: by namespace and name, after a prefix they share). A watch (re)started
            // lists first, so until its list begins it counts as listing and having shown
            // nothing: a group that joins meanwhile is shown everything by that list, with no
            // list beside it.
            let mut listed: Option<Option<String>> = Some(None);
            loop {
                let step = tokio::select! {
                    () = cancel.cancelled() => return,
                    () = self.relist.notified() => Step::ListBeside { why: "a group joined the watch", joined: true },
                    Ok(()) = self.slice.changed() => {
                        let slice = self.slice.borrow_and_update().clone();
                        let now_shard = slice.shard_selector();
                        if now_shard != self.shard {
                            self.counts.reshards.fetch_add(1, Ordering::Relaxed);
                            info!(resource = %describe(&self.key), "the namespaces owned here changed: watching them anew");
                            fed = slice;
                            continue 'restart;
                        }
                        let grows = slice.may_serve_more_than(&fed);
                        let handover = grows && slice.settled.as_ref().map(|r| r.members())
                            != fed.settled.as_ref().map(|r| r.members());
                        fed = slice;
                        if !grows {
                            continue;
                        }
                        let why = if handover {
                            "a handover completed"
                        } else {
                            "keys came back to this dispatcher without a handover (a member left the ring before its handover completed)"
                        };
                        Step::ListBeside { why, joined: false }
                    }
                    page = next_page(&mut side) => Step::Page(page),
                    () = tokio::time::sleep_until(paused.unwrap_or_else(tokio::time::Instant::now)),
                        if paused.is_some() => {
                        paused = None;
                        continue;
                    }
                    event = events.next(), if paused.is_none() => Step::Event(event),
                };
                if let Step::Event(Some(Ok(shown))) = &step
                    && !matches!(shown, Event::Init)
                {
                    retry.succeeded(matches!(shown, Event::InitDone));
                }
                let event = match step {
                    Step::ListBeside { why, joined } => {
                        let listed = listed.as_ref().map(Option::as_deref);
                        let Some(reach) =
                            Reach::of(listed, joined, side.as_ref().map(SideList::reach))
                        else {
                            debug!(resource = %describe(&self.key), why, "no list beside the watch: its own list has shown nothing yet");
                            continue;
                        };
                        self.counts.side_lists.fetch_add(1, Ordering::Relaxed);
                        info!(resource = %describe(&self.key), why, ?reach, "listing beside the watch for the keys now served here");
                        let whole = self.list_mode == ListMode::Whole;
                        side = Some(SideList::start(
                            api.clone(),
                            list_params.clone(),
                            reach,
                            whole,
                        ));
                        continue;
                    }
                    Step::Page(Some(objects)) => {
                        if let Some(list) = &side {
                            let mut past = false;
                            for obj in objects {
                                let key = self.fill(&obj, &types, epoch, list);
                                past |= list.reach().passed(&key);
                            }
                            if past {
                                debug!(resource = %describe(&self.key), "list beside the watch done: it reached where the watch's own list was");
                                side = None;
                            }
                        }
                        continue;
                    }
                    Step::Page(None) => {
                        debug!(resource = %describe(&self.key), "list beside the watch done");
                        side = None;
                        continue;
                    }
                    Step::Event(None) => return,
                    Step::Event(Some(event)) => event,
                };
                match event {
                    Ok(Event::Init) => {
                        self.counts.relists.fetch_add(1, Ordering::Relaxed);
                        epoch = epoch.wrapping_add(1);
                        // The watch re-lists everything itself: a list beside it adds nothing.
                        side = None;
                        listed = Some(None);
                        debug!(resource = %describe(&self.key), epoch, "list started");
                    }
                    Ok(Event::InitApply(obj)) => {
                        self.readiness.send_if_modified(mark_ready);
                        let key = self.apply(&obj, &types, epoch, false);
                        if let Some(last) = &mut listed
                            && last.as_ref().is_none_or(|last| key > *last)
                        {
                            *last = Some(key);
                        }
                    }
                    Ok(Event::InitDone) => {
                        self.readiness.send_if_modified(mark_ready);
                        listed = None;
                        self.sweep(epoch);
                        debug!(resource = %describe(&self.key), epoch, "list done");
                    }
                    Ok(Event::Apply(obj)) => {
                        self.apply(&obj, &types, epoch, false);
                    }
                    Ok(Event::Delete(obj)) => {
                        if let Some(list) = &mut side
                            && !list.deleted(object_key(&self.key.resource, &obj).hash64())
                        {
                            warn!(
                                resource = %describe(&self.key),
                                "too many deletions during the list beside the watch: re-listing instead"
                            );
                            self.apply(&obj, &types, epoch, true);
                            continue 'restart;
                        }
                        self.apply(&obj, &types, epoch, true);
                    }
                    Err(e) => {
                        self.counts.errors.fetch_add(1, Ordering::Relaxed);
                        let gone = status_code(&e) == Some(410);
                        if gone {
                            self.counts.gone.fetch_add(1, Ordering::Relaxed);
                        }
                        let streaming = config.initial_list_strategy
                            == watcher::InitialListStrategy::StreamingList;
                        let failure = WatchFailure {
                            code: status_code(&e),
                            streaming_refused: streaming && refuses_streaming(&e),
                            whole_list_cut_short: self.list_mode == ListMode::Whole
                                && whole_list::cut_short(&e),
                            starting: matches!(*self.readiness.borrow(), Readiness::Starting),
                        };
                        match retry.recover(&failure, tokio::time::Instant::now().into_std()) {
                            Recovery::ListInPages if failure.streaming_refused => {
                                warn!(resource = %describe(&self.key), error = %e, "the API server does not stream lists; listing in pages instead");
                                config.initial_list_strategy =
                                    watcher::InitialListStrategy::ListWatch;
                                continue 'restart;
                            }
                            Recovery::ListInPages => {
                                warn!(resource = %describe(&self.key), error = %e, "the list did not arrive whole; listing in pages instead");
                                self.list_mode = ListMode::Paged;
                                continue 'restart;
                            }
                            Recovery::Fail => {
                                let (code, message) = rejection(&e).unwrap_or_default();
                                let failed = WatchError::Rejected {
                                    code,
                                    resource: describe(&self.key),
                                    message,
                                };
                                warn!(resource = %describe(&self.key), error = %failed, "watch rejected");
                                let _ = self.readiness.send(Readiness::Failed(failed));
                                return;
                            }
                            Recovery::ListAgain => {
                                info!(resource = %describe(&self.key), error = %e, "watch expired (410 Gone): listing again at once");
                            }
                            Recovery::RetryIn(wait) => {
                                warn!(resource = %describe(&self.key), error = %e, retry_in = ?wait, "watch error; retrying");
                                paused = Some(tokio::time::Instant::now() + wait);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Takes an object shown by a list beside the stream, for keys served here that a group
    /// does not know yet ([`GroupEvent::Listed`]), unless a deletion of it was seen since the list
    /// began. Returns the object's request key.
    fn fill(&self, obj: &WatchedObject, types: &TypeMeta, epoch: u32, list: &SideList) -> String {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let text = object_key(&self.key.resource, obj).to_string();
        let key = KeyRef::new(&text);
        let deleted_since = list.was_deleted(key.hash());
        let mut bodies = Bodies::new(types);
        for sub in subscribers.iter() {
            match &sub.owner {
                None if !deleted_since => sub.group.apply(GroupEvent::Listed {
                    key,
                    object: Observed {
                        resource_version: obj.resource_version().unwrap_or_default(),
                        uid: obj.uid().unwrap_or_default(),
                        body: bodies.get(sub.payload, obj),
                        trace: None,
                    },
                    epoch,
                }),
                None => {}
                Some(owner) => {
                    if let Some(owner_key) = owner_key(obj, owner) {
                        let owner_key = owner_key.to_string();
                        if !deleted_since {
                            self.index_children(|c| {
                                c.listed(owner, &text, owner_key.clone(), epoch);
                            });
                        }
                        sub.group.apply(GroupEvent::ListedOwned {
                            key: KeyRef::new(&owner_key),
                        });
                    }
                }
            }
        }
        text
    }

    /// Hands an event of the stream (or of the watch's own list) to every subscriber, by the
    /// rules of [`super::routing`]. The group decides again under its lock, against the slice
    /// current then (and remembers deletions of keys a handover holds, and recent deletions of
    /// keys owned elsewhere). Returns the object's request key.
    fn apply(&self, obj: &WatchedObject, types: &TypeMeta, epoch: u32, deleted: bool) -> String {
        let counter = if deleted {
            &self.counts.deleted
        } else {
            &self.counts.applied
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let slice = self.slice.borrow().clone();
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let text = object_key(&self.key.resource, obj).to_string();
        let key = KeyRef::new(&text);
        let place = place(&slice, key);
        if place == Place::Elsewhere {
            self.counts.elsewhere.fetch_add(1, Ordering::Relaxed);
            if self.shard.is_some()
                && !self.unsharded.swap(true, Ordering::Relaxed)
                && slice.shard_selector() == self.shard
            {
                warn!(
                    resource = %describe(&self.key),
                    key = %text,
                    "the API server sent an object of a namespace another dispatcher owns: it ignores shardSelector (Kubernetes before 1.36, or the ShardedListAndWatch feature gate off); every dispatcher receives every object and filters it itself"
                );
            }
        }
        let mut bodies = Bodies::new(types);
        // With traces exported, the span of this change, whose context the deliveries it
        // causes carry to the replicas (their reconcile spans are its children).
        let span = (place != Place::Elsewhere && logging::traces_enabled()).then(|| {
            tracing::info_span!(
                "change",
                key = %text,
                resource_version = obj.resource_version().unwrap_or_default(),
                deleted
            )
        });
        let trace: Option<Arc<str>> = span.as_ref().and_then(logging::traceparent).map(Arc::from);
        // The owners to tell, once per owner kind however many groups subscribe with it: the
        // child's controlling owner now, and the one it had before if that was another.
        let mut owners: Vec<(&OwnerKind, Vec<String>)> = Vec::new();
        for kind in subscribers.iter().filter_map(|s| s.owner.as_ref()) {
            if owners.iter().any(|(k, _)| *k == kind) {
                continue;
            }
            let now = owner_key(obj, kind).map(|k| k.to_string());
            let tell = self.index_children(|c| c.seen(kind, &text, now, epoch, deleted));
            owners.push((kind, tell));
        }
        for sub in subscribers.iter() {
            match &sub.owner {
                None => {
                    if place == Place::Elsewhere {
                        if deleted {
                            sub.group.apply(GroupEvent::Deleted {
                                key,
                                change: Change {
                                    reason: Reason::Deleted,
                                    resource_version: obj.resource_version().unwrap_or_default(),
                                    uid: obj.uid().unwrap_or_default(),
                                    body: None,
                                    deleted: true,
                                    trace: None,
                                },
                            });
                        } else {
                            // No body: a key owned elsewhere is recorded here only if it is
                            // still on its way out, and then delivered without one.
                            sub.group.apply(GroupEvent::ExistsElsewhere {
                                key,
                                object: Observed {
                                    resource_version: obj.resource_version().unwrap_or_default(),
                                    uid: obj.uid().unwrap_or_default(),
                                    body: None,
                                    trace: None,
                                },
                                epoch,
                            });
                        }
                        continue;
                    }
                    let body = bodies.get(sub.payload, obj);
                    let resource_version = obj.resource_version().unwrap_or_default();
                    let uid = obj.uid().unwrap_or_default();
                    if deleted {
                        sub.group.apply(GroupEvent::Deleted {
                            key,
                            change: Change {
                                reason: Reason::Deleted,
                                resource_version,
                                uid,
                                body,
                                deleted: true,
                                trace: trace.clone(),
                            },
                        });
                    } else {
                        sub.group.apply(GroupEvent::Exists {
                            key,
                            object: Observed {
                                resource_version,
                                uid,
                                body,
                                trace: trace.clone(),
                            },
                            epoch,
                        });
                    }
                }
                Some(owner) => {
                    let tell = owners.iter().find(|(k, _)| *k == owner).map(|(_, t)| t);
                    for key in tell.into_iter().flatten() {
                        sub.group.apply(GroupEvent::OwnedChanged {
                            key: KeyRef::new(key),
                        });
                    }
                }
            }
        }
        text
    }

    /// A list ended: queue the deletions it revealed in every group's primary subscription,
    /// and tell the owners of the owned objects it did not show.
    fn sweep(&self, epoch: u32) {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let lost = self.index_children(|c| {
            c.swept(epoch, |kind| {
                subscribers.iter().any(|s| s.owner.as_ref() == Some(kind))
            })
        });
        for sub in subscribers.iter() {
            match &sub.owner {
                None => sub.group.sweep(epoch, |key| in_watch(&self.key, key)),
                Some(kind) => {
                    for owner in lost.get(kind).into_iter().flatten() {
                        sub.group.apply(GroupEvent::OwnedChanged {
                            key: KeyRef::new(owner),
                        });
                    }
                }
            }
        }
    }

    /// Changes the children index with `f`, keeping its size in the watch's figures.
    fn index_children<R>(&self, f: impl FnOnce(&mut Children) -> R) -> R {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let out = f(&mut children);
        self.counts
            .children
            .store(children.len() as u64, Ordering::Relaxed);
        out
    }
}

/// What woke the watch loop.
#[expect(
    clippy::large_enum_variant,
    reason = "a value of the loop's stack, moved once; boxing would allocate per event"
)]
enum Step {
    /// List beside the stream, for this reason; `joined` when a group joined the watch.
    ListBeside { why: &'static str, joined: bool },
    /// A page of the list beside the stream, or its end.
    Page(Option<Vec<WatchedObject>>),
    /// An event of the stream, or its end.
    Event(Option<watcher::Result<Event<WatchedObject>>>),
}

fn mark_ready(r: &mut Readiness) -> bool {
    if matches!(r, Readiness::Starting) {
        *r = Readiness::Ready;
        true
    } else {
        false
    }
}

/// The API server's refusal of a list or watch, if that is what the error is: a client error
/// (4xx other than 410 Gone, which the watcher recovers from by re-listing).
fn rejection(e: &watcher::Error) -> Option<(u16, String)> {
    let status = api_status(e)?;
    ((400..500).contains(&status.code) && status.code != 410)
        .then(|| (status.code, status.message.clone()))
}

/// Whether the API server refused a streaming list (`sendInitialEvents`), as one without the
/// WatchList feature does.
fn refuses_streaming(e: &watcher::Error) -> bool {
    rejection(e).is_some_and(|(code, message)| {
        matches!(code, 400 | 422) && message.contains("sendInitialEvents")
    })
}

/// The API server's status in a watch error, if it answered one.
fn api_status(e: &watcher::Error) -> Option<&kube::core::Status> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s),
        watcher::Error::WatchError(s) => Some(s),
        _ => None,
    }
}

/// The HTTP status code of a watch error the API server answered.
fn status_code(e: &watcher::Error) -> Option<u16> {
    api_status(e).map(|s| s.code)
}

/// The resource a watch key names, for messages.
pub fn resource_name(r: &ResourceId) -> String {
    if r.group.is_empty() {
        format!("{}/{}", r.version, r.plural)
    } else {
        format!("{}/{}/{}", r.group, r.version, r.plural)
    }
}
