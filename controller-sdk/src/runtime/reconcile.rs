//! One delivery: a free slot, the object, the reconcile, all within the delivery's deadline;
//! then the ack to send.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use kube::runtime::reflector::ObjectRef;
use kube_dispatch_proto::v1::{AckItem, Failure, ReconcileRequest, Requeue, Success, ack_item};
use tokio::{sync::OwnedSemaphorePermit, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{
    load::load,
    recent::KeepOwn,
    shared::{Outcome, Shared, Types},
};
use crate::{
    Action, Error,
    metrics::Ended,
    own_writes::{OWN_WRITES, OwnWrites},
};

/// Runs one delivery, which `arrived` then: waits for a free slot unless its `slot` holds one,
/// loads the object and reconciles it, all by `deadline` (`limit` after the delivery); returns
/// the ack to send (with the memo the reconcile left, or the one it was given), or `None` when
/// the session was lost, in which case the reconcile has been stopped.
pub(super) async fn reconcile_one<T: Types>(
    shared: &Shared<T>,
    mut request: ReconcileRequest,
    slot: Slot,
    arrived: Instant,
    deadline: Instant,
    limit: Duration,
    lost: &CancellationToken,
) -> Option<AckItem> {
    let key = request.key.clone();
    let delivery_id = request.delivery_id;
    let memo = crate::memo::Slot::new(std::mem::take(&mut request.memo));
    let at_dispatcher = request.waited.and_then(|w| Duration::try_from(w).ok());
    let metrics = &shared.metrics;
    // Set once the reconcile starts (a slot is free): the reconcile time counts from then.
    let mut started = None;
    let work = async {
        let _held = Held {
            permit: Some(match slot {
                Slot::Taken(permit) => permit,
                Slot::Waiting(waiting) => {
                    // The semaphore is never closed.
                    let permit = shared.permits.clone().acquire_owned().await.ok()?;
                    drop(waiting);
                    permit
                }
            }),
            freed: &shared.slot_freed,
        };
        let _active = metrics.started(arrived.elapsed(), at_dispatcher);
        started = Some(Instant::now());
        // Stale writes are counted for the controller, unless it records no metrics.
        let controller = if metrics.is_on() {
            shared.open.group.clone()
        } else {
            String::new()
        };
        // What the reconcile's writes of its own object answer is kept as the object.
        let own: Arc<dyn OwnWrites> = Arc::new(KeepOwn {
            key: key.clone(),
            recent: shared.recent.clone(),
            written: shared.written.clone(),
        });
        // Boxed at once: the controller's future and the object's load live inside it, and
        // each scope, the deadline and the task moved it whole before it ran (memmove was an
        // eighth of a replica's CPU over a cold start of quick reconciles, a sixteenth boxed).
        let reconcile = Box::pin(run_reconcile(shared, request));
        Some(
            crate::metrics::CONTROLLER
                .scope(controller, OWN_WRITES.scope(own, memo.scope(reconcile)))
                .await,
        )
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
        () = lost.cancelled() => {
            if started.is_some() {
                metrics.fenced();
            }
            return None;
        }
    };
    let timed_out = matches!(report, Some(Err(Error::Timeout { .. })));
    if let Some(started) = started {
        let ended = match (&outcome, &report) {
            _ if timed_out => Ended::TimedOut,
            (_, Some(Err(_))) | (ack_item::Outcome::Failure(_), _) => Ended::Error,
            (ack_item::Outcome::Requeue(_), _) => Ended::RequeueAfter,
            (ack_item::Outcome::Success(_), _) => Ended::Success,
        };
        let took = started.elapsed();
        metrics.ended(ended, took);
        // What asking ahead weighs is how long a slot was held; a delivery whose deadline
        // passed, while it waited or ran, counts as slow however short its run was.
        shared.prefetch.ended(if timed_out { limit } else { took });
    } else if timed_out {
        shared.prefetch.ended(limit);
    }
    if let Some(report) = report {
        let _ = shared.outcomes.send(report).await;
    }
    Some(AckItem {
        delivery_id,
        outcome: Some(outcome),
        memo: memo.take(),
    })
}

/// A slot a reconcile holds; given back, it tells a session loop waiting for one
/// (`Shared::slot_freed`).
struct Held<'a> {
    permit: Option<OwnedSemaphorePermit>,
    freed: &'a tokio::sync::Notify,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Released first, so the loop told finds the slot free; a notification with no loop
        // waiting is kept for the next that waits.
        drop(self.permit.take());
        self.freed.notify_one();
    }
}

/// A delivery's slot: taken when its poll answered, or waited for.
pub(super) enum Slot {
    Taken(OwnedSemaphorePermit),
    Waiting(Waiting),
}

/// Counts a delivery waiting for a free slot while it lives (`Shared::waiting`).
pub(super) struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    pub(super) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Loads the object of `request` and reconciles it; returns the ack and what to report on the
/// controller's stream.
async fn run_reconcile<T: Types>(
    shared: &Shared<T>,
    request: ReconcileRequest,
) -> (ack_item::Outcome, Option<Outcome<T>>) {
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
        Ok(Some(object)) => object,
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
    let children = crate::children::Children::from_request(&request);
    let reconciled = crate::children::scope(
        children,
        (shared.reconcile)(object.clone(), shared.context.clone()),
    );
    match reconciled.await {
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
