//! One session with one dispatcher: open it, poll while renewing it within the fence, hand each
//! delivery to its own task, send acks as reconciles end, and on a graceful stop drain before
//! closing; when the session is lost, cancel everything it handed out.

use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

use kube_dispatch_proto::{
    capabilities,
    credentials::AuthChannel,
    v1::{
        AckItem, AckRequest, CloseSessionRequest, OpenSessionResponse, PollRequest, Reason,
        ReconcileRequest, dispatcher_client::DispatcherClient,
    },
};
use tokio::{
    sync::mpsc,
    task::{JoinHandle, JoinSet},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span};

use super::{
    close_again::CloseAgain,
    reconcile::{Slot, Waiting, reconcile_one},
    shared::{LiveSession, Shared, Types},
};
use crate::fence::Fence;

/// The largest answer to a poll this SDK accepts (its gRPC decoding limit), and says it
/// accepts (`PollRequest.max_bytes`): the dispatcher keeps every answer within it and delivers
/// an object too large for it without its body, which the reconciler's fresh read then fetches.
pub(super) const MAX_ANSWER_BYTES: u32 = 16 * 1024 * 1024;

/// One session: open, poll until the controller stops (Ok) or the session is lost (Err).
///
/// Every deadline of the session (its fence, each reconcile's limit) counts from when the call
/// that set it was sent (`crate::fence`). A poll asks for the free slots and, while reconciles
/// are quick, a few more (`super::prefetch`), less deliveries still waiting for one; each
/// delivery takes its slot as it arrives, or waits for one in its own task, within its
/// deadline, so the loop never stops renewing. A close the dispatcher did not confirm is returned (`close_again`).
pub(super) async fn session<T: Types>(
    address: &str,
    shared: &Arc<Shared<T>>,
    stop: &CancellationToken,
) -> Result<Option<CloseAgain>, Lost> {
    let (client, opened, sent) = open(address, shared).await?;
    let session_id = opened.session_id;
    let ttl = opened
        .ttl
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or(Duration::from_secs(10));
    let max_reconcile = opened
        .max_reconcile_time
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or(Duration::from_secs(60));
    info!(dispatcher = %address, session = %session_id, ?ttl, dispatcher_version = %opened.dispatcher_version, "session opened");
    // Cancelled when a live dispatcher names this one dead: the session then ends as lost, and
    // is reported ended once every reconcile it handed out has returned (`endings`).
    let dispatcher_id = opened.dispatcher_id;
    let named_dead = shared.endings.opened(&dispatcher_id, &session_id);
    shared.endings.named_dead(
        &dispatcher_id,
        &opened.dead_dispatchers,
        opened.previous_process_died,
    );
    let _live = Live::register(shared, address, &client, &session_id);
    let _open = shared.health.session_opened();
    let _counted = shared.metrics.session_opened(address);

    // Acks go out as reconciles finish, on their own calls: carried on the next poll, they
    // would wait for a long-poll to return, and a key changed while in flight would wait with
    // them. The channel holds at most one ack per running reconcile.
    let (ack_tx, ack_rx) = mpsc::unbounded_channel::<AckItem>();
    let acker = tokio::spawn(send_acks(client.clone(), session_id.clone(), ack_rx));
    // Sessions ended on dispatchers named dead are reported at once, by an ack of their own.
    let reporter = tokio::spawn(send_reports(
        client.clone(),
        session_id.clone(),
        shared.endings.report_changes(),
        shared.clone(),
    ));
    let mut polls = Polls {
        address,
        shared,
        client,
        session_id,
        dispatcher_id,
        fence: Fence::new(ttl, max_reconcile, sent),
        close_again_for: CloseAgain::window(ttl, max_reconcile),
        named_dead,
        ack_tx,
        lost: CancellationToken::new(),
        tasks: JoinSet::new(),
    };
    let result = match polls.run(stop, sent.elapsed()).await {
        // Graceful: let running reconciles finish within their deadlines while renewing the
        // session, so the dispatcher hands their keys to no one else meanwhile.
        Ok(()) => {
            let Polls {
                client,
                session_id,
                fence,
                tasks,
                named_dead,
                ..
            } = &mut polls;
            drain(client, session_id, fence, tasks, named_dead).await
        }
        Err(status) => Err(status),
    };
    polls.finish(result, acker, reporter).await
}

