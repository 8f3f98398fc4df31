//! Readiness and liveness of a running controller, for the replica's probes.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

/// A handle on a controller's health; cheap to clone, readable from any thread (for example
/// from the HTTP handler of a readiness probe).
///
/// - **ready**: at least one dispatcher session is open, so the replica receives work;
/// - **live**: the controller is running and has not shut down.
///
/// ```no_run
/// # use k8s_openapi::api::core::v1::ConfigMap;
/// # use kube_dispatch_controller::Controller;
/// # async fn example(client: kube::Client) {
/// let controller = Controller::<ConfigMap>::new(client, "configmap-hasher");
/// let health = controller.health();
/// // Serve it: 200 from /readyz when health.ready(), 200 from /livez when health.live().
/// # let _ = (controller, health);
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    sessions: AtomicUsize,
    stopped: AtomicBool,
}

impl Health {
    /// Whether at least one dispatcher session is open.
    pub fn ready(&self) -> bool {
        self.sessions() > 0 && self.live()
    }

    /// Whether the controller has not shut down.
    pub fn live(&self) -> bool {
        !self.inner.stopped.load(Ordering::Relaxed)
    }

    /// Number of open dispatcher sessions.
    pub fn sessions(&self) -> usize {
        self.inner.sessions.load(Ordering::Relaxed)
    }

    pub(crate) fn session_opened(&self) -> SessionGuard {
        self.inner.sessions.fetch_add(1, Ordering::Relaxed);
        SessionGuard(self.clone())
    }

    pub(crate) fn stopped(&self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
    }
}

/// Counts a session as open until dropped.
pub(crate) struct SessionGuard(Health);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.inner.sessions.fetch_sub(1, Ordering::Relaxed);
    }
}
