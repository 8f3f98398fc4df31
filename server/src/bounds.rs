//! The bounds every kube-dispatch gRPC server holds at the transport, before a call reaches a
//! service, and what happens when one bites. The threat table in
//! `proto/kubedispatch/v1/security.md` names who each bound holds.
//!
//! | bound | default | past it |
//! | --- | --- | --- |
//! | connections in all ([`ServerLimits::max_connections`]) | 4096 | a new connection is closed at once |
//! | connections from one peer address ([`ServerLimits::max_connections_per_peer`]) | 128 | that peer's new connection is closed at once |
//! | calls at once on one connection ([`ServerLimits::max_streams_per_connection`]) | 128 | HTTP/2 refuses the stream (REFUSED_STREAM) |
//! | calls at once that need no credential, over all peers ([`ServerLimits::max_unauthenticated_calls`]) | 64 | RESOURCE_EXHAUSTED |
//! | a call's time to its answer ([`ServerLimits::request_timeout`]) | 2 min | the call ends CANCELLED |
//! | a connection's age ([`ServerLimits::max_connection_age`]) | 30 min | GOAWAY: calls finish, new ones go on a new connection |
//! | a silent peer (HTTP/2 keepalive) | ping after 30 s, answer within 10 s | the connection is closed |
//! | request headers | 16 KiB | the stream is refused |
//!
//! Each refusal counts in `kube_dispatch_refused_total{bound}` and is logged once per bound and
//! peer (or identity) every [`kube_dispatch_telemetry::metrics::LOG_EVERY`], never once per request: a flood
//! cannot flood the logs too ([`Refusals`]). The flags are [`crate::flags::ServerFlags`].

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tonic::transport::server::Server;

pub use kube_dispatch_telemetry::metrics::Refusals;

/// The transport bounds of one server, set by [`crate::flags::ServerFlags`]. The defaults are the flags'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most connections open at once, from all peers.
    pub max_connections: usize,
    /// Most connections open at once from one peer address.
    pub max_connections_per_peer: usize,
    /// Most calls (HTTP/2 streams) at once on one connection.
    pub max_streams_per_connection: u32,
    /// Most calls at once that carry no credential (grpc.health.v1), over all peers.
    pub max_unauthenticated_calls: usize,
    /// Longest a call may take to its answer (a long-poll's wait is far shorter).
    pub request_timeout: Duration,
    /// A connection older than this is asked to go away (GOAWAY): its calls finish, and new
    /// ones go on a new connection.
    pub max_connection_age: Duration,
    /// An idle connection is pinged after this long, and closed if the ping is not answered
    /// within [`Self::keepalive_timeout`].
    pub keepalive_interval: Duration,
    /// See [`Self::keepalive_interval`].
    pub keepalive_timeout: Duration,
    /// Largest request headers accepted, in bytes.
    pub max_header_bytes: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_peer: 128,
            max_streams_per_connection: 128,
            max_unauthenticated_calls: 64,
            request_timeout: Duration::from_secs(120),
            max_connection_age: Duration::from_secs(30 * 60),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
        }
    }
}

impl ServerLimits {
    /// A tonic server builder that holds these bounds on every connection.
    pub fn server(&self) -> Server {
        Server::builder()
            .max_concurrent_streams(self.max_streams_per_connection)
            .timeout(self.request_timeout)
            // Without a grace, tonic asks the connection to go away (GOAWAY) at its age and
            // lets its calls finish; with one it closes it at age + grace without a GOAWAY,
            // cutting the calls in flight.
            .max_connection_age(self.max_connection_age)
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
            .http2_max_header_list_size(self.max_header_bytes)
            // Streams a peer opens and resets before they are answered (the "rapid reset"
            // attack) count against this, then the connection is closed.
            .http2_max_pending_accept_reset_streams(Some(64))
    }
}

/// The connections open now, in all and per peer address, held within
/// [`ServerLimits::max_connections`] and [`ServerLimits::max_connections_per_peer`]. The map
/// holds an entry only for peers with a connection open, so it is bounded by the first.
#[derive(Debug)]
pub struct Connections {
    limits: ServerLimits,
    refusals: Refusals,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One connection admitted by [`Connections::admit`]; dropping it frees its place.
#[derive(Debug)]
pub struct ConnectionPermit {
    connections: Arc<Connections>,
    peer: IpAddr,
}

impl Connections {
    /// Connections held within `limits`; refusals counted in `refusals`.
    pub fn new(limits: ServerLimits, refusals: Refusals) -> Arc<Self> {
        Arc::new(Self {
            limits,
            refusals,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A place for a new connection from `peer`, or `None` (then close it) when this server
    /// or that peer is at its bound.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionPermit> {
        let refused = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            let (total, per_peer) = &mut *open;
            let of_peer = per_peer.get(&peer).copied().unwrap_or(0);
            if *total >= self.limits.max_connections {
                Some(("connections", self.limits.max_connections))
            } else if of_peer >= self.limits.max_connections_per_peer {
                Some(("connections_per_peer", self.limits.max_connections_per_peer))
            } else {
                *total += 1;
                per_peer.insert(peer, of_peer + 1);
                None
            }
        };
        if let Some((bound, limit)) = refused {
            self.refusals.refused(
                bound,
                &peer.to_string(),
                &format!("at most {limit} connections; new ones are closed"),
            );
            return None;
        }
        Some(ConnectionPermit {
            connections: self.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (total, per_peer) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(n) = per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_held_per_peer_and_in_all() {
        let limits = ServerLimits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..ServerLimits::default()
        };
        let refusals = Refusals::unregistered();
        let connections = Connections::new(limits, refusals.clone());
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let a1 = connections.admit(a).expect("first of a");
        let _a2 = connections.admit(a).expect("second of a");
        assert!(connections.admit(a).is_none(), "a is at its bound");
        assert_eq!(refusals.count("connections_per_peer"), 1);
        let _b1 = connections.admit(b).expect("b is not a");
        assert!(connections.admit(c).is_none(), "the server is full");
        assert_eq!(refusals.count("connections"), 1);
        drop(a1);
        assert_eq!(connections.open(), 2);
        let _c1 = connections.admit(c).expect("a place was freed");
        assert_eq!(connections.open.lock().unwrap().1.len(), 3);
    }

    #[test]
    fn peers_with_nothing_open_are_forgotten() {
        let connections = Connections::new(ServerLimits::default(), Refusals::unregistered());
        for i in 0..1000u32 {
            let peer = IpAddr::from(i.to_be_bytes());
            drop(connections.admit(peer));
        }
        assert_eq!(connections.open(), 0);
        assert!(connections.open.lock().unwrap().1.is_empty());
    }
}
