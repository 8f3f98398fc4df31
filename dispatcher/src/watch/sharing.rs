//! One LIST of the API server for the tier: on a ring keyed by name every dispatcher watches
//! every object of its watches, and each would list them itself, so the API server would encode
//! each object once per dispatcher. Instead, each LIST a watch makes (`super::whole_list`) is
//! placed on the ring by its path and query, like a key: the dispatcher it falls on (its
//! *lister*) makes it, and streams the response to every dispatcher that asks for the same
//! path while it is young (`Peer.List`, `proto/kubedispatch/v1/peer.proto`). The tier's
//! dispatchers share one identity, so a response made for one is the one each would get.
//!
//! A request joins a LIST under way for the same path while at most the first
//! [`REPLAY_BYTES`] of its response have gone out (they are kept to be sent first), or within
//! [`REUSE`] of its end when the whole response was no larger. A watch reads the list as if the
//! API server sent it, then watches from its resourceVersion: a list a moment old only makes the
//! watch replay what changed since. When no lister can answer (it does not list the tier
//! capability `peer-lists`, it cannot be reached, it shares as many lists as it may), the
//! dispatcher lists alone, as before.
//!
//! Bounds: at most [`MAX_LISTS`] LISTs made at once by one dispatcher, each with at most
//! [`MAX_READERS`] readers, each reader with at most `READER_PARTS` parts of at most
//! [`CHUNK_BYTES`] waiting, plus the start kept for late readers (shared by reference) and the
//! part being gathered: 16 × (2 MiB + 8 × 4 × 64 KiB + 64 KiB) = 65 MiB; and at most 16 ended
//! responses of at most 2 MiB kept for [`REUSE`]: 97 MiB in all, besides what HTTP/2 buffers
//! per stream. A reader whose queue is full keeps the LIST waiting at most `READER_ALLOWANCE`
//! (10 s) in all; past it, it is left behind (its list fails, and it lists alone). A relayed
//! stream its peer stops reading once the LIST has ended holds its last parts until its
//! connection ends (`--max-connection-age`).
//!
//! A watch's own list is shared only while it is its first, until the watch has shown an object
//! (`whole_list`'s `Source`, and `WatchTask::events`, which gives sharing to the first pass
//! only): a later list (a re-list after a 410 Gone, one tried again after it failed part-way, a
//! new pass) must not be older than what the watch has shown, or the objects it lacks would be
//! taken for deleted; those are made alone. A list beside the stream (the keys served here grew:
//! the survivors of a member that drained gain its keys together) is shared when the LIST's
//! resourceVersion, read before its first object is taken, is at least the stream's position
//! when the list was asked for (`super::side_list::Beside`); an older one is dropped and the
//! list made alone (counted as `too_old`). A cold start, a restarted dispatcher and a group's first
//! session are first lists. A list whose relay breaks (the lister gone, this reader left
//! behind) fails as a broken relay ([`RelayBroke`]): the watch lists again alone. One the API
//! server cut short at the lister fails as it would have alone (`whole_list::cut_short`: the
//! watch lists by streaming from then on, as a million objects need on a small control plane):
//! no reader holds a list back more than its allowance, so the cut is the API server's.
//!
//! Not shared: lists on a ring keyed by namespace (each dispatcher asks for its own namespaces
//! already) and lists in pages or by streaming (`--list-mode`).

use std::{
    collections::HashMap,
    io,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt, stream::BoxStream};
use kube::{Client, core::Status};
use kube_dispatch_core::handover::Slice;
use kube_dispatch_proto::{
    RingKey,
    credentials::Credentials,
    v1::{ListChunk, ListRequest, list_chunk, peer_client::PeerClient},
};
use tokio::{
    sync::{Semaphore, watch},
    time::Instant,
};
use tonic::transport::Channel;
use tracing::{debug, info};

use self::shared::{Joined, Shared, make};
use super::{list_reader::Body, protobuf};

