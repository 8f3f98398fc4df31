//! A close the dispatcher did not confirm, asked again.
//!
//! A dispatcher answers CloseSession once its Lease lists the session no more
//! (`dispatcher/HANDOVER.md`, "Ending the wait for a member that died, by reports"). Until then,
//! were it to die, its next process would wait for a report of the session, and this replica,
//! no longer assigned that dispatcher, would never be asked for one. So a close that is not
//! confirmed (an error the dispatcher may get over, or no answer within 5 s) is asked again,
//! backing off from 250 ms to 2 s, until it is: by the same process once its Lease write goes
//! through, or by the next process at the address, which takes the close of a session its
//! previous process listed as that session's report. It gives up after [`CloseAgain::window`]
//! or when the controller stops.
//!
//! Bound: at most [`MAX_CLOSING_AGAIN`] closes are asked again at once in a replica; past it a
//! close is left as it was answered (its dispatcher's next process, should it need a report,
//! waits out its handover bound instead).

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use kube_dispatch_proto::{
    credentials::AuthChannel,
    v1::{CloseSessionRequest, dispatcher_client::DispatcherClient},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Most closes a replica asks again at once.
pub(super) const MAX_CLOSING_AGAIN: usize = 16;

/// Longest one close call is given.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a close answered `answer` (`None`: no answer within [`CLOSE_TIMEOUT`]) is done with:
/// confirmed, or refused for a reason asking again would not change. NOT_FOUND is done: the
/// dispatcher neither holds nor lists the session (or predates confirmed closes).
fn done(answer: Option<&Result<(), tonic::Status>>) -> bool {
    use tonic::Code;
    match answer {
        Some(Ok(())) => true,
        Some(Err(status)) => !matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Unknown
                | Code::ResourceExhausted
                | Code::Aborted
                | Code::Internal
                | Code::Cancelled
        ),
        None => false,
    }
}

/// Closes `session_id` with `client` (within [`CLOSE_TIMEOUT`]) and returns what the answer
/// was, `None` when there was none in time.
async fn close(
    client: &mut DispatcherClient<AuthChannel>,
    session_id: &str,
) -> Option<Result<(), tonic::Status>> {
    // Closed once drained: every reconcile the session handed out has returned.
    let call = client.close_session(CloseSessionRequest {
        session_id: session_id.to_owned(),
        reconciles_ended: true,
    });
    tokio::time::timeout(CLOSE_TIMEOUT, call)
        .await
        .ok()
        .map(|answer| answer.map(|_| ()))
}

/// A close to ask again.
pub(super) struct CloseAgain {
    pub(super) client: DispatcherClient<AuthChannel>,
    pub(super) session_id: String,
    pub(super) address: String,
    /// How long to keep asking: the session's ttl or its longest reconcile, whichever is
    /// longer (what the dispatcher's handover bound is made of), and at least a minute.
    pub(super) window: Duration,
}

impl CloseAgain {
    /// How long a close of a session granted `ttl` and `max_reconcile` is asked again.
    pub(super) fn window(ttl: Duration, max_reconcile: Duration) -> Duration {
        ttl.max(max_reconcile).max(Duration::from_secs(60))
    }

    /// Closes the session (within [`CLOSE_TIMEOUT`]): `None` once the close is done
    /// ([`done`]), else itself, to [`CloseAgain::run`].
    pub(super) async fn first(mut self) -> Option<Self> {
        let answer = close(&mut self.client, &self.session_id).await;
        if done(answer.as_ref()) {
            info!(dispatcher = %self.address, session = %self.session_id, "session closed");
            return None;
        }
        let answer = match answer {
            Some(Err(status)) => status.to_string(),
            _ => format!("no answer within {CLOSE_TIMEOUT:?}"),
        };
        warn!(dispatcher = %self.address, session = %self.session_id, %answer, "session closed, but the dispatcher did not confirm its Lease lists it no more: asking again");
        Some(self)
    }

    /// Asks again until the close is done ([`done`]), `window` passes or `stop` is cancelled;
    /// counted in `closing` against [`MAX_CLOSING_AGAIN`].
    pub(super) async fn run(self, closing: &AtomicUsize, stop: &CancellationToken) {
        let Some(_counted) = Counted::within(closing, MAX_CLOSING_AGAIN) else {
            warn!(dispatcher = %self.address, session = %self.session_id, "the dispatcher did not confirm the close, and {MAX_CLOSING_AGAIN} closes are asked again already: left as answered (should that dispatcher die now, its next process waits out its handover bound)");
            return;
        };
        let (client, session_id) = (&self.client, &self.session_id);
        let (done_now, asked) = ask_until_done(
            || {
                let mut client = client.clone();
                let session_id = session_id.clone();
                async move { close(&mut client, &session_id).await }
            },
            self.window,
            stop,
        )
        .await;
        if done_now {
            info!(dispatcher = %self.address, session = %self.session_id, asked, "the close is confirmed: the dispatcher's Lease lists the session no more, or its next process took the close as the session's report");
        } else if !stop.is_cancelled() {
            warn!(dispatcher = %self.address, session = %self.session_id, window = ?self.window, "the dispatcher never confirmed the close: should its next process still wait for the session, it waits out its handover bound");
        }
    }
}

