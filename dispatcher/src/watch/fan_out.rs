//! The fan-out of one watch: each event it shows, handed to every group subscribed to it as one
//! [`GroupEvent`], by the rules of [`super::routing`].
//!
//! The watch loop ([`super::task`]) decides when an event happened and what list it
//! belongs to; this decides whom it concerns: the request key of the object (or of its
//! controlling owner, for a subscription to owned objects), one body per payload mode, and, for
//! owned subscriptions, the owners to tell ([`kube_dispatch_core::children`]: an owner that lost a child is
//! told although the child no longer names it). The group decides, under its lock, what the
//! event means for its queue ([`crate::group::Group::apply`]).

use std::sync::{
    Arc, RwLock,
    atomic::{AtomicU64, Ordering},
};

use kube::{ResourceExt, api::TypeMeta};
use kube_dispatch_core::{
    children::{ChildIndex, Shown},
    handover::Slice,
    key::KeyRef,
    queue::{Change, Observed},
    subscription::{NamedBy, OwnerKind, Parts, Payload, ResourceId, WatchKey},
    transit::{GroupEvent, Origin},
};
use kube_dispatch_proto::v1::Reason;
use kube_dispatch_telemetry::logging;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::{
    object::WatchedObject,
    protobuf::Untranscodable,
    routing::{Bodies, Place, in_watch, named_keys, object_key, owner_key, place},
    side_list::SideList,
};
use crate::group::Group;

/// What publishing an object gives: its request key, or why its JSON cannot be written.
type Written = Result<String, Untranscodable>;

/// A group's interest in a watch.
#[derive(Clone, Debug)]
pub struct Subscriber {
    /// The group fed.
    pub group: Arc<Group>,
    /// Payload of the group's deliveries from this watch.
    pub payload: Payload,
    /// Owner mapping, for subscriptions to owned objects.
    pub owner: Option<OwnerKind>,
    /// For a `referenced_by` subscription: the objects that name this watch's objects.
    pub named_by: Option<NamedBy>,
    /// The parts whose change is delivered (keys.md, "Change filters"); empty for every change.
    pub changes_of: Parts,
}

/// How a subscriber keys the watch's objects.
enum Keyed<'a> {
    /// By the object itself.
    Itself,
    /// By its controlling owner of this kind.
    Owner(&'a OwnerKind),
    /// By the objects that name it.
    Referrers,
}

impl Subscriber {
    fn keyed(&self) -> Keyed<'_> {
        match (&self.owner, &self.named_by) {
            (Some(owner), _) => Keyed::Owner(owner),
            (None, Some(_)) => Keyed::Referrers,
            (None, None) => Keyed::Itself,
        }
    }
}

/// The groups subscribed to one watch, shared by the registry (which adds and removes them) and
/// the watch's task (which feeds them).
pub(super) type Subscribers = Arc<RwLock<Vec<Subscriber>>>;

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
    /// Lists beside the watch not made: the groups had kept up with the keys newly served.
    pub side_lists_spared: AtomicU64,
    /// Errors the watch recovered from (by retrying, or by listing again at once after a 410 Gone).
    pub errors: AtomicU64,
    /// Of those, 410 Gone: the resourceVersion it resumed from had expired.
    pub gone: AtomicU64,
    /// Objects seen whose keys other dispatchers own (decoded for a deletion's memory only).
    pub elsewhere: AtomicU64,
    /// Restarts because the namespaces this dispatcher owns changed (ring keyed by namespace).
    pub reshards: AtomicU64,
    /// Owned objects indexed by their controlling owner now (one per owned object the watch
    /// shows, for owned subscriptions only).
    pub children: AtomicU64,
    /// About the bytes that index holds (about 300 per owned object).
    pub children_bytes: AtomicU64,
    /// Objects that named more than [`kube_dispatch_core::references::MAX_NAMES_PER_OBJECT`]
    /// others at their group's field paths: the names past it are not followed.
    pub names_left_out: AtomicU64,
    /// Of the objects seen, those the API server sent in protobuf (`super::protobuf`).
    pub protobuf: AtomicU64,
    /// Times the watch turned to JSON because what the API server sent in protobuf could not
    /// be read through the dispatcher's table of types (or a proxy refused protobuf).
    pub json_fallbacks: AtomicU64,
}

