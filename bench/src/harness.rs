//! The benchmark harness behind `make bench` (`kube-dispatch-bench compare`: [`run`] and
//! [`report`]) and the other subcommands: `make bench-security` ([`security`]),
//! `make bench-hostile` ([`hostile`]), `make bench-metrics` ([`metrics`]), `make bench-ceiling`
//! ([`ceiling`]) and `make bench-shards` ([`shards`]). Each returns what it measured, which
//! renders as the Markdown tables and serializes as the JSON of `--json`.

pub(crate) mod admin;
pub(crate) mod apiserver;
pub(crate) mod ceiling;
pub(crate) mod hostile;
pub(crate) mod metrics;
pub(crate) mod objects;
pub(crate) mod plot;
pub(crate) mod process;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod security;
pub(crate) mod shards;
