//! The kube-dispatch load balancer.
//!
//! A lookaside placement service: controller replicas register with it and learn which
//! dispatchers to poll over the [`kube_dispatch_proto::v1`] API. It is never in the data path.
//!
//! So far it holds the placement rules ([`placement::place`]); the service around them comes
//! with ring membership.

#![forbid(unsafe_code)]

pub mod placement;