/// The fan-out of one watch: its subscribers, and what it must remember to tell them.
pub(super) struct FanOut {
    key: WatchKey,
    types: Arc<TypeMeta>,
    counts: Arc<WatchCounts>,
    slice: watch::Receiver<Arc<Slice>>,
    subscribers: Subscribers,
    /// The `shardSelector` the watch asked for when it last (re)started, if any.
    shard: Option<String>,
    /// Whether an object of another dispatcher's namespaces arrived although the watch asked
    /// for this dispatcher's only (the API server ignores the selector), since that start.
    unsharded: bool,
    /// The owned objects the watch shows, both ways, for the owned subscriptions; shared with
    /// the groups, which read an owner's children for its requests.
    children: Arc<ChildIndex>,
    /// The slice the index follows ([`FanOut::slice_changed`]): it holds the children of the
    /// owners this slice lets the dispatcher serve, whatever slice is current when an event
    /// arrives, so that what it pruned and what the list beside the stream shows agree.
    followed: Arc<Slice>,
    /// The slice followed before it, as the index keeps it ([`ChildIndex::follow`]): the
    /// children of its owners are indexed too, until no key is on its way out of here.
    kept: Option<Arc<Slice>>,
    /// When to look next whether `kept` is still needed ([`FanOut::keeps_owners_no_longer_needed`]).
    kept_until: Option<std::time::Instant>,
}

mod kept;
mod written;
use written::Content;

impl FanOut {
    /// The type of the watch's objects (the API server leaves it out of a list's items).
    pub(super) fn types(&self) -> &Arc<TypeMeta> {
        &self.types
    }

    /// The fan-out of the watch of `key`, whose objects are of `types`, to `subscribers`, placing
    /// keys on the slice current when each event arrives.
    pub(super) fn new(
        key: WatchKey,
        types: Arc<TypeMeta>,
        counts: Arc<WatchCounts>,
        slice: watch::Receiver<Arc<Slice>>,
        subscribers: Subscribers,
        children: Arc<ChildIndex>,
    ) -> Self {
        let followed = slice.borrow().clone();
        Self {
            key,
            types,
            counts,
            slice,
            subscribers,
            shard: None,
            unsharded: false,
            children,
            followed,
            kept: None,
            kept_until: None,
        }
    }

    /// The watch (re)started asking for the namespaces of `shard` only, if any.
    pub(super) fn restarted(&mut self, shard: Option<String>) {
        self.shard = shard;
        self.unsharded = false;
    }

    /// The `shardSelector` the watch asked for when it last (re)started, if any.
    pub(super) fn shard(&self) -> Option<String> {
        self.shard.clone()
    }

    /// Whether a group keyed by this watch's objects has owners whose children another watch
    /// has not all shown yet for the slice current now ([`Group::children_complete`]): an
    /// owner this watch lists now would be requested without them, and its replica would read
    /// each.
    pub(super) fn owners_lack_children(&self) -> bool {
        let slice = self.slice.borrow().clone();
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let resource = &self.key.resource;
        subscribers.iter().any(|s| {
            matches!(s.keyed(), Keyed::Itself)
                && !s.group.children_complete(resource, &slice, &self.children)
        })
    }

