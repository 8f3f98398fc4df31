//! Controllers written as kube-rs's guide writes them, each with its test, and the same
//! controllers ported to the SDK: `tests/check-ports.sh` (in `make test`) checks that each pair
//! differs in at most ten lines, its test's set-up included.

mod bundle;
mod bundles;
mod bundles_kube_rs;
mod mirror;
mod mirrors;
mod mirrors_kube_rs;
