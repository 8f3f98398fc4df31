//! The task of one watch: its stream of events from the API server, the lists run beside it,
//! and what it does when it breaks.
//!
//! One pass ([`WatchTask::pass`]) starts the stream (kube-runtime's `watcher`, or
//! [`super::whole_list`]) and reads it until it must start again: a 410 Gone or an API-server
//! restart makes the stream list again by itself, while a change of the namespaces owned here
//! (ring keyed by namespace), a refused way of listing, or too many deletions during a list
//! beside the stream start a new pass. What a broken watch does is decided by
//! [`WatchRetry::recover`] in `core/`, from the error as [`WatchFailure`] describes it; the
//! events go to the subscribers through [`FanOut`].
//!
//! Re-lists of the watch itself (the first list, a 410 Gone, an API-server restart) are
//! numbered: every object of a re-list is recorded with the list's epoch, and when it ends each
//! group queues as deleted the keys of that subscription the list did not show.
//!
//! When the keys served here grow (a handover completes, a group joins the watch), the objects
//! of the new keys are found by a list run *beside* the stream, which keeps running: every
//! event, deletions above all, is still seen as it happens. The stream stays the authority: an
//! object of the side list is taken only for a key the group does not know yet and that no
//! deletion seen since the list began names (see `SideList`). A group that joins while the
//! watch is still listing gets the rest of that list from the watch itself, so the list beside
//! it stops once past the greatest key the watch had shown (lists come in key order); none is
//! made if the watch had shown nothing yet, nor when the groups kept up with the new keys while
//! the dispatcher handed nothing out ([`Slice::kept_since`]). See `beside`.

use std::sync::{Arc, atomic::Ordering};

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Client,
    api::{Api, ApiResource, ListParams, TypeMeta},
    runtime::watcher::{self, Event},
};
use kube_dispatch_core::{
    backoff::WatchRetry, children::ChildIndex, handover::Slice, subscription::WatchKey,
    transit::Origin,
};
use kube_dispatch_proto::RingKey;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    fan_out::{FanOut, Seen, Subscribers, WatchCounts, describe},
    object::WatchedObject,
    routing::object_key,
    shard::sharded_client,
    sharing::ListSharing,
    side_list::{SideList, next_page},
    whole_list::{self, Position},
};
use crate::config::ListMode;

mod beside;
mod broken;
mod refusal;

/// Why a watch could not serve a subscription.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WatchError {
    /// The API server rejected the list or watch (bad selector, no permission, ...).
    #[error("the API server rejected the watch of {resource}: {message}")]
    Rejected {
        /// The HTTP status code of the rejection.
        code: u16,
        /// What it was watching.
        resource: String,
        /// The API server's message.
        message: String,
    },
    /// The dispatcher is shutting down.
    #[error("the dispatcher is shutting down")]
    ShuttingDown,
}

/// The state of a watch's first list.
#[derive(Clone, Debug)]
pub(super) enum Readiness {
    Starting,
    Ready,
    Failed(WatchError),
}

/// How a watch task is told things by the registry.
pub(super) struct Controls {
    /// Its counters.
    pub counts: Arc<WatchCounts>,
    /// The groups it feeds.
    pub subscribers: Subscribers,
    /// Notified when a group joins the running watch: it lists beside the stream for it.
    pub joined: Arc<tokio::sync::Notify>,
    /// Where it says how its first list went.
    pub readiness: watch::Sender<Readiness>,
    /// Its index of owned objects, which it keeps.
    pub children: Arc<ChildIndex>,
    /// How its whole lists are shared with the peers that make the same, if they are.
    pub sharing: Option<Arc<ListSharing>>,
    /// Whether its whole lists and watches may be read in protobuf (`--protobuf`).
    pub protobuf: bool,
}

