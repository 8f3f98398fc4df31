//! A watch whose lists are whole (`--list-mode whole`): a LIST without pages after its first,
//! read an object at a time ([`super::list_reader`]), then a WATCH from the list's
//! resourceVersion.
//!
//! Why not pages: the API server serves a paged LIST from its watch cache by collecting, for
//! each page, every object from the page's start to the end of the resource and then cutting
//! the page from it, so listing N objects in pages of P costs it about N²/2P object visits
//! (41 % of its CPU in a cold start of 100k ConfigMaps, BENCHMARKS.md). A LIST without a limit
//! visits each object once, is encoded an item at a time (on by default from Kubernetes 1.33),
//! and is as consistent as a paged one: no resourceVersion is sent, so it is a consistent read.
//!
//! The list is asked for in two responses all the same ([`WholeList`]): a first page of
//! [`FIRST_PAGE`] objects, then, from where it ended, the rest without a limit. The first byte
//! of a LIST without a limit comes only once the API server has collected what it selects:
//! 0.7 to 1.0 s after the request for 30k ConfigMaps of 2 KiB on Kubernetes 1.37, its last byte
//! 0.1 s later, against 25 ms for the whole of a first page of 500 (`curl` of
//! `/api/v1/configmaps`, 2026-11-28). So the first objects are reconciled while the API server
//! collects the rest, which costs it one more walk of its cache than one response would,
//! whatever the number of objects.
//!
//! The events are kube-runtime's [`watcher::Event`]s with its errors, so the watch loop treats
//! both kinds of watch alike: `Init`, an `InitApply` per object as it arrives, `InitDone`, then
//! `Apply` and `Delete`; a 410 Gone (or a watch that cannot be resumed) lists again from the
//! start, any other error is retried from where it was, after the caller's backoff.

