//! Benchmarks of kube-dispatch side by side with the incumbent, a kube-rs `Controller` with its
//! reflector cache, on a real kube-apiserver and etcd on loopback.
//!
//! Two binaries:
//!
//! - `bench-controller` (`src/bin/bench-controller.rs`): one realistic controller that keeps a
//!   content-hash annotation on every object, runnable three ways (`--runtime kube-rs`,
//!   `kube-rs-metadata` or `dispatch`). Every reconcile prints one [`ReconcileStart`] line on
//!   stdout, which is how the harness sees what ran when.
//! - `kube-dispatch-bench` (`main.rs`): the harness behind `make bench`. It creates the
//!   objects, runs each variant in turn, measures memory, CPU, start-up, latency and API-server
//!   requests, and prints the tables its page in `bench/results/` holds.
//!
//! This library holds what both binaries must agree on.

use std::{
    collections::BTreeMap,
    fmt,
    str::FromStr,
    time::{SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The annotation the benchmark controller keeps equal to [`content_hash`] of the object's data.
pub const ANNOTATION: &str = "bench.kube-dispatch.dev/content-hash";

/// The label each child of a Record carries (`bench-controller --children`), naming its owner.
pub const CHILD_LABEL: &str = "bench.kube-dispatch.dev/owner";

/// The label of the objects of a run spread over namespaces: every controller of such a run
/// selects them by its value, children included (a Record's children carry their owner's).
pub const SET_LABEL: &str = "kube-dispatch.dev/bench-set";

/// The data key of a child that holds [`content_hash`] of its owner's data: what the
/// controller keeps it equal to.
pub const CHILD_HASH_KEY: &str = "owner-hash";

/// The name of child `i` of the Record `owner`.
#[must_use]
pub fn child_name(owner: &str, i: usize) -> String {
    format!("{owner}-c{i}")
}

/// The ConfigMap that child `i` of `owner` (a Record) must be: labelled with its owner (and
/// with its owner's [`SET_LABEL`], when it has one), controlled by it, holding the hash of its
/// data.
#[must_use]
pub fn desired_child(owner: &Record, i: usize) -> ConfigMap {
    use kube::{Resource as _, ResourceExt as _};
    let name = owner.name_any();
    let mut labels = std::collections::BTreeMap::from([(CHILD_LABEL.to_owned(), name.clone())]);
    if let Some(set) = owner.labels().get(SET_LABEL) {
        labels.insert(SET_LABEL.to_owned(), set.clone());
    }
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(child_name(&name, i)),
            namespace: owner.namespace(),
            labels: Some(labels),
            owner_references: owner.controller_owner_ref(&()).map(|o| vec![o]),
            ..kube::api::ObjectMeta::default()
        },
        data: Some([(CHILD_HASH_KEY.to_owned(), content_hash(owner.content()))].into()),
        ..ConfigMap::default()
    }
}

/// Whether `child` holds what [`desired_child`] gives it.
#[must_use]
pub fn child_is_current(owner: &Record, child: &ConfigMap) -> bool {
    child
        .data
        .as_ref()
        .and_then(|d| d.get(CHILD_HASH_KEY))
        .is_some_and(|h| *h == content_hash(owner.content()))
}

/// The custom resource of the benchmark: a namespaced object holding a string map, like a
/// ConfigMap's `data` but under `spec`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "bench.kube-dispatch.dev",
    version = "v1",
    kind = "Record",
    plural = "records",
    namespaced
)]
pub struct RecordSpec {
    /// What the record holds.
    #[serde(default)]
    pub data: BTreeMap<String, String>,
}

/// An object whose content the benchmark controller hashes.
pub trait Content {
    /// The string map the hash covers.
    fn content(&self) -> Option<&BTreeMap<String, String>>;
}

impl Content for ConfigMap {
    fn content(&self) -> Option<&BTreeMap<String, String>> {
        self.data.as_ref()
    }
}

impl Content for Record {
    fn content(&self) -> Option<&BTreeMap<String, String>> {
        Some(&self.spec.data)
    }
}

/// SHA-256 of the map, in key order, as lowercase hex.
#[must_use]
pub fn content_hash(data: Option<&BTreeMap<String, String>>) -> String {
    let mut hasher = Sha256::new();
    for (k, v) in data.into_iter().flatten() {
        hasher.update(k.as_bytes());
        hasher.update([0]);
        hasher.update(v.as_bytes());
        hasher.update([0]);
    }
    format!("{:x}", hasher.finalize())
}

/// Microseconds since the Unix epoch: the clock both binaries stamp events with, so a write
/// made by the harness and a reconcile started by another process compare directly.
#[must_use]
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The line `bench-controller` prints when a reconcile starts:
/// `reconcile <unix micros> <namespace>/<name> <resourceVersion>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileStart {
    /// When the reconcile function was entered ([`now_micros`]).
    pub at_micros: u64,
    /// `namespace/name`.
    pub key: String,
    /// The resourceVersion of the object the reconcile was given. On an etcd-backed API server
    /// it is the etcd revision, so later writes have larger numbers; the harness relies on that
    /// (and only the harness: nothing in kube-dispatch does).
    pub resource_version: u64,
}

/// A line that is not a [`ReconcileStart`].
#[derive(Debug, thiserror::Error)]
#[error("not a reconcile line: {0:?}")]
pub struct NotAReconcileLine(String);

impl fmt::Display for ReconcileStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "reconcile {} {} {}",
            self.at_micros, self.key, self.resource_version
        )
    }
}

impl FromStr for ReconcileStart {
    type Err = NotAReconcileLine;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let bad = || NotAReconcileLine(line.to_owned());
        let mut parts = line.split(' ');
        if parts.next() != Some("reconcile") {
            return Err(bad());
        }
        let at_micros = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let key = parts.next().filter(|k| k.contains('/')).ok_or_else(bad)?;
        let resource_version = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            at_micros,
            key: key.to_owned(),
            resource_version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconcile_lines_round_trip_and_reject_other_output() {
        let start = ReconcileStart {
            at_micros: 1_790_000_000_123_456,
            key: "ns/obj-00001".to_owned(),
            resource_version: 4242,
        };
        assert_eq!(
            start.to_string().parse::<ReconcileStart>().ok(),
            Some(start)
        );
        for line in [
            "",
            "reconcile",
            "reconcile 1 ns/a",
            "reconcile 1 nokey 3",
            "reconcile x ns/a 3",
            "reconcile 1 ns/a 3 extra",
            "2026-11-22T00:00:00Z INFO something",
        ] {
            assert!(line.parse::<ReconcileStart>().is_err(), "{line:?} parsed");
        }
    }

    #[test]
    fn the_hash_covers_keys_and_values_in_order() {
        let a: BTreeMap<_, _> = [("a".to_owned(), "bc".to_owned())].into();
        let b: BTreeMap<_, _> = [("ab".to_owned(), "c".to_owned())].into();
        assert_ne!(content_hash(Some(&a)), content_hash(Some(&b)));
        assert_eq!(content_hash(None), content_hash(Some(&BTreeMap::new())));
    }
}
