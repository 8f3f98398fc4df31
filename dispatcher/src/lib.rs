//! The kube-dispatch dispatcher.
//!
//! A dispatcher holds one non-caching watch per subscribed resource, keeps only the keys that
//! fall on its slice of the consistent-hash ring, and hands reconcile requests to controller
//! replicas that long-poll it over the [`kube_dispatch_proto::v1`] API. See the README and
//! `DESIGN` sections 2 to 6 for the delivery contract it implements.

#![forbid(unsafe_code)]

pub mod config;
pub mod discovery;
pub mod group;
pub mod groups;
pub mod grpc;
mod housekeeping;
pub mod membership;
pub mod serve;
pub mod watch;
