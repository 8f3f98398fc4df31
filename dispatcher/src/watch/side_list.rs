//! A list run beside a watch's stream, when the keys served here grow (a handover completes, a
//! group joins the watch), and the deletions the stream shows meanwhile.

use std::{
    collections::HashSet,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::{StreamExt, stream::BoxStream};
use kube::api::{Api, ListParams, TypeMeta};
use tracing::{info, warn};

use super::{
    object::WatchedObject,
    protobuf::{self, Untranscodable},
    sharing::ListSharing,
    whole_list::{WholeList, reaches},
};

/// Page size of a list beside the stream (the watcher's own lists use the same).
const SIDE_LIST_PAGE: u32 = 500;

/// Most deletions remembered during one list beside the stream; past it the watch re-lists
/// instead (and the window that list beside the stream closes is open again for that once).
/// 65 536 key hashes, about 1 MiB.
const MAX_SIDE_LIST_DELETIONS: usize = 1 << 16;

/// A list run beside the watch's stream, and the keys whose deletion the stream
/// showed since it began. The list may be older than events the stream has already shown: a
/// deletion among them would be undone by the list, so objects whose key is here are skipped
/// (the stream shows a re-creation after the deletion). A failed page starts the list again
/// after a backoff; the deletions are kept.
pub(super) struct SideList {
    pages: BoxStream<'static, Vec<WatchedObject>>,
    deleted: HashSet<u64>,
    /// How far it must reach (the watch stops it at the page past that).
    reach: Reach,
}

/// How far a list beside the watch must reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reach {
    /// Up to this request key: the watch's own list shows the group what comes after it.
    UpTo(String),
    /// Every object.
    All,
}

impl Reach {
    /// What a list beside the watch must cover when one is asked for, or `None` if none is
    /// needed. `listed` is how far the watch's own list has got: `None` when it is not listing,
    /// else the greatest request key it has shown, if any (lists come in key order). `joined`
    /// says a group joined the watch (else the keys served here grew by a handover), and
    /// `running` is the reach of the list beside the watch already running, if one is: the new
    /// list covers both.
    pub(super) fn of(
        listed: Option<Option<&str>>,
        joined: bool,
        running: Option<&Reach>,
    ) -> Option<Reach> {
        let needed = match (listed, joined) {
            // The group joined before the watch's list showed anything: it sees all of it.
            (Some(None), true) => return None,
            (Some(Some(last)), true) => Reach::UpTo(last.to_owned()),
            _ => Reach::All,
        };
        Some(match (running, needed) {
            (Some(Reach::All), _) | (_, Reach::All) => Reach::All,
            (Some(Reach::UpTo(a)), Reach::UpTo(b)) => Reach::UpTo(b.max(a.clone())),
            (None, needed) => needed,
        })
    }

    /// Whether a list with this reach is done once it has shown `key`.
    pub(super) fn passed(&self, key: &str) -> bool {
        matches!(self, Reach::UpTo(last) if key > last.as_str())
    }
}

/// A LIST a peer may share with a list beside the stream ([`super::sharing`]): taken only if
/// its resourceVersion is at least the stream's position when the keys served here grew
/// (`super::whole_list::Position`), so that it shows every change the stream showed of those keys
/// before they were served here, and no object the stream had shown deleted. Dispatchers that
/// gain keys together (the survivors of a member that drains, on a ring keyed by name) then
/// read one LIST; one that finds the shared list too old lists alone.
pub(super) struct Beside {
    /// The tier's sharing of lists.
    pub sharing: Arc<ListSharing>,
    /// The stream's position when the list was asked for ([`Position::get`]).
    pub since: u64,
}

impl SideList {
    /// Starts listing as far as `reach`: in pages, or if `whole` in one response read an object
    /// at a time (in protobuf if `protobuf`, each protobuf item written with `types`), as the watch's own
    /// lists are made, and then shared through `beside` if a peer's LIST is new enough.
    pub(super) fn start(
        api: Api<WatchedObject>,
        params: ListParams,
        reach: Reach,
        whole: bool,
        reading: (bool, Arc<TypeMeta>),
        beside: Option<Beside>,
    ) -> Self {
        let pages = if whole {
            listed_whole(api, params, reading, beside)
        } else {
            paged(api, params)
        };
        Self {
            pages,
            deleted: HashSet::new(),
            reach,
        }
    }

    /// How far this list must reach.
    pub(super) fn reach(&self) -> &Reach {
        &self.reach
    }

    /// Notes a deletion the stream showed; false when too many are noted already.
    pub(super) fn deleted(&mut self, hash: u64) -> bool {
        if self.deleted.len() >= MAX_SIDE_LIST_DELETIONS && !self.deleted.contains(&hash) {
            return false;
        }
        self.deleted.insert(hash);
        true
    }

    pub(super) fn was_deleted(&self, hash: u64) -> bool {
        self.deleted.contains(&hash)
    }
}