/// Connects to the dispatcher at `address` and opens a session there for the controller's
/// subscriptions; returns the client, the dispatcher's answer and when the call was sent (what
/// the fence counts from). A dispatcher that lacks a capability the subscriptions need is no
/// session to use: the session is closed again and the error says to upgrade.
async fn open<T: Types>(
    address: &str,
    shared: &Arc<Shared<T>>,
) -> Result<(DispatcherClient<AuthChannel>, OpenSessionResponse, Instant), Lost> {
    let channel = shared
        .credentials
        .endpoint(address)
        .map_err(|e| Lost::Unopened(tonic::Status::invalid_argument(format!("dispatcher: {e}"))))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| Lost::Unopened(tonic::Status::unavailable(format!("cannot connect: {e}"))))?;
    let mut client = DispatcherClient::with_interceptor(channel, shared.credentials.bearer())
        .max_decoding_message_size(MAX_ANSWER_BYTES as usize);
    let sent = Instant::now();
    let opened = client
        .open_session(shared.open.clone())
        .await
        .map_err(Lost::Unopened)?
        .into_inner();
    // An older dispatcher would take a subscription whose fields it does not know for a plain
    // one: not a session to use.
    let missing = capabilities::missing(
        &capabilities::needed_by(&shared.open.subscriptions),
        &opened.capabilities,
    );
    if !missing.is_empty() {
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            client.close_session(CloseSessionRequest {
                session_id: opened.session_id.clone(),
                ..Default::default()
            }),
        )
        .await;
        return Err(Lost::TooOld(tonic::Status::failed_precondition(format!(
            "dispatcher {address} (version {}) does not serve {}, which this controller's subscriptions need: upgrade the dispatchers",
            if opened.dispatcher_version.is_empty() {
                "unknown, before 0.1.0"
            } else {
                &opened.dispatcher_version
            },
            missing.join(", ")
        ))));
    }
    Ok((client, opened, sent))
}

/// The longest a stopping replica's request to answer its poll is given: past it, the poll
/// ends with its wait anyway (at most 5 s).
const RELEASE_BOUND: Duration = Duration::from_secs(5);

/// Asks the dispatcher to answer the held poll of `session_id` now, as its replica is stopping
/// (`AckRequest.stopping`); given up at `lost_at` or after [`RELEASE_BOUND`], whichever comes
/// first. A dispatcher older than the field answers the poll when its wait ends, as before.
async fn release_poll(
    mut client: DispatcherClient<AuthChannel>,
    session_id: String,
    lost_at: Instant,
) {
    let ack = client.ack(AckRequest {
        session_id,
        acks: Vec::new(),
        ended_sessions: Vec::new(),
        stopping: true,
    });
    let until = lost_at.min(Instant::now() + RELEASE_BOUND);
    if let Ok(Err(status)) = tokio::time::timeout_at(until, ack).await {
        debug!(%status, "the dispatcher was not told this replica is stopping; its poll ends when its wait does");
    }
}

/// An open session's poll loop and what it handed out.
struct Polls<'a, T: Types> {
    address: &'a str,
    shared: &'a Arc<Shared<T>>,
    client: DispatcherClient<AuthChannel>,
    session_id: String,
    dispatcher_id: String,
    fence: Fence,
    /// How long a close the dispatcher does not confirm is asked again.
    close_again_for: Duration,
    /// Cancelled when a live dispatcher names this one dead.
    named_dead: CancellationToken,
    ack_tx: mpsc::UnboundedSender<AckItem>,
    /// Cancelled when the session is lost: every reconcile it handed out stops.
    lost: CancellationToken,
    /// The reconciles it handed out.
    tasks: JoinSet<()>,
}

