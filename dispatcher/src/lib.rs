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
//! | [`group`] | one controller group: its queue, partition and sessions under one lock, wake-ups, timers |
//! | [`metrics`] | the groups' metrics at each scrape: controller-runtime's `workqueue_*` and kube-dispatch's own |
//! | `housekeeping` | session expiry, idle groups, the ring's release, resync, queue status |
//! | [`grpc`] | the gRPC services (controllers' and peers'): wire and `Status` only |
//! | [`k8s`] | what faces the API server: watches and their routing rules, the Lease and membership, discovery |
//! | [`lease_sessions`] | the sessions the Lease lists (a session is handed keys once listed), and the reports of ended sessions it carries |

#![forbid(unsafe_code)]

pub mod config;
pub mod group;
pub mod grpc;
mod housekeeping;
pub mod k8s;
pub mod lease_sessions;
pub mod metrics;
pub mod security;
pub mod serve;
pub mod table;
