//! Triggers (`Controller::reconcile_on`, `reconcile_all_on`): what the streams yield, batched,
//! sent to the dispatcher of every open session (`Dispatcher.Trigger`). Each dispatcher takes
//! the keys it serves and ignores the others; every replica of a group runs the same streams,
//! so the dispatchers are asked by the replicas connected to them.

use std::{pin::Pin, sync::Arc};

use futures::{Stream, StreamExt};
use kube_dispatch_proto::v1::TriggerRequest;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::shared::{Shared, Types};

/// What a trigger stream asks for: one key reconciled, or every key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    /// The request key of one object.
    Key(String),
    /// Every key of the group.
    All,
}

/// A stream `Controller::reconcile_on` or `reconcile_all_on` was given.
pub(crate) type TriggerStream = Pin<Box<dyn Stream<Item = Trigger> + Send>>;

/// Most keys one Trigger call names: the dispatcher's limit.
pub(super) const MAX_TRIGGER_KEYS: usize = 1000;

/// Reads `triggers` until they end or `stop`, sending what is ready at once as one call per
/// open session (at most [`MAX_TRIGGER_KEYS`] keys), and reading on only once every call has
/// been answered: a stream is read no faster than the dispatchers take it.
pub(super) async fn send_triggers<T: Types>(
    triggers: impl Stream<Item = Trigger> + Unpin,
    shared: Arc<Shared<T>>,
    stop: CancellationToken,
) {
    let mut batches = triggers.ready_chunks(MAX_TRIGGER_KEYS);
    loop {
        let batch = tokio::select! {
            () = stop.cancelled() => return,
            batch = batches.next() => match batch {
                Some(batch) => batch,
                None => return,
            },
        };
        let all = batch.contains(&Trigger::All);
        let mut keys: Vec<String> = batch
            .into_iter()
            .filter_map(|t| match t {
                Trigger::Key(key) => Some(key),
                Trigger::All => None,
            })
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let sessions: Vec<(String, super::shared::LiveSession)> = shared
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(address, s)| (address.clone(), s.clone()))
            .collect();
        if sessions.is_empty() {
            debug!(
                keys = keys.len(),
                all, "no open session: the trigger is left to the group's other replicas"
            );
            continue;
        }
        let calls = sessions.into_iter().map(|(address, mut live)| {
            let keys = keys.clone();
            async move {
                let request = TriggerRequest {
                    session_id: live.session_id,
                    keys,
                    all,
                };
                if let Err(status) = live.client.trigger(request).await {
                    warn!(dispatcher = %address, %status, "trigger not taken");
                }
            }
        });
        tokio::select! {
            () = stop.cancelled() => return,
            _ = futures::future::join_all(calls) => {}
        }
    }
}
