//! The bounds every kube-dispatch gRPC server holds at the transport, before a call reaches a
//! service, and what happens when one bites. The threat table in
//! `proto/kubedispatch/v1/security.md` names who each bound holds.
//!
//! | bound | default | past it |
//! | --- | --- | --- |
//! | connections in all ([`ServerLimits::max_connections`]) | 4096 | a new connection is closed at once |
//! | connections from one peer address ([`ServerLimits::max_connections_per_peer`]) | 128 | that peer's new connection is closed at once |
//! | TLS handshakes in progress ([`MAX_HANDSHAKES`]), from one peer address ([`MAX_HANDSHAKES_PER_PEER`]) | 256, 8 | the new connection is closed at once: peers that stall handshakes hold at most 8 places each, each for at most 2 s (the TLS module's `HANDSHAKE_TIMEOUT`) |
//! | a connection that says nothing after its handshake (the TLS module's `FIRST_BYTES_TIMEOUT`) | 2 s | the connection is closed |
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

/// Most TLS handshakes in progress at once on one listener.
pub const MAX_HANDSHAKES: usize = 256;
/// Most TLS handshakes in progress at once from one peer address: a client has one or two.
pub const MAX_HANDSHAKES_PER_PEER: usize = 8;

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

/// Places held now, in all and per peer address, within a bound on each. The map holds an
/// entry only for peers that hold a place, so it is bounded by the first bound.
#[derive(Debug)]
struct Places {
    /// What the places are for, and the refusals' bound names: in all, and per peer.
    what: &'static str,
    bounds: [&'static str; 2],
    /// Most places in all, and per peer.
    limits: [usize; 2],
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

impl Places {
    fn new(what: &'static str, bounds: [&'static str; 2], limits: [usize; 2]) -> Self {
        Self {
            what,
            bounds,
            limits,
            held: Mutex::new((0, HashMap::new())),
        }
    }

    /// Takes a place for `peer`, or counts and logs the refusal in `refusals`.
    fn take(&self, peer: IpAddr, refusals: &Refusals) -> bool {
        let refused = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let (total, per_peer) = &mut *held;
            let of_peer = per_peer.get(&peer).copied().unwrap_or(0);
            if *total >= self.limits[0] {
                Some(0)
            } else if of_peer >= self.limits[1] {
                Some(1)
            } else {
                *total += 1;
                per_peer.insert(peer, of_peer + 1);
                None
            }
        };
        if let Some(i) = refused {
            let scope = if i == 0 { "" } else { " from one address" };
            refusals.refused(
                self.bounds[i],
                &peer.to_string(),
                &format!(
                    "at most {} {}{scope}; new connections are closed",
                    self.limits[i], self.what
                ),
            );
        }
        refused.is_none()
    }

    /// Frees a place of `peer`.
    fn give_back(&self, peer: IpAddr) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_peer) = &mut *held;
        *total = total.saturating_sub(1);
        if let Some(n) = per_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&peer);
            }
        }
    }

    fn total(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

/// The connections open now and the TLS handshakes in progress, in all and per peer address,
/// held within [`ServerLimits::max_connections`] and
/// [`ServerLimits::max_connections_per_peer`], and [`MAX_HANDSHAKES`] and
/// [`MAX_HANDSHAKES_PER_PEER`].
#[derive(Debug)]
pub struct Connections {
    refusals: Refusals,
    open: Places,
    handshakes: Places,
}

/// One connection admitted by [`Connections::admit`]; dropping it frees its place.
#[derive(Debug)]
pub struct ConnectionPermit {
    connections: Arc<Connections>,
    peer: IpAddr,
}

/// One TLS handshake let start by [`Connections::handshake`]; dropping it frees its place.
#[derive(Debug)]
pub struct HandshakePermit {
    connections: Arc<Connections>,
    peer: IpAddr,
}

impl Connections {
    /// Connections held within `limits`; refusals counted in `refusals`.
    pub fn new(limits: ServerLimits, refusals: Refusals) -> Arc<Self> {
        Arc::new(Self {
            refusals,
            open: Places::new(
                "connections",
                ["connections", "connections_per_peer"],
                [limits.max_connections, limits.max_connections_per_peer],
            ),
            handshakes: Places::new(
                "TLS handshakes in progress",
                ["handshakes", "handshakes_per_peer"],
                [MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER],
            ),
        })
    }

    /// A place for a new connection from `peer`, or `None` (then close it) when this server
    /// or that peer is at its bound.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionPermit> {
        self.open
            .take(peer, &self.refusals)
            .then(|| ConnectionPermit {
                connections: self.clone(),
                peer,
            })
    }

    /// A place for a TLS handshake with `peer`, or `None` (then close the connection) when
    /// this server or that peer has as many in progress as allowed: peers that stall their
    /// handshakes cannot take every place from the others.
    pub fn handshake(self: &Arc<Self>, peer: IpAddr) -> Option<HandshakePermit> {
        self.handshakes
            .take(peer, &self.refusals)
            .then(|| HandshakePermit {
                connections: self.clone(),
                peer,
            })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.total()
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.connections.open.give_back(self.peer);
    }
}

impl Drop for HandshakePermit {
    fn drop(&mut self) {
        self.connections.handshakes.give_back(self.peer);
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
        assert_eq!(connections.open.held.lock().unwrap().1.len(), 3);
    }

    #[test]
    fn handshakes_are_held_per_peer_and_in_all() {
        let refusals = Refusals::unregistered();
        let connections = Connections::new(ServerLimits::default(), refusals.clone());
        let stalling: IpAddr = "10.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..MAX_HANDSHAKES_PER_PEER)
            .map(|_| {
                connections
                    .handshake(stalling)
                    .expect("within the peer's bound")
            })
            .collect();
        assert!(connections.handshake(stalling).is_none());
        assert_eq!(refusals.count("handshakes_per_peer"), 1);
        // Others still get a place, until the server's bound.
        let mut others = Vec::new();
        for i in 2..=255u8 {
            match connections.handshake(IpAddr::from([10, 0, 0, i])) {
                Some(p) => others.push(p),
                None => break,
            }
        }
        assert_eq!(held.len() + others.len(), MAX_HANDSHAKES.min(8 + 254));
        drop(held);
        assert!(connections.handshake(stalling).is_some(), "freed");
    }

    #[test]
    fn peers_with_nothing_open_are_forgotten() {
        let connections = Connections::new(ServerLimits::default(), Refusals::unregistered());
        for i in 0..1000u32 {
            let peer = IpAddr::from(i.to_be_bytes());
            drop(connections.admit(peer));
        }
        assert_eq!(connections.open(), 0);
        assert!(connections.open.held.lock().unwrap().1.is_empty());
    }
}
