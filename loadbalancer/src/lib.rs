//! The kube-dispatch load balancer.
//!
//! A lookaside placement service: controller replicas register with it and learn which
//! dispatchers to poll over the [`kube_dispatch_proto::v1`] API. It is never in the data path.

#![forbid(unsafe_code)]
