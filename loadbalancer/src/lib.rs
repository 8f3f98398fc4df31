//! The kube-dispatch load balancer.
//!
//! A lookaside placement service: controller replicas register with it over the
//! `kubedispatch.v1.LoadBalancer` API and learn which dispatchers to poll; it is never in the
//! data path. The leader (elected through a Lease) learns the dispatchers from their Leases,
//! places each group's replicas with [`placement::place`] and pushes every change; standbys
//! redirect registrations to it. Entry point: [`service::serve`].
//!
//! | module | holds |
//! | --- | --- |
//! | [`service`] | the server's configuration and [`service::serve`], which wires the rest |
//! | `grpc` | the `LoadBalancer` gRPC service: the leader answers, a standby redirects |
//! | `election` | leader election on one Lease, and what leading means for the registry |
//! | `trackers` | the dispatchers from their Leases, and the expiry of replicas that went away |
//! | [`registry`] | registered replicas and live dispatchers, and the assignments pushed to them |
//! | [`placement`] | which dispatchers each replica of a group polls (pure) |
//! | [`metrics`] | the registry and leadership, read at each scrape |

#![forbid(unsafe_code)]

mod election;
mod grpc;
pub mod metrics;
pub mod placement;
pub mod registry;
pub mod service;
mod trackers;
