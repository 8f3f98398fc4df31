//! The owned objects a dispatcher's watch shows, indexed both ways per owner kind the watch feeds: each
//! child to the controlling owner it was last seen with, and each owner to its children.
//!
//! - A child whose controlling owner changes names only the new owner; the old one, which
//!   lost a child, is told from here.
//! - A child deleted while the watch was away (a watch gap that ends in a re-list) is never
//!   seen again: when the re-list ends, every child it did not show is gone, and its owner is
//!   told.
//! - An owner's children as the watch knows them ([`Children::of`]): name, uid and
//!   resourceVersion, so a reconcile of the owner need not list them; and, where the index
//!   keeps bodies ([`ChildIndex::keep_bodies`]), the child as the watch showed it, so it need
//!   not read them either.
//!
//! Both directions change together in one place (`insert` and `remove`), so neither can hold
//! what the other does not.
//!
//! Bound: one entry per object of the watch that has a controlling owner of a subscribed kind
//! whose key this dispatcher may serve, or could before a member joined while the ring has not
//! changed since ([`ChildIndex::follow`]) (its key, uid and resourceVersion, with its owner's key
//! shared among siblings: about [`Children::bytes`] / [`Children::len`], about 300 bytes each),
//! so it grows with the owners served here, not with every owned object the watch shows;
//! removed when the object is deleted, loses its owner or is missing from a re-list, and when
//! its owner is no longer served here; dropped with the watch. Bodies are held apart from that
//! count, in the process's body pool, and only while it stays at most half full
//! ([`HeldBody`]): past that a child is indexed without its body.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex, OnceLock, RwLock, RwLockWriteGuard,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Instant,
};

use crate::{
    handover::Slice,
    key::KeyRef,
    queue::pool::{BodyPool, HeldBody},
    subscription::OwnerKind,
};

mod following;
use following::Grown;
mod request;
pub use request::{MAX_CHILDREN_PER_REQUEST, OwnerChildren};

/// What the index holds of one child: its owner, the epoch of the list or watch that last
/// showed it, and what an owner's reconcile is told of it.
#[derive(Debug)]
struct Child {
    owner: Arc<str>,
    epoch: u32,
    uid: Box<str>,
    resource_version: Box<str>,
    body: Option<HeldBody>,
}

/// A child as the watch (or a list beside it) shows it.
#[derive(Debug)]
pub struct Shown<'a> {
    /// Its uid.
    pub uid: &'a str,
    /// Its resourceVersion.
    pub resource_version: &'a str,
    /// Its body as JSON, when the index keeps bodies and the pool held it.
    pub body: Option<HeldBody>,
}

impl<'a> From<(&'a str, &'a str)> for Shown<'a> {
    fn from((uid, resource_version): (&'a str, &'a str)) -> Self {
        Self {
            uid,
            resource_version,
            body: None,
        }
    }
}

/// A child as an owner's reconcile is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownChild {
    /// Its request key (group, kind, namespace and name).
    pub key: Arc<str>,
    /// Its uid.
    pub uid: Box<str>,
    /// The resourceVersion the watch last showed.
    pub resource_version: Box<str>,
    /// The child as JSON at that version, when the index kept it.
    pub body: Option<Arc<[u8]>>,
}

/// The children of one owner kind, both ways.
#[derive(Debug, Default)]
struct OfKind {
    by_child: HashMap<Arc<str>, Child>,
    by_owner: HashMap<Arc<str>, BTreeMap<Arc<str>, ()>>,
    /// What both maps hold, by [`entry_bytes`] and owner keys; kept as they change.
    bytes: usize,
}

/// Bytes one entry takes besides its strings: two hash-map slots at their load factor, the
/// owner's set node, the Arc headers and the allocator's headers.
const ENTRY_OVERHEAD: usize = 192;

/// About the bytes the entry of `key` takes.
fn entry_bytes(key: &str, child: &Child) -> usize {
    key.len() + child.uid.len() + child.resource_version.len() + ENTRY_OVERHEAD
}

