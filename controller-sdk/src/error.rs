//! Errors of a controller run, generic over the reconciler's own error as in kube-runtime.

use std::time::Duration;

/// What can go wrong for one reconcile request or one dispatcher connection.
#[derive(Debug, thiserror::Error)]
pub enum Error<E: std::error::Error + 'static> {
    /// The reconciler returned an error; the error policy decided what happens next.
    #[error("reconciler for {key} failed")]
    ReconcilerFailed {
        /// The request key.
        key: String,
        /// The reconciler's error.
        #[source]
        source: E,
    },
    /// The object could not be read from the API server; the request is retried with backoff.
    #[error("reading {key} from the API server failed")]
    ObjectRead {
        /// The request key.
        key: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The object the dispatcher sent does not deserialize as the controller's type.
    #[error("object {key} from the dispatcher is not a valid {kind}")]
    Decode {
        /// The request key.
        key: String,
        /// The kind expected.
        kind: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The reconcile ran past the dispatcher's maximum reconcile time and was cancelled, so the
    /// key's next owner never overlaps it; it is retried with backoff.
    #[error("reconcile of {key} ran past {limit:?} and was cancelled")]
    Timeout {
        /// The request key.
        key: String,
        /// The time limit.
        limit: Duration,
    },
    /// The controller makes a call the tier does not serve; it does not start. `instead` says
    /// what serves it.
    #[error("{call} is not served by the tier: {instead}")]
    Unserved {
        /// The builder call, as `watches(ConfigMap)`.
        call: String,
        /// What to call instead.
        instead: String,
    },
    /// A dispatcher could not be reached, refused the session, or the session was lost; the
    /// controller reconnects with backoff.
    #[error("dispatcher {address}: {status}")]
    Dispatcher {
        /// The dispatcher's address.
        address: String,
        /// What it answered.
        #[source]
        status: tonic::Status,
    },
}