/// The task of the watch of one [`WatchKey`].
pub(super) struct WatchTask {
    key: WatchKey,
    /// How the watch lists now: a whole list cut short makes it [`ListMode::Stream`], a
    /// refused stream [`ListMode::Paged`]; each pass's watcher follows it.
    list_mode: ListMode,
    /// Whether its whole lists and watches are read in protobuf: a built-in resource the
    /// dispatcher's table of types knows, until something it reads is not in the table
    /// (`super::protobuf`); then JSON from the next pass on.
    protobuf: bool,
    api: Api<WatchedObject>,
    /// The watcher's selectors; its initial list strategy comes from `list_mode`.
    config: watcher::Config,
    list_params: ListParams,
    slice: watch::Receiver<Arc<Slice>>,
    /// The slice the watch last fed: a list beside it is needed only when the served set may
    /// grow ([`Slice::may_serve_more_than`]).
    fed: Arc<Slice>,
    /// The number of the slice fed when the watch's current list began: if every group has
    /// kept up with the keys served since ([`Slice::kept_since`]), their growth needs no list.
    /// `None` before, and once a group that joined since was shown objects by a list beside.
    listed_under: Option<u64>,
    /// When to list beside the stream so that the groups index the keys a handover holds, if
    /// one holds keys they may not know ([`Slice::may_hold_more_than`]): [`HELD_LIST_AFTER`]
    /// after the ring gave them, unless the handover completes first.
    index_held_at: Option<Instant>,
    counts: Arc<WatchCounts>,
    joined: Arc<tokio::sync::Notify>,
    readiness: watch::Sender<Readiness>,
    retry: WatchRetry,
    /// The number of the watch's current (or last) own list.
    epoch: u32,
    fan_out: FanOut,
    /// Told when the watch's lists start and end, which say whether it knows every child.
    children: Arc<ChildIndex>,
    /// How its whole lists are shared ([`super::sharing`]); `None` on a ring keyed by
    /// namespace, where each dispatcher lists its own namespaces. Given to the first pass's
    /// own list only (`Self::events`).
    sharing: Option<Arc<ListSharing>>,
    /// The same, for its lists beside the stream, each checked against `position`.
    side_sharing: Option<Arc<ListSharing>>,
    /// How far its whole-list stream has shown the API server's objects.
    position: Arc<Position>,
}

/// What ends a pass of the watch.
enum End {
    /// The watch is cancelled, or failed for good (its readiness says why).
    Stop,
    /// Start the stream again (a new pass), at once.
    Restart,
}

/// One pass: a stream started, and what it has done so far.
struct Pass {
    events: BoxStream<'static, watcher::Result<Event<WatchedObject>>>,
    /// Until when the stream is not polled, after an error ([`WatchRetry`]).
    paused: Option<Instant>,
    /// The list beside the stream, if one runs.
    side: Option<SideList>,
    /// That list only indexes the keys a handover holds: nothing it shows is handed out.
    indexes_only: bool,
    /// How far the watch's own list has got: `None` while it is not listing, then the greatest
    /// key it has shown (request keys of one watch sort as the API server lists objects: by
    /// namespace and name, after a prefix they share). A pass lists first, so until its list
    /// begins it counts as listing and having shown nothing: a group that joins meanwhile is
    /// shown everything by that list, with no list beside it.
    listed: Option<Option<String>>,
    /// The stream broke and has not shown anything since.
    broken: bool,
    /// Until when the list beside the stream, or the pass's own list before it starts, is not
    /// read while the owners it would show lack children another watch is still listing
    /// ([`WatchTask::waits_for_children`]).
    waits_until: Option<Instant>,
    /// The stream has been asked for something: its own list has begun.
    started: bool,
}

impl Pass {
    /// A pass reading `events`; `first` for the watch's first, a cold start.
    fn new(events: BoxStream<'static, watcher::Result<Event<WatchedObject>>>, first: bool) -> Self {
        Pass {
            events,
            paused: None,
            side: None,
            indexes_only: false,
            listed: Some(None),
            broken: false,
            // The owners the watch's first list shows (a cold start) wait for the children
            // another watch is listing. A later pass (a re-list, new namespaces after a ring
            // change) does not hold the stream back: owners this dispatcher kept are changing.
            waits_until: first.then(|| Instant::now() + CHILDREN_WAIT),
            started: false,
        }
    }
}

