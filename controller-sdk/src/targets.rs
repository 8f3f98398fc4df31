//! Which dispatchers a replica polls: a fixed list, or what the load balancer assigns it.

use std::{collections::BTreeSet, time::Duration};

use kube_dispatch_proto::{
    credentials::{AuthChannel, Credentials},
    v1::{LeaveRequest, RegisterRequest, load_balancer_client::LoadBalancerClient},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    discovery::{DispatcherService, Registration, keep_targets},
    reconnect::Reconnects,
};

/// The load balancer's address when none is configured: its Service as `deploy/` installs it.
pub const DEFAULT_LOAD_BALANCER: &str = "kube-dispatch-loadbalancer.kube-dispatch.svc:7071";

/// Where a replica learns its dispatchers.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// These, always.
    Fixed(BTreeSet<String>),
    /// Whatever the load balancer at this address assigns, and, while none answers, what the
    /// dispatcher Service names besides, if one is given.
    LoadBalancer(String, Option<DispatcherService>),
}

/// What a controller was told about where its dispatchers are.
#[derive(Clone, Debug, Default)]
pub(crate) struct Finding {
    /// Polled always, instead of asking a load balancer, when not empty.
    pub(crate) dispatchers: Vec<String>,
    pub(crate) load_balancer: Option<String>,
    /// Looked up while no load balancer answers.
    pub(crate) service: Option<DispatcherService>,
}

impl Source {
    /// Fixed dispatchers if any were given, else the load balancer configured, else the one
    /// named by `KD_LOADBALANCER`, else [`DEFAULT_LOAD_BALANCER`]; with it the dispatcher
    /// Service configured, else the one named by `KD_DISPATCHER_SERVICE`, else none.
    pub(crate) fn new(finding: Finding) -> Self {
        if !finding.dispatchers.is_empty() {
            return Self::Fixed(finding.dispatchers.into_iter().collect());
        }
        let address = finding
            .load_balancer
            .or_else(|| std::env::var("KD_LOADBALANCER").ok())
            .unwrap_or_else(|| DEFAULT_LOAD_BALANCER.to_owned());
        Self::LoadBalancer(
            address,
            finding.service.or_else(DispatcherService::from_env),
        )
    }
}

enum Ended {
    /// A standby named the leader.
    Redirect(String),
    /// The stream ended (the leader stepped down) or the replica is stopping.
    Closed,
}

/// Most redirects followed one after another before backing off: a leader that has just stepped
/// down may point back at a standby for a moment.
const MAX_REDIRECTS: u32 = 3;

/// Registers with the load balancer at `address` and publishes each assignment on `targets`,
/// until `stop`. Follows redirects to the leader (up to [`MAX_REDIRECTS`] in a row, then backs
/// off and starts again from `address`); when no load balancer can be reached, the last
/// assignment stays in force (the replica keeps polling what it has) while it retries, and the
/// dispatchers `service` names are added to it after a while (`discovery`).
pub(crate) async fn follow_load_balancer(
    address: String,
    credentials: Credentials,
    request: RegisterRequest,
    service: Option<DispatcherService>,
    targets: watch::Sender<BTreeSet<String>>,
    stop: CancellationToken,
) {
    let (registration, registered) = watch::channel(Registration::default());
    tokio::join!(
        keep_targets(registered, service, &targets, &stop),
        follow(
            address,
            credentials,
            request,
            &registration,
            &targets,
            &stop
        ),
    );
}

