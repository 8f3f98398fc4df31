//! The benchmark harness behind `make bench` (and `make bench-security`, [`security`], and
//! `make bench-metrics`, [`metrics`]).

pub(crate) mod apiserver;
pub(crate) mod metrics;
pub(crate) mod objects;
pub(crate) mod plot;
pub(crate) mod process;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod security;