/// The longest a list of owners waits for their children, which a list of another watch
/// begun by the same change (a ring change, or the watches' start) shows: owners listed before
/// their children are requested without them, and their replicas read each child from the API
/// server. For a list beside the stream, changes the stream shows meanwhile are delivered at
/// once; only the moved-in owners' first reconcile waits. A pass's own list (a cold start)
/// begins once the wait ends.
const CHILDREN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a handover that gave this dispatcher keys (a member left or died while it serves)
/// may hold them before the watch lists beside its stream so that its groups index them
/// (`dispatcher/HANDOVER.md`, "Deletions in a gap of the watch"). A member that drains hands
/// its keys over within a few Lease writes, and the gate's opening lists beside the stream
/// anyway: waiting spares that second list. After a death the wait lasts until the member's
/// sessions are reported ended or the bound passes, seconds at least, and a deletion of a held
/// key in a gap of the watch before this list is not found.
pub(super) const HELD_LIST_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a list beside the stream waiting for children checks on them.
const CHILDREN_CHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// What woke the watch loop.
#[expect(
    clippy::large_enum_variant,
    reason = "a value of the loop's stack, moved once; boxing would allocate per event"
)]
enum Step {
    /// List beside the stream, for this reason; `joined` when a group joined the watch,
    /// `held` when only to index the keys a handover holds.
    ListBeside {
        why: &'static str,
        joined: bool,
        held: bool,
    },
    /// A page of the list beside the stream, or its end.
    Page(Option<Vec<WatchedObject>>),
    /// An event of the stream, or its end.
    Event(Option<watcher::Result<Event<WatchedObject>>>),
    /// The namespaces owned here changed: watch them anew.
    Reshard,
    /// Nothing to do (a pause ended, a slice change that serves no more keys).
    Nothing,
}

impl WatchTask {
    /// The task of the watch of `key` through `client`, listing the `list_mode` way and
    /// feeding the keys of `slice`.
    pub(super) fn new(
        client: Client,
        key: WatchKey,
        list_mode: ListMode,
        slice: watch::Receiver<Arc<Slice>>,
        controls: Controls,
    ) -> Self {
        let r = &key.resource;
        let api_resource = ApiResource {
            group: r.group.clone(),
            version: r.version.clone(),
            api_version: if r.group.is_empty() {
                r.version.clone()
            } else {
                format!("{}/{}", r.group, r.version)
            },
            kind: r.kind.clone(),
            plural: r.plural.clone(),
        };
        // On a ring keyed by namespace, ask the API server for this dispatcher's namespaces only;
        // on a ring keyed by name, every dispatcher lists the same: one lists for all.
        let (client, sharing) = if slice.borrow().ring.key() == RingKey::Namespace {
            (sharded_client(client, slice.clone()), None)
        } else {
            (client, controls.sharing.clone())
        };
        let api: Api<WatchedObject> = if key.namespace.is_empty() || !r.namespaced {
            Api::all_with(client, &api_resource)
        } else {
            Api::namespaced_with(client, &key.namespace, &api_resource)
        };
        let mut config = watcher::Config::default();
        let mut list_params = ListParams::default();
        if !key.label_selector.is_empty() {
            config = config.labels(&key.label_selector);
            list_params = list_params.labels(&key.label_selector);
        }
        if !key.field_selector.is_empty() {
            config = config.fields(&key.field_selector);
            list_params = list_params.fields(&key.field_selector);
        }
        let types = TypeMeta {
            api_version: api_resource.api_version.clone(),
            kind: api_resource.kind.clone(),
        };
        let protobuf =
            controls.protobuf && super::protobuf::readable(&api_resource.api_version, &r.kind);
        let fed = slice.borrow().clone();
        let fan_out = FanOut::new(
            key.clone(),
            Arc::new(types),
            controls.counts.clone(),
            slice.clone(),
            controls.subscribers,
            controls.children.clone(),
        );
        Self {
            key,
            list_mode,
            protobuf,
            api,
            config,
            list_params,
            slice,
            fed,
            listed_under: None,
            index_held_at: None,
            counts: controls.counts,
            joined: controls.joined,
            readiness: controls.readiness,
            retry: WatchRetry::default(),
            epoch: 0,
            fan_out,
            children: controls.children,
            side_sharing: sharing.clone(),
            sharing,
            position: Arc::default(),
        }
    }

