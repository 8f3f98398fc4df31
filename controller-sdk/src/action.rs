//! What a reconcile asks for next, as in kube-runtime.

use std::time::Duration;

/// The outcome of a successful reconcile, and of an error policy.
///
/// Same constructors as `kube::runtime::controller::Action`, so a kube-rs controller ports by
/// changing the import. The difference is where it goes: a requeue is sent to the dispatcher,
/// which delivers the key again after the delay, to whichever replica then owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `duration`, even if nothing changes.
    #[must_use]
    pub const fn requeue(duration: Duration) -> Self {
        Self {
            requeue_after: Some(duration),
        }
    }

    /// Reconcile again only when something changes (or at the dispatcher's periodic resync).
    #[must_use]
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    /// The requested delay, if any.
    pub const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// The same request in kube-runtime's terms, for code shared with a kube-rs controller.
/// (kube-runtime's `Action` does not say what it holds, so there is no way back: a reconcile
/// that gets one from kube-runtime's `finalizer()` uses [`crate::finalizer::finalizer`].)
impl From<Action> for kube::runtime::controller::Action {
    fn from(action: Action) -> Self {
        match action.requeue_after {
            Some(after) => Self::requeue(after),
            None => Self::await_change(),
        }
    }
}