/// Most LISTs one dispatcher shares at once (made and being read); past it, lists are made
/// alone.
pub const MAX_LISTS: usize = 16;
/// Most readers of one shared LIST (this dispatcher's watch and its peers').
pub const MAX_READERS: usize = 8;
/// Parts a reader may have waiting.
const READER_PARTS: usize = 4;
/// Largest part of a response relayed: what the API server's response brings within 2 ms of a
/// part's first bytes (`shared::gather`), cut to it.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// How much of a response is kept for the readers who join after it began.
pub const REPLAY_BYTES: usize = 2 * 1024 * 1024;
/// How long after its end a response kept whole may still be joined.
pub const REUSE: Duration = Duration::from_secs(1);
/// How long in all a reader may keep a LIST waiting (its queue full) before it is left behind.
const READER_ALLOWANCE: Duration = Duration::from_secs(10);
/// How long a lister may take to send the first part of its answer: about the API server's
/// own request timeout, past which it would have cut the LIST.
const FIRST_PART: Duration = Duration::from_secs(60);
/// Longest path and query a peer may ask to list.
pub const MAX_PATH_BYTES: usize = 8 * 1024;
/// How long a lister that failed to answer is not asked.
const AVOID: Duration = Duration::from_secs(30);
/// Connection attempts to a lister give up after this long.
const CONNECT: Duration = Duration::from_secs(3);
/// HTTP/2 pings to a lister streaming a response: a lister that stops answering them for this
/// long is taken for gone.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// What this dispatcher's sharing has done, for metrics.
#[derive(Debug, Default)]
pub struct SharingCounts {
    /// LISTs sent to the API server to be shared.
    pub made: AtomicU64,
    /// Requests (this dispatcher's or a peer's) answered by a LIST already under way here.
    pub joined: AtomicU64,
    /// Peers' requests answered here.
    pub relayed: AtomicU64,
    /// This dispatcher's lists read from a peer.
    pub from_peers: AtomicU64,
    /// This dispatcher's lists made alone: no lister could share them.
    pub alone: AtomicU64,
    /// Shared lists that a list beside a watch's stream here found older than what the
    /// stream had shown, and left for another (`super::side_list::Beside`).
    pub too_old: AtomicU64,
}

/// One part of a response, as a shared LIST hands it to its readers.
#[derive(Clone, Debug)]
enum Part {
    /// The next bytes of the body.
    Data(Bytes),
    /// The body has ended.
    End,
    /// The API server refused the LIST.
    Refused(Arc<Status>),
    /// The LIST could not be made (the API server could not be reached).
    Failed(Arc<str>),
    /// The API server's response broke off.
    Broke(Arc<str>),
}

/// Marks the error of a list whose relay, not the API server's response, broke: a peer went
/// away or left this reader behind. It is not a list cut short (`whole_list::cut_short`): made
/// again alone, it would most likely succeed.
#[derive(Debug, thiserror::Error)]
#[error("the dispatcher sharing this list stopped relaying it: {0}")]
pub struct RelayBroke(String);

/// Whether `error`, met reading a list, is a [`RelayBroke`].
pub fn relay_broke(error: &io::Error) -> bool {
    error.get_ref().is_some_and(|e| e.is::<RelayBroke>())
}

/// The LISTs this dispatcher shares, and how it asks its peers for theirs.
pub struct ListSharing {
    client: Client,
    identity: String,
    credentials: Credentials,
    slice: watch::Receiver<Arc<Slice>>,
    /// The LISTs that may still be joined, by path and query and whether in protobuf.
    lists: Mutex<HashMap<(String, bool), Arc<Shared>>>,
    /// A permit per LIST being made.
    making: Arc<Semaphore>,
    /// Listers that failed to answer, until when they are not asked.
    avoided: Mutex<HashMap<String, Instant>>,
    /// A channel to each lister asked, by address: its lists share one HTTP/2 connection.
    channels: Mutex<HashMap<String, Channel>>,
    /// What it has done.
    pub counts: SharingCounts,
}

impl std::fmt::Debug for ListSharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListSharing")
            .field("identity", &self.identity)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

/// Who makes a LIST.
enum Lister {
    /// This dispatcher.
    Here,
    /// The peer of this name, at this address.
    Peer(String, String),
    /// Nobody shares it: this dispatcher lists alone.
    Nobody,
}