    /// Runs the watch until `cancel`, or until the API server refuses it before it started.
    pub(super) async fn run(mut self, cancel: CancellationToken) {
        self.fed = self.slice.borrow_and_update().clone();
        // The watch's own list (marked running) shows the children of the owners served now.
        self.fan_out.slice_changed(&self.fed);
        while let End::Restart = self.pass(&cancel).await {}
        // Stopped: the index no longer follows the API server.
        self.children.began_listing(now());
        self.children.own_list_running(true);
    }

    /// The stream of a new pass, listing first the way the watch lists now; only the first
    /// pass shares its list ([`super::sharing`]: a later pass's list must not be older than
    /// what the watch has shown).
    fn events(&mut self) -> BoxStream<'static, watcher::Result<Event<WatchedObject>>> {
        let (api, config) = (self.api.clone(), self.config.clone());
        let sharing = self.sharing.take();
        match self.list_mode {
            ListMode::Whole => {
                let position = self.position.clone();
                whole_list::watcher(
                    api,
                    self.list_params.clone(),
                    sharing,
                    (self.protobuf, self.fan_out.types().clone()),
                    position,
                )
                .boxed()
            }
            ListMode::Paged => watcher::watcher(api, config).boxed(),
            ListMode::Stream => watcher::watcher(api, config.streaming_lists()).boxed(),
        }
    }

    /// Starts the stream and reads it, with the lists beside it, until it must start again.
    async fn pass(&mut self, cancel: &CancellationToken) -> End {
        // The shard the watch asks for from here on; a ring change that changes it starts a
        // new pass (a re-list of the namespaces owned then).
        let shard = self.slice.borrow().shard_selector();
        if shard.is_some() {
            debug!(resource = %describe(&self.key), "watching the namespaces this dispatcher owns only (shardSelector)");
        }
        self.fan_out.restarted(shard);
        let mut pass = Pass::new(self.events(), self.epoch == 0);
        self.children.began_listing(now());
        self.children.own_list_running(true);
        self.children.side_list_running(false);
        self.children.waits_for_others(false);
        loop {
            let waiting = self.waits_for_children(&mut pass);
            // Before it first asks, the stream is held as the list beside it would be.
            let held = waiting && !pass.started;
            // When to look at the owners kept for keys on their way out, or to index held keys.
            let kept_until = self.fan_out.kept_until().map(Instant::from_std);
            let look_at = kept_until.into_iter().chain(self.index_held_at).min();
            let step = tokio::select! {
                () = cancel.cancelled() => return End::Stop,
                () = self.joined.notified() => Step::ListBeside { why: "a group joined the watch", joined: true, held: false },
                Ok(()) = self.slice.changed() => self.slice_changed(),
                page = next_page(&mut pass.side), if !waiting => Step::Page(page),
                () = tokio::time::sleep(CHILDREN_CHECK), if waiting => Step::Nothing,
                () = tokio::time::sleep_until(look_at.unwrap_or_else(Instant::now)),
                    if look_at.is_some() => self.held_list_due(),
                () = tokio::time::sleep_until(pass.paused.unwrap_or_else(Instant::now)),
                    if pass.paused.is_some() => {
                    pass.paused = None;
                    Step::Nothing
                }
                event = pass.events.next(), if pass.paused.is_none() && !held => {
                    pass.started = true;
                    Step::Event(event)
                }
            };
            match step {
                Step::Nothing => {}
                Step::Reshard => return End::Restart,
                Step::ListBeside { why, joined, held } => {
                    if joined {
                        self.children.joins_taken();
                    }
                    self.list_beside(&mut pass, (why, joined, held));
                }
                Step::Page(Some(objects)) => self.side_page(&mut pass, &objects),
                Step::Page(None) => {
                    debug!(resource = %describe(&self.key), "list beside the watch done");
                    pass.side = None;
                }
                Step::Event(None) => return End::Stop,
                Step::Event(Some(Ok(event))) => {
                    if matches!(event, Event::Init)
                        && !pass.broken
                        && matches!(pass.listed, Some(Some(_)))
                    {
                        // kube-runtime starts a list over by itself, without an error, when
                        // the request ends before the list does: a streaming list is a watch,
                        // which ends at its timeout (290 s).
                        warn!(resource = %describe(&self.key), "the list started over before it completed (a streaming list longer than the watch's 290 s timeout?)");
                    }
                    pass.broken = false;
                    if let Some(end) = self.event(&mut pass, event) {
                        return end;
                    }
                }
                Step::Event(Some(Err(e))) => {
                    pass.broken = true;
                    if let Some(end) = self.broken(&mut pass, &e) {
                        return end;
                    }
                }
            }
            // Whether the index has seen every child: the stream is up and no list of the
            // watch's own, nor beside it, is running (an owner's children read meanwhile say
            // they may be incomplete).
            self.children
                .own_list_running(pass.listed.is_some() || pass.paused.is_some() || pass.broken);
            self.children
                .side_list_running(pass.side.is_some() && !pass.indexes_only);
            self.children.step_done(now());
            // The owners that moved to a member that joined are all delivered or gone: their
            // children need not be kept any more.
            if self.fan_out.keeps_owners_no_longer_needed(now()) {
                self.fan_out.forget_kept();
            }
        }
    }

    /// An event of the stream; `Some` when it ends the pass.
    fn event(&mut self, pass: &mut Pass, event: Event<WatchedObject>) -> Option<End> {
        // kube-runtime announces a list before asking anything: only what the server showed
        // counts as a success.
        if !matches!(event, Event::Init) {
            self.retry.succeeded(matches!(event, Event::InitDone));
        }
        match event {
            Event::Init => {
                self.counts.relists.fetch_add(1, Ordering::Relaxed);
                self.epoch = self.epoch.wrapping_add(1);
                self.listed_under = Some(self.fed.number());
                self.children.own_list(true);
                // The watch re-lists everything itself: a list beside it adds nothing, nor
                // one to index the keys a handover holds.
                pass.side = None;
                self.index_held_at = None;
                pass.listed = Some(None);
                debug!(resource = %describe(&self.key), epoch = self.epoch, "list started");
            }
            Event::InitApply(obj) => {
                self.readiness.send_if_modified(mark_ready);
                let key = match self
                    .fan_out
                    .publish(&obj, self.epoch, Seen::Exists(Origin::List))
                {
                    Ok(key) => key,
                    Err(e) => return Some(self.unwritable(pass, e)),
                };
                if let Some(last) = &mut pass.listed
                    && last.as_ref().is_none_or(|last| key > *last)
                {
                    *last = Some(key);
                }
            }
            Event::InitDone => {
                self.readiness.send_if_modified(mark_ready);
                pass.listed = None;
                self.children.own_list(false);
                self.fan_out.sweep(self.epoch);
                debug!(resource = %describe(&self.key), epoch = self.epoch, "list done");
            }
            Event::Apply(obj) => {
                let published =
                    self.fan_out
                        .publish(&obj, self.epoch, Seen::Exists(Origin::Stream));
                if let Err(e) = published {
                    return Some(self.unwritable(pass, e));
                }
            }
            Event::Delete(obj) => {
                let remembered = pass
                    .side
                    .as_mut()
                    .is_none_or(|list| list.deleted(object_key(&self.key.resource, &obj).hash64()));
                if let Err(e) = self.fan_out.publish(&obj, self.epoch, Seen::Deleted) {
                    return Some(self.unwritable(pass, e));
                }
                if !remembered {
                    warn!(
                        resource = %describe(&self.key),
                        "too many deletions during the list beside the watch: re-listing instead"
                    );
                    return Some(End::Restart);
                }
            }
        }
        None
    }
}

/// The time the index's marks of lists are kept in: the runtime's clock, as the groups read it
/// (`Group::now`).
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

#[cfg(test)]
mod tests;

fn mark_ready(r: &mut Readiness) -> bool {
    if matches!(r, Readiness::Starting) {
        *r = Readiness::Ready;
        true
    } else {
        false
    }
}
