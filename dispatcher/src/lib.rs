//! The kube-dispatch dispatcher.
//!
//! A dispatcher holds one non-caching watch per subscribed resource, keeps only the keys that
//! fall on its slice of the consistent-hash ring, and hands reconcile requests to controller
//! replicas that long-poll it over the [`kube_dispatch_proto::v1`] API. The README and
//! `HANDOVER.md` describe the delivery contract it implements; the pure rules (the queue, the
//! handover gate) are in `kube_dispatch_core`.
//!
//! Start at [`serve::serve`], which wires these together:
//!
//! | module | holds |
//! | --- | --- |
//! | [`config`] | every setting: what `serve` runs with, membership and Leases, the table, client limits |
//! | [`serve`] | wiring: watches, groups, membership and the gRPC server; the drain |
//! | [`table`] | the group table: groups made and dropped, sessions found by their wire id; open, poll, ack, close, in domain terms |
//! | [`security`] | who may do what: TLS, authenticated callers, read access per group, Peer callers |
//! | [`group`] | one controller group: its queue, transit and sessions under one lock, wake-ups, timers |
//! | [`metrics`] | the groups' metrics at each scrape: controller-runtime's `workqueue_*` and kube-dispatch's own |
//! | `housekeeping` | session expiry, idle groups, the ring's release, resync, queue status |
//! | [`grpc`] | the gRPC services (controllers' and peers'): wire and `Status` only |
//! | [`watch`] | the watches of the API server: the registry of shared watches, one watch's loop and lists, its events routed to request keys and fanned out to groups, discovery |
//! | [`membership`] | this dispatcher's Lease, the ring and the handover gate judged from all Leases, and the sessions the Lease lists |

#![forbid(unsafe_code)]

pub mod config;
pub mod group;
pub mod grpc;
mod housekeeping;
pub mod membership;
pub mod metrics;
pub mod security;
pub mod serve;
pub mod table;
pub mod watch;