use std::{
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use futures::{AsyncBufReadExt, Stream, StreamExt, stream::BoxStream};
use kube::{
    ResourceExt,
    api::{Api, ListParams, TypeMeta, WatchEvent, WatchParams},
    runtime::watcher::{Error, Event, Result},
};
use tracing::{debug, info, warn};

use super::{
    list_reader::{Body, ListReader, unreadable},
    object::WatchedObject,
    protobuf,
    sharing::{ListSharing, relay_broke},
};

/// How long a watch request may run before the API server ends it (kube-runtime's default).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// A watch that has gone quiet this much longer than its timeout is taken for a dead connection.
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The objects a whole list's first response holds (see the module docs).
pub(super) const FIRST_PAGE: u32 = 500;

enum State {
    /// Nothing listed yet, or the last list or watch can no longer be resumed.
    Empty,
    /// Reading the objects of a list.
    Listing(Box<WholeList>),
    /// Listed (or watched) up to this resourceVersion; no watch open.
    Listed { resource_version: String },
    /// Watching from `resource_version` on.
    Watching {
        resource_version: String,
        events: BoxStream<'static, kube::Result<WatchEvent<WatchedObject>>>,
    },
}

/// What a whole-list watch reads.
struct Source {
    api: Api<WatchedObject>,
    list: ListParams,
    watch: WatchParams,
    sharing: Option<Arc<ListSharing>>,
    /// Whether to list and watch in protobuf (`super::protobuf`).
    protobuf: bool,
    /// The type of the objects, written first in each protobuf item's JSON.
    types: Arc<TypeMeta>,
    /// How far the stream has shown the API server's objects.
    position: Arc<Position>,
}

/// How far a watch's stream has shown the API server's objects: the greatest resourceVersion
/// of a list it has begun to show (known from its first object when the response has its
/// metadata first, as the API server writes a built-in type's list) or of an event or bookmark
/// it has shown. A list beside the stream that a peer shares is taken only if it is at least
/// as new ([`reaches`]): an older one could show an object whose deletion the stream had shown,
/// or an object as it was before a change the stream showed while its key was served
/// elsewhere. Resource versions of one resource are comparable integers (KEP-5504, stable
/// since Kubernetes 1.35): once one is not, no shared list is new enough; nor is one while
/// nothing has been shown, or while a list shows objects before its resourceVersion is known
/// (a custom resource's, its metadata last).
#[derive(Debug, Default)]
pub(super) struct Position {
    reached: AtomicU64,
    /// A list is showing objects whose resourceVersion is not known yet.
    blind: AtomicBool,
}

impl Position {
    /// The stream has shown what the API server had at `resource_version`.
    fn advance(&self, resource_version: &str) {
        let at = resource_version.parse::<u64>().unwrap_or(u64::MAX);
        self.reached.fetch_max(at, Ordering::Relaxed);
    }

    /// The stream shows an object of a list at `resource_version`, if known yet.
    fn listing(&self, resource_version: Option<&str>) {
        match resource_version {
            Some(rv) => self.advance(rv),
            None => self.blind.store(true, Ordering::Relaxed),
        }
    }

    /// The stream has shown the whole of a list at `resource_version`.
    fn listed(&self, resource_version: &str) {
        self.advance(resource_version);
        self.blind.store(false, Ordering::Relaxed);
    }

    /// How far the stream has got: 0 while it has shown nothing or shows a list whose
    /// resourceVersion it does not know yet, `u64::MAX` once a resourceVersion it showed was
    /// not a number.
    pub(super) fn get(&self) -> u64 {
        if self.blind.load(Ordering::Relaxed) {
            return 0;
        }
        self.reached.load(Ordering::Relaxed)
    }
}

/// Whether a list at `resource_version` shows everything a stream had shown when it was at
/// `position` ([`Position::get`]), so that a list beside that stream may be that one.
pub(super) fn reaches(resource_version: Option<&str>, position: u64) -> bool {
    position != 0
        && position != u64::MAX
        && resource_version
            .and_then(|rv| rv.parse::<u64>().ok())
            .is_some_and(|rv| rv >= position)
}

impl Source {
    /// A whole list of what the watch selects. It is shared only until the watch has shown an
    /// object: a list made for others may be a moment older than what the watch has shown
    /// since (a re-list after a 410 Gone, a list tried again after it failed part-way), and the
    /// objects the watch had shown that it lacks would be taken for deleted. Later lists are
    /// consistent reads of the API server, made alone.
    async fn start(&self) -> kube::Result<WholeList> {
        WholeList::start(
            &self.api,
            &self.list,
            self.sharing.clone(),
            0,
            (self.protobuf, &self.types),
        )
        .await
    }

    /// Watches from `resource_version` on, in protobuf or in JSON.
    async fn watch(
        &self,
        resource_version: &str,
    ) -> kube::Result<BoxStream<'static, kube::Result<WatchEvent<WatchedObject>>>> {
        if !self.protobuf {
            return Ok(self.api.watch(&self.watch, resource_version).await?.boxed());
        }
        let request = kube::core::Request::new(self.api.resource_url())
            .watch(&self.watch, resource_version)
            .map_err(kube::Error::BuildRequest)?;
        let client = self.api.clone().into_client();
        Ok(protobuf::watch(&client, request, self.types.clone())
            .await?
            .boxed())
    }
}

/// Watches the objects of `api` that the selectors of `list` match, listing them whole (see
/// the module docs), its first list shared with the peers that make the same through
/// `sharing`, if any ([`super::sharing`]; `Source::start` says why only the first). Like
/// kube-runtime's `watcher`, the stream never ends: after an error the next poll recovers, so
/// poll it with a backoff. With `protobuf`, it lists and watches in protobuf
/// ([`super::protobuf`]). Objects listed in protobuf are written with `types`, their type. It keeps
/// `position` up with what it has shown.
pub(super) fn watcher(
    api: Api<WatchedObject>,
    list: ListParams,
    sharing: Option<Arc<ListSharing>>,
    (protobuf, types): (bool, Arc<TypeMeta>),
    position: Arc<Position>,
) -> impl Stream<Item = Result<Event<WatchedObject>>> + Send + 'static {
    // Bookmarks are asked for by default: they move the resourceVersion a watch resumes from.
    let watch = WatchParams {
        label_selector: list.label_selector.clone(),
        field_selector: list.field_selector.clone(),
        ..WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS)
    };
    let source = Source {
        api,
        list,
        watch,
        sharing,
        protobuf,
        types,
        position,
    };
    futures::stream::unfold(
        (source, State::Empty),
        |(mut source, mut state)| async move {
            loop {
                let (event, next) = step(&mut source, state).await;
                state = next;
                if let Some(event) = event {
                    return Some((event, (source, state)));
                }
            }
        },
    )
}