impl<T: Types> Polls<'_, T> {
    /// Polls until `stop` (Ok) or until the session is lost (Err), handing each delivery to a
    /// task of its own; `round_trip` is the open call's, to size the first wait.
    async fn run(
        &mut self,
        stop: &CancellationToken,
        mut round_trip: Duration,
    ) -> Result<(), tonic::Status> {
        let shared = self.shared;
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            // The free slots and what may wait ahead, less the deliveries already waiting.
            let asked = shared.prefetch.ask(
                shared.permits.available_permits(),
                shared.waiting.load(Ordering::Relaxed),
                self.fence.reconcile_limit(),
                shared.live.lock().unwrap_or_else(|e| e.into_inner()).len(),
            );
            let lost_at = self.fence.lost_at();
            let now = Instant::now();
            if now >= lost_at {
                return Err(not_renewed());
            }
            if self.named_dead.is_cancelled() {
                return Err(found_dead());
            }
            let wait = self.fence.wait_at(now, round_trip);
            if asked == 0 {
                // Every slot busy and enough waiting: poll again once one frees, and renew with
                // an empty ack only if none does before the fence needs it (it was renewed at
                // once before, a call per poll of a busy replica).
                let freed = tokio::select! {
                    freed = tokio::time::timeout(wait, shared.slot_freed.notified()) => freed.is_ok(),
                    () = stop.cancelled() => true,
                    () = self.named_dead.cancelled() => true,
                };
                if freed {
                    continue;
                }
            }
            let sent = Instant::now();
            // Not dropped when the session is told to stop: a poll the dispatcher has answered
            // carries deliveries it counts as in flight here, and an answer that never arrives
            // leaves them there until the session would have expired (a ttl: seconds in which
            // nobody reconciles those keys). The poll is answered within its wait, and what it
            // delivers then runs here before the session closes (below).
            // Named dead meanwhile: the session is given up, with what the poll may hand out
            // (the others wait for this replica's report before they hand its keys to anyone).
            let named_dead = self.named_dead.clone();
            // Told to stop while the poll is held: the dispatcher is asked to answer it now
            // (`AckRequest.stopping`), so the stop does not wait out the poll's wait.
            let mut release = Some((self.client.clone(), self.session_id.clone()));
            let answered = {
                let call = tokio::time::timeout_at(lost_at, self.call(asked, wait));
                tokio::pin!(call);
                loop {
                    tokio::select! {
                        answered = &mut call => break answered,
                        () = named_dead.cancelled() => return Err(found_dead()),
                        () = stop.cancelled(), if release.is_some() => {
                            if let Some((client, session_id)) = release.take() {
                                tokio::spawn(release_poll(client, session_id, lost_at));
                            }
                        }
                    }
                }
            };
            let (requests, held) = match answered {
                Ok(Ok(answer)) => answer,
                Ok(Err(status)) => return Err(status),
                Err(_) => return Err(not_renewed()),
            };
            let delivered = self.fence.renewed(sent, held);
            round_trip = sent.elapsed().saturating_sub(held);
            if asked == 0 {
                continue;
            }
            if stop.is_cancelled() {
                // Stopping: what this answer delivered runs here, in the drain that follows,
                // like every reconcile already running. Handed back, it would reach another
                // replica only once this session closed (its running reconciles end first),
                // and without the objects the dispatcher sent here, which that replica would
                // then read from the API server: a rollout would cost reads.
                self.spawn_reconciles(requests, delivered);
                return Ok(());
            }
            self.spawn_reconciles(requests, delivered);
            while self.tasks.try_join_next().is_some() {}
        }
    }

    /// One call that renews the session: a poll for at most `asked` deliveries, waiting up to
    /// `wait`, or with none to ask for an empty ack, which the dispatcher answers at once.
    /// Returns the deliveries and how long the dispatcher held the poll.
    async fn call(
        &mut self,
        asked: usize,
        wait: Duration,
    ) -> Result<(Vec<ReconcileRequest>, Duration), tonic::Status> {
        if asked == 0 {
            self.client
                .ack(AckRequest {
                    session_id: self.session_id.clone(),
                    acks: Vec::new(),
                    ended_sessions: Vec::new(),
                    stopping: false,
                })
                .await?;
            return Ok((Vec::new(), Duration::ZERO));
        }
        let response = self
            .client
            .poll(PollRequest {
                session_id: self.session_id.clone(),
                max_items: u32::try_from(asked).unwrap_or(u32::MAX),
                wait: prost_types::Duration::try_from(wait).ok(),
                acks: Vec::new(),
                max_bytes: MAX_ANSWER_BYTES,
                ended_sessions: self.shared.endings.reports(),
            })
            .await?
            .into_inner();
        self.shared.endings.named_dead(
            &self.dispatcher_id,
            &response.dead_dispatchers,
            response.previous_process_died,
        );
        let held = response
            .held
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        Ok((response.requests, held))
    }

    /// Hands each of `requests`, delivered at `delivered`, to a task of its own, within the
    /// reconcile deadline the fence gives it.
    fn spawn_reconciles(&mut self, requests: Vec<ReconcileRequest>, delivered: Instant) {
        let deadline = self.fence.reconcile_deadline(delivered);
        let limit = self.fence.reconcile_limit();
        let arrived = Instant::now();
        for request in requests {
            let reason = Reason::try_from(request.reason).unwrap_or(Reason::Unspecified);
            self.shared.metrics.delivered(reason);
            // Slots are taken here, before the next poll counts them; one asked for ahead, or
            // whose slot another session took, finds none and waits in its task.
            let slot = match self.shared.permits.clone().try_acquire_owned() {
                Ok(permit) => Slot::Taken(permit),
                Err(_) => Slot::Waiting(Waiting::new(&self.shared.waiting)),
            };
            let (shared, ack_tx, lost) =
                (self.shared.clone(), self.ack_tx.clone(), self.lost.clone());
            let span = info_span!(
                "reconcile",
                key = %request.key,
                resource_version = %request.resource_version,
                ?reason,
                attempt = request.attempt,
                dispatcher = %self.address,
            );
            // A child of the dispatcher's span for the change, when both export traces.
            kube_dispatch_telemetry::logging::set_parent(&span, &request.traceparent);
            self.tasks.spawn(
                async move {
                    if let Some(ack) =
                        reconcile_one(&shared, request, slot, arrived, deadline, limit, &lost).await
                    {
                        let _ = ack_tx.send(ack);
                    }
                }
                .instrument(span),
            );
        }
    }

    /// Ends the session as `result` says. Drained: every reconcile has ended, so the session
    /// is reported ended, its acks sent, and it is closed so the dispatcher hands this
    /// replica's keys to others at once; a close the dispatcher does not confirm is returned,
    /// to be asked again. Lost: whatever it handed out may now go to another replica, so every
    /// reconcile is cancelled and awaited before anything else.
    async fn finish(
        mut self,
        result: Result<(), tonic::Status>,
        acker: JoinHandle<()>,
        reporter: JoinHandle<()>,
    ) -> Result<Option<CloseAgain>, Lost> {
        let Err(status) = result else {
            reporter.abort();
            self.shared
                .endings
                .ended(&self.dispatcher_id, &self.session_id);
            drop(self.ack_tx);
            let _ = tokio::time::timeout(Duration::from_secs(5), acker).await;
            // Bounded: a dispatcher that stopped answering must not hold the stop; the session
            // then expires there by itself.
            return Ok(CloseAgain {
                client: self.client.clone(),
                session_id: self.session_id.clone(),
                address: self.address.to_owned(),
                window: self.close_again_for,
            }
            .first()
            .await);
        };
        self.lost.cancel();
        self.tasks.shutdown().await;
        acker.abort();
        reporter.abort();
        // Only now may the session be reported ended.
        self.shared
            .endings
            .ended(&self.dispatcher_id, &self.session_id);
        Err(Lost::Ended(status))
    }
}

