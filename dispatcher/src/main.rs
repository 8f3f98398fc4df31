//! The `kube-dispatch-dispatcher` binary: flags, logging, signals; the rest is the library.

use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use kube_dispatch_dispatcher::{
    backoff::Backoff,
    queue::QueueConfig,
    serve::{ServeConfig, serve},
    server::{Limits, Settings},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// kube-dispatch dispatcher: holds one non-caching watch per subscribed resource, keeps the keys
/// on its slice of the consistent-hash ring, and serves reconcile requests to controller
/// replicas over gRPC long-polling (with grpc.health.v1 and server reflection on the same port).
///
/// Every flag can also be set through the environment variable named in brackets. Durations
/// take units: 500ms, 10s, 5m, 1h.
#[derive(Debug, Parser)]
#[command(name = "kube-dispatch-dispatcher", version, about, long_about)]
struct Args {
    /// This dispatcher's identity on the ring, e.g. dispatcher-2. Defaults to the pod name.
    #[arg(long, env = "KD_DISPATCHER_ID")]
    id: Option<String>,

    /// Pod name, used as the identity when --id is not set (set from the downward API).
    #[arg(long, env = "POD_NAME", hide = true)]
    pod_name: Option<String>,

    /// The ring members, comma-separated, this dispatcher among them (e.g.
    /// dispatcher-0,dispatcher-1,dispatcher-2). Defaults to this dispatcher alone.
    #[arg(long, env = "KD_RING_MEMBERS", value_delimiter = ',')]
    members: Vec<String>,

    /// Address to serve gRPC on.
    #[arg(long, env = "KD_LISTEN", default_value = "0.0.0.0:7070")]
    listen: std::net::SocketAddr,

    /// Kubeconfig to use; in a pod, the in-cluster configuration is used when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,

    /// Every key is re-delivered once per interval, spread evenly, without a LIST; 0 disables.
    #[arg(long, env = "KD_RESYNC_INTERVAL", default_value = "10m", value_parser = humantime::parse_duration)]
    resync_interval: Duration,

    /// Session ttl granted when the client asks for none.
    #[arg(long, env = "KD_SESSION_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    session_ttl: Duration,

    /// Longest session ttl a client may ask for.
    #[arg(long, env = "KD_MAX_SESSION_TTL", default_value = "5m", value_parser = humantime::parse_duration)]
    max_session_ttl: Duration,

    /// Longest a long-poll waits for work before returning empty; must be shorter than the
    /// session ttl, since a waiting poll does not renew its session.
    #[arg(long, env = "KD_MAX_POLL_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    max_poll_wait: Duration,

    /// Most reconcile requests one poll returns.
    #[arg(long, env = "KD_MAX_POLL_ITEMS", default_value_t = 1000)]
    max_poll_items: usize,

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

    /// Largest request message accepted, in bytes.
    #[arg(long, env = "KD_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_message_bytes: usize,

    /// Bytes of object bodies a group may hold for queued keys; past it, keys are delivered
    /// without body and the controller reads the object fresh.
    #[arg(long, env = "KD_BODY_BUDGET_BYTES", default_value_t = 64 * 1024 * 1024)]
    body_budget_bytes: usize,

    /// A watch with no subscriber left is stopped after this long.
    #[arg(long, env = "KD_WATCH_GRACE", default_value = "30s", value_parser = humantime::parse_duration)]
    watch_grace: Duration,

    /// A group with no session left is dropped after this long (its keys are forgotten).
    #[arg(long, env = "KD_IDLE_GROUP_GRACE", default_value = "60s", value_parser = humantime::parse_duration)]
    idle_group_grace: Duration,

    /// Longest the drain may take after SIGTERM or SIGINT.
    #[arg(long, env = "KD_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,

    /// Log as JSON lines instead of text. The level comes from RUST_LOG (default info).
    #[arg(long, env = "KD_LOG_JSON")]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        id,
        pod_name,
        members,
        listen,
        kubeconfig,
        resync_interval,
        session_ttl,
        max_session_ttl,
        max_poll_wait,
        max_poll_items,
        backoff_base,
        backoff_cap,
        max_reconcile_time,
        max_sessions,
        max_sessions_per_group,
        max_message_bytes,
        body_budget_bytes,
        watch_grace,
        idle_group_grace,
        drain_timeout,
        log_json,
    } = Args::parse();
    init_logging(log_json);

    let identity = id
        .or(pod_name)
        .context("no identity: set --id (KD_DISPATCHER_ID) or POD_NAME")?;
    let members = if members.is_empty() {
        vec![identity.clone()]
    } else {
        members
    };
    for (name, d) in [
        ("--session-ttl", session_ttl),
        ("--max-session-ttl", max_session_ttl),
        ("--max-poll-wait", max_poll_wait),
        ("--backoff-base", backoff_base),
        ("--backoff-cap", backoff_cap),
        ("--max-reconcile-time", max_reconcile_time),
    ] {
        anyhow::ensure!(!d.is_zero(), "{name} must be greater than zero");
    }
    anyhow::ensure!(
        max_poll_wait < session_ttl,
        "--max-poll-wait ({max_poll_wait:?}) must be shorter than --session-ttl ({session_ttl:?}), or idle sessions expire while polling"
    );
    anyhow::ensure!(
        backoff_base <= backoff_cap,
        "--backoff-base must not exceed --backoff-cap"
    );

    let client = kube_client(kubeconfig.as_deref()).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let settings = Settings {
        identity,
        limits: Limits {
            max_sessions,
            max_sessions_per_group,
            default_ttl: session_ttl,
            min_ttl: Duration::from_secs(1).min(session_ttl),
            max_ttl: max_session_ttl.max(session_ttl),
            max_poll_wait,
            max_poll_items: max_poll_items.max(1),
            ..Limits::default()
        },
        queue: QueueConfig {
            backoff: Backoff {
                base: backoff_base,
                cap: backoff_cap,
            },
            max_reconcile_time,
            body_budget: body_budget_bytes,
        },
        resync_interval,
        idle_group_grace,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    serve(
        ServeConfig {
            settings,
            members,
            watch_grace,
            max_message_bytes,
            drain_timeout,
        },
        client,
        listener,
        shutdown,
        None,
    )
    .await?;
    Ok(())
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("invalid kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig given and no in-cluster configuration found")?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn signal_shutdown(shutdown: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => info!("SIGINT: draining"),
        () = terminate => info!("SIGTERM: draining"),
    }
    shutdown.cancel();
}
