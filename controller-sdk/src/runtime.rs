//! The replica's runtime: one session loop per dispatcher, a shared bound on running
//! reconciles, acks sent as reconciles finish, and fencing: a replica that cannot renew a
//! session within three quarters of its ttl cancels the reconciles it holds from it, before the
//! dispatcher lets another replica take those keys.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt};
use kube::{
    Api, Resource,
    api::{ApiResource, DynamicObject},
    runtime::reflector::ObjectRef,
};
use kube_dispatch_proto::v1::{
    AckItem, AckRequest, CloseSessionRequest, Failure, OpenSessionRequest, PayloadMode,
    PollRequest, Reason, ReconcileRequest, RegisterRequest, Requeue, Success, ack_item,
    dispatcher_client::DispatcherClient,
};
use serde::de::DeserializeOwned;
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch},
    task::JoinSet,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{
    Action, Controller, Error, Health,
    fence::Fence,
    reconnect::reconnect_backoff,
    targets::{Source, follow_load_balancer},
};

type Reconciler<K, Ctx, F> = Arc<dyn Fn(Arc<K>, Arc<Ctx>) -> F + Send + Sync>;
type ErrorPolicy<K, Ctx, E> = Arc<dyn Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync>;
type Outcome<K, E> = Result<(ObjectRef<K>, Action), Error<E>>;

struct Shared<K: Resource, Ctx, E: std::error::Error + 'static, F> {
    dyntype: K::DynamicType,
    client: kube::Client,
    reconcile: Reconciler<K, Ctx, F>,
    error_policy: ErrorPolicy<K, Ctx, E>,
    context: Arc<Ctx>,
    permits: Arc<Semaphore>,
    /// Deliveries waiting for a free slot (another session took the slots a poll counted on):
    /// the next poll asks for that many fewer, so deliveries never pile up behind the slots.
    waiting: AtomicUsize,
    /// Keys being reconciled in this replica: never two of one key at once.
    running: Mutex<HashSet<String>>,
    outcomes: mpsc::Sender<Outcome<K, E>>,
    open: OpenSessionRequest,
    health: Health,
    /// The primary subscription carries whole objects: bodies can be decoded as `K`.
    full_payload: bool,
}

