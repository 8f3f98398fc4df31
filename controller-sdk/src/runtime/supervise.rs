//! Supervision: one session loop per assigned dispatcher, started and gracefully stopped as the
//! assignment changes, each reconnecting with a backoff when its session is lost.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use tokio::{sync::watch, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{
    session::{Lost, session},
    shared::{Shared, Types},
};
use crate::{
    Error,
    reconnect::{Reconnects, pushback},
};

/// Runs one session loop per dispatcher in `targets`, starting and gracefully stopping loops
/// as the set changes, until `stop`; then waits for every loop to finish.
pub(super) async fn supervise<T: Types>(
    mut targets: watch::Receiver<BTreeSet<String>>,
    shared: Arc<Shared<T>>,
    stop: CancellationToken,
) {
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
                running.spawn(session_loop(address, shared.clone(), token, stop.clone()));
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

/// How long a replica waits before asking again a dispatcher that lacks a capability its
/// subscriptions need (`kube_dispatch_proto::capabilities`): longer than the idle grace after
/// which the dispatcher drops the group it made for the refused session.
const TOO_OLD_RETRY: Duration = Duration::from_secs(300);

/// Keeps one session open on one dispatcher until `stop` (the dispatcher is no longer
/// assigned, or the controller stops); then asks again a close the dispatcher did not confirm
/// (`close_again`), until the controller stops (`replica`).
async fn session_loop<T: Types>(
    address: String,
    shared: Arc<Shared<T>>,
    stop: CancellationToken,
    replica: CancellationToken,
) {
    let mut reconnects = Reconnects::new();
    while !stop.is_cancelled() {
        match session(&address, &shared, &stop).await {
            Ok(None) => return,
            Ok(Some(again)) => {
                again.run(&shared.closing_again, &replica).await;
                return;
            }
            Err(lost) => {
                let (status, opened, too_old) = match lost {
                    Lost::Unopened(status) => (status, false, false),
                    Lost::TooOld(status) => (status, false, true),
                    Lost::Ended(status) => (status, true, false),
                };
                // A refusal of the dispatcher's own (other subscriptions in the group, during a
                // rolling update that changes them) is retried as any other.
                let delay = if too_old {
                    // A dispatcher too old for what the subscriptions need: asking again soon
                    // would only keep the group it made for the refused session alive there.
                    error!(dispatcher = %address, %status, delay = ?TOO_OLD_RETRY, "the dispatcher cannot serve this controller; trying it again later");
                    TOO_OLD_RETRY
                } else {
                    // A dispatcher busy opening sessions says how long to wait: at least that.
                    let backoff = reconnects.next(opened);
                    let delay = pushback(&status).map_or(backoff, |asked| asked.max(backoff));
                    warn!(dispatcher = %address, %status, ?delay, "session lost; reconnecting");
                    delay
                };
                shared.metrics.reconnecting();
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