impl ListSharing {
    /// Sharing for the dispatcher `identity`, which lists through `client`, finds its peers in
    /// `slice`, and calls them with `credentials`.
    pub fn new(
        client: Client,
        identity: &str,
        credentials: Credentials,
        slice: watch::Receiver<Arc<Slice>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            identity: identity.to_owned(),
            credentials,
            slice,
            lists: Mutex::default(),
            making: Arc::new(Semaphore::new(MAX_LISTS)),
            avoided: Mutex::default(),
            channels: Mutex::default(),
            counts: SharingCounts::default(),
        })
    }

    /// The response to `request`, a LIST: shared with the peers that ask for the same one when
    /// a lister can share it, otherwise asked of the API server alone.
    /// A request that accepts protobuf first is shared only with requests that do too. With
    /// `min_resource_version` (not 0), a LIST under way whose resourceVersion is known to be
    /// older is not joined: the lister makes another.
    pub async fn respond(
        &self,
        request: http::Request<Vec<u8>>,
        min_resource_version: u64,
    ) -> kube::Result<Body> {
        let path = request
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        let protobuf = request
            .headers()
            .get(http::header::ACCEPT)
            .is_some_and(|accept| {
                accept
                    .as_bytes()
                    .starts_with(protobuf::MEDIA_TYPE.as_bytes())
            });
        match self.lister(&path) {
            Lister::Here => {
                if let Some(joined) = self.join(&path, protobuf, min_resource_version) {
                    return response(joined.parts()).await;
                }
            }
            Lister::Peer(peer, address) => match self
                .ask_peer(&address, &path, protobuf, min_resource_version)
                .await
            {
                Ok(answer) => {
                    self.counts.from_peers.fetch_add(1, Ordering::Relaxed);
                    return answer;
                }
                // A lister sharing as many lists as it may is asked again next time.
                Err(e) if e.code() == tonic::Code::ResourceExhausted => {
                    debug!(%peer, error = %e, "the peer that lists this for the tier is full: listing alone");
                }
                Err(e) => {
                    info!(%peer, %address, error = %e, "the peer that lists this for the tier cannot answer: listing alone, and not asking it for 30 s");
                    self.avoid(&peer);
                    self.forget_channel(&address);
                }
            },
            Lister::Nobody => {}
        }
        self.counts.alone.fetch_add(1, Ordering::Relaxed);
        protobuf::send(&self.client, request).await
    }

    /// What a peer asking for `path` is streamed: the parts of the LIST it joins, as
    /// `Peer.List` sends them.
    /// Asked for in protobuf if `protobuf` (a peer of an older release never asks), of a
    /// resourceVersion at least `min_resource_version` when known ([`Self::respond`]).
    pub fn serve(
        &self,
        peer: &str,
        path: &str,
        protobuf: bool,
        min_resource_version: u64,
    ) -> Result<impl Stream<Item = Result<ListChunk, tonic::Status>> + Send + 'static, tonic::Status>
    {
        list_path(path)?;
        let Some(joined) = self.join(path, protobuf, min_resource_version) else {
            return Err(tonic::Status::resource_exhausted(format!(
                "this dispatcher shares {MAX_LISTS} lists with {MAX_READERS} readers each already: list alone"
            )));
        };
        self.counts.relayed.fetch_add(1, Ordering::Relaxed);
        debug!(%peer, %path, "relaying a list to a peer");
        Ok(relayed(joined.parts()))
    }

    /// Who makes the LIST of `path`: the dispatcher the path falls on, on a ring keyed by name.
    fn lister(&self, path: &str) -> Lister {
        let slice = self.slice.borrow().clone();
        if slice.ring.key() != RingKey::Name {
            return Lister::Nobody;
        }
        let Some(owner) = slice.ring.owner_of_hash(RingKey::Name.place(path)) else {
            return Lister::Nobody;
        };
        if owner == self.identity {
            return Lister::Here;
        }
        let avoided = {
            let mut avoided = self.avoided.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            avoided.retain(|_, until| now < *until);
            avoided.contains_key(owner)
        };
        match slice.peers.get(owner) {
            Some(address) if slice.list_sharers.contains(owner) && !avoided => {
                Lister::Peer(owner.to_owned(), address.clone())
            }
            _ => Lister::Nobody,
        }
    }

    fn avoid(&self, peer: &str) {
        let mut avoided = self.avoided.lock().unwrap_or_else(|e| e.into_inner());
        if avoided.len() < MAX_LISTS * MAX_READERS {
            avoided.insert(peer.to_owned(), Instant::now() + AVOID);
        }
    }

    /// Joins the LIST of `path` under way here, in protobuf if `protobuf`, or starts it; `None`
    /// when this dispatcher shares as many as it may. A LIST under way whose resourceVersion is
    /// known to be older than `min_resource_version` is left to its readers, and another made.
    fn join(&self, path: &str, protobuf: bool, min_resource_version: u64) -> Option<Joined> {
        let key = (path.to_owned(), protobuf);
        let now = Instant::now();
        let mut lists = self.lists.lock().unwrap_or_else(|e| e.into_inner());
        lists.retain(|_, shared| shared.joinable(now));
        let under_way = lists
            .get(&key)
            .filter(|shared| shared.reaches(min_resource_version));
        if let Some(joined) = under_way.and_then(|shared| shared.join(now)) {
            self.counts.joined.fetch_add(1, Ordering::Relaxed);
            return Some(joined);
        }
        if !lists.contains_key(&key) && lists.len() >= MAX_LISTS {
            return None;
        }
        let permit = self.making.clone().try_acquire_owned().ok()?;
        let mut request = http::Request::get(path);
        if protobuf {
            request = request.header(http::header::ACCEPT, protobuf::ACCEPT_LIST);
        }
        let request = request.body(Vec::new()).ok()?;
        let shared = Arc::new(Shared::new());
        let joined = shared.join(now)?;
        lists.insert(key, shared.clone());
        self.counts.made.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(make(self.client.clone(), request, shared, permit));
        Some(joined)
    }

    /// The response to `path` from the lister at `address`; an error when it cannot answer
    /// (before its first part), for this dispatcher to list alone.
    async fn ask_peer(
        &self,
        address: &str,
        path: &str,
        protobuf: bool,
        min_resource_version: u64,
    ) -> Result<kube::Result<Body>, tonic::Status> {
        let mut client =
            PeerClient::with_interceptor(self.channel(address)?, self.credentials.bearer())
                .max_decoding_message_size(REPLAY_BYTES);
        let request = ListRequest {
            identity: self.identity.clone(),
            path: path.to_owned(),
            protobuf,
            min_resource_version,
        };
        let first = tokio::time::timeout(FIRST_PART, async {
            let mut chunks = client.list(request).await?.into_inner();
            let first = chunks.message().await?;
            Ok::<_, tonic::Status>((first, chunks))
        })
        .await;
        let (first, chunks) = match first {
            Ok(answer) => answer?,
            Err(_) => {
                return Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {FIRST_PART:?}"
                )));
            }
        };
        let Some(first) = first else {
            return Err(tonic::Status::unavailable("the peer sent nothing"));
        };
        let parts = futures::stream::once(async move { Ok(first) })
            .chain(chunks)
            .map(part_of)
            .chain(futures::stream::once(async { Part::End }))
            .scan(false, |ended, part| {
                // Past an error or the end, nothing more.
                let done = *ended;
                *ended |= !matches!(part, Part::Data(_));
                futures::future::ready((!done).then_some(part))
            });
        Ok(response(parts.boxed()).await)
    }

    /// The channel to the lister at `address`, connected when first used; one per peer.
    fn channel(&self, address: &str) -> Result<Channel, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(address) {
            return Ok(channel.clone());
        }
        // Only the peers of the current ring: the map holds no more channels than members.
        let peers = self.slice.borrow().peers.clone();
        channels.retain(|a, _| peers.values().any(|p| p == a));
        let channel = self
            .credentials
            .endpoint(address)
            .map_err(|e| tonic::Status::invalid_argument(format!("bad peer address: {e}")))?
            .connect_timeout(CONNECT)
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE)
            .keep_alive_while_idle(true)
            .connect_lazy();
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    fn forget_channel(&self, address: &str) {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(address);
    }
}

