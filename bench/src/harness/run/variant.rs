//! What a run runs: the variants the benchmark compares (the incumbents, and the tier in its
//! shapes), as they are named on the command line and in the tables.

use std::fmt;

/// How the controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Variant {
    /// kube-rs `Controller`, reflector cache of whole objects.
    KubeRs,
    /// The same, its watcher listing by streaming (`watcher::Config::streaming_lists`: one
    /// WATCH with `sendInitialEvents`, served from the API server's watch cache) instead of
    /// pages of 500: what kube-rs users turn to for large collections.
    KubeRsStreaming,
    /// kube-rs `Controller`, metadata-only watch and cache, GET per reconcile.
    KubeRsMetadata,
    /// controller-runtime (Go), its default cache of whole objects.
    ControllerRuntime,
    /// controller-runtime (Go), `builder.OnlyMetadata`: metadata-only cache, GET per reconcile.
    ControllerRuntimeMetadata,
    /// The SDK behind the dispatchers and the load balancer, with this many replicas.
    Dispatch(usize),
    /// As [`Variant::Dispatch`], the dispatchers listing in another mode than their default
    /// whole lists (`--list-mode`).
    DispatchListing(ListMode, usize),
    /// As [`Variant::Dispatch`], each reconcile listing its children instead of reading them
    /// from its request (`--children`).
    DispatchList(usize),
    /// The controller-runtime controller ported to the Go SDK
    /// (`bench/controller-runtime-dispatch`), with this many replicas, on the tier.
    GoDispatch(usize),
    /// As [`Variant::Dispatch`], each reconcile finding its children as a kube-rs controller
    /// reads them from its store, with `reads::children` (`--children-from index`).
    DispatchIndex(usize),
    /// controller-runtime, each reconcile listing its children through a field index of its
    /// cache (`--children-from index`).
    ControllerRuntimeIndex,
    /// [`Variant::GoDispatch`], the children listed through the same field index, which the
    /// Go SDK serves without a cache (`dispatch.NewCache`).
    GoDispatchIndex(usize),
}

/// How the dispatchers of a [`Variant::DispatchListing`] list (`--list-mode` of
/// kube-dispatch-dispatcher, whose default is one whole LIST).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ListMode {
    /// LIST in pages of 500.
    Paged,
    /// One WATCH with `sendInitialEvents`.
    Stream,
    /// Whole lists, each dispatcher making its own (`--share-lists=false`): the tier before
    /// lists were shared.
    Alone,
    /// Whole lists and watches in JSON (`--protobuf=false`): the tier before it read built-in
    /// resources in protobuf.
    Json,
}

impl ListMode {
    /// The dispatcher's `--list-mode` value.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            ListMode::Paged => "paged",
            ListMode::Stream => "stream",
            ListMode::Alone | ListMode::Json => "whole",
        }
    }

    /// The dispatcher's `--protobuf` value.
    pub(crate) fn protobuf(self) -> bool {
        self != ListMode::Json
    }

    /// The dispatcher's `--share-lists` value (lists in pages or by streaming are never
    /// shared, whatever it says).
    pub(crate) fn shared(self) -> bool {
        self != ListMode::Alone
    }

    /// Its name in a variant's: `dispatch-<name>-<replicas>`.
    fn name(self) -> &'static str {
        match self {
            ListMode::Alone => "alone",
            ListMode::Json => "json",
            other => other.flag(),
        }
    }
}

impl Variant {
    /// Whether it runs on the tier (dispatchers and load balancer).
    pub(crate) fn on_tier(self) -> bool {
        matches!(
            self,
            Variant::Dispatch(_)
                | Variant::DispatchList(_)
                | Variant::GoDispatch(_)
                | Variant::DispatchListing(..)
                | Variant::DispatchIndex(_)
                | Variant::GoDispatchIndex(_)
        )
    }

    /// Whether its reconciles list their children through an index (`--children-from index`).
    pub(crate) fn by_index(self) -> bool {
        matches!(
            self,
            Variant::DispatchIndex(_)
                | Variant::ControllerRuntimeIndex
                | Variant::GoDispatchIndex(_)
        )
    }