/// One close asked again, counted while it lives (however its task ends).
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Counted in `count`, unless `most` are counted already.
    fn within(count: &'a AtomicUsize, most: usize) -> Option<Self> {
        let counted = Self(count);
        (count.fetch_add(1, Ordering::AcqRel) < most).then_some(counted)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Asks `ask` after 250 ms, then again backing off to 2 s, until its answer is [`done`], `window`
/// has passed or `stop` is cancelled. Returns whether it was done, and how many times it asked.
async fn ask_until_done<F, Fut>(
    mut ask: F,
    window: Duration,
    stop: &CancellationToken,
) -> (bool, u32)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<Result<(), tonic::Status>>>,
{
    let deadline = tokio::time::Instant::now() + window;
    let mut delay = Duration::from_millis(250);
    let mut asked = 0u32;
    loop {
        tokio::select! {
            () = stop.cancelled() => return (false, asked),
            () = tokio::time::sleep(delay) => {}
        }
        asked += 1;
        if done(ask().await.as_ref()) {
            return (true, asked);
        }
        if tokio::time::Instant::now() >= deadline {
            return (false, asked);
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Answer = std::future::Ready<Option<Result<(), tonic::Status>>>;
    type Asks = Arc<Mutex<Vec<tokio::time::Instant>>>;

    /// Answers UNAVAILABLE `refusals` times, then `last`; records when each ask came.
    fn dispatcher(
        refusals: usize,
        last: Result<(), tonic::Status>,
    ) -> (impl FnMut() -> Answer, Asks) {
        let asks = Arc::new(Mutex::new(Vec::new()));
        let seen = asks.clone();
        let ask = move || {
            let mut asks = seen.lock().unwrap();
            asks.push(tokio::time::Instant::now());
            std::future::ready(Some(if asks.len() > refusals {
                last.clone()
            } else {
                Err(tonic::Status::unavailable("the Lease may still list it"))
            }))
        };
        (ask, asks)
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_is_asked_again_backing_off_until_confirmed() {
        let began = tokio::time::Instant::now();
        let (ask, asks) = dispatcher(4, Ok(()));
        let stop = CancellationToken::new();
        assert_eq!(
            ask_until_done(ask, Duration::from_secs(60), &stop).await,
            (true, 5)
        );
        let after: Vec<u64> = asks
            .lock()
            .unwrap()
            .iter()
            .map(|at| at.duration_since(began).as_millis() as u64)
            .collect();
        assert_eq!(
            after,
            [250, 750, 1750, 3750, 5750],
            "250 ms, doubling to 2 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn asking_again_ends_with_a_final_answer_the_window_or_the_stop() {
        let stop = CancellationToken::new();
        let (ask, _) = dispatcher(1, Err(tonic::Status::not_found("no such session")));
        assert_eq!(
            ask_until_done(ask, Duration::from_secs(60), &stop).await,
            (true, 2),
            "NOT_FOUND: nothing listed, nothing to ask"
        );
        let began = tokio::time::Instant::now();
        let (ask, _) = dispatcher(usize::MAX, Ok(()));
        let (confirmed, asked) = ask_until_done(ask, Duration::from_secs(60), &stop).await;
        assert!(!confirmed);
        assert_eq!(
            began.elapsed().as_secs(),
            61,
            "given up once the window passed"
        );
        assert_eq!(asked, 33);
        stop.cancel();
        let (ask, asks) = dispatcher(usize::MAX, Ok(()));
        assert_eq!(
            ask_until_done(ask, Duration::from_secs(60), &stop).await,
            (false, 0)
        );
        assert!(
            asks.lock().unwrap().is_empty(),
            "a stopped controller asks nothing"
        );
    }

    #[test]
    fn only_a_confirmed_or_final_answer_ends_the_asking() {
        assert!(done(Some(&Ok(()))));
        assert!(done(Some(&Err(tonic::Status::not_found(
            "no such session"
        )))));
        assert!(done(Some(&Err(tonic::Status::permission_denied(
            "not yours"
        )))));
        assert!(!done(Some(&Err(tonic::Status::unavailable(
            "the Lease may still list it"
        )))));
        assert!(!done(Some(&Err(tonic::Status::deadline_exceeded("slow")))));
        assert!(!done(None), "no answer in time");
    }

    #[test]
    fn at_most_the_bound_are_asked_again_and_each_gives_its_place_back() {
        let count = AtomicUsize::new(0);
        let held: Vec<_> = (0..3).filter_map(|_| Counted::within(&count, 2)).collect();
        assert_eq!(held.len(), 2, "the third is left as answered");
        assert_eq!(count.load(Ordering::Acquire), 2);
        drop(held);
        assert_eq!(count.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_window_covers_the_handover_bound_and_a_restart() {
        let s = Duration::from_secs;
        assert_eq!(CloseAgain::window(s(10), s(30)), s(60));
        assert_eq!(CloseAgain::window(s(10), s(300)), s(300));
        assert_eq!(CloseAgain::window(s(120), s(30)), s(120));
    }
}
