//! The `kube-dispatch-dispatcher` binary: flags, logging, signals; the rest is the library.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kube_dispatch_core::{
    backoff::Backoff,
    queue::{QueueConfig, pool::BodyPool},
};
use kube_dispatch_dispatcher::{
    config::{LeaseConfig, Limits, ListFlags, Membership, SecurityConfig, ServeConfig, Settings},
    serve::serve,
};
use kube_dispatch_proto::RingKey;
use kube_dispatch_server::{
    client,
    flags::{CallFlags, SecurityFlags, ServerFlags},
    signal,
};
use kube_dispatch_telemetry::{
    admin::{self, Readiness},
    logging, metrics,
};
use tokio_util::sync::CancellationToken;

/// kube-dispatch dispatcher: holds one non-caching watch per subscribed resource, keeps the keys
/// on its slice of the consistent-hash ring, and serves reconcile requests to controller
/// replicas over gRPC long-polling (with grpc.health.v1 and server reflection on the same port).
///
/// Every flag can also be set through the environment variable named in brackets. Durations
/// take units: 500ms, 10s, 5m, 1h.
#[derive(Debug, Parser)]
#[command(name = "kube-dispatch-dispatcher", version = kube_dispatch_telemetry::version(), about, long_about)]
struct Args {
    /// This dispatcher's identity on the ring, e.g. dispatcher-2. Defaults to the pod name.
    #[arg(long, env = "KD_DISPATCHER_ID")]
    id: Option<String>,

    /// Pod name, used as the identity when --id is not set (set from the downward API).
    #[arg(long, env = "POD_NAME", hide = true)]
    pod_name: Option<String>,

    /// A fixed ring: the members, comma-separated, this dispatcher among them (e.g.
    /// dispatcher-0,dispatcher-1,dispatcher-2). When unset (the default), the ring is made of
    /// the dispatchers that hold a live Lease, and keys are handed over when it changes.
    #[arg(long, env = "KD_RING_MEMBERS", value_delimiter = ',')]
    members: Vec<String>,

    /// Namespace of the dispatcher Leases. Defaults to POD_NAMESPACE, else the namespace of
    /// the kubeconfig context or of the pod's service account.
    #[arg(long, env = "KD_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,

    /// Pod namespace (set from the downward API).
    #[arg(long, env = "POD_NAMESPACE", hide = true)]
    pod_namespace: Option<String>,

    /// Lease duration: a dispatcher whose Lease is not renewed for this long plus
    /// --lease-grace is dropped from the ring; one that cannot renew its own for this long
    /// stops handing out keys.
    #[arg(long, env = "KD_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,

    /// How often the Lease is renewed; well under --lease-duration.
    #[arg(long, env = "KD_LEASE_RENEW_PERIOD", default_value = "3s", value_parser = humantime::parse_duration)]
    lease_renew_period: Duration,

    /// Extra time before a silent dispatcher is dropped from the ring.
    #[arg(long, env = "KD_LEASE_GRACE", default_value = "2s", value_parser = humantime::parse_duration)]
    lease_grace: Duration,

    /// Longest warm-up of a dispatcher that joins the ring (one that starts with no Lease of
    /// its own: a new member, or a restart after a drain). Its Lease is marked warming and the
    /// others keep serving the keys that will move to it, until every controller group they
    /// serve has a session here and has listed what it will own; then it joins, and no write
    /// waits for its lists. Past this bound it joins anyway. 0s joins at once.
    #[arg(long, env = "KD_JOIN_WARM_UP", default_value = "60s", value_parser = humantime::parse_duration)]
    join_warm_up: Duration,

    /// Address to serve gRPC on.
    #[arg(long, env = "KD_LISTEN", default_value = "0.0.0.0:7070")]
    listen: std::net::SocketAddr,

    /// Address of the admin endpoint: plaintext HTTP with /healthz (the process runs, drain
    /// included) and /readyz (every key this dispatcher owns is served; 503 with the reason
    /// while a handover is pending or once draining), for the kubelet's probes. It carries no
    /// object, key or identity.
    #[arg(long, env = "KD_ADMIN_LISTEN", default_value = "0.0.0.0:9070")]
    admin_listen: std::net::SocketAddr,

