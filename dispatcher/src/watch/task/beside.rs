//! The lists beside the stream: when the keys served here grow (a handover completes, a group
//! joins the watch), a list run beside the stream shows the objects of the new keys, unless the
//! groups kept up with them already; its pages, and its wait for the children's list.

use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{CHILDREN_WAIT, HELD_LIST_AFTER, Pass, Step, WatchTask, now};
use crate::config::ListMode;
use crate::watch::{
    fan_out::describe,
    object::WatchedObject,
    side_list::{Beside, Reach, SideList},
};

impl WatchTask {
    /// The slice changed: a new pass if the namespaces owned here changed, a list beside the
    /// stream if the keys served here may have grown.
    pub(super) fn slice_changed(&mut self) -> Step {
        let slice = self.slice.borrow_and_update().clone();
        let fed = std::mem::replace(&mut self.fed, slice.clone());
        if !slice.holds_keys() {
            self.index_held_at = None;
        }
        if slice.shard_selector() != self.fan_out.shard() {
            // Watched anew: the children of the namespaces now owned here come with its list.
            self.children.began_listing(now());
            self.children.own_list_running(true);
            self.fan_out.slice_changed(&slice);
            self.counts.reshards.fetch_add(1, Ordering::Relaxed);
            info!(resource = %describe(&self.key), "the namespaces owned here changed: watching them anew");
            return Step::Reshard;
        }
        if !slice.may_serve_more_than(&fed) {
            self.fan_out.slice_changed(&slice);
            if slice.may_hold_more_than(&fed) && self.index_held_at.is_none() {
                // The groups index the keys the handover holds from a list, so that a re-list
                // after a gap of the stream shows which of them were deleted; unless the
                // handover completes first.
                self.index_held_at = Some(Instant::now() + HELD_LIST_AFTER);
            }
            return Step::Nothing;
        }
        if self
            .listed_under
            .is_some_and(|listed| slice.kept_since(listed))
        {
            // Warmed up (or fenced) since the list began: its objects, and every change
            // since, of each key served now went to the groups and the index of children.
            self.fan_out.slice_changed(&slice);
            self.counts
                .side_lists_spared
                .fetch_add(1, Ordering::Relaxed);
            info!(resource = %describe(&self.key), "no list beside the watch: the groups kept up with every key now served here while this dispatcher handed nothing out");
            return Step::Nothing;
        }
        // Children of owners now served here are shown by the list beside the stream: until it
        // ends they may be missing, which readers on the new slice are told from now on.
        self.children.began_listing(now());
        self.children.list_beside_for_more_owners();
        self.fan_out.slice_changed(&slice);
        let handover = slice.settled.as_ref().map(|r| r.members())
            != fed.settled.as_ref().map(|r| r.members());
        let why = if handover {
            "a handover completed"
        } else {
            "keys came back to this dispatcher without a handover (a member left the ring before its handover completed)"
        };
        Step::ListBeside {
            why,
            joined: false,
            held: false,
        }
    }

    /// If the time to index the keys a handover holds has come, a list beside the stream (the
    /// handover still holds keys: a slice that holds none cancels the time).
    pub(super) fn held_list_due(&mut self) -> Step {
        if self.index_held_at.is_none_or(|at| at > Instant::now()) {
            return Step::Nothing;
        }
        self.index_held_at = None;
        Step::ListBeside {
            why: "a handover has held keys the ring gave this dispatcher for a while: listing them to index them",
            joined: false,
            held: true,
        }
    }

    /// Starts a list beside the stream, unless the watch's own list will show what it would.
    /// `held`: only for the keys a handover holds, to index them, so it does not wait for
    /// the children's list (nothing it shows is handed out).
    pub(super) fn list_beside(
        &mut self,
        pass: &mut Pass,
        (why, joined, held): (&'static str, bool, bool),
    ) {
        if !pass.started {
            debug!(resource = %describe(&self.key), why, "no list beside the watch: its own list has not been asked for yet");
            return;
        }
        // As for a group that joined, the keys a handover holds are shown by the watch's own
        // list from where it has got: keys it showed before the ring gave them were not held.
        let listed = pass.listed.as_ref().map(Option::as_deref);
        let running = pass.side.as_ref().map(SideList::reach);
        let Some(reach) = Reach::of(listed, joined || held, running) else {
            debug!(resource = %describe(&self.key), why, "no list beside the watch: its own list has shown nothing yet");
            return;
        };
        self.counts.side_lists.fetch_add(1, Ordering::Relaxed);
        if joined {
            // It shows the group that joined only the keys served here.
            self.listed_under = None;
        }
        if held {
            info!(resource = %describe(&self.key), why, ?reach, "listing beside the watch for the keys a handover holds");
        } else {
            info!(resource = %describe(&self.key), why, ?reach, "listing beside the watch for the keys now served here");
        }
        // A list only to index held keys hands nothing out: it waits for no children, and
        // readers of the children are not told it runs, unless it replaces one that did.
        pass.indexes_only = held && (pass.side.is_none() || pass.indexes_only);
        if pass.indexes_only {
            pass.waits_until = None;
        } else if !held {
            pass.waits_until = Some(Instant::now() + CHILDREN_WAIT);
        }
        // A whole list may be one a peer makes at the same time, if new enough (`Beside`):
        // not while the stream's position is unknown (nothing shown, a list whose
        // resourceVersion is not read yet) or not a number, when no shared list could be.
        let whole = self.list_mode == ListMode::Whole;
        let since = self.position.get();
        let beside = self
            .side_sharing
            .clone()
            .filter(|_| whole && since != 0 && since != u64::MAX)
            .map(|sharing| Beside { sharing, since });
        pass.side = Some(SideList::start(
            self.api.clone(),
            self.list_params.clone(),
            reach,
            whole,
            (self.protobuf, self.fan_out.types().clone()),
            beside,
        ));
    }

    /// Whether the list beside the stream, or the pass's own list before the stream is first
    /// asked, must wait before it is read: the owners it would show lack children the list of
    /// another watch, begun by the same change, has not shown yet
    /// ([`FanOut::owners_lack_children`]), and it has waited less than [`CHILDREN_WAIT`]. A
    /// list is asked for only once read, so it shows the owners as they are then.
    pub(super) fn waits_for_children(&self, pass: &mut Pass) -> bool {
        let Some(until) = pass.waits_until else {
            return false;
        };
        let waits = (pass.side.is_some() || !pass.started) && self.fan_out.owners_lack_children();
        if waits && Instant::now() < until {
            if !self.children.is_waiting() {
                debug!(resource = %describe(&self.key), "the owners' list waits for their children's");
            }
            self.children.waits_for_others(true);
            return true;
        }
        if waits {
            warn!(resource = %describe(&self.key), waited = ?CHILDREN_WAIT, "the owners' children are still being listed: listing the owners now, their replicas read the children they are not sent");
        }
        pass.waits_until = None;
        self.children.waits_for_others(false);
        false
    }

    /// A page of the list beside the stream: its objects filled in, and the list stopped once
    /// past where it must reach.
    pub(super) fn side_page(&mut self, pass: &mut Pass, objects: &[WatchedObject]) {
        let Some(list) = &pass.side else {
            return;
        };
        let mut past = false;
        for obj in objects {
            let key = self.fan_out.fill(obj, self.epoch, list);
            past |= list.reach().passed(&key);
        }
        if past {
            debug!(resource = %describe(&self.key), "list beside the watch done: it reached where the watch's own list was");
            pass.side = None;
        }
    }
}