/// One step: the event it yields, if any, and the state after it.
async fn step(source: &mut Source, state: State) -> (Option<Result<Event<WatchedObject>>>, State) {
    match state {
        State::Empty => match source.start().await {
            Ok(reader) => (Some(Ok(Event::Init)), State::Listing(Box::new(reader))),
            Err(e) => (Some(Err(Error::InitialListFailed(e))), State::Empty),
        },
        State::Listing(reader) => listing(source, reader).await,
        State::Listed { resource_version } => {
            match source.watch(&resource_version).await {
                Ok(events) => (
                    None,
                    State::Watching {
                        resource_version,
                        events,
                    },
                ),
                Err(e) => {
                    // A resourceVersion too old to watch from is answered with 410 Gone here.
                    let gone = matches!(&e, kube::Error::Api(s) if s.code == 410);
                    let next = if gone {
                        State::Empty
                    } else {
                        State::Listed { resource_version }
                    };
                    (Some(Err(Error::WatchStartFailed(e))), next)
                }
            }
        }
        State::Watching {
            resource_version,
            mut events,
        } => {
            let idle = Duration::from_secs(WATCH_TIMEOUT_SECONDS.into()) + IDLE_MARGIN;
            let event = match tokio::time::timeout(idle, events.next()).await {
                Ok(event) => event,
                Err(_) => {
                    debug!("watch quiet past its timeout: watching again");
                    None
                }
            };
            match event {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    seen(&source.position, object, events, Event::Apply)
                }
                Some(Ok(WatchEvent::Deleted(object))) => {
                    seen(&source.position, object, events, Event::Delete)
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    let resource_version = bookmark.metadata.resource_version;
                    source.position.advance(&resource_version);
                    (
                        None,
                        State::Watching {
                            resource_version,
                            events,
                        },
                    )
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    // 410 Gone: the resourceVersion has expired; only a new list recovers.
                    let next = if status.code == 410 {
                        State::Empty
                    } else {
                        State::Watching {
                            resource_version,
                            events,
                        }
                    };
                    (Some(Err(Error::WatchError(status.boxed()))), next)
                }
                Some(Err(e)) => (
                    Some(Err(Error::WatchFailed(e))),
                    State::Watching {
                        resource_version,
                        events,
                    },
                ),
                None => {
                    // Its timeout, or the API server closed it (a watcher too slow for its
                    // cache, a restart): resumed from where it was, without a list.
                    info!(%resource_version, "the API server ended the watch: watching again");
                    (None, State::Listed { resource_version })
                }
            }
        }
    }
}

/// The next step of a list being read: an object, or its end.
async fn listing(
    source: &mut Source,
    mut reader: Box<WholeList>,
) -> (Option<Result<Event<WatchedObject>>>, State) {
    match reader.next().await {
        Ok(Some(object)) => {
            // Shown: no later list is shared (`Source::start`).
            source.sharing = None;
            source.position.listing(reader.resource_version_so_far());
            (Some(Ok(Event::InitApply(object))), State::Listing(reader))
        }
        Ok(None) => match reader.resource_version().filter(|rv| !rv.is_empty()) {
            Some(rv) => {
                // Listed, even if empty: the stream shows objects next.
                source.sharing = None;
                source.position.listed(rv);
                let resource_version = rv.to_owned();
                (
                    Some(Ok(Event::InitDone)),
                    State::Listed { resource_version },
                )
            }
            None => (Some(Err(Error::NoResourceVersion)), State::Empty),
        },
        Err(e) => (Some(Err(Error::InitialListFailed(e))), State::Empty),
    }
}