    /// Where controllers reach this dispatcher (host:port), published on its Lease for the load
    /// balancer. Defaults to POD_IP with the --listen port, else the --listen address.
    #[arg(long, env = "KD_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,

    /// Pod IP (set from the downward API).
    #[arg(long, env = "POD_IP", hide = true)]
    pod_ip: Option<std::net::IpAddr>,

    /// Kubeconfig to use; unset, KUBECONFIG (a list of files, merged;
    /// empty as unset), ~/.kube/config, or in a pod the in-cluster configuration.
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,

    /// Every key is re-delivered once per interval, spread evenly, without a LIST; 0 disables.
    #[arg(long, env = "KD_RESYNC_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    resync_interval: Duration,

    /// Session ttl granted when the client asks for none.
    #[arg(long, env = "KD_SESSION_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    session_ttl: Duration,

    /// Longest session ttl a client may ask for. With --max-reconcile-time it bounds how long
    /// the keys of a dispatcher that died are held before another takes them over.
    #[arg(long, env = "KD_MAX_SESSION_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    max_session_ttl: Duration,

    /// Longest a long-poll waits for work before returning empty; must be shorter than the
    /// session ttl, since a waiting poll does not renew its session.
    #[arg(long, env = "KD_MAX_POLL_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    max_poll_wait: Duration,

    /// Most reconcile requests one poll returns.
    #[arg(long, env = "KD_MAX_POLL_ITEMS", default_value_t = 1000)]
    max_poll_items: usize,

    /// Most bytes of reconcile requests one poll returns, however much the client accepts
    /// (a client that accepts less, as its poll says, gets less; one that names nothing gets at
    /// most 4 MiB, gRPC's default limit). An object larger than the answer may hold is
    /// delivered without its body and read fresh by the controller.
    #[arg(long, env = "KD_MAX_POLL_BYTES", default_value_t = 16 * 1024 * 1024)]
    max_poll_bytes: usize,

    /// Delay of the first retry after a failed reconcile; doubles per failure.
    #[arg(long, env = "KD_BACKOFF_BASE", default_value = "5ms", value_parser = humantime::parse_duration)]
    backoff_base: Duration,

    /// Longest retry delay.
    #[arg(long, env = "KD_BACKOFF_CAP", default_value = "1000s", value_parser = humantime::parse_duration)]
    backoff_cap: Duration,

    /// A delivery not acknowledged within this time counts as failed and is retried; the SDK
    /// cancels reconciles that run longer.
    #[arg(long, env = "KD_MAX_RECONCILE_TIME", default_value = "60s", value_parser = humantime::parse_duration)]
    max_reconcile_time: Duration,

    /// Most live sessions on this dispatcher.
    #[arg(long, env = "KD_MAX_SESSIONS", default_value_t = 10_000)]
    max_sessions: usize,

    /// Most live sessions of one controller group on this dispatcher.
    #[arg(long, env = "KD_MAX_SESSIONS_PER_GROUP", default_value_t = 1_000)]
    max_sessions_per_group: usize,

    /// Most live sessions of one identity (ServiceAccount) on this dispatcher, over all its
    /// groups; past it, RESOURCE_EXHAUSTED for that identity only.
    #[arg(long, env = "KD_MAX_SESSIONS_PER_IDENTITY", default_value_t = 1_000)]
    max_sessions_per_identity: usize,

    /// Most controller groups one identity holds on this dispatcher, idle ones included
    /// (--idle-group-grace); past it, RESOURCE_EXHAUSTED for that identity only.
    #[arg(long, env = "KD_MAX_GROUPS_PER_IDENTITY", default_value_t = 100)]
    max_groups_per_identity: usize,

    /// Most OpenSessions served at once (the first of a group waits for its watches' first
    /// lists). One past it is refused at once with RESOURCE_EXHAUSTED and gRPC's pushback
    /// (grpc-retry-pushback-ms: 500), which the SDKs wait out with jitter: in a reconnect storm
    /// replicas come back spread out rather than queue for seconds.
    #[arg(long, env = "KD_MAX_OPENING_SESSIONS", default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_opening_sessions: usize,

