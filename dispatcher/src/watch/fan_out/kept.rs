//! The slice the fan-out's index of children follows, and the one it keeps beside it while
//! owners that moved to a member that joined may still be delivered here.

use std::sync::Arc;

use kube_dispatch_core::{children::ChildIndex, handover::Slice, key::KeyRef};

use super::FanOut;

/// How long the index keeps the owners of the slice before at least, and then between two
/// looks at whether a key is still on its way out: the groups mark the keys that move away
/// once the membership loop has published the slice, a moment after the watch may see it.
const KEPT_LOOKED_AT: std::time::Duration = std::time::Duration::from_millis(500);

impl FanOut {
    /// Whether the index holds the children of `owner`: the slice it follows lets it, or the
    /// one it keeps beside it does ([`ChildIndex::holds_children_of`]).
    pub(super) fn indexes_children_of(&self, owner: KeyRef<'_>) -> bool {
        ChildIndex::holds_children_of(&self.followed, self.kept.as_ref(), owner)
    }

    /// The slice changed to `slice`: the children of owners it no longer lets this dispatcher
    /// serve are forgotten (a list beside the stream shows those of owners that come back),
    /// but for those of the slice before while no member left the ring ([`ChildIndex::follow`]).
    pub(in crate::watch) fn slice_changed(&mut self, slice: &Arc<Slice>) {
        let kept = self.children.follow(slice.clone());
        self.kept_until = match (&self.kept, &kept) {
            (_, None) => None,
            (None, Some(_)) => Some(tokio::time::Instant::now().into_std() + KEPT_LOOKED_AT),
            (Some(_), Some(_)) => self.kept_until,
        };
        self.kept = kept;
        self.followed = slice.clone();
        self.count_children();
    }

    /// Whether the index keeps the owners of the slice before the one it follows, and, looked
    /// at no sooner than [`KEPT_LOOKED_AT`] after it began to and after the last look, every
    /// group it feeds has released the keys that moved away (none is still queued or in flight
    /// here): it need not any more.
    pub(in crate::watch) fn keeps_owners_no_longer_needed(
        &mut self,
        now: std::time::Instant,
    ) -> bool {
        if self.kept_until.is_none_or(|until| now < until) {
            return false;
        }
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        let leaving = subscribers.iter().any(|s| s.group.has_leaving_keys());
        drop(subscribers);
        if leaving {
            self.kept_until = Some(now + KEPT_LOOKED_AT);
        }
        !leaving
    }

    /// When [`FanOut::keeps_owners_no_longer_needed`] is next worth asking, if the index keeps
    /// the owners of the slice before.
    pub(in crate::watch) fn kept_until(&self) -> Option<std::time::Instant> {
        self.kept_until
    }

    /// Stops keeping the owners of the slice before ([`ChildIndex::forget_kept`]).
    pub(in crate::watch) fn forget_kept(&mut self) {
        self.kept = None;
        self.kept_until = None;
        self.children.forget_kept();
        self.count_children();
    }
}
