//! The kube-dispatch controller SDK: stateless Kubernetes controllers that hold no cache and
//! need no leader election.
//!
//! A controller written against this crate looks like a kube-rs `Controller`: a reconcile
//! function, an error policy and a context, started with [`Controller::run`]. Instead of
//! running informers, each replica registers with the load balancer, opens a session on each
//! dispatcher the load balancer assigns it (or on each dispatcher it is given), long-polls
//! it for reconcile requests, runs them with bounded concurrency, and acknowledges each
//! outcome. Dispatchers make sure each key is reconciled by one replica of the group at a time,
//! so replicas can be added, killed and restarted freely.
//!
//! Start at [`Controller`].
//!
//! | module | holds |
//! | --- | --- |
//! | `controller` | [`Controller`], its options and [`Controller::run`] |
//! | `from_kube` | [`Controller::for_api`], [`Controller::owns_api`] and [`Controller::watches`]: kube-runtime's `Controller::new`, `owns` and `watches`, with their arguments |
//! | `action`, `error`, `health` | what a reconcile returns ([`Action`]), what fails ([`Error`]), liveness and readiness ([`Health`]) |
//! | [`precondition`] | writes conditional on the resourceVersion a reconcile was given: merge patches, server-side applies as a field manager, replaces |
//! | [`reads`] | what a kube-rs controller read from its reflector store (children, `find`), from the watch cache: the children the request lists by name, else one LIST of a namespace |
//! | [`finalizer`] | kube-runtime's `finalizer()` with the SDK's [`Action`]: a kube-rs controller with finalizers ports by its imports |
//! | `targets` | which dispatchers a replica polls: a fixed list, or the load balancer's assignment |
//! | `discovery` | [`DispatcherService`]: the dispatchers a replica adds from their headless Service while no load balancer answers |
//! | `runtime` | sessions, long-polls, acks, the reconcile runner and object loading |
//! | [`metrics`] | the replica's metrics, by controller-runtime's names, served with `/healthz` and `/readyz` on [`Controller::admin_listen`] |
//! | `fence` | when a replica must count a session as lost, from when its calls were sent |
//! | `reconnect` | how reconnects are paced |
//! | [`traces`] | OpenTelemetry export: each reconcile span is a child of the dispatcher's span for the change that caused it |

#![forbid(unsafe_code)]

mod action;
pub mod api_requests;
pub mod children;
mod controller;
mod discovery;
mod error;
mod fence;
pub mod finalizer;
mod from_kube;
mod health;
pub mod memo;
pub mod metrics;
mod own_writes;
pub mod precondition;
pub mod reads;
mod reconnect;
mod runtime;
mod targets;

pub use action::Action;
pub use controller::Controller;
pub use discovery::DispatcherService;
pub use error::Error;
pub use health::Health;
pub use kube_dispatch_proto::v1::{ObjectPart, PayloadMode};
pub use targets::DEFAULT_LOAD_BALANCER;

/// Traces across the hop. Each reconcile runs in a `reconcile` span; when the dispatcher
/// exports traces, the delivery carries the W3C context of its span for the change, and the
/// reconcile span becomes its child. Add [`traces::otlp_layer`] to your subscriber (beside its
/// fmt layer) to export the replica's spans too, and keep the [`traces::Traces`] it returns
/// until the end of `main`; the example `configmap_hasher` does so when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set. A controller with an OpenTelemetry pipeline of its own
/// (its own `tracing_opentelemetry` layer, of the release this SDK uses) keeps it: the reconcile
/// span joins the dispatcher's trace in that pipeline just the same.
pub mod traces {
    pub use kube_dispatch_telemetry::logging::{OtlpLayer, Traces, TracesError, otlp_layer};
}