    /// Largest request message accepted, in bytes.
    #[arg(long, env = "KD_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_message_bytes: usize,

    /// Bytes of object bodies a group may hold for queued keys; past it, keys are delivered
    /// without body and the controller reads the object fresh. By default 256 MiB, the body
    /// pool's default size (--max-body-bytes), which groups share evenly once it runs short: a
    /// group alone may use it, so the keys a dispatcher takes over in a handover (tens of
    /// thousands at once, listed faster than replicas reconcile them) keep their bodies. Set it
    /// lower to cap every group; raise it with the pool.
    #[arg(long, env = "KD_BODY_BUDGET_BYTES", default_value_t = 256 * 1024 * 1024)]
    body_budget_bytes: usize,

    /// Bytes of memos a group may keep: the notes (at most 512 bytes each) a controller's
    /// acknowledgement leaves for its key's next delivery, such as the versions of the children
    /// it wrote. Past it a memo is not kept, and the next delivery of that key carries none
    /// (the controller reads what it would have skipped).
    #[arg(long, env = "KD_MEMO_BUDGET_BYTES", default_value_t = 16 * 1024 * 1024)]
    memo_budget_bytes: usize,

    /// Bytes of memos all groups together may keep, apart from bodies (so memos never crowd
    /// bodies out); past it memos are not kept, as past --memo-budget-bytes.
    #[arg(long, env = "KD_MAX_MEMO_BYTES", default_value_t = 32 * 1024 * 1024)]
    max_memo_bytes: usize,

    /// Bytes of object bodies all groups together may hold, whoever they belong to: the bound
    /// that keeps bodies within the pod's memory limit (deploy/ sets that limit from it). When
    /// less than a tenth is left, each group holding more than an even share drops bodies down
    /// to it; keys without a body are delivered all the same, and their controllers read the
    /// objects. Owners' children's bodies (for SDKs that take them) are held here too, only
    /// while the pool is at most half full.
    #[arg(long, env = "KD_MAX_BODY_BYTES", default_value_t = 256 * 1024 * 1024)]
    max_body_bytes: usize,

    /// A watch with no subscriber left is stopped after this long.
    #[arg(long, env = "KD_WATCH_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    watch_grace: Duration,

    #[command(flatten)]
    listing: ListFlags,

    /// What places a key on the ring; every dispatcher of the tier must use the same (the ring
    /// id differs, so a mixed tier hands nothing over). "name": the whole key, which spreads
    /// keys evenly whatever the namespaces, and every dispatcher receives every event of its
    /// watches. "namespace": the namespace alone, so a namespace's objects, owners and children
    /// stay on one dispatcher, which asks the API server for its own namespaces only
    /// (shardSelector; Kubernetes 1.36 with the ShardedListAndWatch feature gate, otherwise it
    /// filters what it receives itself). Choose it for many namespaces of similar size: one
    /// large namespace lands on one dispatcher, and so may namespaces whose names differ only in
    /// their last characters (team-1, team-2, ...: FNV-1a, the API server's shard hash, leaves
    /// them close together). With it, a deletion that a dispatcher had not
    /// delivered when it died is not delivered by the next owner (which did not watch that
    /// namespace); use finalizers where a deletion must be seen.
    #[arg(long, env = "KD_RING_KEY", value_enum, default_value_t = RingKeyArg::Name)]
    ring_key: RingKeyArg,

    /// A group with no session left is dropped after this long: its keys, and the changes and
    /// deletions it kept for replicas that were away, are forgotten. A controller back within
    /// it is handed what changed, deletions too; back later, every object that exists, but not
    /// the deletions made meanwhile (proto/kubedispatch/v1/keys.md).
    #[arg(long, env = "KD_IDLE_GROUP_GRACE", default_value = "60s", value_parser = humantime::parse_duration)]
    idle_group_grace: Duration,

    /// Every this long, each controller group whose queue changed logs a `queue status` line:
    /// keys known, ready for delivery, in flight, and sessions. 0s disables it.
    #[arg(long, env = "KD_STATUS_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    status_interval: Duration,