pub(crate) fn run<K, Ctx, E, F, R, P>(
    controller: Controller<K>,
    reconcile: Arc<R>,
    error_policy: Arc<P>,
    context: Arc<Ctx>,
) -> impl Stream<Item = Outcome<K, E>> + Send
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
    R: Fn(Arc<K>, Arc<Ctx>) -> F + Send + Sync + 'static,
    P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    let Controller {
        dyntype,
        client,
        group,
        replica_id,
        primary,
        owned,
        dispatchers,
        load_balancer,
        concurrency,
        session_ttl,
        shutdown,
        health,
        ..
    } = controller;
    // Outcomes are buffered up to the concurrency; a consumer that stops reading slows the
    // replica down rather than growing memory.
    let (tx, rx) = mpsc::channel(concurrency);
    let full_payload = matches!(
        PayloadMode::try_from(primary.payload),
        Ok(PayloadMode::Full | PayloadMode::Unspecified)
    );
    let mut subscriptions = vec![primary];
    subscriptions.extend(owned);
    let shared = Arc::new(Shared {
        dyntype,
        client,
        reconcile: reconcile as Reconciler<K, Ctx, F>,
        error_policy: error_policy as ErrorPolicy<K, Ctx, E>,
        context,
        permits: Arc::new(Semaphore::new(concurrency)),
        waiting: AtomicUsize::new(0),
        running: Mutex::new(HashSet::new()),
        outcomes: tx,
        open: OpenSessionRequest {
            group: group.clone(),
            replica_id: replica_id.clone(),
            subscriptions,
            ttl: prost_types::Duration::try_from(session_ttl).ok(),
        },
        health: health.clone(),
        full_payload,
    });
    let stop = CancellationToken::new();
    if let Some(signal) = shutdown {
        let stop = stop.clone();
        tokio::spawn(async move {
            signal.await;
            info!("shutting down: finishing running reconciles, then closing sessions");
            health.stopped();
            stop.cancel();
        });
    }
    let (targets_tx, targets) = watch::channel(BTreeSet::new());
    match Source::new(dispatchers, load_balancer) {
        Source::Fixed(addresses) => {
            targets_tx.send_replace(addresses);
        }
        Source::LoadBalancer(address) => {
            info!(load_balancer = %address, group = %group, replica = %replica_id, "registering with the load balancer");
            tokio::spawn(follow_load_balancer(
                address,
                RegisterRequest { group, replica_id },
                targets_tx,
                stop.clone(),
            ));
        }
    }
    tokio::spawn(supervise(targets, shared, stop));
    // The stream ends when every session loop has finished and dropped its sender.
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// Runs one session loop per dispatcher in `targets`, starting and gracefully stopping loops
/// as the set changes, until `stop`; then waits for every loop to finish.
async fn supervise<K, Ctx, E, F>(
    mut targets: watch::Receiver<BTreeSet<String>>,
    shared: Arc<Shared<K, Ctx, E, F>>,
    stop: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
{
    let mut loops: HashMap<String, CancellationToken> = HashMap::new();
    let mut running = JoinSet::new();
    let mut source_open = true;
    loop {
        let want = targets.borrow_and_update().clone();
        loops.retain(|address, token| {
            let keep = want.contains(address);
            if !keep {
                info!(dispatcher = %address, "no longer assigned: finishing its reconciles and closing the session");
                token.cancel();
            }
            keep
        });
        for address in want {
            if !loops.contains_key(&address) {
                let token = stop.child_token();
                loops.insert(address.clone(), token.clone());
                running.spawn(session_loop(address, shared.clone(), token));
            }
        }
        while running.try_join_next().is_some() {}
        tokio::select! {
            () = stop.cancelled() => break,
            changed = targets.changed(), if source_open => source_open = changed.is_ok(),
            Some(_) = running.join_next() => {}
        }
    }
    drop(shared);
    while running.join_next().await.is_some() {}
}

/// Keeps one session open on one dispatcher for as long as the controller runs.
async fn session_loop<K, Ctx, E, F>(
    address: String,
    shared: Arc<Shared<K, Ctx, E, F>>,
    stop: CancellationToken,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
{
    let mut backoff = reconnect_backoff();
    while !stop.is_cancelled() {
        match session(&address, &shared, &stop).await {
            Ok(()) => return,
            Err(status) => {
                let delay = backoff.next().unwrap_or(Duration::from_secs(30));
                warn!(dispatcher = %address, %status, ?delay, "session lost; reconnecting");
                let _ = shared
                    .outcomes
                    .send(Err(Error::Dispatcher {
                        address: address.clone(),
                        status,
                    }))
                    .await;
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// One session: open, poll until the controller stops (Ok) or the session is lost (Err).
///
/// Every deadline of the session (its fence, each reconcile's limit) counts from when the call
/// that set it was sent (`crate::fence`). A poll asks for no more than the free slots (less
/// deliveries still waiting for one), and each delivery takes its slot as it arrives; one whose
/// slot another session took meanwhile waits in its own task, within its deadline, so the loop
/// never stops renewing.
async fn session<K, Ctx, E, F>(
    address: &str,
    shared: &Arc<Shared<K, Ctx, E, F>>,
    stop: &CancellationToken,
) -> Result<(), tonic::Status>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
{
    let channel = Endpoint::from_shared(address.to_owned())
        .map_err(|e| tonic::Status::invalid_argument(format!("bad dispatcher address: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot connect: {e}")))?;
    let mut client = DispatcherClient::new(channel);
    let sent = Instant::now();
    let opened = client.open_session(shared.open.clone()).await?.into_inner();
    let session_id = opened.session_id;
    let ttl = opened
        .ttl
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or(Duration::from_secs(10));
    let max_reconcile = opened
        .max_reconcile_time
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or(Duration::from_secs(60));
    let mut fence = Fence::new(ttl, max_reconcile, sent);
    info!(dispatcher = %address, session = %session_id, ?ttl, "session opened");
    let _open = shared.health.session_opened();

    let lost = CancellationToken::new();
    // Acks go out as reconciles finish, on their own calls: carried on the next poll, they
    // would wait for a long-poll to return, and a key changed while in flight would wait with
    // them. The channel holds at most one ack per running reconcile.
    let (ack_tx, ack_rx) = mpsc::unbounded_channel::<AckItem>();
    let acker = tokio::spawn(send_acks(client.clone(), session_id.clone(), ack_rx));
    let mut tasks = JoinSet::new();
    // Of the last call, to size the next wait.
    let mut round_trip = sent.elapsed();
    let result = loop {
        if stop.is_cancelled() {
            break Ok(());
        }
        let free = shared
            .permits
            .available_permits()
            .saturating_sub(shared.waiting.load(Ordering::Relaxed));
        let lost_at = fence.lost_at();
        let now = Instant::now();
        if now >= lost_at {
            break Err(not_renewed());
        }
        let wait = fence.wait_at(now, round_trip);
        let sent = Instant::now();
        let call = async {
            if free == 0 {
                // Saturated: renew without taking work; the dispatcher answers at once.
                client
                    .ack(AckRequest {
                        session_id: session_id.clone(),
                        acks: Vec::new(),
                    })
                    .await?;
                Ok((Vec::new(), Duration::ZERO))
            } else {
                let response = client
                    .poll(PollRequest {
                        session_id: session_id.clone(),
                        max_items: u32::try_from(free).unwrap_or(u32::MAX),
                        wait: prost_types::Duration::try_from(wait).ok(),
                        acks: Vec::new(),
                    })
                    .await?
                    .into_inner();
                let held = response
                    .held
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default();
                Ok::<_, tonic::Status>((response.requests, held))
            }
        };
        let (requests, held) = tokio::select! {
            r = tokio::time::timeout_at(lost_at, call) => match r {
                Ok(Ok(answer)) => answer,
                Ok(Err(status)) => break Err(status),
                Err(_) => break Err(not_renewed()),
            },
            () = stop.cancelled() => continue,
        };
        let delivered = fence.renewed(sent, held);
        round_trip = sent.elapsed().saturating_sub(held);
        if free == 0 {
            // Wait for a free slot, no longer than leaves time to renew before the fence.
            let wait = fence.wait_at(Instant::now(), round_trip);
            let _ = tokio::time::timeout(wait, shared.permits.acquire()).await;
            continue;
        }
        let deadline = fence.reconcile_deadline(delivered);
        let limit = fence.reconcile_limit();
        for request in requests {
            // Slots are taken here, before the next poll counts them; a delivery finds none
            // only if another session took them since this poll counted, and then waits in its
            // task.
            let permit = shared.permits.clone().try_acquire_owned().ok();
            let (shared, ack_tx, lost) = (shared.clone(), ack_tx.clone(), lost.clone());
            let span = info_span!(
                "reconcile",
                key = %request.key,
                resource_version = %request.resource_version,
                reason = ?Reason::try_from(request.reason).unwrap_or(Reason::Unspecified),
                attempt = request.attempt,
                dispatcher = %address,
            );
            tasks.spawn(
                async move {
                    let id = request.delivery_id;
                    if let Some(outcome) =
                        reconcile_one(&shared, request, permit, deadline, limit, &lost).await
                    {
                        let _ = ack_tx.send(AckItem {
                            delivery_id: id,
                            outcome: Some(outcome),
                        });
                    }
                }
                .instrument(span),
            );
        }
        while tasks.try_join_next().is_some() {}
    };
    let result = match result {
        // Graceful: let running reconciles finish within their deadlines while renewing the
        // session, so the dispatcher hands their keys to no one else meanwhile.
        Ok(()) => drain(&client, &session_id, &mut fence, &mut tasks).await,
        Err(status) => Err(status),
    };
    match result {
        Ok(()) => {
            // Every reconcile has ended: send their acks, and close the session so the
            // dispatcher hands this replica's keys to others at once.
            drop(ack_tx);
            let _ = tokio::time::timeout(Duration::from_secs(5), acker).await;
            let _ = client
                .close_session(CloseSessionRequest {
                    session_id: session_id.clone(),
                })
                .await;
            info!(dispatcher = %address, session = %session_id, "session closed");
            Ok(())
        }
        Err(status) => {
            // Lost: whatever this session handed us may now go to another replica. Cancel it,
            // and wait until every reconcile has stopped before anything else.
            lost.cancel();
            tasks.shutdown().await;
            acker.abort();
            Err(status)
        }
    }
}

fn not_renewed() -> tonic::Status {
    tonic::Status::deadline_exceeded("session not renewed in time")
}

/// Waits for the session's running reconciles to end, renewing the session every poll wait.
/// Returns an error, for the caller to cancel what still runs, when a renewal fails or the
/// fence passes first.
async fn drain(
    client: &DispatcherClient<tonic::transport::Channel>,
    session_id: &str,
    fence: &mut Fence,
    tasks: &mut JoinSet<()>,
) -> Result<(), tonic::Status> {
    // One renewal at a time, kept across the reconciles that end meanwhile (restarting it on
    // each would never let one finish while reconciles end faster than a round trip).
    let renew_at = |at: Instant, lost_at: Instant| {
        let mut client = client.clone();
        let request = AckRequest {
            session_id: session_id.to_owned(),
            acks: Vec::new(),
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
        }
    }
}

/// Sends acks as they come, batching those that are already waiting, until every sender is
/// gone. A failed ack is dropped: its delivery expires on the dispatcher and is retried.
async fn send_acks(
    mut client: DispatcherClient<tonic::transport::Channel>,
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
        };
        if let Err(status) = client.ack(request).await {
            debug!(session = %session_id, %status, "ack failed; the dispatcher will retry those keys");
        }
    }
}

/// Runs one delivery: waits for a free slot unless it holds `permit`, loads the object and
/// reconciles it, all by `deadline` (`limit` after the delivery); returns the ack to send, or
/// `None` when the session was lost, in which case the reconcile has been stopped.
async fn reconcile_one<K, Ctx, E, F>(
    shared: &Shared<K, Ctx, E, F>,
    request: ReconcileRequest,
    permit: Option<OwnedSemaphorePermit>,
    deadline: Instant,
    limit: Duration,
    lost: &CancellationToken,
) -> Option<ack_item::Outcome>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
{
    let key = request.key.clone();
    let work = async {
        let _permit = match permit {
            Some(permit) => permit,
            None => {
                let _waiting = Waiting::new(&shared.waiting);
                // The semaphore is never closed.
                shared.permits.clone().acquire_owned().await.ok()?
            }
        };
        Some(run_reconcile(shared, request).await)
    };
    let (outcome, report) = tokio::select! {
        r = tokio::time::timeout_at(deadline, work) => match r {
            Ok(done) => done?,
            Err(_) => (
                ack_item::Outcome::Failure(Failure {
                    message: format!("timed out after {limit:?}"),
                }),
                Some(Err(Error::Timeout { key, limit })),
            ),
        },
        () = lost.cancelled() => return None,
    };
    if let Some(report) = report {
        let _ = shared.outcomes.send(report).await;
    }
    Some(outcome)
}

/// Counts a delivery waiting for a free slot while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Loads the object of `request` and reconciles it; returns the ack and what to report on the
/// controller's stream.
async fn run_reconcile<K, Ctx, E, F>(
    shared: &Shared<K, Ctx, E, F>,
    request: ReconcileRequest,
) -> (ack_item::Outcome, Option<Outcome<K, E>>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Future<Output = Result<Action, E>> + Send + 'static,
{
    let key = request.key.clone();
    let fail = |message: String| ack_item::Outcome::Failure(Failure { message });
    if !shared
        .running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.clone())
    {
        return (
            fail(format!("{key} is already being reconciled in this replica")),
            None,
        );
    }
    struct Release<'a>(&'a Mutex<HashSet<String>>, String);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.1);
        }
    }
    let _release = Release(&shared.running, key.clone());

    let object = match load(shared, &request).await {
        Ok(Some(object)) => Arc::new(object),
        Ok(None) => {
            debug!(
                key,
                "object gone and no last state to reconcile: nothing to do"
            );
            return (ack_item::Outcome::Success(Success {}), None);
        }
        Err(e) => return (fail(e.to_string()), Some(Err(e))),
    };
    let object_ref = ObjectRef::from_obj_with(&*object, shared.dyntype.clone());
    match (shared.reconcile)(object.clone(), shared.context.clone()).await {
        Ok(action) => (ack_for(action, None), Some(Ok((object_ref, action)))),
        Err(e) => {
            let action = (shared.error_policy)(object, &e, shared.context.clone());
            (
                ack_for(action, Some(e.to_string())),
                Some(Err(Error::ReconcilerFailed { key, source: e })),
            )
        }
    }
}

