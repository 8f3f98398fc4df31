//! What the binaries share: the Kubernetes client from flags, logging, and signals.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A Kubernetes client from `kubeconfig`, else from the environment (in-cluster configuration,
/// `KUBECONFIG`, `~/.kube/config`).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
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

/// Logs to stdout, as text or JSON lines, at the level RUST_LOG sets (default info).
pub fn init_logging(json: bool) {
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

/// Cancels `shutdown` on SIGTERM or SIGINT.
pub async fn shutdown_on_signal(shutdown: CancellationToken) {
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