/// The registration loop of [`follow_load_balancer`]: publishes each assignment on
/// `registration`, naming in each registration the dispatchers assigned last (`targets` is what
/// the replica polls, for its logs).
async fn follow(
    address: String,
    credentials: Credentials,
    request: RegisterRequest,
    registration: &watch::Sender<Registration>,
    targets: &watch::Sender<BTreeSet<String>>,
    stop: &CancellationToken,
) {
    // The load balancer's certificate is its own, verified under the name it is dialled by,
    // on its leader too.
    let credentials = credentials.for_load_balancer(&address);
    let mut reconnects = Reconnects::new();
    let mut current = address.clone();
    let mut redirects = 0u32;
    while !stop.is_cancelled() {
        let mut assigned = false;
        let ended = register(
            &credentials,
            &current,
            &request,
            registration,
            stop,
            &mut assigned,
        )
        .await;
        registration.send_if_modified(|r| std::mem::replace(&mut r.registered, false));
        if stop.is_cancelled() {
            return;
        }
        let delay = match ended {
            Ok(Ended::Redirect(leader)) if redirects < MAX_REDIRECTS => {
                redirects += 1;
                info!(load_balancer = %leader, "redirected to the leading load balancer");
                current = leader;
                continue;
            }
            Ok(Ended::Redirect(leader)) => {
                warn!(load_balancer = %leader, "redirected again and again; backing off");
                reconnects.next(assigned)
            }
            Ok(Ended::Closed) => {
                info!("load balancer ended the registration; registering again");
                reconnects.next(assigned)
            }
            Err(status) => {
                // A registration that delivered an assignment worked, however it ended.
                let delay = reconnects.next(assigned);
                warn!(%status, ?delay, dispatchers = ?*targets.borrow(), "cannot register with the load balancer; polling the dispatchers assigned last");
                delay
            }
        };
        // After a pause, start again from the configured address, which names today's leader
        // (a Service in front of every load balancer, or a standby that redirects), with a fresh
        // count of redirects: a leader that could not be reached a moment ago may be up now.
        current = address.clone();
        redirects = 0;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// One registration stream, naming the dispatchers assigned last and publishing each
/// assignment on `registration`. Returns how it ended; `assigned` is set once it delivers an
/// assignment (an error after that still leaves it set).
async fn register(
    credentials: &Credentials,
    address: &str,
    request: &RegisterRequest,
    registration: &watch::Sender<Registration>,
    stop: &CancellationToken,
    assigned: &mut bool,
) -> Result<Ended, tonic::Status> {
    let endpoint = credentials
        .endpoint(address)
        .map_err(|e| tonic::Status::invalid_argument(format!("load balancer: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        // A leader that vanishes without closing the connection is noticed within seconds.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let connect = endpoint.connect();
    // Not registered yet: nothing to take leave of when stopped meanwhile.
    let channel = tokio::select! {
        () = stop.cancelled() => return Ok(Ended::Closed),
        c = connect => c.map_err(|e| tonic::Status::unavailable(format!("cannot connect to {address}: {e}")))?,
    };
    let mut client: LoadBalancerClient<AuthChannel> =
        LoadBalancerClient::with_interceptor(channel, credentials.bearer());
    // With the dispatchers assigned last: a load balancer that has just become the leader
    // places this replica there, so a change of leader moves no session. Not those found in the
    // dispatcher Service meanwhile, which every replica would name: the hint would be lost.
    // (The load balancer reads the first 64.)
    let register = RegisterRequest {
        dispatchers: registration
            .borrow()
            .dispatchers
            .iter()
            .take(64)
            .cloned()
            .collect(),
        ..request.clone()
    };
    let mut stream = tokio::select! {
        () = stop.cancelled() => return Ok(Ended::Closed),
        s = client.register(register) => s?.into_inner(),
    };
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => {
                leave(&mut client, request).await;
                return Ok(Ended::Closed);
            }
            m = stream.message() => m?,
        };
        let Some(assignment) = message else {
            return Ok(Ended::Closed);
        };
        if !assignment.leader.is_empty() {
            return Ok(Ended::Redirect(assignment.leader));
        }
        *assigned = true;
        let set: BTreeSet<String> = assignment.dispatchers.iter().cloned().collect();
        info!(generation = assignment.generation, dispatchers = ?set, "assigned dispatchers");
        registration.send_modify(|r| r.assigned(set));
    }
}

/// How long a replica that shuts down waits for the load balancer to take its leave.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Tells the load balancer this replica is shutting down, so its dispatchers go to the other
/// replicas now rather than after the load balancer's grace. Best effort: without an answer
/// the grace still applies.
async fn leave(client: &mut LoadBalancerClient<AuthChannel>, request: &RegisterRequest) {
    let leave = LeaveRequest {
        group: request.group.clone(),
        replica_id: request.replica_id.clone(),
    };
    match tokio::time::timeout(LEAVE_TIMEOUT, client.leave(leave)).await {
        Ok(Ok(_)) => info!("left the load balancer: its dispatchers go to the other replicas"),
        Ok(Err(status)) => {
            warn!(%status, "the load balancer did not take the leave; it frees this replica's dispatchers after its grace");
        }
        Err(_) => {
            warn!(timeout = ?LEAVE_TIMEOUT, "the load balancer did not answer the leave; it frees this replica's dispatchers after its grace");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::SocketAddr,
        pin::Pin,
        sync::{
            Arc,
            atomic::{AtomicU32, Ordering},
        },
    };

    use futures::{Stream, StreamExt};
    use kube_dispatch_proto::v1::{
        Assignment, LeaveResponse,
        load_balancer_server::{LoadBalancer, LoadBalancerServer},
    };
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic::{Request, Response, Status};

    use super::*;

    /// A load balancer that refuses its first `refuse` registrations as unavailable, then
    /// answers each with `answer` and keeps the stream open.
    struct Fake {
        refuse: u32,
        calls: Arc<AtomicU32>,
        answer: Assignment,
        /// The replica ids that left.
        left: Arc<std::sync::Mutex<Vec<String>>>,
    }

    #[tonic::async_trait]
    impl LoadBalancer for Fake {
        type RegisterStream = Pin<Box<dyn Stream<Item = Result<Assignment, Status>> + Send>>;

        async fn register(
            &self,
            _: Request<RegisterRequest>,
        ) -> Result<Response<Self::RegisterStream>, Status> {
            if self.calls.fetch_add(1, Ordering::SeqCst) < self.refuse {
                return Err(Status::unavailable("starting"));
            }
            let answers = futures::stream::iter([Ok(self.answer.clone())]);
            Ok(Response::new(Box::pin(
                answers.chain(futures::stream::pending()),
            )))
        }

        async fn leave(
            &self,
            request: Request<LeaveRequest>,
        ) -> Result<Response<LeaveResponse>, Status> {
            let mut left = self.left.lock().expect("not poisoned");
            left.push(request.into_inner().replica_id);
            Ok(Response::new(LeaveResponse { removed: true }))
        }
    }

    /// Serves `fake` on a loopback port until `stop`.
    async fn serve(fake: Fake, stop: &CancellationToken) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let address = listener.local_addr().expect("local address");
        let stop = stop.clone();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(LoadBalancerServer::new(fake))
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(listener),
                    stop.cancelled_owned(),
                ),
        );
        address
    }

    /// The configured address is a standby that names the leader, and the leader refuses more
    /// registrations than redirects are followed in a row (it is still starting). The replica
    /// must keep coming back to it after each pause, and get its assignment once the leader
    /// answers. It used to count redirects across pauses and, past the limit, never follow one
    /// again: replicas stayed on their old dispatchers for good, and a dispatcher that joined
    /// meanwhile got no session.
    #[tokio::test]
    async fn a_replica_reaches_a_leader_that_refused_it_at_first() {
        let stop = CancellationToken::new();
        let leader_calls = Arc::new(AtomicU32::new(0));
        let left: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let leader = Fake {
            refuse: MAX_REDIRECTS + 1,
            calls: leader_calls.clone(),
            left: left.clone(),
            answer: Assignment {
                dispatchers: vec!["127.0.0.1:7070".into()],
                generation: 1,
                ..Default::default()
            },
        };
        let leader = serve(leader, &stop).await;
        let standby_left: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let standby = Fake {
            refuse: 0,
            calls: Arc::default(),
            left: standby_left.clone(),
            answer: Assignment {
                leader: leader.to_string(),
                ..Default::default()
            },
        };
        let standby = serve(standby, &stop).await;
        let (targets, mut assigned) = watch::channel(BTreeSet::new());
        let follow = tokio::spawn(follow_load_balancer(
            standby.to_string(),
            Credentials::plaintext(),
            RegisterRequest {
                group: "g".into(),
                replica_id: "r1".into(),
                dispatchers: Vec::new(),
            },
            None,
            targets,
            stop.clone(),
        ));
        let reached = tokio::time::timeout(
            Duration::from_secs(30),
            assigned.wait_for(|dispatchers| !dispatchers.is_empty()),
        )
        .await
        .map(|got| got.map(|dispatchers| dispatchers.clone()));
        let calls = leader_calls.load(Ordering::SeqCst);
        let Ok(Ok(dispatchers)) = reached else {
            panic!("no assignment within 30 s; the leader was asked {calls} times");
        };
        assert_eq!(dispatchers, BTreeSet::from(["127.0.0.1:7070".to_owned()]));
        assert_eq!(calls, MAX_REDIRECTS + 2);
        stop.cancel();
        follow.await.expect("the registration task ends on stop");
        // Shutting down, the replica took its leave of the leader it was registered with.
        assert_eq!(*left.lock().unwrap(), ["r1"]);
        assert!(standby_left.lock().unwrap().is_empty());
    }
}