    /// Publishes what the watch saw of `obj` (in its stream, or in its own list of `epoch`) to
    /// every subscriber, by the rules of [`super::routing`]. Each group records it under its
    /// lock, against the slice current then ([`kube_dispatch_core::transit::Transit::record`]:
    /// it remembers deletions of keys a handover holds, recent deletions of keys owned
    /// elsewhere, and changes the stream shows of keys a handover holds). Returns the object's
    /// request key, or why its JSON, needed here, cannot be written ([`Self::write_json`]).
    pub(super) fn publish(&mut self, obj: &WatchedObject, epoch: u32, seen: Seen) -> Written {
        let (deleted, origin) = match seen {
            Seen::Exists(origin) => (false, origin),
            Seen::Deleted => (true, Origin::Stream),
        };
        let slice = self.slice.borrow().clone();
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let text = object_key(&self.key.resource, obj).to_string();
        let key = KeyRef::new(&text);
        let place = place(&slice, key);
        // Before anything is counted or recorded: an error starts the watch again.
        self.write_json(&subscribers, obj, (place, deleted), &text)?;
        let counter = if deleted {
            &self.counts.deleted
        } else {
            &self.counts.applied
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if obj.read_in_protobuf() {
            self.counts.protobuf.fetch_add(1, Ordering::Relaxed);
        }
        let (uid, version) = (
            obj.uid().unwrap_or_default(),
            obj.resource_version().unwrap_or_default(),
        );
        if place == Place::Elsewhere {
            self.counts.elsewhere.fetch_add(1, Ordering::Relaxed);
            if self.shard.is_some() && !self.unsharded && slice.shard_selector() == self.shard {
                self.unsharded = true;
                warn!(
                    resource = %describe(&self.key),
                    key = %text,
                    "the API server sent an object of a namespace another dispatcher owns: it ignores shardSelector (Kubernetes before 1.36, or the ShardedListAndWatch feature gate off); every dispatcher receives every object and filters it itself"
                );
            }
        }
        let mut bodies = Bodies::new(&self.types);
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
        let owners = self.index_child(&subscribers, obj, (&text, epoch), deleted, &mut bodies);
        for sub in subscribers.iter() {
            match sub.keyed() {
                Keyed::Itself => {
                    let indexing = if deleted || place == Place::Elsewhere {
                        Indexing::Gone
                    } else {
                        Indexing::Replace
                    };
                    self.index_names(&sub.group, obj, &text, epoch, indexing);
                    sub.group.record(primary_event(
                        (&uid, &version),
                        (key, epoch),
                        seen,
                        place,
                        || Content::of(sub, obj, &mut bodies, trace.clone()),
                    ));
                }
                Keyed::Owner(owner) => {
                    let tell = owners.iter().find(|(k, _)| *k == owner).map(|(_, t)| t);
                    // Owners the group's own watch of them lists are left to that watch while the
                    // group does not know them yet.
                    let owners_listed = sub.group.spec.lists_owners_of(owner, &self.key.namespace);
                    for key in tell.into_iter().flatten() {
                        sub.group.record(GroupEvent::OwnedChanged {
                            key: KeyRef::new(key),
                            origin,
                            owners_listed,
                        });
                    }
                }
                Keyed::Referrers => {
                    sub.group
                        .named_object_seen(&text, &version, epoch, deleted, origin);
                }
            }
        }
        drop(subscribers);
        self.count_children();
        Ok(text)
    }

    /// Records in the index of owned objects what the watch saw of `obj` (key `text`, shown at
    /// `epoch`), once per owner kind however many groups subscribe with it; returns the owners
    /// to tell per kind: the child's controlling owner now, and the one it had before if that
    /// was another.
    fn index_child<'s>(
        &self,
        subscribers: &'s [Subscriber],
        obj: &WatchedObject,
        (text, epoch): (&str, u32),
        deleted: bool,
        bodies: &mut Bodies<'_>,
    ) -> Vec<(&'s OwnerKind, Vec<String>)> {
        let (uid, version) = (
            obj.uid().unwrap_or_default(),
            obj.resource_version().unwrap_or_default(),
        );
        let mut owners: Vec<(&OwnerKind, Vec<String>)> = Vec::new();
        for kind in subscribers.iter().filter_map(|s| s.owner.as_ref()) {
            if owners.iter().any(|(k, _)| *k == kind) {
                continue;
            }
            // Only children of owners this dispatcher may serve are indexed: one whose owner is
            // served elsewhere is as good as unowned here (its former owner, if served here, is
            // told it lost a child).
            let now = owner_key(obj, kind)
                .map(|k| k.to_string())
                .filter(|k| self.indexes_children_of(KeyRef::new(k)));
            let body = match (&now, deleted) {
                (Some(_), false) => self.children.hold(|| bodies.full(obj)),
                _ => None,
            };
            let shown = Shown {
                uid: &uid,
                resource_version: &version,
                body,
            };
            let tell = self
                .children
                .write()
                .seen(kind, text, now, epoch, deleted, shown);
            owners.push((kind, tell));
        }
        owners
    }

