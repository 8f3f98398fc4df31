//! Which owners' children the index holds as the slice changes: those of the owners the slice
//! it follows lets this dispatcher serve, and for a while those of the slice before it, whose
//! owners moving to a member that joined are still delivered here.

use std::sync::{Arc, atomic::Ordering};

use kube_dispatch_proto::RingKey;

use super::{ChildIndex, HELD_THROUGH};
use crate::{handover::Slice, key::KeyRef};

/// The slice whose owners' children an index keeps beside those of `next`, the slice it follows
/// from now on, having followed `followed` (and kept `kept`): while `next`'s ring has every
/// member of `followed`'s (members joined; or only its settled ring, its peers or its Lease
/// changed), the slice kept already or else `followed`. A dispatcher that stops serving keys
/// that move to a member that joined (its settled ring catching up with its ring) still
/// delivers those of them queued here before it releases the ring, and their requests show
/// their children as the index kept them all along. The watch may see the join's two slices as
/// one (the slice channel keeps the latest), hence members joined, not only the same ring.
/// `None` once a member leaves: nothing moves away then.
///
/// Never on a ring keyed by namespace: there the watch asks the API server for this dispatcher's
/// namespaces only, and the children of the others stop coming. Nor from a slice off its ring
/// (warming up), which may serve every key.
fn still_followed(
    followed: &Arc<Slice>,
    kept: Option<&Arc<Slice>>,
    next: &Slice,
) -> Option<Arc<Slice>> {
    let joined = followed.ring.key() == next.ring.key()
        && followed
            .ring
            .members()
            .iter()
            .all(|m| next.ring.members().contains(m));
    (joined && next.ring.key() != RingKey::Namespace && followed.is_member())
        .then(|| kept.unwrap_or(followed).clone())
}

/// Whether `slice` lets the index hold `owner`'s children: it may serve the owner, and on a ring
/// keyed by namespace the watch still shows the owner's namespace (it asks only for those this
/// dispatcher owns on its ring, once it is a member; not those it serves until a handover
/// completes).
fn holds_children_of(slice: &Slice, owner: KeyRef<'_>) -> bool {
    slice.may_serve(owner)
        && (slice.ring.key() != RingKey::Namespace || !slice.is_member() || slice.owns_key(owner))
}

/// Which owners the index began to hold without a list to show their children: a member that
/// leaves the ring while its handover is pending lets this dispatcher may-serve its keys
/// ([`Slice::may_serve`]) though it serves no more of them (no list beside the watch is due),
/// and only the children of those owners that change from then on are indexed. Such an owner's
/// children are complete only once a list marked after the growth has ended.
#[derive(Debug)]
pub(super) struct Grown {
    /// Lists marked so far: the watch's own, and those beside it (for more owners, for a join).
    lists: u64,
    /// A list was marked in the watch task's current step: the `follow` that comes in the same
    /// step is the change it lists for, and its growth is covered.
    marked: bool,
    /// When the running own list and list beside were marked (`lists` then).
    own_from: u64,
    side_from: u64,
    /// Before each growth not yet covered: the slice followed and the one kept, and `lists`
    /// then. `Err` with the `lists` of the latest growth past [`HELD_THROUGH`]: no owner is
    /// complete until a list marked since has ended.
    before: Result<Vec<Before>, u64>,
}

/// What the index held by before a growth ([`Grown`]): the slice it followed, the one it kept,
/// and the lists marked until then.
type Before = (Arc<Slice>, Option<Arc<Slice>>, u64);

impl Default for Grown {
    fn default() -> Self {
        Self {
            lists: 0,
            marked: false,
            own_from: 0,
            side_from: 0,
            before: Ok(Vec::new()),
        }
    }
}

impl Grown {
    /// A list is marked: the own list (`own`) or one beside the watch.
    pub(super) fn marked(&mut self, own: bool) {
        self.lists += 1;
        self.marked = true;
        *(if own {
            &mut self.own_from
        } else {
            &mut self.side_from
        }) = self.lists;
    }

    /// The own list (`own`) or the list beside the watch ended: the growths before it was
    /// marked are covered.
    pub(super) fn ended(&mut self, own: bool) {
        let from = if own { self.own_from } else { self.side_from };
        match &mut self.before {
            Ok(before) => before.retain(|(_, _, at)| *at >= from),
            Err(at) if *at < from => self.before = Ok(Vec::new()),
            Err(_) => {}
        }
    }

    /// The watch task's step ended.
    pub(super) fn step_done(&mut self) {
        self.marked = false;
    }

    /// Whether the children of `owner` have been indexed since before every growth not yet
    /// covered.
    pub(super) fn covers(&self, owner: KeyRef<'_>) -> bool {
        self.before.as_ref().is_ok_and(|before| {
            (before.iter())
                .all(|(fed, kept, _)| ChildIndex::holds_children_of(fed, kept.as_ref(), owner))
        })
    }

