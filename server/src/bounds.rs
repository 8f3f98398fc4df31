//! The bounds every kube-dispatch gRPC server holds at the transport, before a call reaches a
//! service, and what happens when one bites. The threat table in
//! `proto/kubedispatch/v1/security.md` names who each bound holds.
//!
//! | bound | default | past it |
//! | --- | --- | --- |
//! | connections the kernel holds until the server accepts them ([`LISTEN_BACKLOG`]: [`bind`]) | 1024, at most `net.core.somaxconn` | the kernel drops the client's SYN, and the client tries again a second later |
//! | connections in all ([`ServerLimits::max_connections`]) | 4096 | a new connection is closed at once |
//! | connections from one peer address ([`ServerLimits::max_connections_per_peer`]) | 128 | that peer's new connection is closed at once |
//! | TLS handshakes in progress ([`MAX_HANDSHAKES`]), from one peer address ([`MAX_HANDSHAKES_PER_PEER`]) | 256, 8 | the new connection is closed at once: peers that stall handshakes hold at most 8 places each, each for at most 2 s (the TLS module's `HANDSHAKE_TIMEOUT`) |
//! | a connection that says nothing after its handshake (the TLS module's `FIRST_BYTES_TIMEOUT`) | 2 s | the connection is closed |
//! | places kept for known peers (addresses that authenticated a call in the last [`KNOWN_FOR`], at most [`MAX_KNOWN_PEERS`] remembered) | a quarter more connections and handshakes in all, with the same bound per address | taken only once every other place is held: a flood from many addresses does not lock out a replica that reconnects, or the tier's members |
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
    io,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use tonic::transport::server::Server;

pub use kube_dispatch_telemetry::metrics::Refusals;

/// Most connections the kernel holds for a gRPC listener until the server accepts them: a
/// flood that reconnects thousands of times a second must not fill it while the accept loop
/// takes a few milliseconds off, or a replica's SYN is dropped and its connection waits a
/// second for the retry. The kernel holds at most `net.core.somaxconn` (4096 by default since
/// Linux 5.4).
pub const LISTEN_BACKLOG: i32 = 1024;

/// A listening socket on `address` with [`LISTEN_BACKLOG`], non-blocking, with `SO_REUSEADDR`
/// (a restarted server binds again while its old connections linger in `TIME_WAIT`; not on
/// Windows, where it would let another process take the port), as tokio's own bind makes it
/// but for the backlog (tokio's is the standard library's 128): for
/// `tokio::net::TcpListener::from_std`. Every listener of the dispatcher and the load
/// balancer listens through it, the admin ports (probes and metrics) too, whose kubelet probes
/// give up after a second by default; so do the servers of the tests and of
/// `kube-dispatch-testing`.
pub fn bind(address: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    #[cfg(not(windows))]
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// [`bind`], as tokio's listener: call within a tokio runtime.
pub fn listen(address: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    bind(address).and_then(tokio::net::TcpListener::from_std)
}

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
    /// Most places in all, and per peer.
    limits: [usize; 2],
    held: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Which bound refused a place: in all, or per peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    All,
    Peer,
}

impl Places {
    fn new(limits: [usize; 2]) -> Self {
        Self {
            limits,
            held: Mutex::new((0, HashMap::new())),
        }
    }

    /// Takes a place for `peer`, or says which bound is reached.
    fn take(&self, peer: IpAddr) -> Result<(), Full> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let (total, per_peer) = &mut *held;
        let of_peer = per_peer.get(&peer).copied().unwrap_or(0);
        if *total >= self.limits[0] {
            return Err(Full::All);
        }
        if of_peer >= self.limits[1] {
            return Err(Full::Peer);
        }
        *total += 1;
        per_peer.insert(peer, of_peer + 1);
        Ok(())
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

/// Places of one kind (connections, or TLS handshakes in progress): the general ones, and a
/// reserve that only known peers take once the general ones are all held.
#[derive(Debug)]
struct Guarded {
    /// What the places are for, and the refusals' bound names: in all, and per peer.
    what: &'static str,
    bounds: [&'static str; 2],
    general: Places,
    reserve: Places,
}

impl Guarded {
    fn new(what: &'static str, bounds: [&'static str; 2], limits: [usize; 2]) -> Self {
        Self {
            what,
            bounds,
            general: Places::new(limits),
            reserve: Places::new([limits[0] / 4, limits[1]]),
        }
    }

    /// A place for `peer` (`known`: it authenticated lately), from the reserve when the
    /// general places are all held; `None` (counted and logged in `refusals`) past the bounds.
    fn take(&self, peer: IpAddr, known: bool, refusals: &Refusals) -> Option<bool> {
        let refused = match self.general.take(peer) {
            Ok(()) => return Some(false),
            Err(Full::All) if known => match self.reserve.take(peer) {
                Ok(()) => return Some(true),
                Err(full) => full,
            },
            Err(full) => full,
        };
        let (bound, limit, scope) = match refused {
            Full::All => (self.bounds[0], self.general.limits[0], ""),
            Full::Peer => (self.bounds[1], self.general.limits[1], " from one address"),
        };
        refusals.refused(
            bound,
            &peer.to_string(),
            &format!(
                "at most {limit} {}{scope}; new connections are closed",
                self.what
            ),
        );
        None
    }

