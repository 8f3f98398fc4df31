//! The `kube-dispatch-loadbalancer` binary: flags, logging, signals; the rest is the library.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kube_dispatch_loadbalancer::service::{Config, serve};
use kube_dispatch_server::flags::{SecurityFlags, ServerFlags};
use kube_dispatch_telemetry::{
    admin::{self, Readiness},
    metrics,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// kube-dispatch load balancer: tells every registered controller replica which dispatchers to
/// poll, so that every dispatcher is polled by at least one replica of each controller group and
/// the load is spread evenly. Run two or more; one leads (a Lease), the others redirect
/// registrations to it and take over if it dies.
///
/// Every flag can also be set through the environment variable named in brackets. Durations
/// take units: 500ms, 10s, 5m.
#[derive(Debug, Parser)]
#[command(name = "kube-dispatch-loadbalancer", version = kube_dispatch_telemetry::version(), about, long_about)]
struct Args {
    /// Address to serve gRPC on.
    #[arg(long, env = "KD_LISTEN", default_value = "0.0.0.0:7071")]
    listen: std::net::SocketAddr,

    /// Address of the admin endpoint: plaintext HTTP with /healthz and /readyz for the
    /// kubelet's probes. It carries no registration, group or identity.
    #[arg(long, env = "KD_ADMIN_LISTEN", default_value = "0.0.0.0:9071")]
    admin_listen: std::net::SocketAddr,

    /// Where controllers reach this replica (host:port); also its identity in the leader
    /// election. Defaults to POD_IP with the --listen port, else the --listen address.
    #[arg(long, env = "KD_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,

    /// Pod IP (set from the downward API).
    #[arg(long, env = "POD_IP", hide = true)]
    pod_ip: Option<std::net::IpAddr>,

    /// Namespace of the leader Lease and of the dispatcher Leases. Defaults to POD_NAMESPACE,
    /// else the namespace of the kubeconfig context or of the pod's service account.
    #[arg(long, env = "KD_NAMESPACE")]
    namespace: Option<String>,

    /// Pod namespace (set from the downward API).
    #[arg(long, env = "POD_NAMESPACE", hide = true)]
    pod_namespace: Option<String>,

    /// Name of the leader Lease.
    #[arg(
        long,
        env = "KD_LEASE_NAME",
        default_value = "kube-dispatch-loadbalancer"
    )]
    lease_name: String,

    /// Leader Lease duration (whole seconds): a standby takes over this long after the leader
    /// stops renewing (at once when a leader that stops releases it).
    #[arg(long, env = "KD_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,

    /// How long before its Lease expires the leader renews it (whole seconds); also the clock
    /// skew between nodes that leader election tolerates.
    #[arg(long, env = "KD_LEASE_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    lease_grace: Duration,

    /// Extra time before a dispatcher whose Lease is not renewed is dropped; use the
    /// dispatchers' --lease-grace.
    #[arg(long, env = "KD_DISPATCHER_GRACE", default_value = "2s", value_parser = humantime::parse_duration)]
    dispatcher_grace: Duration,

    /// A replica whose registration stream ended keeps its place this long (a reconnect moves
    /// nothing), then is removed and its dispatchers go to the others. A replica that shuts
    /// down gracefully says so (Leave) and is removed at once.
    #[arg(long, env = "KD_REPLICA_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    replica_grace: Duration,

    /// How long a load balancer that has just become the leader waits for the replicas to
    /// register again before it places any. Each says which dispatchers it polls and is placed
    /// there as far as the placement rules allow, so a change of leader (a rolling update of
    /// the load balancers) moves no connection. Replicas keep polling meanwhile. A group none
    /// of whose replicas is back yet is placed at once (a tier and its controllers starting
    /// together); a replica new to a group whose replicas are coming back waits this long for
    /// its first dispatchers. At most 30s.
    #[arg(long, env = "KD_LEADER_SETTLE", default_value = "2s", value_parser = humantime::parse_duration)]
    leader_settle: Duration,

    /// Most controller replicas registered at once, over all groups.
    #[arg(long, env = "KD_MAX_REGISTRATIONS", default_value_t = 10_000)]
    max_registrations: usize,

    /// Most controller replicas one identity (user) may have registered at once, over all
    /// its groups: one tenant cannot take the registrations of all the others. Past it,
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "KD_MAX_REGISTRATIONS_PER_IDENTITY", default_value_t = 256)]
    max_registrations_per_identity: usize,

    /// Kubeconfig to use; unset, KUBECONFIG (a list of files, merged;
    /// empty as unset), ~/.kube/config, or in a pod the in-cluster configuration.
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,

    /// Log as JSON lines instead of text (KD_LOG_JSON takes true/false, 1/0, yes/no). The
    /// level comes from RUST_LOG (default info).
    #[arg(long, env = "KD_LOG_JSON", value_parser = clap::builder::BoolishValueParser::new())]
    log_json: bool,

    #[command(flatten)]
    security: SecurityFlags,

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
    kube_dispatch_telemetry::logging::init(args.log_json);
    anyhow::ensure!(
        args.lease_duration.as_secs() >= 2,
        "--lease-duration must be at least 2s"
    );
    anyhow::ensure!(
        args.lease_grace.as_secs() >= 1 && args.lease_grace < args.lease_duration,
        "--lease-grace must be at least 1s and shorter than --lease-duration"
    );
    anyhow::ensure!(
        args.leader_settle <= Duration::from_secs(30),
        "--leader-settle must be at most 30s"
    );
    let client = kube_dispatch_server::client::from_kubeconfig(args.kubeconfig.as_deref()).await?;
    let listener = kube_dispatch_server::bounds::listen(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let advertise_address = args.advertise_address.unwrap_or_else(|| match args.pod_ip {
        Some(ip) => std::net::SocketAddr::new(ip, args.listen.port()).to_string(),
        None => args.listen.to_string(),
    });
    let config = Config {
        advertise_address,
        namespace: args
            .namespace
            .or(args.pod_namespace)
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        lease_name: args.lease_name,
        lease_duration: args.lease_duration,
        lease_grace: args.lease_grace,
        dispatcher_grace: args.dispatcher_grace,
        replica_grace: args.replica_grace,
        leader_settle: args.leader_settle,
        max_registrations: args.max_registrations,
        max_registrations_per_identity: args.max_registrations_per_identity,
        transport: args.security.transport()?,
        server: args.server.limits()?,
        authentication: args.security.authentication()?,
        readiness: Readiness::new("starting"),
        group_owners: args.security.group_owners()?,
        metrics: metrics::Metrics::default(),
    };
    // As the dispatcher's: the probes' connections must not wait for a dropped SYN.
    let admin = kube_dispatch_server::bounds::listen(args.admin_listen)
        .with_context(|| format!("cannot listen on {} (--admin-listen)", args.admin_listen))?;
    let admin_stop = CancellationToken::new();
    tokio::spawn(admin::serve(
        admin,
        config.readiness.clone(),
        config.metrics.clone(),
        admin_stop.clone(),
    ));
    let shutdown = CancellationToken::new();
    tokio::spawn(kube_dispatch_server::signal::cancel_on_signal(
        shutdown.clone(),
    ));
    info!(?config, "starting");
    let served = serve(config, client, listener, shutdown, None).await;
    admin_stop.cancel();
    if let Err(e) = served {
        warn!(error = %e, "load balancer failed");
        return Err(e.into());
    }
    Ok(())
}
