//! SIGTERM and SIGINT start a drain.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Cancels `shutdown` on SIGTERM or SIGINT.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
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
