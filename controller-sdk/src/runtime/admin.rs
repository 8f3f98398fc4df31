//! The admin endpoint: `/metrics`, `/healthz` and `/readyz`, one per address for the whole
//! process. Controllers of one process that name the same address share it, as the controllers
//! of one controller-runtime manager share its probes: `/readyz` answers ready only while every
//! one of them has a dispatcher session open, and otherwise names the first that has none.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Mutex, PoisonError},
};

use kube_dispatch_telemetry::admin::{self, Readiness, Status};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::Health;

/// One served address: what its `/readyz` answers, and the controllers it answers for.
struct Endpoint {
    readiness: Readiness,
    members: Vec<(String, Health)>,
}

/// The endpoints this process serves, by address. Bound: one per address its controllers name,
/// each with the controllers that named it and have not stopped.
static ENDPOINTS: Mutex<BTreeMap<SocketAddr, Endpoint>> = Mutex::new(BTreeMap::new());

/// Serves the admin endpoint on `address` for as long as the process runs (liveness holds
/// through the drain), or joins the controller of `group` to the one already served there.
pub(super) fn serve(address: SocketAddr, group: &str, health: &Health) {
    let mut endpoints = ENDPOINTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(endpoint) = endpoints.get_mut(&address) {
        // A controller of the process that stopped (and, say, was started again) no longer
        // holds the endpoint back.
        endpoint.members.retain(|(_, member)| member.live());
        endpoint.members.push((group.to_owned(), health.clone()));
        info!(%address, group, "admin endpoint shared with the process's other controllers");
    } else {
        let listener = match std::net::TcpListener::bind(address)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
        {
            Ok(listener) => listener,
            Err(error) => {
                error!(%address, %error, "cannot serve the admin endpoint (metrics and probes)");
                return;
            }
        };
        info!(%address, "admin endpoint: /metrics, /healthz, /readyz");
        let readiness = Readiness::new("starting");
        tokio::spawn(admin::serve(
            listener,
            readiness.clone(),
            crate::metrics::registry().clone(),
            CancellationToken::new(),
        ));
        let members = vec![(group.to_owned(), health.clone())];
        endpoints.insert(address, Endpoint { readiness, members });
    }
    drop(endpoints);
    let mut changes = health.readiness().subscribe();
    tokio::spawn(async move {
        loop {
            answer(address);
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
}

/// Sets what `address`'s `/readyz` answers from its controllers' readiness.
fn answer(address: SocketAddr) {
    let endpoints = ENDPOINTS.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(endpoint) = endpoints.get(&address) else {
        return;
    };
    let not_ready =
        endpoint
            .members
            .iter()
            .find_map(|(group, member)| match member.readiness().status() {
                Status::Ready => None,
                Status::NotReady(why) if endpoint.members.len() == 1 => Some(why),
                Status::NotReady(why) => Some(format!("controller {group}: {why}")),
            });
    match not_ready {
        None => endpoint.readiness.ready(),
        Some(why) => endpoint.readiness.not_ready(why),
    }
}
