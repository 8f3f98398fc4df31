//! Triggers (`Controller::reconcile_on`, `reconcile_all_on`): what the streams yield, batched,
//! sent to the dispatcher of every open session (`Dispatcher.Trigger`). Each dispatcher takes
//! the keys it serves and ignores the others; every replica of a group runs the same streams,
//! so the dispatchers are asked by the replicas connected to them.
//!
//! Bounds: at most [`MAX_TRIGGER_KEYS`] keys wait while the replica has no open session; past
//! that they are merged into one "every key" trigger. A stream is read no faster than the
//! dispatchers answer, each call within [`CALL_TIMEOUT`].

use std::{collections::BTreeSet, pin::Pin, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube_dispatch_proto::{MAX_TRIGGER_KEYS, v1::TriggerRequest};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::shared::{LiveSession, Shared, Types};

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

/// How long one dispatcher may take to answer a trigger before it is given up on (and logged):
/// one that stopped answering does not hold the others' triggers back longer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What is waiting to be sent.
#[derive(Default)]
struct Pending {
    keys: BTreeSet<String>,
    all: bool,
}

impl Pending {
    fn add(&mut self, trigger: Trigger) {
        match trigger {
            Trigger::All => self.all = true,
            // A key with no name (an `ObjectRef` built by hand) names no object.
            Trigger::Key(key) if key.ends_with('/') => {}
            Trigger::Key(key) => {
                self.keys.insert(key);
                // Too many to keep: every key instead, which covers them.
                if self.keys.len() > MAX_TRIGGER_KEYS {
                    self.keys.clear();
                    self.all = true;
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty() && !self.all
    }
}

/// Reads `triggers` until they end or `stop`, sending what is ready at once as one call per
/// open session (at most [`MAX_TRIGGER_KEYS`] keys), and reading on only once every call has
/// been answered. While no session is open, what the streams yield waits (bounded, see the
/// module) for the next one.
pub(super) async fn send_triggers<T: Types>(
    triggers: impl Stream<Item = Trigger> + Unpin,
    shared: Arc<Shared<T>>,
    stop: CancellationToken,
) {
    let mut batches = triggers.ready_chunks(MAX_TRIGGER_KEYS);
    let mut pending = Pending::default();
    let mut open = true;
    loop {
        let sessions: Vec<(String, LiveSession)> = shared
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(address, s)| (address.clone(), s.clone()))
            .collect();
        if !pending.is_empty() && !sessions.is_empty() {
            let Pending { keys, all } = std::mem::take(&mut pending);
            send(sessions, keys.into_iter().collect(), all, &stop).await;
            continue;
        }
        if !open && pending.is_empty() {
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            // A session opened: what waits for one can go.
            () = shared.session_opened.notified(), if !pending.is_empty() => {}
            batch = batches.next(), if open => match batch {
                Some(batch) => batch.into_iter().for_each(|t| pending.add(t)),
                None => open = false,
            },
        }
        if !pending.is_empty()
            && shared
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            debug!(
                keys = pending.keys.len(),
                all = pending.all,
                "no open session: the trigger waits for one"
            );
        }
    }
}

/// Sends one trigger to each of `sessions`, at once, each within [`CALL_TIMEOUT`].
async fn send(
    sessions: Vec<(String, LiveSession)>,
    keys: Vec<String>,
    all: bool,
    stop: &CancellationToken,
) {
    let calls = sessions.into_iter().map(|(address, mut live)| {
        let keys = keys.clone();
        async move {
            let request = TriggerRequest {
                session_id: live.session_id,
                keys,
                all,
            };
            match tokio::time::timeout(CALL_TIMEOUT, live.client.trigger(request)).await {
                Ok(Ok(_)) => {}
                Ok(Err(status)) => warn!(dispatcher = %address, %status, "trigger not taken"),
                Err(_) => warn!(dispatcher = %address, timeout = ?CALL_TIMEOUT, "trigger not answered in time"),
            }
        }
    });
    tokio::select! {
        () = stop.cancelled() => {}
        _ = futures::future::join_all(calls) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_keys_past_the_bound_become_every_key_and_nameless_keys_are_dropped() {
        let mut pending = Pending::default();
        pending.add(Trigger::Key("/ConfigMap/ns/".into()));
        assert!(pending.is_empty(), "a key with no name names nothing");
        for i in 0..MAX_TRIGGER_KEYS {
            pending.add(Trigger::Key(format!("/ConfigMap/ns/c{i}")));
        }
        assert_eq!((pending.keys.len(), pending.all), (MAX_TRIGGER_KEYS, false));
        pending.add(Trigger::Key("/ConfigMap/ns/c0".into()));
        assert_eq!(pending.keys.len(), MAX_TRIGGER_KEYS, "each key once");
        pending.add(Trigger::Key("/ConfigMap/ns/one-more".into()));
        assert!(pending.keys.is_empty() && pending.all, "every key instead");
    }
}