impl OfKind {
    /// Records `child` under `owner`, replacing what was known of it; returns the owner it had
    /// before, if any.
    fn insert(
        &mut self,
        key: &str,
        owner: &str,
        epoch: u32,
        object: Shown<'_>,
    ) -> Option<Arc<str>> {
        let before = self.remove(key);
        let owner: Arc<str> = match self.by_owner.get_key_value(owner) {
            Some((shared, _)) => shared.clone(),
            None => {
                self.bytes += owner.len();
                Arc::from(owner)
            }
        };
        let child = Child {
            owner: owner.clone(),
            epoch,
            uid: object.uid.into(),
            resource_version: object.resource_version.into(),
            body: object.body,
        };
        self.bytes += entry_bytes(key, &child);
        let key: Arc<str> = Arc::from(key);
        self.by_owner
            .entry(owner)
            .or_default()
            .insert(key.clone(), ());
        self.by_child.insert(key, child);
        before.map(|c| c.owner)
    }

    /// Forgets `child`; returns what was known of it.
    fn remove(&mut self, key: &str) -> Option<Child> {
        let child = self.by_child.remove(key)?;
        self.bytes -= entry_bytes(key, &child);
        if let Some(siblings) = self.by_owner.get_mut(&child.owner) {
            siblings.remove(key);
            if siblings.is_empty() {
                self.by_owner.remove(&child.owner);
                self.bytes -= child.owner.len();
            }
        }
        Some(child)
    }
}

/// Per owner kind, each child to its owner and each owner to its children.
#[derive(Debug, Default)]
pub struct Children {
    by_kind: HashMap<OwnerKind, OfKind>,
}

impl Children {
    /// Owned objects indexed, over every owner kind.
    pub fn len(&self) -> usize {
        self.by_kind.values().map(|k| k.by_child.len()).sum()
    }

    /// Whether no owned object is indexed.
    pub fn is_empty(&self) -> bool {
        self.by_kind.values().all(|k| k.by_child.is_empty())
    }

    /// About how many bytes the index holds: each child's key, uid and resourceVersion and a
    /// fixed overhead per entry, and each owner's key once however many children share it.
    pub fn bytes(&self) -> usize {
        self.by_kind.values().map(|k| k.bytes).sum()
    }

    /// Records `child` as seen in `epoch` with `owner` (its controlling owner of `kind` now, if
    /// any) and its `uid` and `resource_version`, or deleted; returns the owners to tell: the
    /// current one, and the one it had before if that was another.
    pub fn seen<'a>(
        &mut self,
        kind: &OwnerKind,
        child: &str,
        owner: Option<String>,
        epoch: u32,
        deleted: bool,
        object: impl Into<Shown<'a>>,
    ) -> Vec<String> {
        let children = self.by_kind.entry(kind.clone()).or_default();
        let before = match (&owner, deleted) {
            (Some(owner), false) => children.insert(child, owner, epoch, object.into()),
            _ => children.remove(child).map(|c| c.owner),
        };
        let mut tell: Vec<String> = owner.into_iter().collect();
        if let Some(before) = before
            && !tell.iter().any(|t| **t == *before)
        {
            tell.push(before.to_string());
        }
        tell
    }

    /// Records `child`, shown by a list beside the watch with `owner`, unless the watch knows it
    /// already: the watch's stream is the authority on what it has shown (the list may be
    /// older). A child known at the very version listed, but without its body, takes the
    /// list's.
    pub fn listed<'a>(
        &mut self,
        kind: &OwnerKind,
        child: &str,
        owner: String,
        epoch: u32,
        object: impl Into<Shown<'a>>,
    ) {
        let children = self.by_kind.entry(kind.clone()).or_default();
        let object = object.into();
        match children.by_child.get_mut(child) {
            None => {
                children.insert(child, &owner, epoch, object);
            }
            Some(known) => {
                if known.body.is_none() && *known.resource_version == *object.resource_version {
                    known.body = object.body;
                }
            }
        }
    }

    /// A re-list of `epoch` ended: the children it did not show were deleted while the watch
    /// was away. Forgets them and the kinds no longer subscribed (`subscribed`); returns their
    /// owners, per kind, each once.
    pub fn swept(
        &mut self,
        epoch: u32,
        subscribed: impl Fn(&OwnerKind) -> bool,
    ) -> HashMap<OwnerKind, Vec<String>> {
        self.by_kind.retain(|kind, _| subscribed(kind));
        let mut tell: HashMap<OwnerKind, Vec<String>> = HashMap::new();
        for (kind, children) in &mut self.by_kind {
            let gone: Vec<Arc<str>> = children
                .by_child
                .iter()
                .filter(|(_, c)| c.epoch != epoch)
                .map(|(key, _)| key.clone())
                .collect();
            for key in gone {
                if let Some(child) = children.remove(&key) {
                    tell.entry(kind.clone())
                        .or_default()
                        .push(child.owner.to_string());
                }
            }
        }
        for owners in tell.values_mut() {
            owners.sort_unstable();
            owners.dedup();
        }
        tell
    }

    /// Forgets the children of the owners `keep` rejects (their keys are no longer served here,
    /// [`crate::handover::Slice::may_serve`]): nobody is told, as nothing changed but where
    /// the owners are reconciled. A list shows them again if they come back.
    pub fn retain_owners(&mut self, keep: impl Fn(&str) -> bool) {
        for children in self.by_kind.values_mut() {
            let gone: Vec<Arc<str>> = children
                .by_child
                .iter()
                .filter(|(_, c)| !keep(&c.owner))
                .map(|(key, _)| key.clone())
                .collect();
            for key in gone {
                children.remove(&key);
            }
        }
    }

    /// Forgets the children of `kind` (no subscriber follows it any more).
    pub fn forget(&mut self, kind: &OwnerKind) {
        self.by_kind.remove(kind);
    }

    /// The children of `owner` (a request key of `kind`), in key order.
    pub fn of(&self, kind: &OwnerKind, owner: &str) -> Vec<KnownChild> {
        let Some(children) = self.by_kind.get(kind) else {
            return Vec::new();
        };
        let Some(keys) = children.by_owner.get(owner) else {
            return Vec::new();
        };
        keys.keys()
            .filter_map(|key| {
                let c = children.by_child.get(key)?;
                Some(KnownChild {
                    key: key.clone(),
                    uid: c.uid.clone(),
                    resource_version: c.resource_version.clone(),
                    body: c.body.as_ref().map(|b| b.body().clone()),
                })
            })
            .collect()
    }
}

