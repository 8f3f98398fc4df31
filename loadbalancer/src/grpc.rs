//! The `kubedispatch.v1.LoadBalancer` service: registrations checked and answered by the leader,
//! redirected to it by a standby.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_dispatch_proto::v1::{
    Assignment, LeaveRequest, LeaveResponse, RegisterRequest, load_balancer_server::LoadBalancer,
};
use kube_dispatch_server::auth::Caller;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use futures::{Stream, StreamExt};
use std::pin::Pin;

use crate::registry::{MAX_POLLED, RegisterError, Registry};

/// Longest group name or replica id accepted.
const MAX_ID_LEN: usize = 253;

/// Longest dispatcher address (`host:port`) of a registration that is read: a DNS name and a
/// port.
const MAX_ADDRESS_LEN: usize = 259;

type AssignmentStream = Pin<Box<dyn Stream<Item = Result<Assignment, Status>> + Send>>;

pub(crate) struct Service {
    pub(crate) registry: Arc<Registry>,
    pub(crate) leading: watch::Receiver<bool>,
    pub(crate) leases: Api<Lease>,
    pub(crate) lease_name: String,
    pub(crate) identity: String,
    /// The leader as last read, and when: a standby reads the leader Lease at most once per
    /// [`LEADER_TTL`], however many replicas register with it (one read at a time).
    pub(crate) leader: tokio::sync::Mutex<Option<(String, Instant)>>,
}

/// How long a standby trusts the leader it read from the Lease.
const LEADER_TTL: Duration = Duration::from_secs(1);

#[tonic::async_trait]
impl LoadBalancer for Service {
    type RegisterStream = AssignmentStream;

    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<Self::RegisterStream>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        check_ids(&req.group, &req.replica_id)?;
        if !*self.leading.borrow() {
            match self.leader().await? {
                Holder::Other(leader) => {
                    let redirect = Assignment {
                        leader,
                        ..Assignment::default()
                    };
                    return Ok(Response::new(
                        futures::stream::once(async { Ok(redirect) }).boxed(),
                    ));
                }
                // The Lease names this replica already and its election is about to say so:
                // turned away, the replica would back off for longer than that takes.
                Holder::Me => {
                    let mut leading = self.leading.clone();
                    let now_leading = tokio::time::timeout(LEADER_TTL, leading.wait_for(|l| *l));
                    if !matches!(now_leading.await, Ok(Ok(_))) {
                        return Err(no_leader());
                    }
                }
            }
        }
        let (assignment, guard) = self
            .registry
            .register(
                &req.group,
                &req.replica_id,
                caller.identity().map(|i| i.username.as_str()),
                &polled(req.dispatchers),
            )
            .map_err(|e| match e {
                RegisterError::Full(_) | RegisterError::FullForIdentity { .. } => {
                    Status::resource_exhausted(e.to_string())
                }
                RegisterError::NotOwner(_) | RegisterError::ReplicaOfAnother { .. } => {
                    Status::permission_denied(e.to_string())
                }
            })?;
        let mut leading = self.leading.clone();
        // The stream ends when this replica stops leading, or when the registration is dropped.
        // Nothing is sent before the replica is placed (generation 0, while the registry
        // settles): it keeps polling what it was assigned last.
        let stream = tokio_stream::wrappers::WatchStream::new(assignment)
            .filter(|a| futures::future::ready(a.generation > 0))
            .take_until(async move {
                let _ = leading.wait_for(|l| !*l).await;
            })
            .map(move |a| {
                let _registered = &guard;
                Ok(a)
            });
        Ok(Response::new(stream.boxed()))
    }

    async fn leave(
        &self,
        request: Request<LeaveRequest>,
    ) -> Result<Response<LeaveResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        check_ids(&req.group, &req.replica_id)?;
        if !*self.leading.borrow() {
            return Err(Status::failed_precondition(
                "this load balancer does not lead; the leader forgets the replica after its grace",
            ));
        }
        let removed = self
            .registry
            .leave(
                &req.group,
                &req.replica_id,
                caller.identity().map(|i| i.username.as_str()),
            )
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        Ok(Response::new(LeaveResponse { removed }))
    }
}

/// INVALID_ARGUMENT unless the group and the replica id are 1 to [`MAX_ID_LEN`] characters.
fn check_ids(group: &str, replica_id: &str) -> Result<(), Status> {
    for (field, value) in [("group", group), ("replica_id", replica_id)] {
        if value.is_empty() || value.len() > MAX_ID_LEN {
            return Err(Status::invalid_argument(format!(
                "{field} must be 1 to {MAX_ID_LEN} characters long"
            )));
        }
    }
    Ok(())
}

/// The dispatchers a registration says its replica polls, as far as they are read: the first
/// [`MAX_POLLED`] of at most [`MAX_ADDRESS_LEN`] bytes. A hint, so never a reason to refuse.
fn polled(dispatchers: Vec<String>) -> Vec<String> {
    dispatchers
        .into_iter()
        .filter(|d| d.len() <= MAX_ADDRESS_LEN)
        .take(MAX_POLLED)
        .collect()
}

impl Service {
    /// Who holds the leader Lease, read from it at most once per [`LEADER_TTL`] when another
    /// replica does.
    async fn leader(&self) -> Result<Holder, Status> {
        let mut cached = self.leader.lock().await;
        if let Some((leader, at)) = &*cached
            && at.elapsed() < LEADER_TTL
        {
            return Ok(Holder::Other(leader.clone()));
        }
        let holder = self.read_leader().await?;
        if let Holder::Other(leader) = &holder {
            *cached = Some((leader.clone(), Instant::now()));
        }
        Ok(holder)
    }

    /// Who holds the leader Lease, as it says now.
    async fn read_leader(&self) -> Result<Holder, Status> {
        let lease = self
            .leases
            .get_opt(&self.lease_name)
            .await
            .map_err(|e| Status::unavailable(format!("cannot read the leader Lease: {e}")))?;
        match lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
        {
            Some(holder) if holder == self.identity => Ok(Holder::Me),
            Some(holder) => Ok(Holder::Other(holder)),
            None => Err(no_leader()),
        }
    }
}

/// The holder of the leader Lease, as a replica that does not lead sees it.
enum Holder {
    /// Another replica, at this address.
    Other(String),
    /// This replica: its election has taken the Lease and is about to say so.
    Me,
}

fn no_leader() -> Status {
    Status::unavailable(
        "no load balancer leads right now; keep polling the dispatchers you have and retry",
    )
}