fn found_dead() -> tonic::Status {
    tonic::Status::unavailable(
        "the other dispatchers found this dispatcher dead: session ended, to be reported so they take its keys over",
    )
}

/// Why a session loop reconnects.
#[derive(Debug)]
pub(super) enum Lost {
    /// No session was opened: the dispatcher could not be reached, or refused one.
    Unopened(tonic::Status),
    /// The dispatcher opened a session but lacks a capability the subscriptions need (it is
    /// older than the controller); the session was closed.
    TooOld(tonic::Status),
    /// A session that was open ended (the dispatcher went away, or a renewal failed): it
    /// worked, so the next attempt starts the backoff afresh and follows a restarted
    /// dispatcher within a moment instead of after the delays earlier failures grew.
    Ended(tonic::Status),
}

fn not_renewed() -> tonic::Status {
    tonic::Status::deadline_exceeded("session not renewed in time")
}

/// Waits for the session's running reconciles to end, renewing the session every poll wait.
/// Returns an error, for the caller to cancel what still runs, when a renewal fails or the
/// fence passes first.
async fn drain(
    client: &DispatcherClient<AuthChannel>,
    session_id: &str,
    fence: &mut Fence,
    tasks: &mut JoinSet<()>,
    named_dead: &CancellationToken,
) -> Result<(), tonic::Status> {
    // One renewal at a time, kept across the reconciles that end meanwhile (restarting it on
    // each would never let one finish while reconciles end faster than a round trip).
    let renew_at = |at: Instant, lost_at: Instant| {
        let mut client = client.clone();
        let request = AckRequest {
            session_id: session_id.to_owned(),
            acks: Vec::new(),
            ended_sessions: Vec::new(),
            stopping: false,
        };
        Box::pin(async move {
            tokio::time::sleep_until(at).await;
            let sent = Instant::now();
            let answer = tokio::time::timeout_at(lost_at, client.ack(request)).await;
            (sent, answer)
        })
    };
    let mut renewal = renew_at(Instant::now(), fence.lost_at());
    loop {
        tokio::select! {
            joined = tasks.join_next() => {
                if joined.is_none() {
                    return Ok(());
                }
            }
            (sent, answer) = &mut renewal => match answer {
                Ok(Ok(_)) => {
                    fence.renewed(sent, Duration::ZERO);
                    renewal = renew_at(Instant::now() + fence.poll_wait(), fence.lost_at());
                }
                Ok(Err(status)) => return Err(status),
                Err(_) => return Err(not_renewed()),
            },
            // Its dispatcher was found dead: nothing is gained by letting the reconciles run,
            // and the others wait for this session's end.
            () = named_dead.cancelled() => return Err(found_dead()),
        }
    }
}