/// A chunk of `Peer.List`, or its error, as a part of the response.
fn part_of(chunk: Result<ListChunk, tonic::Status>) -> Part {
    match chunk {
        Ok(ListChunk {
            part: Some(list_chunk::Part::Data(data)),
        }) => Part::Data(data),
        Ok(ListChunk {
            part: Some(list_chunk::Part::Refused(json)),
        }) => match serde_json::from_slice::<Status>(&json) {
            Ok(status) => Part::Refused(Arc::new(status)),
            Err(e) => {
                Part::Failed(format!("the peer relayed a refusal that is not a Status: {e}").into())
            }
        },
        Ok(ListChunk { part: None }) => Part::Data(Bytes::new()),
        // The API server's response broke off at the lister, as it would have here.
        Err(status) if status.code() == tonic::Code::Aborted => {
            Part::Broke(status.message().into())
        }
        Err(status) => Part::Failed(format!("{}: {}", status.code(), status.message()).into()),
    }
}

/// A list response from its `parts`: an error if the first is one, otherwise its body.
async fn response(mut parts: BoxStream<'static, Part>) -> kube::Result<Body> {
    let first = match parts.next().await {
        Some(Part::Data(data)) => data,
        Some(Part::End) | None => Bytes::new(),
        Some(Part::Refused(status)) => {
            return Err(kube::Error::Api(Box::new(Status::clone(&status))));
        }
        Some(Part::Failed(message) | Part::Broke(message)) => {
            return Err(kube::Error::Service(message.to_string().into()));
        }
    };
    let rest = futures::stream::unfold(Some(parts), |parts| async move {
        let mut parts = parts?;
        match parts.next().await {
            Some(Part::Data(data)) => Some((Ok(data), Some(parts))),
            Some(Part::End) => None,
            // The API server cut the response short, as it would have cut this reader's own
            // (no reader holds a list back more than its allowance): listed another way.
            Some(Part::Broke(message)) => Some((Err(io::Error::other(message.to_string())), None)),
            Some(Part::Refused(_) | Part::Failed(_)) | None => Some((
                Err(io::Error::other(RelayBroke(
                    "the list ended before its end".into(),
                ))),
                None,
            )),
        }
    });
    let body = futures::stream::once(async move { Ok(first) })
        .chain(rest)
        .into_async_read();
    Ok(Box::pin(body))
}

