//! Every setting of a dispatcher, in one place: what [`crate::serve::serve`] runs with
//! ([`ServeConfig`]), where the ring comes from ([`Membership`], [`LeaseConfig`]), the group and
//! session table's settings ([`Settings`]), the client limits ([`Limits`]) and security
//! ([`SecurityConfig`]). The queue's own
//! settings and what groups remember of deletions are the core's
//! ([`QueueConfig`], [`kube_dispatch_core::recent_deletions::RecentDeletionsConfig`]). The
//! binary's flags map onto these; their defaults are the flags' defaults.

use std::time::Duration;

use kube_dispatch_core::{
    queue::{QueueConfig, pool::BodyPool},
    quota::Quotas,
};
use kube_dispatch_proto::RingKey;
use kube_dispatch_server::auth::GroupOwners;
pub use kube_dispatch_server::bounds::ServerLimits;
use kube_dispatch_telemetry::{admin::Readiness, metrics::Metrics};

pub use crate::security::SecurityConfig;

/// Limits that protect the dispatcher from misbehaving clients. The defaults are the flags'
/// defaults (`kube-dispatch-dispatcher --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most live sessions on this dispatcher.
    pub max_sessions: usize,
    /// Most live sessions per group.
    pub max_sessions_per_group: usize,
    /// Most live sessions of one identity, over all its groups (with authentication).
    pub max_sessions_per_identity: usize,
    /// Most groups one identity holds here, idle ones included (with authentication).
    pub max_groups_per_identity: usize,
    /// Session ttl when the client asks for none.
    pub default_ttl: Duration,
    /// Bounds of a session ttl.
    pub min_ttl: Duration,
    /// Bounds of a session ttl.
    pub max_ttl: Duration,
    /// Longest a poll waits for work.
    pub max_poll_wait: Duration,
    /// Most requests one poll returns.
    pub max_poll_items: usize,
    /// Most bytes of requests one poll returns, whatever the client accepts
    /// (`PollRequest.max_bytes` lowers it).
    pub max_poll_bytes: usize,
    /// Most acks in one request.
    pub max_acks: usize,
    /// Most OpenSessions served at once; one past it is refused at once with a hint to ask
    /// again later (`crate::grpc::dispatcher::OPEN_RETRY_HINT`).
    pub max_opening_sessions: usize,
}

impl Limits {
    /// The limits on sessions and groups, as the table's rules take them.
    pub fn quotas(&self) -> Quotas {
        Quotas {
            max_sessions: self.max_sessions,
            max_sessions_per_group: self.max_sessions_per_group,
            max_sessions_per_identity: self.max_sessions_per_identity,
            max_groups_per_identity: self.max_groups_per_identity,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_sessions: 10_000,
            max_sessions_per_group: 1_000,
            max_sessions_per_identity: 1_000,
            max_groups_per_identity: 100,
            default_ttl: Duration::from_secs(10),
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(30),
            max_poll_wait: Duration::from_secs(5),
            max_poll_items: 1_000,
            max_poll_bytes: 16 * 1024 * 1024,
            max_acks: 10_000,
            max_opening_sessions: 64,
        }
    }
}

/// Settings of the dispatcher core.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This dispatcher's identity on the ring.
    pub identity: String,
    /// Client limits.
    pub limits: Limits,
    /// Queue behaviour of every group.
    pub queue: QueueConfig,
    /// The bytes of object bodies all groups together may hold (`--max-body-bytes`): each
    /// group within `queue.body_budget`, and all of them within this pool, shared out evenly
    /// when it runs short.
    pub bodies: BodyPool,
    /// The bytes of memos all groups together may keep (`--max-memo-bytes`): each group within
    /// `queue.memo_budget`, and all of them within this pool, apart from bodies.
    pub memos: BodyPool,
    /// Every key is resynced once per interval; zero disables resync.
    pub resync_interval: Duration,
    /// A group with no session is dropped (and its watches released) after this long.
    pub idle_group_grace: Duration,
    /// Every this long, each controller group whose queue changed logs a `queue status` line
    /// (keys known, ready, in flight, sessions); zero disables it.
    pub status_interval: Duration,
    /// Most deletions of keys owned by other dispatchers each group remembers, so a key that
    /// moves here is not lost if it was deleted in transit
    /// (`kube_dispatch_core::recent_deletions`); about 100 bytes each.
    pub max_recent_deletions: usize,
    /// Which groups are shared by several users (`--group-owner`); every other group is its
    /// user's own.
    pub group_owners: GroupOwners,
}

/// Everything a dispatcher needs besides its API-server client and its listener.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Settings of the group and session table (identity, limits, queue, resync).
    pub settings: Settings,
    /// Where the ring comes from.
    pub membership: Membership,
    /// What places a key on the ring (`--ring-key`); the same on every dispatcher of a tier.
    pub ring_key: RingKey,
    /// A watch with no subscriber is stopped after this long.
    pub watch_grace: Duration,
    /// How a watch lists what exists: streamed through the watch, or in pages.
    pub list_mode: ListMode,
    /// Whether the watches' whole lists are shared with the peers that make the same
    /// (`--share-lists`; `crate::watch::sharing`). Peers' requests are served either way.
    pub share_lists: bool,
    /// Whether whole lists and watches of built-in resources are read in protobuf
    /// (`--protobuf`; `crate::watch::protobuf`).
    pub protobuf: bool,
    /// Largest request message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Connections, streams, calls without a credential and deadlines, held at the transport.
    pub server: ServerLimits,
    /// Longest the drain may take after shutdown begins.
    pub drain_timeout: Duration,
    /// TLS, authentication and authorization.
    pub security: SecurityConfig,
    /// What the admin endpoint's `/readyz` answers: kept in step with the gRPC health status
    /// (ready once every key this dispatcher owns is served, not ready from the drain on).
    pub readiness: Readiness,
    /// The registry the dispatcher's metrics join (`crate::metrics`), served on `/metrics`.
    pub metrics: Metrics,
}