/// An object the watch showed: the event, and the watch going on from its resourceVersion.
fn seen(
    position: &Position,
    object: WatchedObject,
    events: BoxStream<'static, kube::Result<WatchEvent<WatchedObject>>>,
    event: fn(WatchedObject) -> Event<WatchedObject>,
) -> (Option<Result<Event<WatchedObject>>>, State) {
    match object.resource_version().filter(|rv| !rv.is_empty()) {
        Some(resource_version) => {
            position.advance(&resource_version);
            (
                Some(Ok(event(object))),
                State::Watching {
                    resource_version,
                    events,
                },
            )
        }
        None => (Some(Err(Error::NoResourceVersion)), State::Empty),
    }
}

/// Whether `error` says a whole list failed part-way or ran out of time: its response was cut
/// short or unreadable, or the API server answered that the request timed out (504, or a
/// `Timeout` status). Errors before any response (the API server unreachable, say) are not,
/// nor is a shared list whose relay broke ([`relay_broke`]: the peer, not the API server,
/// failed).
pub(super) fn cut_short(error: &Error) -> bool {
    match error {
        Error::InitialListFailed(kube::Error::ReadEvents(e)) => !relay_broke(e) && !unreadable(e),
        Error::InitialListFailed(kube::Error::Api(status)) => {
            status.code == 504 || status.reason == "Timeout"
        }
        _ => false,
    }
}

/// How many times the rest of a list is asked for in all before the list starts over, and the
/// wait before asking again (doubling, at most [`REST_WAIT_CAP`]): a refusal of the rest (a
/// 429 from the API server's priority and fairness, a 503) asks again with the same token
/// rather than list the first page again at the watch's shorter retry.
const REST_ATTEMPTS: u32 = 5;
const REST_WAIT: Duration = Duration::from_millis(250);
const REST_WAIT_CAP: Duration = Duration::from_secs(2);

/// A list of every object `params` selects, in two responses (see the module docs): its
/// objects read one at a time as they arrive, through the client `api` was made with.
pub(super) struct WholeList {
    api: Api<WatchedObject>,
    sharing: Option<Arc<ListSharing>>,
    params: ListParams,
    protobuf: bool,
    /// The type of the objects, written first in each protobuf item's JSON.
    types: Arc<TypeMeta>,
    reader: Reader,
    /// The first response's resourceVersion, once it has been read: the list's.
    snapshot: Option<String>,
}

/// A list response's reader, for the encoding it came in.
enum Reader {
    Json(ListReader<Body>),
    Protobuf(protobuf::ListReader),
}

impl Reader {
    /// A reader of `body`, in the encoding its first byte shows: a list shared by a peer
    /// comes in whichever encoding the peer asked for (a peer of an older release asks for
    /// JSON whatever the request said). Items read in protobuf are written with `types` if
    /// given, when their JSON is written; JSON items stay as they came (written with their type,
    /// each would be copied as it is read, most of them to be dropped as placed elsewhere).
    async fn of(mut body: Body, types: Option<Arc<TypeMeta>>) -> io::Result<Self> {
        let first = body.fill_buf().await?.first().copied();
        Ok(if first == Some(protobuf::MAGIC[0]) {
            Self::Protobuf(protobuf::ListReader::new(body, types))
        } else {
            Self::Json(ListReader::new(body))
        })
    }

    async fn next(&mut self) -> io::Result<Option<WatchedObject>> {
        match self {
            Self::Json(r) => r.next().await,
            Self::Protobuf(r) => r.next().await,
        }
    }

    fn resource_version(&self) -> Option<&str> {
        match self {
            Self::Json(r) => r.resource_version(),
            Self::Protobuf(r) => r.resource_version(),
        }
    }

