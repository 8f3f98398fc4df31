//! Which dispatchers a replica polls: a fixed list, or what the load balancer assigns it.

use std::{collections::BTreeSet, time::Duration};

use kube_dispatch_proto::v1::{RegisterRequest, load_balancer_client::LoadBalancerClient};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tracing::{info, warn};

use crate::runtime::reconnect_backoff;

/// The load balancer's address when none is configured: its Service as `deploy/` installs it.
pub const DEFAULT_LOAD_BALANCER: &str = "http://kube-dispatch-loadbalancer.kube-dispatch.svc:7071";

/// Where a replica learns its dispatchers.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// These, always.
    Fixed(BTreeSet<String>),
    /// Whatever the load balancer at this address assigns.
    LoadBalancer(String),
}

impl Source {
    /// Fixed dispatchers if any were given, else the load balancer configured, else the one
    /// named by `KD_LOADBALANCER`, else [`DEFAULT_LOAD_BALANCER`].
    pub(crate) fn new(dispatchers: Vec<String>, load_balancer: Option<String>) -> Self {
        if !dispatchers.is_empty() {
            return Self::Fixed(dispatchers.into_iter().map(|a| with_scheme(&a)).collect());
        }
        let address = load_balancer
            .or_else(|| std::env::var("KD_LOADBALANCER").ok())
            .unwrap_or_else(|| DEFAULT_LOAD_BALANCER.to_owned());
        Self::LoadBalancer(with_scheme(&address))
    }
}

/// `http://` in front of a bare `host:port`.
pub(crate) fn with_scheme(address: &str) -> String {
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

enum Ended {
    /// A standby named the leader.
    Redirect(String),
    /// The stream ended (the leader stepped down) or the replica is stopping.
    Closed,
}

/// Registers with the load balancer at `address` and publishes each assignment on `targets`,
/// until `stop`. Follows redirects to the leader; when no load balancer can be reached, the
/// last assignment stays in force (the replica keeps polling what it has) while it retries.
pub(crate) async fn follow_load_balancer(
    address: String,
    request: RegisterRequest,
    targets: watch::Sender<BTreeSet<String>>,
    stop: CancellationToken,
) {
    let mut backoff = reconnect_backoff();
    let mut current = address.clone();
    let mut redirects = 0u32;
    while !stop.is_cancelled() {
        let delay = match register(&current, &request, &targets, &stop).await {
            Ok((Ended::Redirect(leader), _)) if redirects < 3 => {
                redirects += 1;
                info!(load_balancer = %leader, "redirected to the leading load balancer");
                current = with_scheme(&leader);
                continue;
            }
            Ok((Ended::Redirect(leader), _)) => {
                warn!(load_balancer = %leader, "redirected again and again; backing off");
                current = address.clone();
                backoff.next()
            }
            Ok((Ended::Closed, assigned)) => {
                current = address.clone();
                if assigned {
                    backoff = reconnect_backoff();
                    redirects = 0;
                }
                info!("load balancer ended the registration; registering again");
                backoff.next()
            }
            Err(status) => {
                current = address.clone();
                let delay = backoff.next();
                warn!(%status, ?delay, dispatchers = ?*targets.borrow(), "cannot register with the load balancer; polling the dispatchers assigned last");
                delay
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(delay.unwrap_or(Duration::from_secs(30))) => {}
        }
    }
}

/// One registration stream. Returns how it ended and whether it delivered an assignment.
async fn register(
    address: &str,
    request: &RegisterRequest,
    targets: &watch::Sender<BTreeSet<String>>,
    stop: &CancellationToken,
) -> Result<(Ended, bool), tonic::Status> {
    let channel = Endpoint::from_shared(address.to_owned())
        .map_err(|e| tonic::Status::invalid_argument(format!("bad load balancer address: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        // A leader that vanishes without closing the connection is noticed within seconds.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("cannot connect to {address}: {e}")))?;
    let mut stream = LoadBalancerClient::new(channel)
        .register(request.clone())
        .await?
        .into_inner();
    let mut assigned = false;
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return Ok((Ended::Closed, assigned)),
            m = stream.message() => m?,
        };
        let Some(assignment) = message else {
            return Ok((Ended::Closed, assigned));
        };
        if !assignment.leader.is_empty() {
            return Ok((Ended::Redirect(assignment.leader), assigned));
        }
        assigned = true;
        let set: BTreeSet<String> = assignment
            .dispatchers
            .iter()
            .map(|a| with_scheme(a))
            .collect();
        info!(generation = assignment.generation, dispatchers = ?set, "assigned dispatchers");
        targets.send_replace(set);
    }
}