/// How long a failed list beside the stream waits before it starts again, for as long as it
/// fails (the watch's stream runs meanwhile): 500 ms doubling to 15 s, each with a random jitter
/// of up to as much again, so at most 30 s.
fn retry_delays() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(15))
        .without_max_times()
        .build()
}

/// A list in pages of [`SIDE_LIST_PAGE`]; a failed page starts it again after a backoff.
fn paged(api: Api<WatchedObject>, params: ListParams) -> BoxStream<'static, Vec<WatchedObject>> {
    futures::stream::unfold(
        (Some(String::new()), retry_delays()),
        move |(continue_token, mut delays)| {
            let (api, params) = (api.clone(), params.clone());
            async move {
                let mut token = continue_token?;
                loop {
                    let mut page_params = params.clone().limit(SIDE_LIST_PAGE);
                    if !token.is_empty() {
                        page_params = page_params.continue_token(&token);
                    }
                    match api.list(&page_params).await {
                        Ok(list) => {
                            let next = list.metadata.continue_.filter(|c| !c.is_empty());
                            return Some((list.items, (next, retry_delays())));
                        }
                        Err(e) => {
                            let delay = delays.next().unwrap_or(Duration::from_secs(15));
                            warn!(error = %e, ?delay, "list beside the watch failed; listing again");
                            tokio::time::sleep(delay).await;
                            // A continue token may have expired: start over (a newer snapshot).
                            token.clear();
                        }
                    }
                }
            }
        },
    )
    .boxed()
}

/// What a list in one response carries from one object to the next.
struct Whole {
    reader: Option<WholeList>,
    delays: ExponentialBackoff,
    /// Whether it still lists in protobuf: once it turns to JSON, it stays there.
    protobuf: bool,
    /// The type of the objects, written first in each protobuf item's JSON.
    types: Arc<TypeMeta>,
    /// A peer's list it may read, until one was too old or failed: then it lists alone.
    beside: Option<Beside>,
    /// The reader's list was found new enough, or is this dispatcher's own.
    checked: bool,
    /// Shared lists found too old so far: the lister, which knows their resourceVersion by
    /// then, makes another for the second try; past [`SHARED_TRIES`], it lists alone.
    too_old: u8,
    /// The objects of a shared list read before its resourceVersion was, and their bytes.
    held: Vec<WatchedObject>,
    held_bytes: usize,
    /// The list has ended (with the objects it held).
    ended: bool,
}

/// Most bytes of a shared list's objects held until its resourceVersion is read (the first
/// response of a custom resource's list, [`super::whole_list::FIRST_PAGE`] objects, ends with
/// it); past it the list is made alone.
const HELD_BYTES: usize = 8 << 20;

/// How many shared lists a list beside the stream tries before it lists alone.
const SHARED_TRIES: u8 = 2;

impl Whole {
    /// Starts its list: a peer's through `beside` while it may take one, else its own.
    async fn start(&mut self, api: &Api<WatchedObject>, params: &ListParams) {
        let sharing = self.beside.as_ref().map(|b| b.sharing.clone());
        let since = self.beside.as_ref().map_or(0, |b| b.since);
        self.checked = sharing.is_none();
        let reading = (self.protobuf, &self.types);
        match WholeList::start(api, params, sharing, since, reading).await {
            Ok(started) => self.reader = Some(started),
            Err(e) => self.failed(e).await,
        }
    }

    /// Holds `object` of a shared list until the list's resourceVersion is read; false past
    /// [`HELD_BYTES`].
    fn hold(&mut self, object: WatchedObject) -> bool {
        self.held_bytes += object.held_bytes();
        if self.held_bytes > HELD_BYTES {
            return false;
        }
        self.held.push(object);
        true
    }

    /// Lists alone from now on.
    fn alone(&mut self) {
        self.reader = None;
        self.beside = None;
        self.held = Vec::new();
        self.held_bytes = 0;
    }

    /// The list failed: it starts again after a backoff (at once in JSON when protobuf was
    /// the reason), alone.
    async fn failed(&mut self, error: kube::Error) {
        self.alone();
        if self.protobuf && super::protobuf::needs_json(&error) {
            warn!(error = %error, "the list beside the watch cannot be read in protobuf; listing in JSON");
            self.protobuf = false;
            return;
        }
        let delay = self.delays.next().unwrap_or(Duration::from_secs(15));
        warn!(error = %error, ?delay, "list beside the watch failed; listing again");
        tokio::time::sleep(delay).await;
    }
}