    /// Most deletions of keys owned by other dispatchers that each controller group remembers
    /// (about 100 bytes each), for the time a key can be in transit between owners (Lease
    /// duration + grace + renew period + the handover bound). A key that moves here after its
    /// object was deleted in transit then still gets its deletion delivered. Past it, such a
    /// deletion may be missed; the dispatcher logs a warning when that happens.
    #[arg(long, env = "KD_MAX_RECENT_DELETIONS", default_value_t = 65_536)]
    max_recent_deletions: usize,

    /// Longest the drain may take after SIGTERM or SIGINT.
    #[arg(long, env = "KD_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,

    /// Log as JSON lines instead of text (KD_LOG_JSON takes true/false, 1/0, yes/no). The
    /// level comes from RUST_LOG (default info).
    #[arg(long, env = "KD_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new())]
    log_json: bool,

    /// Export traces to this OpenTelemetry collector over OTLP/gRPC (for example
    /// http://otel-collector:4317). Off when unset. Each watched change gets a span, and the
    /// deliveries it causes carry its W3C trace context, so a replica's reconcile span is its
    /// child.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,

    /// Users allowed to call the Peer service (repeat for several). Default: this dispatcher's
    /// own user as the API server names it, which every pod of the StatefulSet shares.
    #[arg(long = "peer-user", env = "KD_PEER_USERS", value_delimiter = ',')]
    peer_users: Vec<String>,

    /// Longest a controller's read access is trusted before it is reviewed again
    /// (SubjectAccessReview): a removed RoleBinding ends its sessions within this, plus one
    /// poll.
    #[arg(long, env = "KD_AUTHORIZATION_RECHECK", default_value = "2m", value_parser = humantime::parse_duration)]
    authorization_recheck: Duration,

    #[command(flatten)]
    security: SecurityFlags,

    #[command(flatten)]
    calls: CallFlags,

    #[command(flatten)]
    server: ServerFlags,
}

/// mimalloc rather than the C library's allocator: it gives freed memory back to the system
/// (glibc's kept what a cold start's lists and deliveries once took, so a dispatcher's steady
/// RSS stayed at its peak), and it is far faster than musl's, which the static images link.
/// Version 2 without transparent huge pages (the workspace's features): with them, or with
/// version 3, RSS grows in 2 MiB steps and was higher than glibc's (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.validate()?;
    let identity = args
        .id
        .clone()
        .or_else(|| args.pod_name.clone())
        .context("no identity: set --id (KD_DISPATCHER_ID) or POD_NAME")?;
    let settings = args.settings(identity.clone())?;
    let Args {
        members,
        lease_namespace,
        pod_namespace,
        lease_duration,
        lease_renew_period,
        lease_grace,
        join_warm_up,
        listen,
        admin_listen,
        advertise_address,
        pod_ip,
        kubeconfig,
        session_ttl,
        max_session_ttl,
        max_reconcile_time,
        max_message_bytes,
        watch_grace,
        listing,
        ring_key,
        drain_timeout,
        log_json,
        otlp_endpoint,
        peer_users,
        authorization_recheck,
        security,
        calls,
        server,
        ..
    } = args;
    let _traces = logging::init_with_traces(
        log_json,
        otlp_endpoint.as_deref(),
        "kube-dispatch-dispatcher",
    )?;

    let security = security_config(security, calls, peer_users, authorization_recheck)?;
    let client = client::from_kubeconfig(kubeconfig.as_deref()).await?;
    let membership = membership(
        members,
        lease_namespace
            .or(pod_namespace)
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        LeaseConfig {
            namespace: String::new(),
            identity: identity.clone(),
            address: advertise_address.unwrap_or_else(|| match pod_ip {
                Some(ip) => std::net::SocketAddr::new(ip, listen.port()).to_string(),
                None => listen.to_string(),
            }),
            duration: lease_duration,
            renew_period: lease_renew_period,
            grace: lease_grace,
            // A replica cancels what it holds from a session it could not renew within 3/4 of
            // the ttl, and any reconcile at 90 % of the maximum reconcile time.
            handover_bound: max_session_ttl.max(session_ttl).max(max_reconcile_time),
            warm_up: join_warm_up,
        },
    );
    let listener = kube_dispatch_server::bounds::listen(listen)
        .with_context(|| format!("cannot listen on {listen}"))?;
    let (readiness, registry, admin_stop) = start_admin(admin_listen).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(signal::cancel_on_signal(shutdown.clone()));
    let served = serve(
        ServeConfig {
            settings,
            membership,
            ring_key: ring_key.into(),
            watch_grace,
            list_mode: listing.list_mode,
            share_lists: listing.share_lists,
            protobuf: listing.protobuf,
            max_message_bytes,
            server: server.limits()?,
            drain_timeout,
            security,
            readiness,
            metrics: registry,
        },
        client,
        listener,
        shutdown,
        None,
    )
    .await;
    // Liveness holds until the drain is over.
    admin_stop.cancel();
    Ok(served?)
}