/// Sends the sessions to report ended (`endings`) with an ack of session `session_id` each time
/// there are new ones, until aborted; a failed send is left to the next poll, which carries
/// them too.
async fn send_reports<T: Types>(
    mut client: DispatcherClient<AuthChannel>,
    session_id: String,
    mut changes: tokio::sync::watch::Receiver<u64>,
    shared: Arc<Shared<T>>,
) {
    while changes.changed().await.is_ok() {
        let ended_sessions = shared.endings.reports();
        if ended_sessions.is_empty() {
            continue;
        }
        let request = AckRequest {
            session_id: session_id.clone(),
            acks: Vec::new(),
            ended_sessions,
            stopping: false,
        };
        if let Err(status) = client.ack(request).await {
            debug!(session = %session_id, %status, "reporting sessions ended failed; the next poll reports them");
        }
    }
}

/// Sends acks as they come, batching those that are already waiting, until every sender is
/// gone. A failed ack is dropped: its delivery expires on the dispatcher and is retried.
async fn send_acks(
    mut client: DispatcherClient<AuthChannel>,
    session_id: String,
    mut acks: mpsc::UnboundedReceiver<AckItem>,
) {
    const BATCH: usize = 1000;
    while let Some(first) = acks.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match acks.try_recv() {
                Ok(a) => batch.push(a),
                Err(_) => break,
            }
        }
        let request = AckRequest {
            session_id: session_id.clone(),
            acks: batch,
            ended_sessions: Vec::new(),
            stopping: false,
        };
        if let Err(status) = client.ack(request).await {
            debug!(session = %session_id, %status, "ack failed; the dispatcher will retry those keys");
        }
    }
}

/// A session in the replica's table of open sessions ([`Shared::live`]) for as long as it lives.
struct Live<'a, T: Types> {
    shared: &'a Shared<T>,
    address: &'a str,
    session_id: String,
}

impl<'a, T: Types> Live<'a, T> {
    fn register(
        shared: &'a Shared<T>,
        address: &'a str,
        client: &DispatcherClient<AuthChannel>,
        session_id: &str,
    ) -> Self {
        shared
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                address.to_owned(),
                LiveSession {
                    client: client.clone(),
                    session_id: session_id.to_owned(),
                },
            );
        shared.session_opened.notify_one();
        Self {
            shared,
            address,
            session_id: session_id.to_owned(),
        }
    }
}

impl<T: Types> Drop for Live<'_, T> {
    fn drop(&mut self) {
        let mut live = self.shared.live.lock().unwrap_or_else(|e| e.into_inner());
        // A newer session of the same dispatcher may have taken the place already.
        if live
            .get(self.address)
            .is_some_and(|s| s.session_id == self.session_id)
        {
            live.remove(self.address);
        }
    }
}
