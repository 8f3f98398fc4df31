//! The operator API (`proto/kubedispatch/v1/operator.proto`), which `kdctl` calls: what this
//! dispatcher serves and holds, where one key stands, the reconcile of one key asked by an
//! operator, the drain that hands its slice over before maintenance, and the undrain that
//! brings it back. Each call is authorized by a SubjectAccessReview on a non-resource path
//! ([`crate::security::STATUS_PATH`], [`crate::security::DRAIN_PATH`] for both drain and
//! undrain, [`crate::security::RECONCILE_PATH`]).

use std::{sync::Arc, time::Duration};

use kube_dispatch_core::queue::{KeyState as QueueKeyState, KeyStatus};
use kube_dispatch_proto::{
    RequestKey,
    v1::{
        DispatcherState, DrainRequest, DrainResponse, GroupStatus, KeyInGroup, KeyRequest,
        KeyResponse, KeyState, ReconcileKeyRequest, StatusRequest, StatusResponse, UndrainRequest,
        UndrainResponse, operator_server,
    },
};
use kube_dispatch_server::auth::{Caller, GroupId};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::info;

use crate::{
    security::{DRAIN_PATH, Guard, RECONCILE_PATH, STATUS_PATH},
    table::GroupTable,
};

/// Where this dispatcher's drain stands: set by the drain in `crate::serve`, read by the
/// operator API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainState {
    /// Not draining.
    Serving,
    /// Handing nothing more out; waiting for deliveries in flight.
    Draining,
    /// Out of the ring, serving nothing.
    Drained(Drained),
}

/// How a drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// Deliveries still in flight when the drain timeout ran out (0: the Lease was released).
    pub in_flight_left: usize,
    /// How long it took.
    pub took: Duration,
}

/// The drain as the operator API sees it: the token that starts it and its state.
#[derive(Clone, Debug)]
pub struct DrainHandle {
    /// Cancelled to start the drain (also by the dispatcher's shutdown).
    pub start: CancellationToken,
    /// Where it stands.
    pub state: watch::Receiver<DrainState>,
    /// Whether the ring comes from Leases (a fixed ring has nobody to hand over to).
    pub leases: bool,
    /// The process's shutdown: a drain it began is not undone.
    pub shutdown: CancellationToken,
    /// Cancelled to bring the drained dispatcher back into the ring (`crate::serve` then
    /// serves a new term, as a process that starts).
    pub undrain: CancellationToken,
}

impl DrainHandle {
    /// How the drain ended, once it has (UNAVAILABLE if the dispatcher stops first).
    async fn drained(&self) -> Result<Drained, Status> {
        let mut state = self.state.clone();
        let drained = state
            .wait_for(|s| matches!(s, DrainState::Drained(_)))
            .await
            .map_err(|_| Status::unavailable("the dispatcher stopped while draining"))?;
        match *drained {
            DrainState::Drained(drained) => Ok(drained),
            _ => unreachable!("waited for Drained"),
        }
    }
}

/// The gRPC service operators call.
#[derive(Debug)]
pub struct OperatorService {
    groups: Arc<GroupTable>,
    guard: Arc<Guard>,
    drain: DrainHandle,
}

impl OperatorService {
    /// A service over `groups` and `drain`, for the callers `guard` admits.
    pub fn new(groups: Arc<GroupTable>, guard: Arc<Guard>, drain: DrainHandle) -> Self {
        Self {
            groups,
            guard,
            drain,
        }
    }

    /// Where the key `text` stands in each group that knows it and whose objects `caller` may
    /// get; with `reconcile`, where this dispatcher serves the key, reconciled there first
    /// (a trigger: it never adds a key).
    async fn key_in_groups(
        &self,
        caller: &Caller,
        text: String,
        reconcile: bool,
    ) -> Result<KeyResponse, Status> {
        let key = RequestKey::parse(&text).map_err(|e| {
            Status::invalid_argument(format!(
                "{text:?} is not a request key (<api-group>/<Kind>/<namespace>/<name>): {e}"
            ))
        })?;
        let slice = self.groups.slice();
        let served =
            slice.serves(&key) && matches!(*self.drain.state.borrow(), DrainState::Serving);
        let mut groups: Vec<KeyInGroup> = Vec::new();
        for group in self.groups.all() {
            if group.key_status(&text).is_none()
                || !self
                    .guard
                    .may_get_in(caller, &group.accesses, &key.namespace)
                    .await?
            {
                continue;
            }
            if reconcile && served {
                info!(caller = %caller.name(), group = %group.id.name, key = %text, "reconcile asked through the operator API");
                group.trigger(std::slice::from_ref(&text), false).await;
            }
            if let Some(status) = group.key_status(&text) {
                groups.push(key_in_group(&group.id, status));
            }
        }
        groups.sort_by(|a, b| (&a.group, &a.owner).cmp(&(&b.group, &b.owner)));
        Ok(KeyResponse {
            dispatcher_id: self.groups.identity().to_owned(),
            ring_owner: slice.ring.owner(&key).unwrap_or_default().to_owned(),
            served,
            groups,
            state: self.state() as i32,
        })
    }

    fn state(&self) -> DispatcherState {
        match *self.drain.state.borrow() {
            DrainState::Draining => DispatcherState::Draining,
            DrainState::Drained(_) => DispatcherState::Drained,
            DrainState::Serving if self.groups.slice().is_settled() => DispatcherState::Serving,
            DrainState::Serving => DispatcherState::Handover,
        }
    }
}