/// Who may call, and how this dispatcher calls its peers.
fn security_config(
    security: SecurityFlags,
    calls: CallFlags,
    peer_users: Vec<String>,
    authorization_recheck: Duration,
) -> anyhow::Result<SecurityConfig> {
    Ok(SecurityConfig {
        transport: security.transport()?,
        authentication: security.authentication()?,
        authorization: security.authorization(authorization_recheck)?,
        peer_credentials: calls.credentials(&security)?,
        peer_users: (!peer_users.is_empty()).then_some(peer_users),
    })
}

/// Serves the admin endpoint (probes and metrics) on `address` until the token returned is
/// cancelled: liveness holds until the drain is over.
async fn start_admin(
    address: std::net::SocketAddr,
) -> anyhow::Result<(Readiness, metrics::Metrics, CancellationToken)> {
    // The kubelet's probes connect anew each time and give up after a second, the time a
    // dropped SYN costs: the admin port holds a burst of connections as the gRPC port does.
    let admin = kube_dispatch_server::bounds::listen(address)
        .with_context(|| format!("cannot listen on {address} (--admin-listen)"))?;
    let readiness = Readiness::new("starting");
    let stop = CancellationToken::new();
    let registry = metrics::Metrics::default();
    tokio::spawn(admin::serve(
        admin,
        readiness.clone(),
        registry.clone(),
        stop.clone(),
    ));
    Ok((readiness, registry, stop))
}

impl Args {
    /// The group table's settings for the dispatcher `identity`.
    fn settings(&self, identity: String) -> anyhow::Result<Settings> {
        let limit_flags = LimitFlags::of(self);
        Ok(Settings {
            identity,
            limits: limits(&limit_flags),
            queue: queue_config(&limit_flags),
            bodies: BodyPool::new(self.max_body_bytes),
            memos: BodyPool::new(self.max_memo_bytes),
            resync_interval: self.resync_interval,
            idle_group_grace: self.idle_group_grace,
            status_interval: self.status_interval,
            max_recent_deletions: self.max_recent_deletions,
            group_owners: self.security.group_owners()?,
        })
    }

    /// Refuses durations that cannot work together, with the flag to change.
    fn validate(&self) -> anyhow::Result<()> {
        for (name, d) in [
            ("--session-ttl", self.session_ttl),
            ("--max-session-ttl", self.max_session_ttl),
            ("--max-poll-wait", self.max_poll_wait),
            ("--backoff-base", self.backoff_base),
            ("--backoff-cap", self.backoff_cap),
            ("--max-reconcile-time", self.max_reconcile_time),
            ("--lease-duration", self.lease_duration),
            ("--lease-renew-period", self.lease_renew_period),
        ] {
            anyhow::ensure!(!d.is_zero(), "{name} must be greater than zero");
        }
        anyhow::ensure!(
            self.max_poll_wait < self.session_ttl,
            "--max-poll-wait ({:?}) must be shorter than --session-ttl ({:?}), or idle sessions expire while polling",
            self.max_poll_wait,
            self.session_ttl
        );
        anyhow::ensure!(
            self.lease_renew_period < self.lease_duration,
            "--lease-renew-period ({:?}) must be shorter than --lease-duration ({:?})",
            self.lease_renew_period,
            self.lease_duration
        );
        anyhow::ensure!(
            self.backoff_base <= self.backoff_cap,
            "--backoff-base must not exceed --backoff-cap"
        );
        Ok(())
    }
}