/// A list in one response, its objects handed on one at a time as they arrive; a failure
/// starts it again after a backoff. Dropping it ends the response. Through `beside`, the
/// response may be a peer's ([`Beside`]): its resourceVersion is checked before any of its
/// objects is taken (a custom resource's JSON list tells it at the end of its first response:
/// those objects are held until then, at most [`HELD_BYTES`]), and a list too old is dropped
/// for another ([`SHARED_TRIES`]), then for one made alone.
fn listed_whole(
    api: Api<WatchedObject>,
    params: ListParams,
    (protobuf, types): (bool, Arc<TypeMeta>),
    beside: Option<Beside>,
) -> BoxStream<'static, Vec<WatchedObject>> {
    let start = Whole {
        reader: None,
        delays: retry_delays(),
        protobuf,
        types,
        beside,
        checked: false,
        too_old: 0,
        held: Vec::new(),
        held_bytes: 0,
        ended: false,
    };
    futures::stream::unfold(start, move |mut whole| {
        let (api, params) = (api.clone(), params.clone());
        async move {
            if whole.ended {
                return None;
            }
            loop {
                let Some(reader) = whole.reader.as_mut() else {
                    whole.start(&api, &params).await;
                    continue;
                };
                // Written as JSON now if read in protobuf: what the table of types cannot
                // read is the list's error, and the list is made again in JSON; an object past
                // a bound goes on without its body, as from the stream (`FanOut::write_json`).
                let next = reader.next().await.and_then(|next| {
                    next.map(|object| match object.transcoded() {
                        Ok(()) | Err(Untranscodable::Bound(_)) => Ok(object),
                        Err(e) => Err(protobuf::read_error(e)),
                    })
                    .transpose()
                });
                let next = match next {
                    Ok(next) => next,
                    Err(e) => {
                        whole.failed(e).await;
                        continue;
                    }
                };
                if whole.checked {
                    whole.delays = retry_delays();
                    return next.map(|object| (vec![object], whole));
                }
                let at = reader.resource_version_so_far();
                // A custom resource's JSON list tells its resourceVersion at the end of its
                // first response: its objects wait until then.
                if at.is_none()
                    && let Some(object) = next
                {
                    if whole.hold(object) {
                        continue;
                    }
                    warn!(most = HELD_BYTES, "the list the tier shared holds too much before its resourceVersion: listing beside the watch alone");
                    whole.alone();
                    continue;
                }
                if let Some(beside) = whole.beside.as_ref().filter(|b| !reaches(at, b.since)) {
                    beside.sharing.counts.too_old.fetch_add(1, Ordering::Relaxed);
                    whole.too_old += 1;
                    let alone = whole.too_old >= SHARED_TRIES;
                    info!(list = ?at, stream = beside.since, alone, "the list the tier shared is older than what this watch had shown: asking for another");
                    if alone {
                        whole.alone();
                    } else {
                        let beside = whole.beside.take();
                        whole.alone();
                        whole.beside = beside;
                    }
                    continue;
                }
                whole.checked = true;
                whole.delays = retry_delays();
                let mut page = std::mem::take(&mut whole.held);
                whole.held_bytes = 0;
                match next {
                    Some(object) => page.push(object),
                    // Ended: what it held is all of it.
                    None => whole.ended = true,
                }
                if page.is_empty() {
                    return None;
                }
                return Some((page, whole));
            }
        }
    })
    .boxed()
}

/// The next page of the list beside the stream, if one runs (else never).
pub(super) async fn next_page(side: &mut Option<SideList>) -> Option<Vec<WatchedObject>> {
    match side {
        Some(list) => list.pages.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::Reach::{self, All, UpTo};

    fn up_to(key: &str) -> Reach {
        UpTo(key.to_owned())
    }

    #[test]
    fn a_group_joining_the_watch_list_lists_beside_it_as_far_as_that_list_got() {
        // Joined before the watch's list showed anything: no list beside it.
        assert_eq!(Reach::of(Some(None), true, None), None);
        assert_eq!(Reach::of(Some(None), true, Some(&up_to("/a/b"))), None);
        // Joined during the list: up to the greatest key it had shown.
        assert_eq!(
            Reach::of(Some(Some("/a/m")), true, None),
            Some(up_to("/a/m"))
        );
        // Joined once the list is done, or a handover: everything.
        assert_eq!(Reach::of(None, true, None), Some(All));
        assert_eq!(Reach::of(Some(Some("/a/m")), false, None), Some(All));
        assert_eq!(Reach::of(Some(None), false, None), Some(All));
    }

    #[test]
    fn a_new_list_beside_the_watch_covers_the_one_it_replaces() {
        let joined_at =
            |last: &str, running: &Reach| Reach::of(Some(Some(last)), true, Some(running));
        assert_eq!(joined_at("/a/c", &up_to("/a/m")), Some(up_to("/a/m")));
        assert_eq!(joined_at("/a/x", &up_to("/a/m")), Some(up_to("/a/x")));
        assert_eq!(joined_at("/a/x", &All), Some(All));
        assert_eq!(Reach::of(None, true, Some(&up_to("/a/m"))), Some(All));
    }

    #[test]
    fn a_list_is_done_once_past_its_reach() {
        assert!(!up_to("/a/m").passed("/a/l"));
        assert!(!up_to("/a/m").passed("/a/m"));
        assert!(up_to("/a/m").passed("/a/n"));
        assert!(!All.passed("/z/z"));
    }
}
