//! Operations: the operator API and `kdctl`, metrics under their documented names, and the
//! manifests of `deploy/`.

mod deploy;
mod metrics;
mod operator;
