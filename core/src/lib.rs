//! The pure rules of kube-dispatch: what a dispatcher decides, with no I/O, no Kubernetes
//! client and no gRPC server. Time is a parameter (an `Instant` passed in), so every rule is
//! unit-tested without a clock, and the protocol model (`model/`) can check the same ideas.
//!
//! | module | holds |
//! | --- | --- |
//! | [`queue`] | one group's work queue: coalescing, per-key exclusivity, retries, fairness (start at [`queue::GroupQueue`]) |
//! | [`children`] | the owned objects a watch shows, both ways: each child's owner, each owner's children |
//! | [`handover`] | the handover gate: which keys a dispatcher may hand out while the ring changes ([`handover::Handover`], [`handover::Slice`]) |
//! | [`key`] | a request key with its hash, computed once |
//! | [`leases`] | what a process knows of the dispatcher Leases, and which members are live |
//! | [`listing`] | the sessions a dispatcher lists on its Lease, and the reports of ended sessions it carries |
//! | [`partition`] | what a group knows besides its queue as the ring changes: held and remembered deletions |
//! | [`references`] | references by field path: which objects name which others, both ways, for one group |
//! | [`recent_deletions`] | deletions of keys owned elsewhere, remembered for a bounded time and number |
//! | [`backoff`] | per-key exponential backoff for failed reconciles, and a watch's recovery when it breaks ([`backoff::WatchRetry`]) |
//! | [`quota`] | how many sessions and groups a tenant may hold, and the body pool's shares when it runs short |
//! | [`subscription`] | what controller groups subscribe to, validated from the wire |
//! | [`request`] | acknowledgements from the wire, checked and bounded before the queue acts on them |
//!
//! The adapters live elsewhere: the dispatcher's watches, membership loop and gRPC services in
//! `kube-dispatch-dispatcher`, the Lease watch and process plumbing in `kube-dispatch-runtime`.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod children;
pub mod handover;
pub mod key;
pub mod leases;
pub mod listing;
pub mod partition;
pub mod queue;
pub mod quota;
pub mod recent_deletions;
pub mod references;
pub mod request;
pub mod subscription;
