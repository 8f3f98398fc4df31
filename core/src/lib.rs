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
//! | [`lease_sessions`] | the sessions a dispatcher lists on its Lease, and the reports of ended sessions it carries |
//! | [`transit`] | keys in transit between dispatchers: what a group keeps besides its queue as the ring changes (changes and deletions a handover holds, deletions remembered for keys owned elsewhere), and the one entry for a key's events ([`transit::Transit::record`]) |
//! | [`references`] | references by field path: which objects name which others, both ways, for one group |
//! | [`recent_deletions`] | deletions of keys owned elsewhere, remembered for a bounded time and number |
//! | [`backoff`] | per-key exponential backoff for failed reconciles, and a watch's recovery when it breaks ([`backoff::WatchRetry`]) |
//! | [`quota`] | how many sessions and groups a tenant may hold, and the body pool's shares when it runs short |
//! | [`subscription`] | what controller groups subscribe to, validated from the wire |
//! | [`ack`] | acknowledgements from the wire, checked and bounded before the queue acts on them |
//!
//! The adapters live elsewhere: the dispatcher's watches, membership loop and gRPC services in
//! `kube-dispatch-dispatcher`, the Lease watch and process plumbing in `kube-dispatch-server`.

#![forbid(unsafe_code)]

pub mod ack;
pub mod backoff;
pub mod children;
pub mod handover;
pub mod key;
pub mod lease_sessions;
pub mod leases;
pub mod queue;
pub mod quota;
pub mod recent_deletions;
pub mod references;
pub mod subscription;
pub mod transit;