/// Where a dispatcher's ring comes from.
#[derive(Clone, Debug)]
pub enum Membership {
    /// A fixed list of members, this dispatcher among them; it never changes.
    Fixed(Vec<String>),
    /// The live dispatcher Leases, with handover when they change.
    Leases(LeaseConfig),
}

/// How this dispatcher takes part in membership.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Namespace of the Leases.
    pub namespace: String,
    /// This dispatcher's identity, the name of its Lease.
    pub identity: String,
    /// Where this dispatcher serves (`host:port`), published on its Lease.
    pub address: String,
    /// Lease duration written into the Lease.
    pub duration: Duration,
    /// How often the Lease is renewed; well under the duration.
    pub renew_period: Duration,
    /// Extra time before a silent member is dropped.
    pub grace: Duration,
    /// `T`: the longest a reconcile handed out by a dispatcher that died can still run.
    pub handover_bound: Duration,
    /// The longest a dispatcher that joins warms up first (`crate::membership::warm_up`):
    /// the others keep serving what moves to it until it has made and listed their groups.
    /// Zero joins at once.
    pub warm_up: Duration,
}

impl LeaseConfig {
    /// The longest a key can be in transit between owners unseen by either: a dead owner is
    /// dropped a Lease duration plus grace after its last renewal (up to a renew period after
    /// it died), and what it had handed out may have run for `T` before that. Deletions of
    /// keys owned elsewhere are remembered this long (`kube_dispatch_core::recent_deletions`).
    pub fn transit_window(&self) -> Duration {
        self.duration + self.grace + self.renew_period + self.handover_bound
    }
}

/// The dispatcher's flags of how its watches list.
#[derive(Clone, Debug, clap::Args)]
pub struct ListFlags {
    /// How each watch lists what exists when it starts and after it expires. "whole": one LIST
    /// without pages, which the API server serves from its watch cache and encodes an object
    /// at a time (on by default from Kubernetes 1.33), read an object at a time, then WATCH; a
    /// list cut short or timed out (too large to send within the API server's request timeout,
    /// 60 s by default: a million objects on a small control plane) is made by streaming from
    /// then on, or in pages where streaming is refused. "paged": LIST in pages of 500, then
    /// WATCH; each page costs the API server a walk of its cache to the end of the resource,
    /// so at 100k objects paging cost it 3× the CPU of whole lists (bench/HISTORY.md, "Lists
    /// whole"), but it is the way for API servers before 1.33. "stream": one WATCH with
    /// sendInitialEvents, the least memory while listing, more API-server CPU than paging (a
    /// server that refuses it is listed in pages instead).
    #[arg(long, env = "KD_LIST_MODE", value_enum, default_value_t = ListMode::Whole)]
    pub list_mode: ListMode,

    /// Share whole lists with the other dispatchers (ring keyed by name, --list-mode whole):
    /// the dispatcher a LIST's path falls on makes it and streams it to every peer asking for
    /// the same at about the same time (Peer.List), so the API server encodes each object once
    /// for the tier. Peers whose Lease lacks peer-lists, or cannot answer: listed alone.
    /// Peers' requests are served either way. false: each dispatcher lists alone.
    #[arg(long, env = "KD_SHARE_LISTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub share_lists: bool,

    /// Read built-in resources (ConfigMaps, Pods, Deployments, ...) in protobuf
    /// (application/vnd.kubernetes.protobuf) with --list-mode whole: the API server encodes an
    /// object in protobuf at under half the CPU of JSON, and the dispatcher hands replicas
    /// the JSON the API server would have written, from a table of the Kubernetes types
    /// built into it. A resource whose objects have a field the table does not know (an API
    /// server newer than the dispatcher) is read in JSON from then on, and so are custom
    /// resources. false: everything in JSON.
    #[arg(long, env = "KD_PROTOBUF", default_value_t = true, action = clap::ArgAction::Set)]
    pub protobuf: bool,
}

/// How a watch lists what exists when it starts and after it expires.
///
/// Measured with 3 dispatchers on a ring keyed by name (bench/HISTORY.md, "Lists whole"): at
/// 100k ConfigMaps, listing whole cost the API server a third of the CPU that paging did (11.7
/// against 34.5 s for the three dispatchers' cold start), reconciled everything 1.75× sooner and
/// lowered a dispatcher's peak memory from 34.9 to 25.8 MiB; at 10k it was ahead on each figure
/// too. Streaming holds the least memory but costs the API server more CPU than paging at 10k.
/// So whole lists are the default; `paged` is for API servers that encode lists all at once
/// (before Kubernetes 1.33) or serve them from etcd (before 1.31).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ListMode {
    /// LIST in pages of 500, then WATCH from the list's resourceVersion.
    Paged,
    /// One WATCH with `sendInitialEvents` (streaming lists; the WatchList feature, on by
    /// default from Kubernetes 1.34), served from the API server's watch cache; a server that
    /// refuses it is listed in pages instead.
    Stream,
    /// A LIST in two responses, a first page of 500 and then the rest without a limit from
    /// where the page ended, which the API server serves from its watch cache and encodes an
    /// object at a time (on by default from Kubernetes 1.33), read an object at a time, then
    /// WATCH from its resourceVersion. Spares the API server the walk of its cache that each
    /// page costs, and the first page's objects are reconciled while it prepares the rest; the
    /// dispatcher holds one object of the response at a time. A list that is cut short or
    /// times out is made by streaming from then on ([`ListMode::Stream`], which no request
    /// timeout ends), or in pages where the server refuses streaming.
    #[default]
    Whole,
}