    fn continue_token(&self) -> Option<&str> {
        match self {
            Self::Json(r) => r.continue_token(),
            Self::Protobuf(r) => r.continue_token(),
        }
    }
}

impl WholeList {
    /// Starts the list: asks for its first page (whatever `params` says of a limit or where
    /// to continue), each response shared through `sharing` if any (a LIST under way there
    /// joined only if not known to be older than `min_resource_version`), in protobuf if
    /// `protobuf`; its protobuf items, of `types`, written with it.
    pub(super) async fn start(
        api: &Api<WatchedObject>,
        params: &ListParams,
        sharing: Option<Arc<ListSharing>>,
        min_resource_version: u64,
        (protobuf, types): (bool, &Arc<TypeMeta>),
    ) -> kube::Result<Self> {
        let params = ListParams {
            limit: None,
            continue_token: None,
            ..params.clone()
        };
        let first = ListParams {
            limit: Some(FIRST_PAGE),
            ..params.clone()
        };
        Ok(Self {
            reader: respond(
                api,
                sharing.as_deref(),
                &first,
                min_resource_version,
                (protobuf, types),
            )
            .await?,
            api: api.clone(),
            sharing,
            params,
            protobuf,
            types: types.clone(),
            snapshot: None,
        })
    }

    /// The next object, or `None` when the list has ended. An error is final: a
    /// response was cut short or unreadable, or the rest of the list was refused (a `continue`
    /// too old to serve is answered with 410 Gone; anything else after [`REST_ATTEMPTS`]).
    pub(super) async fn next(&mut self) -> kube::Result<Option<WatchedObject>> {
        loop {
            if let Some(object) = self.reader.next().await.map_err(kube::Error::ReadEvents)? {
                return Ok(Some(object));
            }
            if self.snapshot.is_none() {
                self.snapshot = self.reader.resource_version().map(str::to_owned);
            }
            // Whatever response ends with a `continue` is followed (an API server gives none
            // to a request without a limit, but a server in front of it might).
            let Some(token) = self.reader.continue_token() else {
                return Ok(None);
            };
            let rest = ListParams {
                continue_token: Some(token.to_owned()),
                ..self.params.clone()
            };
            debug!(first = FIRST_PAGE, "listing the rest in one response");
            let reading = (self.protobuf, &self.types);
            self.reader = Self::rest(&self.api, self.sharing.as_deref(), &rest, reading).await?;
        }
    }

    /// The response to `rest`, asked for again after a wait when refused; see
    /// [`REST_ATTEMPTS`].
    async fn rest(
        api: &Api<WatchedObject>,
        sharing: Option<&ListSharing>,
        rest: &ListParams,
        reading: (bool, &Arc<TypeMeta>),
    ) -> kube::Result<Reader> {
        let waits = ExponentialBuilder::default()
            .with_min_delay(REST_WAIT)
            .with_max_delay(REST_WAIT_CAP)
            .with_max_times(REST_ATTEMPTS as usize - 1);
        // The rest is of the first response's snapshot, whichever LIST it joins.
        (|| respond(api, sharing, rest, 0, reading))
            .retry(waits)
            .sleep(tokio::time::sleep)
            // An expired `continue` can only be listed again from the start.
            .when(|e| !matches!(e, kube::Error::Api(status) if status.code == 410))
            .notify(|e, wait| {
                warn!(error = %e, ?wait, "the rest of the list was refused; asking for it again");
            })
            .await
    }

    /// The list's resourceVersion as far as it has been read: its first response's, known
    /// once that response's metadata has been read (the API server writes it before the
    /// items, so by the first object).
    pub(super) fn resource_version_so_far(&self) -> Option<&str> {
        self.snapshot
            .as_deref()
            .or_else(|| self.reader.resource_version())
    }

    /// The list's resourceVersion, once [`Self::next`] has returned `None`: its first
    /// response's (the rest is of the same snapshot; were it newer, a watch from it would miss
    /// what changed in between of the first page's objects).
    pub(super) fn resource_version(&self) -> Option<&str> {
        self.snapshot.as_deref()
    }
}