    /// The index follows `slice` (keeping `kept`) after `before` (keeping `kept_before`).
    fn follows(
        &mut self,
        (slice, kept): (&Slice, Option<&Arc<Slice>>),
        (before, kept_before): (&Arc<Slice>, Option<&Arc<Slice>>),
    ) {
        if self.marked || within((slice, kept), (before, kept_before)) {
            return;
        }
        let lists = self.lists;
        match &mut self.before {
            // One that held no more, gone at the same list's end, says it already: a chain of
            // growths before the next list (members that die one after the other) keeps one.
            Ok(growths)
                if growths.iter().any(|(b, k, at)| {
                    *at == lists && within((b, k.as_ref()), (before, kept_before))
                }) => {}
            Ok(growths) if growths.len() < HELD_THROUGH => {
                growths.push((before.clone(), kept_before.cloned(), lists));
            }
            _ => self.before = Err(lists),
        }
    }
}

/// Whether the index holds the children of no owner following `slice` (keeping `kept`) that it
/// did not following `before` (keeping `kept_before`): judged by the members
/// ([`Slice::may_serve_within`]), so false where not certain.
fn within(
    (slice, kept): (&Slice, Option<&Arc<Slice>>),
    (before, kept_before): (&Arc<Slice>, Option<&Arc<Slice>>),
) -> bool {
    let ring_only = slice.ring.key() == RingKey::Namespace;
    let olds = [Some(before), kept_before];
    [Some(slice), kept.map(|k| &**k)]
        .into_iter()
        .flatten()
        .all(|n| (olds.iter().flatten()).any(|o| n.may_serve_within(o, ring_only)))
}

impl ChildIndex {
    /// The index holds the children of the owners `slice` lets this dispatcher serve, and of
    /// those the slice before it did while no member left the ring (`still_followed`; a list
    /// beside the watch, if it must show more of them, is already marked running): those of
    /// the others are forgotten under the index's lock, which readers hold
    /// ([`ChildIndex::of`]).
    ///
    /// Returns the slice it keeps beside `slice`: the fan-out indexes children for the owners
    /// of both ([`ChildIndex::holds_children_of`]).
    pub fn follow(&self, slice: Arc<Slice>) -> Option<Arc<Slice>> {
        let mut children = self.write();
        let mut fed = self.fed.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let kept_before = kept.clone();
        *kept = fed
            .as_ref()
            .and_then(|fed| still_followed(fed, kept.as_ref(), &slice));
        if let Some(before) = fed.as_ref() {
            self.grown()
                .follows((&slice, kept.as_ref()), (before, kept_before.as_ref()));
        }
        children.retain_owners(|owner| {
            Self::holds_children_of(&slice, kept.as_ref(), KeyRef::new(owner))
        });
        *fed = Some(slice);
        let kept = kept.clone();
        drop(fed);
        drop(children);
        kept
    }

    /// Stops keeping the owners of the slice before ([`ChildIndex::follow`]) once no key is on
    /// its way out of this dispatcher: their children are forgotten.
    pub fn forget_kept(&self) {
        let mut children = self.write();
        let fed = self.fed.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.take().is_some()
            && let Some(fed) = fed.as_ref()
        {
            children.retain_owners(|owner| holds_children_of(fed, KeyRef::new(owner)));
        }
    }

    /// Whether the index holds the children of `owner` when it follows `followed` and keeps
    /// `kept` beside it ([`ChildIndex::follow`]): the fan-out indexes a child only for such an
    /// owner.
    pub fn holds_children_of(
        followed: &Slice,
        kept: Option<&Arc<Slice>>,
        owner: KeyRef<'_>,
    ) -> bool {
        holds_children_of(followed, owner) || kept.is_some_and(|k| holds_children_of(k, owner))
    }

    /// The flags [`ChildIndex::of`] reads, under the index's lock.
    pub(super) fn complete_flags(&self, key: KeyRef<'_>) -> bool {
        // `fed`, then `kept`, as `follow` takes them; `held_through` apart
        // (`list_beside_for_more_owners` takes it with `fed`, one at a time).
        let followed = {
            let fed = self.fed.lock().unwrap_or_else(|e| e.into_inner());
            let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            fed.as_ref()
                .is_some_and(|fed| Self::holds_children_of(fed, kept.as_ref(), key))
        };
        let listed_beside = !self.side_list.load(Ordering::Acquire) || {
            let held = self.held_through.lock().unwrap_or_else(|e| e.into_inner());
            held.as_ref()
                .is_some_and(|slices| !slices.is_empty() && slices.iter().all(|s| s.may_serve(key)))
        };
        let grown = self.grown().covers(key);
        self.joining.load(Ordering::Acquire) == 0
            && !self.own_list.load(Ordering::Acquire)
            && followed
            && listed_beside
            && grown
    }
}