/// One watch's index of owned objects, shared by its fan-out, which changes it, and the groups
/// subscribed to its owned objects, which read an owner's children for its requests.
#[derive(Debug)]
pub struct ChildIndex {
    children: RwLock<Children>,
    /// The watch's own list is running (its first, or a re-list): children it has not shown
    /// again yet may be missing, and children deleted meanwhile may still be here.
    own_list: AtomicBool,
    /// A list beside the watch is running: children of an owner kind that just joined the
    /// watch, or of keys just moved here, may be missing.
    side_list: AtomicBool,
    /// While a list beside the watch runs for keys newly served here: the slices followed
    /// before each change that started or extended it. The children of an owner every one of
    /// them may serve have been indexed all along, so its requests are complete. `None` when
    /// that is not known until the list ends (a group joined the watch, or more than
    /// [`HELD_THROUGH`] changes came while the list ran): no owner's are complete meanwhile.
    held_through: Mutex<Option<Vec<Arc<Slice>>>>,
    /// The owners it began to hold without a list to show their children ([`Grown`]).
    grown: Mutex<Grown>,
    /// The watch's list beside its stream waits for the children of its own objects
    /// ([`ChildIndex::waits_for_others`]): a watch of those children, whose owners this watch
    /// indexes (an ownership cycle), does not wait for it in turn.
    waiting: AtomicBool,
    /// Groups joined the running watch that its task has not yet started listing for.
    joining: AtomicUsize,
    /// Steps of the watch task that ended with the watch showing everything.
    quiet: AtomicU64,
    /// When the watch last stopped showing everything (the end of the first step of the task
    /// that did not): how long its owners' children have been incomplete, which bounds how
    /// long an owner's delivery waits for them ([`ChildIndex::listing_since`]). `None` while
    /// it shows everything.
    listing_since: Mutex<Option<Instant>>,
    /// The slice whose owners the index holds the children of ([`ChildIndex::follow`]): a
    /// reader on another slice (the watch's task has not taken in a ring change yet) may be
    /// missing the children of owners that just came here.
    fed: Mutex<Option<Arc<Slice>>>,
    /// The slice followed before `fed` while no member has left the ring since
    /// (`still_followed`): its owners' children are kept too, for the owners on their way out
    /// that this dispatcher still delivers before it releases the ring.
    kept: Mutex<Option<Arc<Slice>>>,
    /// Where children's bodies are held, once a group that reads this index has a session
    /// that takes them ([`ChildIndex::keep_bodies`]); none kept before.
    bodies: OnceLock<BodyPool>,
}

