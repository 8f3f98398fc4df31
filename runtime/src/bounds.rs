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
//! | a connection's age ([`ServerLimits::max_connection_age`]) | 30 min, then 5 min of grace | GOAWAY: calls finish, the client reconnects |
//! | a silent peer (HTTP/2 keepalive) | ping after 30 s, answer within 10 s | the connection is closed |
//! | request headers | 16 KiB | the stream is refused |
//!
//! Each refusal counts in `kube_dispatch_refused_total{bound}` and is logged once per bound and
//! peer (or identity) every [`LOG_EVERY`], never once per request: a flood cannot flood the
//! logs too.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet, metrics::counter::Counter, metrics::family::Family,
};
use tonic::transport::server::Server;
use tracing::warn;

use crate::metrics::Metrics;

/// Longest a refusal of one bound for one peer or identity stays unlogged after the first.
pub const LOG_EVERY: Duration = Duration::from_secs(600);
/// Most peers and identities whose last refusal log is remembered.
const LOG_MEMORY: u64 = 4096;

/// The transport bounds of one server, set by [`ServerFlags`]. The defaults are the flags'.
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
    /// A connection older than this is asked to go away (GOAWAY); its calls finish.
    pub max_connection_age: Duration,
    /// How long calls on a connection past its age may take before it is closed.
    pub max_connection_age_grace: Duration,
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
            max_connection_age_grace: Duration::from_secs(5 * 60),
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
            .max_connection_age(self.max_connection_age)
            .max_connection_age_grace(self.max_connection_age_grace)
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
            .http2_max_header_list_size(self.max_header_bytes)
            // Streams a peer opens and resets before they are answered (the "rapid reset"
            // attack) count against this, then the connection is closed.
            .http2_max_pending_accept_reset_streams(Some(64))
    }
}

/// The transport bounds' flags, the same on every gRPC server.
#[derive(Clone, Debug, clap::Args)]
pub struct ServerFlags {
    /// Most connections this server holds open at once, from all peers; past it a new
    /// connection is closed at once.
    #[arg(long, env = "KD_MAX_CONNECTIONS", default_value_t = ServerLimits::default().max_connections)]
    pub max_connections: usize,

    /// Most connections open at once from one peer address; past it that peer's new
    /// connections are closed at once, while other peers connect as before. A controller
    /// replica holds one per dispatcher.
    #[arg(long, env = "KD_MAX_CONNECTIONS_PER_PEER", default_value_t = ServerLimits::default().max_connections_per_peer)]
    pub max_connections_per_peer: usize,

    /// Most calls at once on one connection (HTTP/2 streams); past it the stream is refused.
    #[arg(long, env = "KD_MAX_STREAMS_PER_CONNECTION", default_value_t = ServerLimits::default().max_streams_per_connection)]
    pub max_streams_per_connection: u32,

    /// Most calls at once that carry no credential (grpc.health.v1, for probes), over all
    /// peers; past it RESOURCE_EXHAUSTED. Authenticated calls never wait for these.
    #[arg(long, env = "KD_MAX_UNAUTHENTICATED_CALLS", default_value_t = ServerLimits::default().max_unauthenticated_calls)]
    pub max_unauthenticated_calls: usize,

    /// Longest a call may take to its answer; a long-poll waits far less (--max-poll-wait).
    #[arg(long, env = "KD_REQUEST_TIMEOUT", default_value = "2m", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// A connection older than this is asked to go away (GOAWAY): its calls finish and the
    /// client reconnects, so no connection lives for ever and load spreads again.
    #[arg(long, env = "KD_MAX_CONNECTION_AGE", default_value = "30m", value_parser = humantime::parse_duration)]
    pub max_connection_age: Duration,

    /// How long calls on a connection past --max-connection-age may take before it is closed
    /// (a placement stream from the load balancer is then opened again).
    #[arg(long, env = "KD_MAX_CONNECTION_AGE_GRACE", default_value = "5m", value_parser = humantime::parse_duration)]
    pub max_connection_age_grace: Duration,