/// The parts of a shared LIST as `Peer.List` streams them.
fn relayed(
    parts: BoxStream<'static, Part>,
) -> impl Stream<Item = Result<ListChunk, tonic::Status>> + Send + 'static {
    futures::stream::unfold(Some(parts), |parts| async move {
        let mut parts = parts?;
        let chunk = |part| ListChunk { part: Some(part) };
        match parts.next().await {
            Some(Part::Data(data)) => Some((Ok(chunk(list_chunk::Part::Data(data))), Some(parts))),
            Some(Part::End) => None,
            Some(Part::Refused(status)) => {
                let json = serde_json::to_vec(&*status).unwrap_or_default();
                Some((Ok(chunk(list_chunk::Part::Refused(json.into()))), None))
            }
            Some(Part::Failed(message)) => {
                Some((Err(tonic::Status::unavailable(message.to_string())), None))
            }
            Some(Part::Broke(message)) => {
                Some((Err(tonic::Status::aborted(message.to_string())), None))
            }
            None => Some((
                Err(tonic::Status::unavailable(
                    "left behind: the list was read too slowly",
                )),
                None,
            )),
        }
    })
}

/// Ok if `path` is the path and query of a LIST this dispatcher makes for a peer: of a
/// collection under `/api/` or `/apis/`, in a namespace or not, with no `watch` (which never
/// ends) and no other verb's subresource.
pub fn list_path(path: &str) -> Result<(), tonic::Status> {
    let invalid = |why: &str| {
        Err(tonic::Status::invalid_argument(format!(
            "path must be a LIST of /api/ or /apis/ of at most {MAX_PATH_BYTES} bytes: {why}"
        )))
    };
    if path.len() > MAX_PATH_BYTES {
        return invalid("too long");
    }
    let Ok(parsed) = path.parse::<http::uri::PathAndQuery>() else {
        return invalid("not a path and query");
    };
    if parsed.path().contains('%') {
        return invalid("an escaped character in the path");
    }
    let segments: Vec<&str> = parsed.path().split('/').skip(1).collect();
    if segments
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return invalid("an empty, . or .. segment");
    }
    // `/api/v1/<resource>` or `/apis/<group>/<version>/<resource>`, each with
    // `namespaces/<namespace>/` before the resource or not.
    let prefix = match segments.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return invalid("not under /api/ or /apis/"),
    };
    let collection = match segments.len().checked_sub(prefix) {
        Some(1) => true,
        Some(3) => segments[prefix] == "namespaces",
        _ => false,
    };
    if !collection {
        return invalid("not a collection");
    }
    let query = parsed.query().unwrap_or_default();
    if form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == "watch" || k == "follow") {
        return invalid("a watch");
    }
    Ok(())
}

mod shared;
#[cfg(test)]
mod tests;
