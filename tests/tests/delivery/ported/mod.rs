//! Controllers written as kube-rs's guide writes them, each with its tests, and the same
//! controllers ported to the SDK. They live with the SDK's examples
//! (`controller-sdk/examples/ported`, whose `ported` example runs the ports in one process, as
//! the real-node e2e deploys them); their tests run here, against the local API server.
//! `tests/check-ports.sh` (in `make test`) checks that each pair differs in at most ten lines,
//! its tests' set-up included.

#[path = "../../../../controller-sdk/examples/ported/bundle.rs"]
mod bundle;
#[path = "../../../../controller-sdk/examples/ported/bundles.rs"]
mod bundles;
#[path = "../../../../controller-sdk/examples/ported/bundles_kube_rs.rs"]
mod bundles_kube_rs;
#[path = "../../../../controller-sdk/examples/ported/mirror.rs"]
mod mirror;
#[path = "../../../../controller-sdk/examples/ported/mirrors.rs"]
mod mirrors;
#[path = "../../../../controller-sdk/examples/ported/mirrors_kube_rs.rs"]
mod mirrors_kube_rs;
