//! The drain of one term of a dispatcher: asked for on shutdown or through the operator API,
//! it hands nothing more out, waits for the reconciles in flight, stops the membership (the
//! Lease released only if none is left) and closes the table.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kube_dispatch_proto::v1::dispatcher_server::DispatcherServer;
use kube_dispatch_telemetry::admin::Readiness;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tracing::{info, warn};

use crate::{
    grpc::{
        dispatcher::DispatcherService,
        operator::{DrainState, Drained},
    },
    table::GroupTable,
};

/// Resolves once `ending` (shut down or undrained) and drained: the term's server stops then
/// (a drain asked through the operator API leaves it serving the operator API and health
/// until then).
pub(super) async fn drained(ending: CancellationToken, mut state: watch::Receiver<DrainState>) {
    ending.cancelled().await;
    let _ = state
        .wait_for(|s| matches!(s, DrainState::Drained(_)))
        .await;
}

/// The drain, once asked for (on shutdown, or through the operator API).
pub(super) struct Drain {
    pub(super) groups: Arc<GroupTable>,
    pub(super) health: tonic_health::server::HealthReporter,
    pub(super) readiness: Readiness,
    pub(super) state: watch::Sender<DrainState>,
    pub(super) timeout: Duration,
    /// Set when nothing was left in flight: the membership task then releases the Lease.
    pub(super) clean: Arc<AtomicBool>,
    pub(super) members_stop: CancellationToken,
    pub(super) membership_task: Option<tokio::task::JoinHandle<()>>,
}

impl Drain {
    /// Waits for `leave`, then drains: health NOT_SERVING, nothing more handed out, up to the
    /// timeout for reconciles in flight, the membership task stopped (releasing the Lease only
    /// if none is left), every session closed, and `stop` for the groups and watches. Returns
    /// at once if `stop` comes first (serve() ended before any drain: nothing to hand over).
    pub(super) async fn run(self, leave: CancellationToken, stop: CancellationToken) {
        let Drain {
            groups,
            health,
            readiness,
            state,
            timeout,
            clean,
            members_stop,
            membership_task,
        } = self;
        tokio::select! {
            () = leave.cancelled() => {}
            () = stop.cancelled() => return,
        }
        let began = tokio::time::Instant::now();
        state.send_replace(DrainState::Draining);
        info!("draining: health NOT_SERVING, handing out nothing more");
        readiness.not_ready("draining");
        health
            .set_not_serving::<DispatcherServer<DispatcherService>>()
            .await;
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        groups.begin_drain();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut left = groups.in_flight();
        while left > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            left = groups.in_flight();
        }
        if left == 0 {
            info!("drained: no reconcile in flight");
        } else {
            warn!(
                in_flight = left,
                ?timeout,
                "drain timed out with reconciles in flight"
            );
        }
        clean.store(left == 0, Ordering::Release);
        members_stop.cancel();
        if let Some(task) = membership_task {
            let _ = task.await;
        }
        groups.close_all();
        stop.cancel();
        info!(took = ?began.elapsed(), "drained: out of the ring, serving nothing");
        state.send_replace(DrainState::Drained(Drained {
            in_flight_left: left,
            took: began.elapsed(),
        }));
    }
}