    fn give_back(&self, peer: IpAddr, reserved: bool) {
        if reserved {
            self.reserve.give_back(peer);
        } else {
            self.general.give_back(peer);
        }
    }
}

/// Peers remembered as known: at most this many, each for [`KNOWN_FOR`] after it was vouched
/// for (a peer still calling is vouched for again on its first call after that: one cheap
/// lookup per call, not a write).
pub const MAX_KNOWN_PEERS: u64 = 4096;
/// How long a peer that authenticated stays known.
pub const KNOWN_FOR: Duration = Duration::from_secs(600);

/// The connections open now and the TLS handshakes in progress, in all and per peer address,
/// held within [`ServerLimits::max_connections`] and
/// [`ServerLimits::max_connections_per_peer`], and [`MAX_HANDSHAKES`] and
/// [`MAX_HANDSHAKES_PER_PEER`]. Peers that authenticated a call lately (a replica with a
/// session, a dispatcher calling its peers: [`Connections::vouch`]) have a reserve of a quarter
/// more of each in all, which only they take once the others are all held: a flood from many
/// addresses cannot lock out a replica that reconnects, or the tier's own members.
#[derive(Debug)]
pub struct Connections {
    refusals: Refusals,
    open: Guarded,
    handshakes: Guarded,
    known: moka::sync::Cache<IpAddr, ()>,
}

/// One place taken from [`Connections`] (a connection admitted by [`Connections::admit`], a
/// TLS handshake let start by [`Connections::handshake`]); dropping it frees the place.
#[derive(Debug)]
pub struct Permit {
    connections: Arc<Connections>,
    /// Where the place was taken: the connections, or the handshakes.
    places: fn(&Connections) -> &Guarded,
    peer: IpAddr,
    reserved: bool,
}

/// A connection admitted by [`Connections::admit`].
pub type ConnectionPermit = Permit;

/// A TLS handshake let start by [`Connections::handshake`].
pub type HandshakePermit = Permit;

impl Connections {
    /// Connections held within `limits`; refusals counted in `refusals`.
    pub fn new(limits: ServerLimits, refusals: Refusals) -> Arc<Self> {
        Arc::new(Self {
            refusals,
            open: Guarded::new(
                "connections",
                ["connections", "connections_per_peer"],
                [limits.max_connections, limits.max_connections_per_peer],
            ),
            handshakes: Guarded::new(
                "TLS handshakes in progress",
                ["handshakes", "handshakes_per_peer"],
                [MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER],
            ),
            known: moka::sync::Cache::builder()
                .max_capacity(MAX_KNOWN_PEERS)
                .time_to_live(KNOWN_FOR)
                .build(),
        })
    }

    /// `peer` authenticated a call: its next connections may take the reserved places.
    pub fn vouch(&self, peer: IpAddr) {
        if !self.known.contains_key(&peer) {
            self.known.insert(peer, ());
        }
    }

    /// A place for a new connection from `peer`, or `None` (then close it) when this server
    /// or that peer is at its bound.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<ConnectionPermit> {
        self.place(peer, |c| &c.open)
    }

    /// A place for a TLS handshake with `peer`, or `None` (then close the connection) when
    /// this server or that peer has as many in progress as allowed: peers that stall their
    /// handshakes cannot take every place from the others.
    pub fn handshake(self: &Arc<Self>, peer: IpAddr) -> Option<HandshakePermit> {
        self.place(peer, |c| &c.handshakes)
    }

    /// A place among `places` for `peer`, from the reserve if it is known and every general
    /// place is held, or `None` at the bound.
    fn place(
        self: &Arc<Self>,
        peer: IpAddr,
        places: fn(&Connections) -> &Guarded,
    ) -> Option<Permit> {
        let known = self.known.contains_key(&peer);
        let reserved = places(self).take(peer, known, &self.refusals)?;
        Some(Permit {
            connections: self.clone(),
            places,
            peer,
            reserved,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.general.total() + self.open.reserve.total()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        (self.places)(&self.connections).give_back(self.peer, self.reserved);
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
        assert_eq!(connections.open.general.held.lock().unwrap().1.len(), 3);
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
    fn known_peers_have_a_reserve_when_the_others_hold_every_place() {
        let connections = Connections::new(ServerLimits::default(), Refusals::unregistered());
        let flood: Vec<_> = (0..MAX_HANDSHAKES as u32)
            .map(|i| {
                let peer = IpAddr::from((0x0a00_0000 + i).to_be_bytes());
                connections.handshake(peer).expect("a general place")
            })
            .collect();
        let (stranger, replica): (IpAddr, IpAddr) =
            ("10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap());
        assert!(connections.handshake(stranger).is_none(), "all held");
        connections.vouch(replica);
        let reserved: Vec<_> = (0..MAX_HANDSHAKES_PER_PEER)
            .map(|_| connections.handshake(replica).expect("a reserved place"))
            .collect();
        assert!(reserved.iter().all(|p| p.reserved));
        assert!(
            connections.handshake(replica).is_none(),
            "its own bound holds in the reserve"
        );
        drop(reserved);
        drop(flood);
        let again = connections.handshake(replica).expect("a general place");
        assert!(
            !again.reserved,
            "the reserve is taken only when the rest is full"
        );
    }

    #[test]
    fn peers_with_nothing_open_are_forgotten() {
        let connections = Connections::new(ServerLimits::default(), Refusals::unregistered());
        for i in 0..1000u32 {
            let peer = IpAddr::from(i.to_be_bytes());
            drop(connections.admit(peer));
        }
        assert_eq!(connections.open(), 0);
        assert!(connections.open.general.held.lock().unwrap().1.is_empty());
    }

    /// Past a backlog of 128 (the standard library's), the kernel drops a SYN and the client
    /// sends it again a second later: 300 connections that the server has not accepted yet are
    /// all held at once (on a kernel whose `net.core.somaxconn` allows that many).
    #[test]
    fn the_listen_backlog_holds_a_burst_the_accept_loop_has_not_taken_yet() {
        let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok());
        let burst = somaxconn.map_or(300, |max| max.min(300));
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let held: Vec<_> = (0..burst)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connection {i} of {burst} not held: {e}"))
            })
            .collect();
        assert_eq!(held.len(), burst);
    }
}
