//! The Bundle kind both versions of the bundles controller keep: a number of identical
//! ConfigMaps, named after the Bundle.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a Bundle asks for.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "examples.kube-dispatch.dev",
    version = "v1",
    kind = "Bundle",
    namespaced,
    status = "BundleStatus"
)]
pub(super) struct BundleSpec {
    /// How many ConfigMaps hold `data`: `<bundle>-0` to `<bundle>-<copies - 1>`.
    pub(super) copies: u32,
    /// What each copy holds.
    pub(super) data: BTreeMap<String, String>,
}

/// What the controller saw last.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct BundleStatus {
    /// How many copies hold the data.
    pub(super) ready_copies: u32,
    /// The generation those figures are of.
    pub(super) observed_generation: i64,
}
