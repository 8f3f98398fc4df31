//! A LIST made once and read by several: its readers, and the start of its response kept for
//! those who join late ([`super`] says when one may).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use futures::{AsyncBufRead, AsyncBufReadExt, StreamExt, stream::BoxStream};
use kube::Client;
use tokio::{
    sync::{OwnedSemaphorePermit, mpsc},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use super::{CHUNK_BYTES, MAX_READERS, Part, READER_ALLOWANCE, READER_PARTS, REPLAY_BYTES, REUSE};

/// A LIST shared while it is made: its readers, and the start of its response for those who
/// join late.
pub(super) struct Shared {
    state: Mutex<SharedState>,
}

struct SharedState {
    /// The parts sent so far, while they add up to at most [`REPLAY_BYTES`]; `None` once past
    /// (nobody joins any more).
    replay: Option<Vec<Bytes>>,
    replay_bytes: usize,
    /// Where the next parts go.
    readers: Vec<Reader>,
    /// The id of the next reader.
    next_reader: u64,
    /// When it ended whole (a LIST that ended otherwise is not kept: `replay` is `None`).
    ended: Option<Instant>,
    /// The LIST's resourceVersion, once read from the start of its response.
    resource_version: Option<u64>,
}

/// A reader of a LIST being made: where its parts go, and how long it has kept the LIST
/// waiting so far (its queue full).
#[derive(Clone)]
struct Reader {
    id: u64,
    parts: mpsc::Sender<Part>,
    waited: Duration,
}

/// What a reader of a shared LIST gets: the parts it missed, then the rest (none when it
/// joined a LIST that had ended whole).
pub(super) struct Joined {
    replay: Vec<Bytes>,
    rest: Option<mpsc::Receiver<Part>>,
}

impl Joined {
    pub(super) fn parts(self) -> BoxStream<'static, Part> {
        let replay = futures::stream::iter(self.replay.into_iter().map(Part::Data));
        match self.rest {
            Some(rest) => replay.chain(ReceiverStream::new(rest)).boxed(),
            None => replay.chain(futures::stream::iter([Part::End])).boxed(),
        }
    }
}