    /// The Rust SDK with one replica, whatever its dispatchers' list mode: what the
    /// incumbents' figures are divided by.
    pub(crate) fn is_sdk_alone(self) -> bool {
        matches!(self, Variant::Dispatch(1) | Variant::DispatchListing(_, 1))
    }

    /// The dispatchers' `--list-mode`, when not their default.
    pub(crate) fn list_mode(self) -> Option<ListMode> {
        match self {
            Variant::DispatchListing(mode, _) => Some(mode),
            _ => None,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variant::KubeRs => f.write_str("kube-rs"),
            Variant::KubeRsStreaming => f.write_str("kube-rs-streaming"),
            Variant::KubeRsMetadata => f.write_str("kube-rs-metadata"),
            Variant::ControllerRuntime => f.write_str("controller-runtime"),
            Variant::ControllerRuntimeMetadata => f.write_str("controller-runtime-metadata"),
            Variant::Dispatch(n) => write!(f, "dispatch-{n}"),
            Variant::DispatchList(n) => write!(f, "dispatch-list-{n}"),
            Variant::GoDispatch(n) => write!(f, "go-dispatch-{n}"),
            Variant::DispatchListing(mode, n) => write!(f, "dispatch-{}-{n}", mode.name()),
            Variant::DispatchIndex(n) => write!(f, "dispatch-index-{n}"),
            Variant::ControllerRuntimeIndex => f.write_str("controller-runtime-index"),
            Variant::GoDispatchIndex(n) => write!(f, "go-dispatch-index-{n}"),
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kube-rs" => Ok(Variant::KubeRs),
            "kube-rs-streaming" => Ok(Variant::KubeRsStreaming),
            "kube-rs-metadata" => Ok(Variant::KubeRsMetadata),
            "controller-runtime" => Ok(Variant::ControllerRuntime),
            "controller-runtime-metadata" => Ok(Variant::ControllerRuntimeMetadata),
            "controller-runtime-index" => Ok(Variant::ControllerRuntimeIndex),
            _ => {
                let replicas = |n: &str| n.parse().ok().filter(|n| (1..=64).contains(n));
                if let Some(n) = s.strip_prefix("go-dispatch-index-") {
                    replicas(n).map(Variant::GoDispatchIndex)
                } else if let Some(n) = s.strip_prefix("dispatch-index-") {
                    replicas(n).map(Variant::DispatchIndex)
                } else if let Some(n) = s.strip_prefix("go-dispatch-") {
                    replicas(n).map(Variant::GoDispatch)
                } else if let Some(n) = s.strip_prefix("dispatch-list-") {
                    replicas(n).map(Variant::DispatchList)
                } else if let Some(n) = s.strip_prefix("dispatch-paged-") {
                    replicas(n).map(|n| Variant::DispatchListing(ListMode::Paged, n))
                } else if let Some(n) = s.strip_prefix("dispatch-stream-") {
                    replicas(n).map(|n| Variant::DispatchListing(ListMode::Stream, n))
                } else if let Some(n) = s.strip_prefix("dispatch-alone-") {
                    replicas(n).map(|n| Variant::DispatchListing(ListMode::Alone, n))
                } else if let Some(n) = s.strip_prefix("dispatch-json-") {
                    replicas(n).map(|n| Variant::DispatchListing(ListMode::Json, n))
                } else {
                    s.strip_prefix("dispatch-").and_then(replicas).map(Variant::Dispatch)
                }
                .ok_or_else(|| {
                    format!(
                        "unknown variant {s:?}: expected kube-rs, kube-rs-streaming, kube-rs-metadata, controller-runtime, controller-runtime-metadata, controller-runtime-index, dispatch-<replicas 1..=64>, dispatch-paged-<replicas 1..=64>, dispatch-stream-<replicas 1..=64>, dispatch-alone-<replicas 1..=64>, dispatch-json-<replicas 1..=64>, dispatch-list-<replicas 1..=64>, dispatch-index-<replicas 1..=64>, go-dispatch-<replicas 1..=64> or go-dispatch-index-<replicas 1..=64>"
                    )
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