fn ack_for(action: Action, error: Option<String>) -> ack_item::Outcome {
    match (action.requeue_after(), error) {
        (Some(after), _) => ack_item::Outcome::Requeue(Requeue {
            after: prost_types::Duration::try_from(after.max(Duration::from_millis(1))).ok(),
        }),
        (None, Some(message)) => ack_item::Outcome::Failure(Failure { message }),
        (None, None) => ack_item::Outcome::Success(Success {}),
    }
}

/// A deleted object as JSON from the request alone: type, name, namespace, uid,
/// resourceVersion and a deletion timestamp.
fn tombstone<K, Ctx, E, F>(
    shared: &Shared<K, Ctx, E, F>,
    request: &ReconcileRequest,
) -> Option<Vec<u8>>
where
    K: Resource,
    E: std::error::Error + 'static,
{
    let key = request.object.as_ref()?;
    let mut metadata = serde_json::json!({
        "name": key.name,
        "deletionTimestamp": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ),
    });
    for (field, value) in [
        ("namespace", &key.namespace),
        ("uid", &request.uid),
        ("resourceVersion", &request.resource_version),
    ] {
        if !value.is_empty() {
            metadata[field] = value.clone().into();
        }
    }
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": K::api_version(&shared.dyntype),
        "kind": K::kind(&shared.dyntype),
        "metadata": metadata,
    }))
    .ok()
}