/// The ring's membership: the fixed `members`, or, with none, the Leases in `namespace`
/// (`lease`'s own namespace is set from it).
fn membership(members: Vec<String>, namespace: String, lease: LeaseConfig) -> Membership {
    if members.is_empty() {
        Membership::Leases(LeaseConfig { namespace, ..lease })
    } else {
        Membership::Fixed(members)
    }
}

/// The flags that set the client limits and the queue.
#[derive(Clone, Copy)]
struct LimitFlags {
    session_ttl: Duration,
    max_session_ttl: Duration,
    max_poll_wait: Duration,
    max_poll_items: usize,
    max_poll_bytes: usize,
    backoff_base: Duration,
    backoff_cap: Duration,
    max_reconcile_time: Duration,
    max_sessions: usize,
    max_sessions_per_group: usize,
    max_sessions_per_identity: usize,
    max_groups_per_identity: usize,
    max_opening_sessions: usize,
    body_budget_bytes: usize,
    memo_budget_bytes: usize,
}

impl LimitFlags {
    fn of(args: &Args) -> Self {
        Self {
            session_ttl: args.session_ttl,
            max_session_ttl: args.max_session_ttl,
            max_poll_wait: args.max_poll_wait,
            max_poll_items: args.max_poll_items,
            max_poll_bytes: args.max_poll_bytes,
            backoff_base: args.backoff_base,
            backoff_cap: args.backoff_cap,
            max_reconcile_time: args.max_reconcile_time,
            max_sessions: args.max_sessions,
            max_sessions_per_group: args.max_sessions_per_group,
            max_sessions_per_identity: args.max_sessions_per_identity,
            max_groups_per_identity: args.max_groups_per_identity,
            max_opening_sessions: args.max_opening_sessions,
            body_budget_bytes: args.body_budget_bytes,
            memo_budget_bytes: args.memo_budget_bytes,
        }
    }
}

/// The client limits the flags set.
fn limits(f: &LimitFlags) -> Limits {
    Limits {
        max_sessions: f.max_sessions,
        max_sessions_per_group: f.max_sessions_per_group,
        max_sessions_per_identity: f.max_sessions_per_identity,
        max_groups_per_identity: f.max_groups_per_identity,
        default_ttl: f.session_ttl,
        min_ttl: Duration::from_secs(1).min(f.session_ttl),
        max_ttl: f.max_session_ttl.max(f.session_ttl),
        max_poll_wait: f.max_poll_wait,
        max_poll_items: f.max_poll_items.max(1),
        max_poll_bytes: f.max_poll_bytes.max(1),
        max_opening_sessions: f.max_opening_sessions,
        ..Limits::default()
    }
}

/// The queue settings the flags set.
fn queue_config(f: &LimitFlags) -> QueueConfig {
    QueueConfig {
        backoff: Backoff {
            base: f.backoff_base,
            cap: f.backoff_cap,
        },
        max_reconcile_time: f.max_reconcile_time,
        body_budget: f.body_budget_bytes,
        memo_budget: f.memo_budget_bytes,
        // Set for each group by what it subscribes to (`Group::spawn`).
        keep_delivered_bodies: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's defaults (used by tests and embedders) are the flags' defaults.
    #[test]
    fn the_flag_defaults_are_the_library_defaults() {
        let flags = LimitFlags::of(&Args::parse_from(["kube-dispatch-dispatcher"]));
        assert_eq!(limits(&flags), Limits::default());
        assert_eq!(queue_config(&flags), QueueConfig::default());
    }
}

/// `--ring-key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RingKeyArg {
    /// The whole key.
    Name,
    /// The namespace.
    Namespace,
}

impl From<RingKeyArg> for RingKey {
    fn from(arg: RingKeyArg) -> Self {
        match arg {
            RingKeyArg::Name => RingKey::Name,
            RingKeyArg::Namespace => RingKey::Namespace,
        }
    }
}
