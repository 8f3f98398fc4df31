//! References and children: the objects that name others by a declared field path, reconciled
//! when what they name changes, and the index of an owner kind's children.

use std::sync::{Arc, MutexGuard, atomic::Ordering};

use kube_dispatch_core::{
    children::ChildIndex,
    handover::Slice,
    key::KeyRef,
    references::References,
    subscription::{OwnerKind, ResourceId},
    transit::{GroupEvent, Origin},
};

use super::{Group, KEYS_PER_HOLD};

impl Group {
    /// The index of references, to change it.
    pub(super) fn references(&self) -> MutexGuard<'_, References> {
        self.references.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object of `key`, shown by the list or stream of `epoch`, names `targets` (request
    /// keys; none if it was deleted or is served elsewhere now); `if_absent`: only if nothing
    /// is indexed for it (a list beside the stream, maybe older than it).
    pub fn names(&self, key: &str, targets: Vec<String>, epoch: u32, if_absent: bool) {
        let mut references = self.references();
        if if_absent {
            references.name_if_absent(key, targets, epoch);
        } else {
            references.name(key, targets, epoch);
        }
    }

    /// The object of the request key `target` was shown at `resource_version` by the list or
    /// stream (`origin`) of `epoch`, or deleted: each object that names it is reconciled, if
    /// it changed.
    pub fn named_object_seen(
        &self,
        target: &str,
        resource_version: &str,
        epoch: u32,
        deleted: bool,
        origin: Origin,
    ) {
        let referrers = self
            .references()
            .target_seen(target, resource_version, epoch, deleted);
        self.named_changed(&referrers, origin);
    }

    /// The watch of named objects ended its list of `epoch`: the objects that name one of
    /// `belongs` it did not show (deleted while the watch was away) are reconciled.
    pub fn named_objects_swept(&self, epoch: u32, belongs: impl Fn(&str) -> bool) {
        let referrers = self.references().swept_targets(epoch, belongs);
        self.named_changed(&referrers, Origin::List);
    }

    /// Reconciles `referrers`: an object they name changed, as the watch's stream showed
    /// (remembered to go first if a handover holds them, and in the live lane) or a list did.
    fn named_changed(&self, referrers: &[Arc<str>], origin: Origin) {
        for chunk in referrers.chunks(KEYS_PER_HOLD) {
            self.record_all(chunk.iter().map(|key| GroupEvent::NamedChanged {
                key: KeyRef::new(key),
                origin,
            }));
        }
    }

    /// Takes the children of owners of `kind` from `index` into this group's requests.
    pub fn owns_from(&self, kind: OwnerKind, index: Arc<ChildIndex>) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock `take_children_bodies` takes, so that neither misses the other.
        self.keep_children_bodies_in(&index);
        if !owned
            .iter()
            .any(|(k, i)| *k == kind && Arc::ptr_eq(i, &index))
        {
            owned.push((kind, index));
        }
    }

    /// A session of the group takes its owners' children's bodies: its indexes keep them from
    /// now on (those it takes later too), and its requests carry them.
    pub fn take_children_bodies(&self) {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        self.children_bodies.store(true, Ordering::Release);
        for (_, index) in owned.iter() {
            index.keep_bodies(&self.body_pool);
        }
    }

    /// Has `index` keep children's bodies if this group's requests carry them: asked before a
    /// watch lists, so that the first list's children come with theirs.
    pub fn keep_children_bodies_in(&self, index: &ChildIndex) {
        if self.takes_children_bodies() {
            index.keep_bodies(&self.body_pool);
        }
    }

    /// Whether every index this group takes the children of owners of `resource` from holds
    /// every child of the owners `slice` serves ([`ChildIndex::complete_for`]), but `except`
    /// (the index of the watch asking, whose own list shows its children as it goes) and the
    /// indexes whose watch itself waits for others (an ownership cycle: neither waits for the
    /// other).
    pub fn children_complete(
        &self,
        resource: &ResourceId,
        slice: &Slice,
        except: &ChildIndex,
    ) -> bool {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned
            .iter()
            .filter(|(kind, index)| {
                kind.group == resource.group
                    && kind.kind == resource.kind
                    && !std::ptr::eq(Arc::as_ptr(index), except)
                    && !index.is_waiting()
            })
            .all(|(_, index)| index.complete_for(slice))
    }

    /// Whether its requests carry children's bodies ([`Group::take_children_bodies`]).
    pub fn takes_children_bodies(&self) -> bool {
        self.children_bodies.load(Ordering::Acquire)
    }
}