    /// An idle connection is pinged after this long (HTTP/2 keepalive) and closed when the
    /// ping is not answered within 10 s: a peer that vanished holds nothing for long.
    #[arg(long, env = "KD_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub keepalive_interval: Duration,
}

impl ServerFlags {
    /// The bounds these flags set; a zero count or duration is an error.
    pub fn limits(&self) -> Result<ServerLimits, crate::flags::FlagError> {
        use crate::flags::FlagError::Zero;
        if self.max_connections == 0 {
            return Err(Zero("--max-connections"));
        }
        if self.max_connections_per_peer == 0 {
            return Err(Zero("--max-connections-per-peer"));
        }
        if self.max_streams_per_connection == 0 {
            return Err(Zero("--max-streams-per-connection"));
        }
        if self.max_unauthenticated_calls == 0 {
            return Err(Zero("--max-unauthenticated-calls"));
        }
        for (name, d) in [
            ("--request-timeout", self.request_timeout),
            ("--max-connection-age", self.max_connection_age),
            ("--keepalive-interval", self.keepalive_interval),
        ] {
            if d.is_zero() {
                return Err(Zero(name));
            }
        }
        Ok(ServerLimits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            max_streams_per_connection: self.max_streams_per_connection,
            max_unauthenticated_calls: self.max_unauthenticated_calls,
            request_timeout: self.request_timeout,
            max_connection_age: self.max_connection_age,
            max_connection_age_grace: self.max_connection_age_grace,
            keepalive_interval: self.keepalive_interval,
            ..ServerLimits::default()
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabel {
    bound: &'static str,
}

/// Counts and logs the refusals of a process's bounds: `kube_dispatch_refused_total{bound}`,
/// and a warning once per bound and peer (or identity) every [`LOG_EVERY`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Refusals {
    counts: Family<BoundLabel, Counter>,
    logged: moka::sync::Cache<(&'static str, String), ()>,
}

impl Refusals {
    /// Refusals counted in `metrics`; [`Metrics::refusals`] makes the one of a process.
    pub(crate) fn register(metrics: &Metrics) -> Self {
        let counts = Family::<BoundLabel, Counter>::default();
        metrics.register(
            "kube_dispatch_refused",
            "Calls and connections refused because a bound was reached, by bound",
            counts.clone(),
        );
        Self::with(counts)
    }

    /// Refusals counted nowhere (tests, and servers built without a registry).
    pub fn unregistered() -> Self {
        Self::with(Family::default())
    }

    fn with(counts: Family<BoundLabel, Counter>) -> Self {
        Self {
            counts,
            logged: moka::sync::Cache::builder()
                .max_capacity(LOG_MEMORY)
                .time_to_live(LOG_EVERY)
                .build(),
        }
    }

    /// Counts one refusal by `bound` of `who` (a peer address or an identity), and logs it
    /// with `detail` unless it was logged lately.
    pub fn refused(&self, bound: &'static str, who: &str, detail: &str) {
        self.counts.get_or_create(&BoundLabel { bound }).inc();
        let key = (bound, who.to_owned());
        if self.logged.contains_key(&key) {
            return;
        }
        self.logged.insert(key, ());
        warn!(
            bound,
            who,
            detail,
            "refused: a bound was reached (logged once per {LOG_EVERY:?} for this bound and peer)"
        );
    }

    /// How many refusals `bound` has counted.
    pub fn count(&self, bound: &'static str) -> u64 {
        self.counts.get_or_create(&BoundLabel { bound }).get()
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
    use clap::Parser;

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

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerFlags,
    }

    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        let flags = Cli::parse_from(["server"]).server;
        assert_eq!(flags.limits().unwrap(), ServerLimits::default());
        let zero = Cli::parse_from(["server", "--max-connections-per-peer", "0"]).server;
        assert!(zero.limits().is_err());
    }
}