impl Shared {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(SharedState {
                replay: Some(Vec::new()),
                replay_bytes: 0,
                readers: Vec::new(),
                next_reader: 0,
                ended: None,
                resource_version: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn joinable(&self, now: Instant) -> bool {
        let state = self.state();
        state.replay.is_some() && state.ended.is_none_or(|at| now <= at + REUSE)
    }

    /// Whether it may be joined by a request for a list at least as new as
    /// `min_resource_version` (0: any): yes unless its resourceVersion is known and older.
    pub(super) fn reaches(&self, min_resource_version: u64) -> bool {
        self.state()
            .resource_version
            .is_none_or(|rv| rv >= min_resource_version)
    }

    /// How many parts of the response were kept so far (`usize::MAX` once past the replay:
    /// nothing is kept to read).
    fn parts_sent(&self) -> usize {
        self.state().replay.as_ref().map_or(usize::MAX, Vec::len)
    }

    /// Reads the LIST's resourceVersion from the start of its response kept for late readers,
    /// if not known yet.
    async fn learn_resource_version(&self) {
        let parts = {
            let state = self.state();
            let Some(replay) = state
                .replay
                .as_ref()
                .filter(|_| state.resource_version.is_none())
            else {
                return;
            };
            // Shared by reference: copied out of the lock.
            replay.clone()
        };
        let start = Bytes::from(parts.concat());
        if let Some(rv) = crate::watch::whole_list::resource_version_of(start).await {
            self.state().resource_version = Some(rv);
        }
    }

    pub(super) fn join(&self, now: Instant) -> Option<Joined> {
        let mut state = self.state();
        let replay = state.replay.clone()?;
        if let Some(at) = state.ended {
            return (now <= at + REUSE).then_some(Joined { replay, rest: None });
        }
        if state.readers.len() >= MAX_READERS {
            return None;
        }
        let (tx, rx) = mpsc::channel(READER_PARTS);
        let id = state.next_reader;
        state.next_reader += 1;
        state.readers.push(Reader {
            id,
            parts: tx,
            waited: Duration::ZERO,
        });
        Some(Joined {
            replay,
            rest: Some(rx),
        })
    }

    /// Records `data` as sent, and returns the readers to send it to.
    fn sent(&self, data: &Bytes) -> Vec<Reader> {
        let mut state = self.state();
        state.replay_bytes += data.len();
        let kept = state.replay_bytes <= REPLAY_BYTES;
        match &mut state.replay {
            Some(replay) if kept => replay.push(data.clone()),
            _ => state.replay = None,
        }
        state.readers.retain(|r| !r.parts.is_closed());
        state.readers.clone()
    }

    /// Records the LIST's end with `last`, and returns the readers to send it to. Only a
    /// whole response is kept to be joined: a refusal (a 429 of the API server's priority and
    /// fairness, a 503) or a failure is each reader's own, and the next asks again.
    fn end(&self, last: &Part) -> Vec<Reader> {
        let mut state = self.state();
        if !matches!(last, Part::End) {
            state.replay = None;
        }
        state.ended = Some(Instant::now());
        std::mem::take(&mut state.readers)
    }

    /// Whether nobody reads the LIST and nobody can join it any more.
    fn abandoned(&self) -> bool {
        let state = self.state();
        state.replay.is_none() && state.readers.is_empty()
    }

    fn leave_behind(&self, id: u64) {
        self.state().readers.retain(|r| r.id != id);
    }

    fn waited(&self, id: u64, took: Duration) {
        if let Some(reader) = self.state().readers.iter_mut().find(|r| r.id == id) {
            reader.waited += took;
        }
    }

    /// Sends `part` to each of `readers`: at once to those with room, then, all at the same
    /// time, to those whose queue is full, each for what is left of its
    /// [`READER_ALLOWANCE`]; a reader that uses it up is left behind (its list fails, and it
    /// lists alone), so no reader holds the others back more than that in all.
    async fn send(&self, readers: Vec<Reader>, part: Part) {
        let mut full = Vec::new();
        for reader in readers {
            match reader.parts.try_send(part.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => self.leave_behind(reader.id),
                Err(mpsc::error::TrySendError::Full(part)) => full.push((reader, part)),
            }
        }
        let waits = full.into_iter().map(|(reader, part)| async move {
            let started = Instant::now();
            let left = READER_ALLOWANCE.saturating_sub(reader.waited);
            let sent = tokio::time::timeout(left, reader.parts.send(part)).await;
            (reader.id, started.elapsed(), matches!(sent, Ok(Ok(()))))
        });
        for (id, took, sent) in futures::future::join_all(waits).await {
            if sent {
                self.waited(id, took);
            } else {
                warn!(allowance = ?READER_ALLOWANCE, "a reader of a shared list kept it waiting too long: leaving it behind (it lists alone)");
                self.leave_behind(id);
            }
        }
    }
}

/// The parts of a response read for its resourceVersion as they come (and then the whole of
/// it, if kept, once it has ended).
const LEARN_PARTS: usize = 4;

/// Makes the LIST `request` through `client` and hands its response to the readers of
/// `shared`, holding `_permit` until it ends.
pub(super) async fn make(
    client: Client,
    request: http::Request<Vec<u8>>,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
) {
    // The rest of a list is joined by its `continue`, which fixes its snapshot: its
    // resourceVersion is not asked about.
    let learns = !request
        .uri()
        .query()
        .unwrap_or_default()
        .contains("continue=");
    let body = match crate::watch::protobuf::send(&client, request).await {
        Ok(body) => body,
        Err(kube::Error::Api(status)) => {
            return finish(&shared, Part::Refused(Arc::new(*status))).await;
        }
        Err(e) => return finish(&shared, Part::Failed(e.to_string().into())).await,
    };
    let mut body = std::pin::pin!(body);
    let mut gathered = Vec::with_capacity(CHUNK_BYTES);
    loop {
        // Bytes read before the response ended or broke off go out first.
        let (data, then) = gather(body.as_mut(), &mut gathered).await;
        if !data.is_empty() {
            let readers = shared.sent(&data);
            // Read from its first parts (a built-in type's list has its metadata first), else
            // from the whole response once it has ended, if it was kept.
            if learns && shared.parts_sent() <= LEARN_PARTS {
                shared.learn_resource_version().await;
            }

            if readers.is_empty() && shared.abandoned() {
                debug!("nobody reads a shared list any more: stopping it");
                return;
            }
            shared.send(readers, Part::Data(data)).await;
        }
        match then {
            Then::More => {}
            Then::End => break,
            Then::Broke(e) => return finish(&shared, Part::Broke(e.to_string().into())).await,
        }
    }
    if learns {
        shared.learn_resource_version().await;
    }
    finish(&shared, Part::End).await;
}

/// What follows the bytes [`gather`] read.
#[derive(Debug)]
pub(super) enum Then {
    /// More of the response, not read yet.
    More,
    /// Its end.
    End,
    /// The response broke off.
    Broke(std::io::Error),
}

/// How long the bytes of a part wait for more before they go out.
const GATHER_FOR: Duration = Duration::from_millis(2);

/// Reads the next part of a response, up to [`CHUNK_BYTES`]: what comes within [`GATHER_FOR`]
/// of its first bytes, gathered in `data` (emptied first) and copied out at its size. The API
/// server writes a list about an object at a time, and each part is a message to every reader:
/// forwarded as read, a cold start's list of 10 000 ConfigMaps of 2 KiB went to each reader in
/// about 9 800 writes, each a system call here and a wake-up there (2 226 gathered;
/// bench/HISTORY.md, 2026-12-04 07:10).
pub(super) async fn gather<B: AsyncBufRead>(
    mut body: std::pin::Pin<&mut B>,
    data: &mut Vec<u8>,
) -> (Bytes, Then) {
    data.clear();
    let mut until = None;
    loop {
        let read = match until {
            None => Some(body.fill_buf().await),
            Some(until) => tokio::time::timeout_at(until, body.fill_buf()).await.ok(),
        };
        until.get_or_insert_with(|| Instant::now() + GATHER_FOR);
        let then = match read {
            None => Then::More,
            Some(Ok([])) => Then::End,
            Some(Ok(buf)) => {
                let taken = buf.len().min(CHUNK_BYTES - data.len());
                data.extend_from_slice(&buf[..taken]);
                body.as_mut().consume(taken);
                if data.len() < CHUNK_BYTES {
                    continue;
                }
                Then::More
            }
            Some(Err(e)) => Then::Broke(e),
        };
        return (Bytes::copy_from_slice(data), then);
    }
}

/// Ends `shared` with `last`, and sends it to its readers.
async fn finish(shared: &Shared, last: Part) {
    let readers = shared.end(&last);
    shared.send(readers, last).await;
}
