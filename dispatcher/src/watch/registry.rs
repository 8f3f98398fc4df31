//! The registry of this dispatcher's watches against the API server: one shared, non-caching
//! watch per distinct [`WatchKey`] (resource, namespace, selectors), started by the first group
//! that subscribes to it and stopped a grace period after the last one leaves.
//!
//! Each watch runs as a task of its own (`super::task`), which hands its events to the
//! subscribed groups (`super::fan_out`). No object is kept once it has been handed on: the
//! groups' queues are the only index, but for the owner each owned object was last seen with
//! (`kube_dispatch_core::children`), which tells an owner of a child it lost. Objects are kept as the API
//! server sent them, JSON text or protobuf bytes, with only routing's fields decoded
//! ([`super::object::WatchedObject`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use kube::Client;
use kube_dispatch_core::{
    children::ChildIndex,
    handover::Slice,
    subscription::{OwnerKind, WatchKey},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::fan_out::Subscribers;
pub use super::fan_out::{Subscriber, WatchCounts, resource_name};
pub use super::task::WatchError;
use super::{
    fan_out::describe,
    sharing::ListSharing,
    task::{Controls, Readiness, WatchTask},
};
use crate::{config::ListMode, group::Group};

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
    children: Arc<ChildIndex>,
    subscribers: Subscribers,
    readiness: watch::Receiver<Readiness>,
    /// Tells the task a group joined the running watch (it lists beside the stream for it).
    joined: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
    /// Cancels a pending stop when a subscriber comes back within the grace.
    stopping: Option<CancellationToken>,
}

/// How the watches list what exists.
#[derive(Debug)]
pub struct Listing {
    /// The way (`--list-mode`).
    pub mode: ListMode,
    /// The whole lists made here for the peers and with them: served to the peers that ask
    /// (`Peer.List`) whenever there is one.
    pub sharing: Option<Arc<ListSharing>>,
    /// Whether this dispatcher's own watches share their whole lists (`--share-lists`).
    pub share: bool,
    /// Whether whole lists and watches of built-in resources are read in protobuf
    /// (`--protobuf`).
    pub protobuf: bool,
}

impl Listing {
    /// Lists made `mode`'s way, each alone.
    pub fn alone(mode: ListMode) -> Self {
        Self {
            mode,
            sharing: None,
            share: false,
            protobuf: true,
        }
    }
}