impl Default for ChildIndex {
    fn default() -> Self {
        Self {
            children: RwLock::default(),
            own_list: AtomicBool::new(true),
            side_list: AtomicBool::new(false),
            held_through: Mutex::new(Some(Vec::new())),
            grown: Mutex::default(),
            waiting: AtomicBool::new(false),
            joining: AtomicUsize::new(0),
            quiet: AtomicU64::new(0),
            listing_since: Mutex::new(None),
            fed: Mutex::new(None),
            kept: Mutex::new(None),
            bodies: OnceLock::new(),
        }
    }
}

/// Ring changes a list beside the watch may span and still take the children of owners served
/// throughout as complete ([`ChildIndex::list_beside_for_more_owners`]); past it, none are
/// until the list ends.
const HELD_THROUGH: usize = 4;

impl ChildIndex {
    /// The index, to read its size.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Children> {
        self.children.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The index, to change it (the fan-out only).
    pub fn write(&self) -> RwLockWriteGuard<'_, Children> {
        self.children.write().unwrap_or_else(|e| e.into_inner())
    }

    /// What the index began to hold without a list ([`ChildIndex::own_list`]).
    fn grown(&self) -> std::sync::MutexGuard<'_, Grown> {
        self.grown.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watch does not show everything of its own (`true`: its own list runs, or its
    /// stream is broken or paused) or does again (`false`).
    pub fn own_list_running(&self, running: bool) {
        self.own_list.store(running, Ordering::Release);
    }

    /// The watch's own list (its first, or a re-list) begins (`true`: asked for from now on)
    /// or has shown everything (`false`). Only a list counts: a stream that breaks and resumes
    /// where it was shows no object again: owners gained with no list due are complete once a
    /// list marked after they were gained has ended.
    pub fn own_list(&self, begins: bool) {
        let mut grown = self.grown();
        if begins {
            grown.marked(true);
        } else {
            grown.ended(true);
        }
    }

    /// A list beside the watch started (`true`) or ended (`false`).
    pub fn side_list_running(&self, running: bool) {
        if self.side_list.swap(running, Ordering::AcqRel) && !running {
            self.grown().ended(false);
        }
    }

    /// The keys served here grow: a list beside the watch starts (or one running is extended)
    /// to show the children of the owners now served. Called before the index follows the new
    /// slice: the owners the slice followed until now (and every slice followed since the list
    /// began) may serve keep complete children.
    pub fn list_beside_for_more_owners(&self) {
        // One lock at a time (`of` takes them too).
        let fed = self.fed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut held = self.held_through.lock().unwrap_or_else(|e| e.into_inner());
        if !self.side_list.load(Ordering::Acquire) {
            *held = Some(Vec::new());
        }
        *held = match (held.take(), fed) {
            (Some(mut slices), Some(fed)) if slices.len() < HELD_THROUGH => {
                slices.push(fed);
                Some(slices)
            }
            _ => None,
        };
        drop(held);
        self.grown().marked(false);
        self.side_list.store(true, Ordering::Release);
    }

    /// The watch's list beside its stream waits (`true`) or no longer waits for the children
    /// of its own objects that other watches list.
    pub fn waits_for_others(&self, waits: bool) {
        self.waiting.store(waits, Ordering::Release);
    }

    /// Whether the watch's list beside its stream waits for other watches' children.
    pub fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }

    /// Keeps the bodies of the children seen from now on, in `pool` while it stays at most half
    /// full ([`HeldBody`]); the children indexed before stay without theirs until they change
    /// or are listed again. The first pool given is kept.
    pub fn keep_bodies(&self, pool: &BodyPool) {
        let _ = self.bodies.set(pool.clone());
    }

    /// Whether the index keeps the bodies of the children it sees ([`ChildIndex::keep_bodies`]).
    pub fn keeps_bodies(&self) -> bool {
        self.bodies.get().is_some()
    }

    /// `body`, held in the pool of [`ChildIndex::keep_bodies`] if the index keeps bodies, the
    /// pool has room and there is a body; `None` otherwise. Asked before the body is made, so an
    /// index that keeps none costs nothing: `body` runs only when one is kept.
    pub fn hold(&self, body: impl FnOnce() -> Option<Arc<[u8]>>) -> Option<HeldBody> {
        HeldBody::take(self.bodies.get()?, body()?)
    }

    /// Whether the index holds every child of the owners `slice` lets this dispatcher serve:
    /// it follows that slice's placement, and the watch shows everything
    /// ([`ChildIndex::shows_everything`]).
    pub fn complete_for(&self, slice: &Slice) -> bool {
        // The slice first: the task marks a list running before it follows a slice the list
        // is for, so a reader that sees the new slice sees the list running too.
        self.follows(slice) && self.shows_everything()
    }

    /// Whether the index follows `slice`'s placement ([`ChildIndex::follow`]).
    fn follows(&self, slice: &Slice) -> bool {
        self.fed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|fed| fed.same_placement(slice))
    }

    /// Whether the watch shows everything it watches to every group it feeds: its stream is
    /// up, and neither its own list nor one beside it runs, nor is one owed to a group that
    /// joined.
    pub fn shows_everything(&self) -> bool {
        self.joining.load(Ordering::Acquire) == 0
            && !self.own_list.load(Ordering::Acquire)
            && !self.side_list.load(Ordering::Acquire)
    }

    /// The watch task finished a step at `now`: if it shows everything now, says so (see
    /// [`ChildIndex::quiet_steps`]) and forgets since when it did not; if not, notes `now` as
    /// that time unless one is known ([`ChildIndex::listing_since`]).
    pub fn step_done(&self, now: Instant) {
        self.grown().step_done();
        let everything = self.shows_everything();
        if everything {
            self.quiet.fetch_add(1, Ordering::AcqRel);
        }
        let mut since = self.listing_since.lock().unwrap_or_else(|e| e.into_inner());
        *since = if everything {
            None
        } else {
            since.or(Some(now))
        };
    }

    /// A list that stops the watch showing everything begins at `now` (its own list, one
    /// beside it, a group's join), unless one already runs: marked before it is marked running,
    /// so that an owner found incomplete because of it knows since when
    /// ([`ChildIndex::listing_since`]).
    pub fn began_listing(&self, now: Instant) {
        self.listing_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(now);
    }

    /// Since when the watch has not shown everything (a list of its own, one beside it, or a
    /// group's join running): `None` while it shows everything, and before its task marked a
    /// list begun or ended a step. An owner's children found incomplete are being listed
    /// since then, and a delivery may wait a little for that list to end rather than be made
    /// with them incomplete, which costs its reconcile reads.
    pub fn listing_since(&self) -> Option<Instant> {
        *self.listing_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many steps of the watch task ended with the watch showing everything: a group that
    /// subscribed when this was `n` has been shown everything once it is past `n` (or the
    /// watch shows everything now), however briefly, whatever joins came after.
    pub fn quiet_steps(&self) -> u64 {
        self.quiet.load(Ordering::Acquire)
    }

    /// A group joined the running watch (before its task is told).
    pub fn joined(&self) {
        self.joining.fetch_add(1, Ordering::AcqRel);
    }

    /// The task took in the groups that joined: it lists beside the watch for them, or its own
    /// list shows them everything.
    pub fn joins_taken(&self) {
        *self.held_through.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.grown().marked(false);
        self.side_list.store(true, Ordering::Release);
        self.joining.store(0, Ordering::Release);
    }

    /// The children of `owner`, a request key of `kind`, at most
    /// [`MAX_CHILDREN_PER_REQUEST`], and whether the watch had shown them all: the index holds
    /// the children of the owners of the slice it follows, so they are complete when that slice
    /// may serve `owner`, the watch's stream is up, no list of its own runs, no group joined it
    /// unlisted, and no list beside it runs but for owners the slices it spans all served. A
    /// reader on a newer slice the watch has not taken in yet is answered for the owners both
    /// serve, as their children were kept all along.
    pub fn of(&self, kind: &OwnerKind, owner: &str) -> OwnerChildren {
        // Under the index's lock, which `follow` changes the slice under; the flags before the
        // children: a list that starts after this is taken as complete for what was read,
        // which it was.
        let index = self.read();
        let complete = self.complete_flags(KeyRef::new(owner));
        let mut children = index.of(kind, owner);
        drop(index);
        let truncated = children.len() > MAX_CHILDREN_PER_REQUEST;
        children.truncate(MAX_CHILDREN_PER_REQUEST);
        OwnerChildren {
            children,
            complete,
            truncated,
        }
    }

    /// Whether [`ChildIndex::of`] would find `owner`'s children complete now, without reading
    /// them: to decide whether its delivery waits for them.
    pub fn is_complete_for(&self, owner: &str) -> bool {
        let _index = self.read();
        self.complete_flags(KeyRef::new(owner))
    }
}

#[cfg(test)]
mod tests;
