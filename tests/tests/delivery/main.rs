//! Delivery against the real API server: what controllers written with the SDK are handed,
//! with which reason and key, and the contract's edges (`CONTRACT.md`).

mod configset;
mod contract_edges;
mod controller;
mod dispatcher;
mod finalizers;
mod ported;
mod precondition;
mod protobuf;
mod traces;