    /// Takes an object shown by a list beside the stream, for keys served here that a group
    /// does not know yet ([`GroupEvent::Listed`]), unless a deletion of it was seen since the list
    /// began. Returns the object's request key.
    pub(super) fn fill(&mut self, obj: &WatchedObject, epoch: u32, list: &SideList) -> String {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let text = object_key(&self.key.resource, obj).to_string();
        let key = KeyRef::new(&text);
        let deleted_since = list.was_deleted(key.hash());
        let (uid, version) = (
            obj.uid().unwrap_or_default(),
            obj.resource_version().unwrap_or_default(),
        );
        let mut bodies = Bodies::new(&self.types);
        for sub in subscribers.iter() {
            match sub.keyed() {
                Keyed::Itself if !deleted_since => {
                    // Only for a key the stream has not indexed: the list may be older.
                    if place(&self.slice.borrow(), key) == Place::Here {
                        self.index_names(&sub.group, obj, &text, epoch, Indexing::IfAbsent);
                    }
                    sub.group.record(GroupEvent::Listed {
                        key,
                        object: Observed {
                            resource_version: version.clone(),
                            uid: uid.clone(),
                            body: bodies.get(sub.payload, obj),
                            trace: None,
                            fingerprint: obj.fingerprint(sub.changes_of),
                        },
                        epoch,
                    });
                }
                // A group that just joined the watch has missed the changes of the objects
                // named so far: a first sighting tells their referrers.
                Keyed::Referrers if !deleted_since => {
                    sub.group
                        .named_object_seen(&text, &version, epoch, false, Origin::List);
                }
                Keyed::Itself | Keyed::Referrers => {}
                // The child is indexed for its owner's requests. The owner is queued for it
                // only in a group with no primary subscription of the owners: otherwise its
                // watch of them lists them beside its stream too (waiting for this list,
                // `WatchTask::waits_for_children`), with their bodies, once their children are
                // all known here; queued from here, an owner would be delivered without its
                // body and before its children were all listed, and its replica read both.
                Keyed::Owner(owner) => {
                    if let Some(owner_key) = owner_key(obj, owner) {
                        let owner_key = owner_key.to_string();
                        let served = self.indexes_children_of(KeyRef::new(&owner_key));
                        if !deleted_since && served {
                            let shown = Shown {
                                uid: &uid,
                                resource_version: &version,
                                body: self.children.hold(|| bodies.full(obj)),
                            };
                            self.children.write().listed(
                                owner,
                                &text,
                                owner_key.clone(),
                                epoch,
                                shown,
                            );
                        }
                        if !sub.group.spec.lists_owners_of(owner, &self.key.namespace) {
                            sub.group.record(GroupEvent::ListedOwned {
                                key: KeyRef::new(&owner_key),
                            });
                        }
                    }
                }
            }
        }
        drop(subscribers);
        self.count_children();
        text
    }

    /// The watch's own list of `epoch` ended: queue the deletions it revealed in every group's
    /// primary subscription, and tell the owners of the owned objects it did not show.
    pub(super) fn sweep(&mut self, epoch: u32) {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let lost = self.children.write().swept(epoch, |kind| {
            subscribers.iter().any(|s| s.owner.as_ref() == Some(kind))
        });
        for sub in subscribers.iter() {
            match sub.keyed() {
                Keyed::Itself => sub.group.sweep(epoch, |key| in_watch(&self.key, key)),
                Keyed::Owner(kind) => {
                    for owner in lost.get(kind).into_iter().flatten() {
                        sub.group.record(GroupEvent::OwnedChanged {
                            key: KeyRef::new(owner),
                            origin: Origin::List,
                            owners_listed: false,
                        });
                    }
                }
                Keyed::Referrers => sub
                    .group
                    .named_objects_swept(epoch, |key| in_watch(&self.key, key)),
            }
        }
        drop(subscribers);
        self.count_children();
    }

