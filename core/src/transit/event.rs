//! What a group is told of one key ([`GroupEvent`]), and where it was seen ([`Origin`]).

use crate::{
    key::KeyRef,
    queue::{Change, Lane, Observed},
};

#[cfg(doc)]
use super::Transit;
#[cfg(doc)]
use crate::queue::GroupQueue;

/// Where an event comes from. What a list shows waits behind what the watch's stream shows
/// ([`Lane`]), and only the stream's changes of keys a handover holds are remembered to go first
/// once they are served here: a list shows every object, changed or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A list: the watch's own, a re-list, or a list beside the stream.
    List,
    /// The watch's stream.
    Stream,
}

impl Origin {
    /// The lane a change of this origin waits in.
    pub fn lane(self) -> Lane {
        match self {
            Origin::List => Lane::Listed,
            Origin::Stream => Lane::Live,
        }
    }
}

/// What a watch, a list beside it or a peer tells a group of one key: the group's one entry for
/// events ([`Transit::record`]). Besides these, a group takes the end of a re-list
/// ([`GroupQueue::sweep`]) and a ring change ([`Transit::trim`]).
#[derive(Debug)]
pub enum GroupEvent<'a> {
    /// The watch shows the object of a key it placed on this dispatcher (its stream, or its
    /// own list with that list's `epoch`).
    Exists {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The object as the group keeps it.
        object: Observed,
        /// The list that showed it, or the list the stream follows.
        epoch: u32,
        /// The list or the stream.
        origin: Origin,
    },
    /// The watch shows the object of a key another dispatcher owned when it looked: no body.
    /// A deletion remembered for it is forgotten.
    ExistsElsewhere {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The object, without a body.
        object: Observed,
        /// As for [`GroupEvent::Exists`].
        epoch: u32,
        /// As for [`GroupEvent::Exists`].
        origin: Origin,
    },
    /// The object of a key was deleted: seen by the watch, wherever the key is placed, or
    /// remembered by a peer (`change.deleted` is set).
    Deleted {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The deletion.
        change: Change,
    },
    /// An object the key's object owns changed or went away.
    OwnedChanged {
        /// The owner's request key.
        key: KeyRef<'a>,
        /// Where the owned object's change was seen.
        origin: Origin,
        /// The group's primary subscription lists the owners itself
        /// (`GroupSpec::lists_owners_of`): an owner served here is queued only if the queue
        /// knows its object. One it does not know yet comes with the owners' own list, or the
        /// list beside its stream, with its body and, that list waiting for the children's, its
        /// children complete; queued from here it would be delivered without either, and its
        /// replica read both. (Known to exist nowhere, it has nothing to reconcile.) An owner a
        /// handover holds is remembered as before, to go first once it is served.
        owners_listed: bool,
    },
    /// An object the key's object names at a field path (`crate::references`) was created,
    /// changed or deleted.
    NamedChanged {
        /// The naming object's request key.
        key: KeyRef<'a>,
        /// Where the named object's change was seen.
        origin: Origin,
    },
    /// A replica asked for a reconcile of the key (`Dispatcher.Trigger`): taken only for a key
    /// served here whose object the queue knows exists, so a trigger adds no key and never
    /// hurries a deletion's retry.
    Triggered {
        /// The key.
        key: KeyRef<'a>,
    },
    /// A list run beside the watch's stream shows the object, for keys newly served here. The
    /// stream is the authority on every key it has shown (the list may be older), so this
    /// fills only a key the queue knows no version of.
    Listed {
        /// The object's request key.
        key: KeyRef<'a>,
        /// The object as the group keeps it.
        object: Observed,
        /// The watch's list epoch.
        epoch: u32,
    },
    /// A list run beside the watch's stream shows an owned object, on the terms of
    /// [`GroupEvent::Listed`]: only for an owner key the queue does not hold.
    ListedOwned {
        /// The owner's request key.
        key: KeyRef<'a>,
    },
}

impl<'a> GroupEvent<'a> {
    /// The watch shows the object of `key` as `object`, from the list of `epoch` or its stream
    /// (`origin`): [`GroupEvent::ExistsElsewhere`] if the key is owned `elsewhere` (as
    /// `Slice::owned_elsewhere` says), else [`GroupEvent::Exists`].
    pub fn exists(
        key: KeyRef<'a>,
        object: Observed,
        (epoch, origin): (u32, Origin),
        elsewhere: bool,
    ) -> Self {
        if elsewhere {
            GroupEvent::ExistsElsewhere {
                key,
                object,
                epoch,
                origin,
            }
        } else {
            GroupEvent::Exists {
                key,
                object,
                epoch,
                origin,
            }
        }
    }
}
