//! The replica's runtime: one session loop per dispatcher, a shared bound on running
//! reconciles, acks sent as reconciles finish, and fencing: a replica that cannot renew a
//! session within three quarters of its ttl cancels the reconciles it holds from it, before the
//! dispatcher lets another replica take those keys.
//!
//! | module | holds |
//! | --- | --- |
//! | this one | [`run`], the entry point |
//! | `shared` | what every part shares: the controller's types and their bounds, the replica's state |
//! | `supervise` | one session loop per assigned dispatcher, reconnecting with a backoff |
//! | `session` | one session: open, poll within the fence, acks, drain, close |
//! | `reconcile` | one delivery: a slot, the object, the reconcile, the ack |
//! | `load` | the object of a delivery: its body, a fresh read, or a tombstone |
//! | `trigger` | `reconcile_on` and `reconcile_all_on`: triggers sent to the open sessions' dispatchers |
//! | `endings` | sessions on dispatchers that died: fenced when a live one names it dead, then reported ended |
//! | `close_again` | a close the dispatcher did not confirm (its Lease may still list the session), asked again |
//! | `admin` | the admin endpoint, shared by the process's controllers that name one address |

mod admin;
mod close_again;
mod endings;
mod load;
mod prefetch;
mod recent;
mod reconcile;
mod session;
mod shared;
mod supervise;
mod trigger;

pub(crate) use trigger::{Trigger, TriggerStream};

use std::{
    collections::{BTreeSet, HashSet},
    future::Future,
    sync::{Arc, Mutex},
};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube_dispatch_proto::v1::{OpenSessionRequest, PayloadMode, RegisterRequest};
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::info;

use self::shared::{Bound, ErrorPolicy, Outcome, Reconciler, Shared};
use crate::{
    Action, Controller, Health,
    metrics::ControllerMetrics,
    targets::{Source, follow_load_balancer},
};

/// Runs the replica described by `controller`: registers with the load balancer (or takes its
/// fixed dispatchers), keeps a session with each assigned dispatcher, and reconciles what they
/// hand out with `reconcile` and `error_policy`. The stream yields every outcome, and ends once
/// the controller's shutdown signal has drained every session.
pub(crate) fn run<K, Ctx, E, F, R, P>(
    controller: Controller<K>,
    reconcile: Arc<R>,
    error_policy: Arc<P>,
    context: Arc<Ctx>,
) -> impl Stream<Item = Outcome<Bound<K, Ctx, E, F>>> + Send
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
        finding,
        credentials,
        concurrency,
        metrics,
        session_ttl,
        shutdown,
        triggers,
        health,
        admin_listen,
        recent_objects,
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
    let shared = Arc::new(Shared::<Bound<K, Ctx, E, F>> {
        dyntype,
        client,
        reconcile: reconcile as Reconciler<Bound<K, Ctx, E, F>>,
        error_policy: error_policy as ErrorPolicy<Bound<K, Ctx, E, F>>,
        context,
        permits: Arc::new(Semaphore::new(concurrency)),
        slot_freed: tokio::sync::Notify::new(),
        waiting: Arc::default(),
        prefetch: prefetch::Prefetch::new(controller.prefetch.unwrap_or(concurrency), concurrency),
        running: Mutex::new(HashSet::new()),
        outcomes: tx,
        open: OpenSessionRequest {
            group: group.clone(),
            replica_id: replica_id.clone(),
            subscriptions,
            ttl: prost_types::Duration::try_from(session_ttl).ok(),
            client: format!("kube-dispatch-rust/{}", env!("CARGO_PKG_VERSION")),
            capabilities: kube_dispatch_proto::capabilities::ALL
                .iter()
                .map(|c| (*c).to_owned())
                .collect(),
        },
        health: health.clone(),
        full_payload,
        credentials: credentials.clone(),
        metrics: if metrics {
            ControllerMetrics::new(&group, concurrency)
        } else {
            ControllerMetrics::off()
        },
        recent: Arc::new(recent::Recent::new(recent_objects)),
        written: Arc::new(crate::own_writes::Written::new()),
        live: Mutex::default(),
        session_opened: tokio::sync::Notify::new(),
        endings: endings::Endings::default(),
        closing_again: Default::default(),
    });
    let stop = CancellationToken::new();
    if let Some(address) = admin_listen {
        admin::serve(address, &group, &health);
    }
    if let Some(signal) = shutdown {
        tokio::spawn(stop_on(signal, health, stop.clone()));
    }
    let targets = follow_targets(Source::new(finding), &shared, &stop);
    if !triggers.is_empty() {
        tokio::spawn(trigger::send_triggers(
            futures::stream::select_all(triggers),
            shared.clone(),
            stop.clone(),
        ));
    }
    tokio::spawn(supervise::supervise(targets, shared, stop));
    // The stream ends when every session loop has finished and dropped its sender.
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// Starts the drain once `signal` resolves: the replica reports itself stopped and every
/// session finishes its running reconciles, then closes.
async fn stop_on(signal: impl Future<Output = ()>, health: Health, stop: CancellationToken) {
    signal.await;
    info!("shutting down: finishing running reconciles, then closing sessions");
    health.stopped();
    stop.cancel();
}

/// The dispatchers this replica keeps a session with: the fixed ones, or those the load
/// balancer assigns, followed until `stop`. The stream of outcomes stays open until the
/// registration has ended too, so a replica that shuts down exits only once it has taken its
/// leave of the load balancer (its dispatchers go to the other replicas at once).
fn follow_targets<T: shared::Types>(
    source: Source,
    shared: &Arc<Shared<T>>,
    stop: &CancellationToken,
) -> watch::Receiver<BTreeSet<String>> {
    let (targets_tx, targets) = watch::channel(BTreeSet::new());
    match source {
        Source::Fixed(addresses) => {
            targets_tx.send_replace(addresses);
        }
        Source::LoadBalancer(address, service) => {
            let (group, replica_id) = (shared.open.group.clone(), shared.open.replica_id.clone());
            info!(load_balancer = %address, group = %group, replica = %replica_id, "registering with the load balancer");
            let hold = shared.outcomes.clone();
            let follow = follow_load_balancer(
                address,
                shared.credentials.clone(),
                RegisterRequest {
                    group,
                    replica_id,
                    dispatchers: Vec::new(),
                },
                service,
                targets_tx,
                stop.clone(),
            );
            tokio::spawn(async move {
                follow.await;
                drop(hold);
            });
        }
    }
    targets
}
