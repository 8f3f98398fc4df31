//! Readiness and liveness of a running controller, for the replica's probes.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use kube_dispatch_telemetry::admin::Readiness;

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
/// // Served at /readyz and /healthz with Controller::admin_listen; or serve it yourself.
/// # let _ = (controller, health);
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<State>,
}

#[derive(Debug)]
struct State {
    sessions: AtomicUsize,
    stopped: AtomicBool,
    /// What the admin endpoint's `/readyz` answers, kept in step with the above.
    readiness: Readiness,
}

impl Default for State {
    fn default() -> Self {
        Self {
            sessions: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            readiness: Readiness::new(NO_SESSION),
        }
    }
}

const NO_SESSION: &str = "no dispatcher session open";

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
        self.update_readiness();
        SessionGuard(self.clone())
    }

    pub(crate) fn stopped(&self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
        self.update_readiness();
    }

    /// The readiness the admin endpoint serves.
    pub(crate) fn readiness(&self) -> Readiness {
        self.inner.readiness.clone()
    }

    fn update_readiness(&self) {
        let readiness = &self.inner.readiness;
        if !self.live() {
            readiness.not_ready("shutting down");
        } else if self.sessions() == 0 {
            readiness.not_ready(NO_SESSION);
        } else {
            readiness.ready();
        }
    }
}

/// Counts a session as open until dropped.
pub(crate) struct SessionGuard(Health);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.inner.sessions.fetch_sub(1, Ordering::Relaxed);
        self.0.update_readiness();
    }
}
