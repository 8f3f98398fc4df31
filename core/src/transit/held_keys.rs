//! The index of held keys ([`HeldKeys`]): which keys a handover holds exist, so that a re-list
//! after a gap of the watch shows which of them were deleted (`dispatcher/HANDOVER.md`,
//! "Deletions in a gap of the watch").

use std::collections::HashMap;

use crate::handover::Slice;

/// Keys this dispatcher owns on its ring whose objects the watch showed existing (its stream,
/// its own list, or the list beside it that a handover's start asks for) while the queue could
/// not take them (the handover held them), with the list epoch each was last seen in. A re-list
/// that does not show one of them (a watch that could not resume, 410 Gone) reveals its
/// deletion, which no list could show otherwise and which nobody else may know: its old owner
/// forgot it, or died. An entry goes once the queue knows the key (the key is served, or kept
/// while nothing may be handed out), its object is deleted, or the key moves away. At most one
/// per key this dispatcher owns: about 100 bytes each (the key and its epoch).
#[derive(Debug, Default)]
pub(super) struct HeldKeys(HashMap<String, u32, foldhash::fast::RandomState>);

impl HeldKeys {
    /// The object of `key` exists as of list epoch `epoch`: recorded if the index knows the
    /// key, or if `held` (a handover holds it); an entry left at an older epoch would be taken
    /// for a deletion by the next sweep.
    pub(super) fn seen(&mut self, key: &str, epoch: u32, held: bool) {
        match self.0.get_mut(key) {
            Some(seen) => *seen = epoch,
            None if held => {
                self.0.insert(key.to_owned(), epoch);
            }
            None => {}
        }
    }

    /// The queue knows `key` now, or its object was deleted: the index need not know it.
    pub(super) fn forget(&mut self, key: &str) {
        if !self.0.is_empty() {
            self.0.remove(key);
        }
    }

    /// Takes out the keys `belongs` accepts that the re-list of epoch `epoch` did not show:
    /// their objects were deleted while the watch was away.
    pub(super) fn swept(&mut self, epoch: u32, belongs: impl Fn(&str) -> bool) -> Vec<String> {
        self.0
            .extract_if(|key, seen| *seen != epoch && belongs(key))
            .map(|(key, _)| key)
            .collect()
    }

    /// Forgets the keys `slice` does not own: their new owner lists them. Call only with a
    /// slice on its own ring: off it, this dispatcher owns nothing and keeps what it knew.
    pub(super) fn retain_owned(&mut self, slice: &Slice) {
        self.0.retain(|key, _| slice.owns_str(key));
    }

    /// How many keys it knows.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}