/// The object to reconcile: the body the dispatcher sent, or a fresh read. For a deletion, the
/// last known state marked with a deletion timestamp (so a finalizer-free controller can clean
/// up), else a tombstone built from the request, or `None` when the type cannot be built from
/// metadata alone.
async fn load<K, Ctx, E, F>(
    shared: &Shared<K, Ctx, E, F>,
    request: &ReconcileRequest,
) -> Result<Option<K>, Error<E>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + 'static,
    E: std::error::Error + 'static,
{
    let decode = |bytes: &[u8]| {
        serde_json::from_slice::<K>(bytes).map_err(|source| Error::Decode {
            key: request.key.clone(),
            kind: K::kind(&shared.dyntype).into_owned(),
            source,
        })
    };
    let full = shared.full_payload;
    if request.deleted {
        if request.object_json.is_empty() || !full {
            // No last state (a deletion found by a re-list, or a payload without bodies): a
            // tombstone with what the request says, if the type can be built from metadata
            // alone; otherwise there is nothing to hand over.
            return Ok(tombstone(shared, request).and_then(|json| decode(&json).ok()));
        }
        let mut object = decode(&request.object_json)?;
        let meta = object.meta_mut();
        if meta.deletion_timestamp.is_none() {
            meta.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        }
        return Ok(Some(object));
    }
    if full && !request.object_json.is_empty() {
        return decode(&request.object_json).map(Some);
    }
    let Some(key) = request.object.as_ref() else {
        return Ok(None);
    };
    // Through the dynamic API, so one code path serves namespaced and cluster-scoped kinds.
    let resource = ApiResource::erase::<K>(&shared.dyntype);
    let api: Api<DynamicObject> = if key.namespace.is_empty() {
        Api::all_with(shared.client.clone(), &resource)
    } else {
        Api::namespaced_with(shared.client.clone(), &key.namespace, &resource)
    };
    let read = api
        .get_opt(&key.name)
        .await
        .map_err(|source| Error::ObjectRead {
            key: request.key.clone(),
            source,
        })?;
    let Some(object) = read else { return Ok(None) };
    let json = serde_json::to_vec(&object).map_err(|source| Error::Decode {
        key: request.key.clone(),
        kind: K::kind(&shared.dyntype).into_owned(),
        source,
    })?;
    decode(&json).map(Some)
}
