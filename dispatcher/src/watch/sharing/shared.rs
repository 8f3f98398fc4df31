//! A LIST made once and read by several: its readers, and the start of its response kept for
//! those who join late ([`super`] says when one may).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{AsyncBufRead, AsyncBufReadExt, StreamExt, stream::BoxStream};
use kube::Client;
use tokio::{
    sync::{OwnedSemaphorePermit, mpsc},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use super::{CHUNK_BYTES, MAX_READERS, Part, READER_PARTS, READER_WAIT, REPLAY_BYTES, REUSE};

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
    readers: Vec<mpsc::Sender<Part>>,
    /// When it ended, and its last part.
    ended: Option<(Instant, Part)>,
}

/// What a reader of a shared LIST gets: the parts it missed, then the rest.
pub(super) struct Joined {
    replay: Vec<Bytes>,
    rest: Option<mpsc::Receiver<Part>>,
    last: Option<Part>,
}

impl Joined {
    pub(super) fn parts(self) -> BoxStream<'static, Part> {
        let replay = futures::stream::iter(self.replay.into_iter().map(Part::Data));
        match (self.rest, self.last) {
            (Some(rest), _) => replay.chain(ReceiverStream::new(rest)).boxed(),
            (None, last) => replay.chain(futures::stream::iter(last)).boxed(),
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
                ended: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn joinable(&self, now: Instant) -> bool {
        let state = self.state();
        state.replay.is_some()
            && state
                .ended
                .as_ref()
                .is_none_or(|(at, _)| now <= *at + REUSE)
    }

    pub(super) fn join(&self, now: Instant) -> Option<Joined> {
        let mut state = self.state();
        let replay = state.replay.clone()?;
        if let Some((at, last)) = &state.ended {
            return (now <= *at + REUSE).then(|| Joined {
                replay,
                rest: None,
                last: Some(last.clone()),
            });
        }
        if state.readers.len() >= MAX_READERS {
            return None;
        }
        let (tx, rx) = mpsc::channel(READER_PARTS);
        state.readers.push(tx);
        Some(Joined {
            replay,
            rest: Some(rx),
            last: None,
        })
    }

    /// Records `data` as sent, and returns the readers to send it to.
    fn sent(&self, data: &Bytes) -> Vec<mpsc::Sender<Part>> {
        let mut state = self.state();
        state.replay_bytes += data.len();
        let kept = state.replay_bytes <= REPLAY_BYTES;
        match &mut state.replay {
            Some(replay) if kept => replay.push(data.clone()),
            _ => state.replay = None,
        }
        state.readers.retain(|r| !r.is_closed());
        state.readers.clone()
    }

    /// Records the LIST's end with `last`, and returns the readers to send it to. Only a
    /// whole response or a refusal is kept to be joined.
    fn end(&self, last: Part) -> Vec<mpsc::Sender<Part>> {
        let mut state = self.state();
        if !matches!(last, Part::End | Part::Refused(_)) {
            state.replay = None;
        }
        state.ended = Some((Instant::now(), last));
        std::mem::take(&mut state.readers)
    }

    /// Whether nobody reads the LIST and nobody can join it any more.
    fn abandoned(&self) -> bool {
        let state = self.state();
        state.replay.is_none() && state.readers.is_empty()
    }

    fn leave_behind(&self, reader: &mpsc::Sender<Part>) {
        self.state().readers.retain(|r| !r.same_channel(reader));
    }

    /// Sends `part` to each of `readers`, leaving behind those that take nothing for
    /// [`READER_WAIT`].
    async fn send(&self, readers: Vec<mpsc::Sender<Part>>, part: Part) {
        for reader in readers {
            match tokio::time::timeout(READER_WAIT, reader.send(part.clone())).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => self.leave_behind(&reader),
                Err(_) => {
                    warn!(waited = ?READER_WAIT, "a reader of a shared list took nothing: leaving it behind (it lists again alone)");
                    self.leave_behind(&reader);
                }
            }
        }
    }
}

/// Makes the LIST `request` through `client` and hands its response to the readers of
/// `shared`, holding `_permit` until it ends.
pub(super) async fn make(
    client: Client,
    request: http::Request<Vec<u8>>,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
) {
    let body = match client.request_stream(request).await {
        Ok(body) => body,
        Err(kube::Error::Api(status)) => {
            return finish(&shared, Part::Refused(Arc::new(*status))).await;
        }
        Err(e) => return finish(&shared, Part::Failed(e.to_string().into())).await,
    };
    let mut body = std::pin::pin!(body);
    loop {
        let data = match body.as_mut().fill_buf().await {
            Ok([]) => break,
            Ok(buf) => Bytes::copy_from_slice(&buf[..buf.len().min(CHUNK_BYTES)]),
            Err(e) => return finish(&shared, Part::Broke(e.to_string().into())).await,
        };
        body.as_mut().consume(data.len());
        let readers = shared.sent(&data);
        if readers.is_empty() && shared.abandoned() {
            debug!("nobody reads a shared list any more: stopping it");
            return;
        }
        shared.send(readers, Part::Data(data)).await;
    }
    finish(&shared, Part::End).await;
}

/// Ends `shared` with `last`, and sends it to its readers.
async fn finish(shared: &Shared, last: Part) {
    let readers = shared.end(last.clone());
    shared.send(readers, last).await;
}
