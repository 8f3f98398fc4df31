//! The registry of this dispatcher's watches against the API server: one shared, non-caching
//! watch per distinct [`WatchKey`] (resource, namespace, selectors), started by the first group
//! that subscribes to it and stopped a grace period after the last one leaves.
//!
//! Each watch runs as a task of its own ([`super::watch_task`]), which hands its events to the
//! subscribed groups ([`super::fan_out`]). No object is kept once it has been handed on: the
//! groups' queues are the only index, but for the owner each owned object was last seen with
//! (`super::children`), which tells an owner of a child it lost. Objects are kept as the JSON
//! text the API server sent, with only routing's fields decoded
//! ([`super::object::WatchedObject`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use kube::Client;
use kube_dispatch_core::{handover::Slice, subscription::WatchKey};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::fan_out::Subscribers;
pub use super::fan_out::{Subscriber, WatchCounts, resource_name};
pub use super::watch_task::WatchError;
use super::{
    fan_out::describe,
    watch_task::{Controls, Readiness, WatchTask},
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
    subscribers: Subscribers,
    readiness: watch::Receiver<Readiness>,
    /// Tells the task a group joined the running watch (it lists beside the stream for it).
    joined: Arc<tokio::sync::Notify>,
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
                    // The new group has not seen the objects that exist: the task lists them
                    // beside the stream, unless its own list will show them.
                    r.joined.notify_one();
                    r.readiness.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(Readiness::Starting);
                    let run = Running {
                        counts: Arc::default(),
                        subscribers: Arc::new(RwLock::new(vec![sub])),
                        readiness: rx.clone(),
                        joined: Arc::new(tokio::sync::Notify::new()),
                        cancel: self.cancel.child_token(),
                        stopping: None,
                    };
                    let task = WatchTask::new(
                        self.client.clone(),
                        key.clone(),
                        self.list_mode,
                        self.slice.clone(),
                        Controls {
                            counts: run.counts.clone(),
                            subscribers: run.subscribers.clone(),
                            joined: run.joined.clone(),
                            readiness: tx,
                        },
                    );
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
