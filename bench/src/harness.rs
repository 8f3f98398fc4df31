//! The benchmark harness behind `make bench` (and `make bench-security`, [`security`],
//! `make bench-metrics`, [`metrics`], and `make bench-ceiling`, [`ceiling`]).

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
