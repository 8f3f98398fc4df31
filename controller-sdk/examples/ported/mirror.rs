//! The Mirror kind both versions of the mirrors controller keep: a record of the data of the
//! ConfigMap it names. (The Go SDK's mirrors example keeps the same kind.)

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a Mirror asks for.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "examples.kube-dispatch.dev",
    version = "v1",
    kind = "Mirror",
    namespaced,
    status = "MirrorStatus"
)]
#[serde(rename_all = "camelCase")]
pub(super) struct MirrorSpec {
    /// The ConfigMap, in the Mirror's namespace, whose data it records.
    pub(super) config_map_name: String,
}

/// What the controller recorded last.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct MirrorStatus {
    /// The hex SHA-256 of the ConfigMap's keys and values, in key order.
    pub(super) data_hash: String,
    /// The generation that hash was recorded for.
    pub(super) observed_generation: i64,
}