/// All watches of this dispatcher.
pub struct Watches {
    client: Client,
    slice: watch::Receiver<Arc<Slice>>,
    grace: Duration,
    listing: Listing,
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
    /// a list made as `listing` says; a watch with no subscriber is stopped after `grace`.
    /// Everything stops on `cancel`.
    pub fn new(
        client: Client,
        slice: watch::Receiver<Arc<Slice>>,
        grace: Duration,
        listing: Listing,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            slice,
            grace,
            listing,
            running: Mutex::new(HashMap::new()),
            cancel,
        })
    }

    /// The lists made here for the peers and with them, if any.
    pub fn sharing(&self) -> Option<&Arc<ListSharing>> {
        self.listing.sharing.as_ref()
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
    /// watch's first list has started to arrive or failed. Returns the watch's index of owned
    /// objects, from which a subscriber to them reads an owner's children.
    pub async fn subscribe(
        &self,
        key: &WatchKey,
        sub: Subscriber,
    ) -> Result<Arc<ChildIndex>, WatchError> {
        let owned = sub.owner.is_some();
        let group = sub.group.clone();
        let (mut readiness, children) = {
            let mut running = self.running();
            match running.get_mut(key) {
                Some(r) => {
                    if let Some(stop) = r.stopping.take() {
                        stop.cancel();
                    }
                    let mut subs = r.subscribers.write().unwrap_or_else(|e| e.into_inner());
                    // One subscriber per group and owner kind: a group may subscribe to a watch
                    // for itself and for the owners of its objects.
                    subs.retain(|s| {
                        !(Arc::ptr_eq(&s.group, &sub.group)
                            && s.owner == sub.owner
                            && s.named_by == sub.named_by)
                    });
                    subs.push(sub);
                    if owned {
                        group.keep_children_bodies_in(&r.children);
                    }
                    // The new group has not seen the objects that exist: the task lists them
                    // beside the stream, unless its own list will show them.
                    r.children
                        .began_listing(tokio::time::Instant::now().into_std());
                    r.children.joined();
                    r.joined.notify_one();
                    (r.readiness.clone(), r.children.clone())
                }
                None => {
                    let (tx, rx) = watch::channel(Readiness::Starting);
                    let children = Arc::<ChildIndex>::default();
                    if owned {
                        group.keep_children_bodies_in(&children);
                    }
                    let run = Running {
                        counts: Arc::default(),
                        children,
                        subscribers: Arc::new(RwLock::new(vec![sub])),
                        readiness: rx.clone(),
                        joined: Arc::new(tokio::sync::Notify::new()),
                        cancel: self.cancel.child_token(),
                        stopping: None,
                    };
                    let task = WatchTask::new(
                        self.client.clone(),
                        key.clone(),
                        self.listing.mode,
                        self.slice.clone(),
                        Controls {
                            counts: run.counts.clone(),
                            subscribers: run.subscribers.clone(),
                            joined: run.joined.clone(),
                            readiness: tx,
                            children: run.children.clone(),
                            sharing: self.listing.sharing.clone().filter(|_| self.listing.share),
                            protobuf: self.listing.protobuf,
                        },
                    );
                    tokio::spawn(task.run(run.cancel.clone()));
                    info!(resource = %describe(key), watch = %id_of(key), "starting watch");
                    let children = run.children.clone();
                    running.insert(key.clone(), run);
                    (rx, children)
                }
            }
        };
        loop {
            let state = readiness.borrow_and_update().clone();
            match state {
                Readiness::Ready => return Ok(children),
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
            let leaving: Vec<OwnerKind> = subs
                .iter()
                .filter(|s| Arc::ptr_eq(&s.group, group))
                .filter_map(|s| s.owner.clone())
                .collect();
            subs.retain(|s| !Arc::ptr_eq(&s.group, group));
            // The fan-out keeps an owner kind's children only while it is subscribed: forgotten
            // now, they are listed afresh if the kind comes back, never taken from a view that
            // stopped following the watch.
            for kind in leaving {
                if !subs.iter().any(|s| s.owner.as_ref() == Some(&kind)) {
                    r.children.write().forget(&kind);
                }
            }
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

#[cfg(test)]
mod tests {
    //! The registry against a scripted API server ([`crate::watch::scripted_api`]) and a paused
    //! clock: which watches it starts, shares and stops, and what a joining group is shown.

    use kube_dispatch_core::subscription::{Parts, Payload};

    use super::*;
    use crate::watch::scripted_api::{ApiServer, Member, alone, config_maps, named, within};

    const GRACE: Duration = Duration::from_secs(30);

    /// Watches through `client` that list in pages, alone, until `cancel`.
    fn paged(client: kube::Client, cancel: &CancellationToken) -> Arc<Watches> {
        Watches::new(
            client,
            alone(),
            GRACE,
            Listing::alone(ListMode::Paged),
            cancel.clone(),
        )
    }

    fn subscriber(member: &Member) -> Subscriber {
        Subscriber {
            group: member.group.clone(),
            payload: Payload::KeyOnly,
            owner: None,
            named_by: None,
            changes_of: Parts::ALL_CHANGES,
        }
    }

    /// Subscribes `member` in a task of its own: a first subscription waits for the list.
    fn subscribe(
        watches: &Arc<Watches>,
        member: &Member,
    ) -> tokio::task::JoinHandle<Result<Arc<ChildIndex>, WatchError>> {
        let (watches, sub) = (watches.clone(), subscriber(member));
        tokio::spawn(async move { watches.subscribe(&config_maps(), sub).await })
    }

    /// A second group shares the running watch: the watch lists beside its stream, which keeps
    /// running, and only the new group is shown what exists.
    #[tokio::test(start_paused = true)]
    async fn a_group_that_joins_a_running_watch_is_shown_what_exists_by_a_list_beside_it() {
        let cancel = CancellationToken::new();
        let (client, mut api) = ApiServer::start();
        let watches = paged(client, &cancel);
        let first = Member::join("first", alone(), &cancel);
        let subscribed = subscribe(&watches, &first);
        api.next().await.list(10, &[("a", 5), ("b", 6)]);
        let stream = api.next().await.open();
        within("the subscription ended", subscribed)
            .await
            .expect("joined")
            .expect("subscribed");
        assert_eq!(first.delivered(), named(&[("a", false), ("b", false)]));

        let second = Member::join("second", alone(), &cancel);
        within(
            "a running watch took the group",
            watches.subscribe(&config_maps(), subscriber(&second)),
        )
        .await
        .expect("a running watch is ready at once");
        let beside = api.next().await;
        assert!(
            beside.is_paged_list(),
            "a list beside the stream: {:?}",
            beside.query
        );
        beside.list(11, &[("a", 5), ("b", 6)]);
        second.woken().await;
        assert_eq!(second.delivered(), named(&[("a", false), ("b", false)]));
        assert_eq!(
            first.delivered(),
            named(&[]),
            "the first group knew them already"
        );
        assert!(stream.is_open(), "the stream kept running");
        assert_eq!(watches.len(), 1, "one watch for both");
        cancel.cancel();
    }

    /// A watch with no subscriber left stops after the grace, not before; a group that comes
    /// back within it keeps the running watch.
    #[tokio::test(start_paused = true)]
    async fn a_watch_stops_a_grace_after_its_last_group_leaves() {
        let cancel = CancellationToken::new();
        let (client, mut api) = ApiServer::start();
        let watches = paged(client, &cancel);
        let member = Member::join("g", alone(), &cancel);
        let subscribed = subscribe(&watches, &member);
        api.next().await.list(10, &[("a", 5)]);
        let stream = api.next().await.open();
        within("the subscription ended", subscribed)
            .await
            .expect("joined")
            .expect("subscribed");

        watches.unsubscribe(&config_maps(), &member.group);
        tokio::time::sleep(GRACE / 2).await;
        within(
            "the running watch took the group back",
            watches.subscribe(&config_maps(), subscriber(&member)),
        )
        .await
        .expect("back within the grace");
        api.next().await.list(11, &[("a", 5)]);
        tokio::time::sleep(GRACE).await;
        assert!(stream.is_open(), "the watch outlived the first grace");
        assert_eq!(watches.len(), 1);

        watches.unsubscribe(&config_maps(), &member.group);
        tokio::time::sleep(GRACE / 2).await;
        assert!(stream.is_open(), "kept within the grace");
        stream.closed().await;
        assert!(watches.is_empty());
        cancel.cancel();
    }

    /// A watch the API server refuses fails the subscription with the server's reason and is
    /// forgotten: the next subscription starts a new one.
    #[tokio::test(start_paused = true)]
    async fn a_refused_watch_fails_the_subscription_and_is_forgotten() {
        let cancel = CancellationToken::new();
        let (client, mut api) = ApiServer::start();
        let watches = paged(client, &cancel);
        let member = Member::join("g", alone(), &cancel);
        let subscribed = subscribe(&watches, &member);
        api.next()
            .await
            .refuse(403, "Forbidden", "configmaps is forbidden");
        let refused = within("the subscription ended", subscribed)
            .await
            .expect("joined");
        assert!(
            matches!(&refused, Err(WatchError::Rejected { code: 403, message, .. }) if message.contains("forbidden")),
            "{refused:?}"
        );
        assert!(watches.is_empty());
        let again = subscribe(&watches, &member);
        let list = api.next().await;
        assert!(list.is_paged_list(), "a new watch lists: {:?}", list.query);
        list.list(10, &[]);
        api.next().await.open();
        within("the subscription ended", again)
            .await
            .expect("joined")
            .expect("subscribed");
        cancel.cancel();
    }
    /// An owner kind whose last subscriber left is forgotten by the watch's index of owned
    /// objects: a group that subscribes with it again is shown its children afresh, not a view
    /// that stopped following the watch (a child deleted meanwhile is not among them).
    #[tokio::test(start_paused = true)]
    async fn an_owner_kind_that_comes_back_is_shown_its_children_afresh() {
        use crate::watch::scripted_api::owned_object;
        let deployments = OwnerKind {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespaced: true,
        };
        let owned = |member: &Member| Subscriber {
            owner: Some(deployments.clone()),
            ..subscriber(member)
        };
        let children = |index: &ChildIndex| -> Vec<String> {
            index
                .of(&deployments, "apps/Deployment/ns/d1")
                .children
                .iter()
                .map(|c| c.key.to_string())
                .collect()
        };
        let cancel = CancellationToken::new();
        let (client, mut api) = ApiServer::start();
        let watches = paged(client, &cancel);
        let first = Member::join("first", alone(), &cancel);
        let subscribed = {
            let (watches, sub) = (watches.clone(), owned(&first));
            tokio::spawn(async move { watches.subscribe(&config_maps(), sub).await })
        };
        api.next().await.list_raw(
            10,
            &[owned_object("c1", 5, "d1"), owned_object("c2", 6, "d1")],
        );
        let stream = api.next().await.open();
        let index = within("the subscription ended", subscribed)
            .await
            .expect("joined")
            .expect("subscribed");
        assert_eq!(children(&index), ["/ConfigMap/ns/c1", "/ConfigMap/ns/c2"]);
        assert!(index.of(&deployments, "apps/Deployment/ns/d1").complete);

        watches.unsubscribe(&config_maps(), &first.group);
        assert!(
            children(&index).is_empty(),
            "forgotten with its last subscriber"
        );
        // Deleted while nobody follows Deployments' children here.
        stream.send("DELETED", owned_object("c1", 7, "d1"));
        // Nothing subscribed is told of it, so the watch's counter is the only sign it was
        // read: waited for on the paused clock, a millisecond at a time, within a deadline.
        let counts = watches.figures()[0].counts.clone();
        crate::watch::scripted_api::until("the watch read the deletion", || {
            counts.deleted.load(std::sync::atomic::Ordering::Relaxed) > 0
        })
        .await;

        let second = Member::join("second", alone(), &cancel);
        let again = within(
            "the running watch took the group",
            watches.subscribe(&config_maps(), owned(&second)),
        )
        .await
        .expect("ready at once");
        assert!(Arc::ptr_eq(&again, &index), "the same watch");
        api.next()
            .await
            .list_raw(12, &[owned_object("c2", 6, "d1")]);
        second.woken().await;
        assert_eq!(children(&index), ["/ConfigMap/ns/c2"]);
        cancel.cancel();
    }
}