/// The resourceVersion of the list response that begins with `start`, as far as `start` shows
/// it: read object by object until it is known, or `start` ends (a built-in type's list has
/// its metadata first, a custom resource's JSON list, its keys sorted, last).
pub(super) async fn resource_version_of(start: Bytes) -> Option<u64> {
    let mut reader = Reader::of(Box::pin(futures::io::Cursor::new(start)), None)
        .await
        .ok()?;
    // A response cut short where `start` ends is read as far as it goes.
    while reader.resource_version().is_none() && matches!(reader.next().await, Ok(Some(_))) {}
    reader.resource_version()?.parse().ok()
}

/// A list response to `params`, its objects to be read as they arrive: shared through
/// `sharing` if any, otherwise asked of the API server through `api`'s client; asked for in
/// protobuf if `protobuf`; its protobuf items, of `types`, written with it.
async fn respond(
    api: &Api<WatchedObject>,
    sharing: Option<&ListSharing>,
    params: &ListParams,
    min_resource_version: u64,
    (protobuf, types): (bool, &Arc<TypeMeta>),
) -> kube::Result<Reader> {
    let mut request = kube::core::Request::new(api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    if protobuf {
        let accept = http::HeaderValue::from_static(protobuf::ACCEPT_LIST);
        request.headers_mut().insert(http::header::ACCEPT, accept);
    }
    let body = match sharing {
        Some(sharing) => sharing.respond(request, min_resource_version).await?,
        None => protobuf::send(&api.clone().into_client(), request).await?,
    };
    Reader::of(body, Some(types.clone()))
        .await
        .map_err(kube::Error::ReadEvents)
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("refused", reason).with_code(code).boxed())
    }

    #[test]
    fn only_a_list_cut_short_or_timed_out_is_made_another_way() {
        let cut = || kube::Error::ReadEvents(std::io::Error::other("connection reset"));
        assert!(cut_short(&Error::InitialListFailed(cut())));
        assert!(cut_short(&Error::InitialListFailed(api(504, ""))));
        assert!(cut_short(&Error::InitialListFailed(api(500, "Timeout"))));
        // Refusals, and failures of the watch rather than of its list, are not.
        assert!(!cut_short(&Error::InitialListFailed(api(403, "Forbidden"))));
        assert!(!cut_short(&Error::InitialListFailed(api(
            500,
            "InternalError"
        ))));
        assert!(!cut_short(&Error::WatchFailed(cut())));
        // Nor is a response that reads as JSON but not as a list of objects.
        let unreadable = ListReader::new(futures::io::Cursor::new(br#"{"items":[1]}"#.to_vec()));
        let error = futures::executor::block_on(async {
            let mut reader = unreadable;
            reader.next().await.expect_err("not an object")
        });
        assert!(!cut_short(&Error::InitialListFailed(
            kube::Error::ReadEvents(error)
        )));
        assert!(!cut_short(&Error::NoResourceVersion));
    }

    #[test]
    fn a_stream_position_is_unknown_while_a_list_hides_its_resource_version() {
        let position = Position::default();
        assert!(!reaches(Some("5"), position.get()), "nothing shown yet");
        position.listing(Some("7"));
        assert_eq!(position.get(), 7);
        assert!(reaches(Some("7"), position.get()) && !reaches(Some("6"), position.get()));
        assert!(!reaches(None, position.get()) && !reaches(Some("x"), position.get()));
        // A list whose metadata comes last (a custom resource's): unknown until it ends.
        position.listing(None);
        assert_eq!(position.get(), 0);
        assert!(!reaches(Some("9"), position.get()));
        position.listed("9");
        assert_eq!(position.get(), 9);
        position.advance("8");
        assert_eq!(position.get(), 9, "it never goes back");
        position.advance("not-a-number");
        assert!(!reaches(Some("99"), position.get()), "no longer comparable");
    }
}