    /// Records what the object of `key`, shown at `epoch`, names at the field paths of
    /// `group`'s `referenced_by` subscriptions, as `indexing` says. Only groups that follow
    /// references read the object for it.
    fn index_names(
        &self,
        group: &Group,
        obj: &WatchedObject,
        key: &str,
        epoch: u32,
        indexing: Indexing,
    ) {
        // An object whose JSON is past a bound (`Self::write_json`) keeps what it named.
        let names_none = group.spec.named_from(&self.key.resource).next().is_none();
        if names_none || (indexing != Indexing::Gone && obj.json().is_none()) {
            return;
        }
        let targets = if indexing == Indexing::Gone {
            Vec::new()
        } else {
            let (targets, left_out) = named_keys(&group.spec, &self.key.resource, obj);
            if left_out {
                self.counts.names_left_out.fetch_add(1, Ordering::Relaxed);
                debug!(group = %group.id, key, "the object names more than {} others at its field paths: those past it are not followed", kube_dispatch_core::references::MAX_NAMES_PER_OBJECT);
            }
            targets
        };
        group.names(key, targets, epoch, indexing == Indexing::IfAbsent);
    }

    fn count_children(&self) {
        let children = self.children.read();
        self.counts
            .children
            .store(children.len() as u64, Ordering::Relaxed);
        self.counts
            .children_bytes
            .store(children.bytes() as u64, Ordering::Relaxed);
    }
}

/// What an event of an object a group reconciles does to the group's index of references.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Indexing {
    /// The object names what it names now (the stream).
    Replace,
    /// Only if the index has nothing for it: a list beside the stream, maybe older.
    IfAbsent,
    /// Deleted, or served elsewhere: it names nothing here.
    Gone,
}

/// What a watch saw of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// It exists as shown, by the watch's own list or its stream.
    Exists(Origin),
    /// The stream shows it deleted.
    Deleted,
}

/// The event a subscription to the objects themselves (not their owners) gets for the object
/// of `uid` at `resource_version`, seen as `seen` at `epoch` and placed at `place`: `content`
/// gives its body, trace context and change filter's hash, asked for only if the key is served
/// here (a key owned elsewhere is recorded only if it is still on its way out, and then
/// delivered without a body, and without filtering).
fn primary_event<'k>(
    (uid, resource_version): (&str, &str),
    (key, epoch): (KeyRef<'k>, u32),
    seen: Seen,
    place: Place,
    content: impl FnOnce() -> Content,
) -> GroupEvent<'k> {
    let (uid, resource_version) = (uid.to_owned(), resource_version.to_owned());
    let Content {
        body,
        trace,
        fingerprint,
    } = if place == Place::Elsewhere {
        Content::default()
    } else {
        content()
    };
    let origin = match seen {
        Seen::Exists(origin) => origin,
        Seen::Deleted => {
            return GroupEvent::Deleted {
                key,
                change: Change {
                    reason: Reason::Deleted,
                    resource_version,
                    uid,
                    body,
                    deleted: true,
                    trace,
                },
            };
        }
    };
    let object = Observed {
        resource_version,
        uid,
        body,
        trace,
        fingerprint,
    };
    GroupEvent::exists(key, object, (epoch, origin), place == Place::Elsewhere)
}

/// A watch, for log lines: its resource, namespace and selectors.
pub(super) fn describe(key: &WatchKey) -> String {
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

/// The resource a watch key names, for messages.
pub fn resource_name(r: &ResourceId) -> String {
    if r.group.is_empty() {
        format!("{}/{}", r.version, r.plural)
    } else {
        format!("{}/{}/{}", r.group, r.version, r.plural)
    }
}
