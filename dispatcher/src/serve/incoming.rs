//! The connections a dispatcher accepts, handed from one term to the next.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The accepted connections, served by one term after another: the listener and its accept
/// loop live as long as the process, so a connection accepted while one term winds down is
/// served by the next. Bounded as the accept loop's channel is.
pub(super) struct Incoming(Arc<std::sync::Mutex<Option<IncomingConnections>>>);

type IncomingConnections =
    tokio::sync::mpsc::Receiver<std::io::Result<kube_dispatch_server::tls::Conn>>;

impl Incoming {
    pub(super) fn new(
        accepted: tokio_stream::wrappers::ReceiverStream<
            std::io::Result<kube_dispatch_server::tls::Conn>,
        >,
    ) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(accepted.into_inner()))))
    }

    /// The connections for one term's server, handed back when the server lets go of them
    /// (as it begins to stop), unless `shutdown` by then: the channel then closes, and the
    /// accept loop lets go of the listener while the server finishes, so that the address can
    /// be bound again as soon as the dispatcher has stopped.
    pub(super) fn stream(&self, shutdown: CancellationToken) -> TermIncoming {
        let accepted = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if accepted.is_none() {
            warn!("a term began while the previous one still held the accepted connections");
        }
        TermIncoming {
            accepted,
            home: self.0.clone(),
            shutdown,
        }
    }
}

/// One term's share of [`Incoming`].
pub(super) struct TermIncoming {
    accepted: Option<IncomingConnections>,
    home: Arc<std::sync::Mutex<Option<IncomingConnections>>>,
    shutdown: CancellationToken,
}

impl futures::Stream for TermIncoming {
    type Item = std::io::Result<kube_dispatch_server::tls::Conn>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        match self.accepted.as_mut() {
            Some(accepted) => accepted.poll_recv(cx),
            None => std::task::Poll::Ready(None),
        }
    }
}

impl Drop for TermIncoming {
    fn drop(&mut self) {
        if let Some(accepted) = self.accepted.take()
            && !self.shutdown.is_cancelled()
        {
            *self.home.lock().unwrap_or_else(|e| e.into_inner()) = Some(accepted);
        }
    }
}