#[tonic::async_trait]
impl operator_server::Operator for OperatorService {
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.guard
            .may_operate(&Caller::of(&request), "get", STATUS_PATH)
            .await?;
        let slice = self.groups.slice();
        let identity = self.groups.identity();
        let mut groups: Vec<GroupStatus> = self
            .groups
            .all()
            .iter()
            .map(|group| {
                let figures = group.figures();
                let replicas = group.replicas();
                GroupStatus {
                    group: group.id.name.clone(),
                    owner: group.id.owner.clone().unwrap_or_default(),
                    sessions: u32::try_from(replicas.len()).unwrap_or(u32::MAX),
                    replicas,
                    keys: figures.queue.keys as u64,
                    ready: figures.queue.ready as u64,
                    in_flight: figures.queue.in_flight as u64,
                    delayed: figures.queue.delayed as u64,
                    backing_off: figures.queue.backing_off as u64,
                    held_deletions: figures.held as u64,
                    longest_in_flight: Some(duration(figures.queue.longest)),
                }
            })
            .collect();
        groups.sort_by(|a, b| (&a.group, &a.owner).cmp(&(&b.group, &b.owner)));
        let state = self.state();
        Ok(Response::new(StatusResponse {
            dispatcher_id: identity.to_owned(),
            version: kube_dispatch_telemetry::version().to_owned(),
            state: state as i32,
            members: slice.ring.members().to_vec(),
            settled_members: slice
                .settled
                .as_ref()
                .map(|r| r.members().to_vec())
                .unwrap_or_default(),
            slice_share: if state == DispatcherState::Drained {
                0.0
            } else {
                slice.ring.share(identity)
            },
            in_flight: groups.iter().map(|g| g.in_flight).sum(),
            groups,
        }))
    }

    async fn key(&self, request: Request<KeyRequest>) -> Result<Response<KeyResponse>, Status> {
        let caller = Caller::of(&request);
        self.guard.may_operate(&caller, "get", STATUS_PATH).await?;
        let text = request.into_inner().key;
        self.key_in_groups(&caller, text, false)
            .await
            .map(Response::new)
    }

    async fn reconcile(
        &self,
        request: Request<ReconcileKeyRequest>,
    ) -> Result<Response<KeyResponse>, Status> {
        let caller = Caller::of(&request);
        self.guard
            .may_operate(&caller, "post", RECONCILE_PATH)
            .await?;
        let text = request.into_inner().key;
        self.key_in_groups(&caller, text, true)
            .await
            .map(Response::new)
    }

    async fn drain(
        &self,
        request: Request<DrainRequest>,
    ) -> Result<Response<DrainResponse>, Status> {
        let caller = Caller::of(&request);
        self.guard.may_operate(&caller, "post", DRAIN_PATH).await?;
        if !self.drain.leases {
            return Err(Status::failed_precondition(
                "this dispatcher's ring is fixed (--members): there is no other member to hand its keys to; stop it instead",
            ));
        }
        if !self.drain.start.is_cancelled() {
            info!(caller = %caller.name(), "drain requested through the operator API");
            self.drain.start.cancel();
        }
        let drained = self.drain.drained().await?;
        Ok(Response::new(DrainResponse {
            dispatcher_id: self.groups.identity().to_owned(),
            clean: drained.in_flight_left == 0,
            in_flight_left: drained.in_flight_left as u64,
            took: Some(duration(drained.took)),
        }))
    }

    async fn undrain(
        &self,
        request: Request<UndrainRequest>,
    ) -> Result<Response<UndrainResponse>, Status> {
        let caller = Caller::of(&request);
        self.guard.may_operate(&caller, "post", DRAIN_PATH).await?;
        if !self.drain.leases {
            return Err(Status::failed_precondition(
                "this dispatcher's ring is fixed (--members): it never drains, so there is nothing to undo",
            ));
        }
        if self.drain.shutdown.is_cancelled() {
            return Err(Status::unavailable(
                "this dispatcher is stopping (SIGTERM): its drain is not undone; the pod that replaces it joins the ring",
            ));
        }
        let answer = |rejoining, holds_for_previous| {
            Response::new(UndrainResponse {
                dispatcher_id: self.groups.identity().to_owned(),
                rejoining,
                holds_for_previous,
            })
        };
        if !self.drain.start.is_cancelled() {
            return Ok(answer(false, false));
        }
        let drained = self.drain.drained().await?;
        info!(
            caller = %caller.name(),
            in_flight_left = drained.in_flight_left,
            "undrain requested through the operator API: rejoining the ring as a process that starts"
        );
        self.drain.undrain.cancel();
        // A SIGTERM that came while it drained, or comes now, wins: the term ends as a stop.
        if self.drain.shutdown.is_cancelled() {
            return Err(Status::unavailable(
                "this dispatcher began stopping (SIGTERM) while it was drained: it will not rejoin",
            ));
        }
        Ok(answer(true, drained.in_flight_left > 0))
    }
}

/// A key's status in `group`, on the wire.
fn key_in_group(group: &GroupId, status: KeyStatus) -> KeyInGroup {
    KeyInGroup {
        group: group.name.clone(),
        owner: group.owner.clone().unwrap_or_default(),
        state: match status.state {
            QueueKeyState::Idle => KeyState::Idle,
            QueueKeyState::Queued => KeyState::Queued,
            QueueKeyState::InFlight => KeyState::InFlight,
            QueueKeyState::BackingOff => KeyState::BackingOff,
            QueueKeyState::RequeueAfter => KeyState::RequeueAfter,
        } as i32,
        replica: status.replica.unwrap_or_default(),
        wait: status.wait.map(duration),
        failures: status.failures,
        changed_in_flight: status.changed_in_flight,
        deleted: status.deleted,
        resource_version: status.resource_version,
        leaving: status.leaving,
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
}
