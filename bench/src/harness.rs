//! The benchmark harness behind `make bench`.

pub(crate) mod apiserver;
pub(crate) mod objects;
pub(crate) mod plot;
pub(crate) mod process;
pub(crate) mod report;
pub(crate) mod run;
